# shellcheck shell=bash
# Sourced by .ci/cuda-check and scripts/gpu-check.sh: `cuda_toolkit [runtime]` makes a CUDA
# toolkit usable by candle's and cudarc's build scripts, installing NVIDIA's pip wheels into a
# venv when the machine has none (cached: a second call reuses it). It exports PATH (nvcc),
# CUDA_ROOT/CUDA_PATH/CUDA_HOME and LD_LIBRARY_PATH.
#
# The venv is an entry of the per-user cache (scripts/cache.sh: AGENTD_CACHE, default
# ~/.cache/agentd-ci), cuda-venv-KEY, KEY the sha256 of the pins below and of python3's build,
# so every clone on the machine shares it and a change of pins makes a new one. Its fixed path
# also keeps CUDA_ROOT the same from clone to clone, which the build scripts of candle-kernels
# and cudarc watch: the CUDA check's shared cargo target dir is reused only while it stays the
# same. With AGENTD_CACHE= (empty) or an unwritable cache it is target/cuda-venv as before.
#
# Why these wheels and pins:
# - The CUDA 13 wheels: the `-cu12` nvcc wheels hold only `ptxas`, not `nvcc` itself.
# - 13.4, not newer: cudarc 0.19 (candle 0.11's CUDA bindings) refuses CUDA 13.5 at build time
#   ("Unsupported cuda toolkit version").
# - nvcc, crt (the compiler's headers), nvvm (cicc, the device compiler), the runtime
#   headers and cccl (below) are the least that compiles candle's kernels. cuBLAS, cuRAND, NVRTC are
#   loaded by cudarc only at run time, so only `cuda_toolkit runtime` (a GPU run) adds them.
# - cccl: the runtime wheel's cuda_fp16.h includes <nv/target>, which is CCCL's (libcu++) and
#   ships in its own wheel; without it nvcc stops at candle's first kernel ("fatal error:
#   nv/target: No such file or directory"). PyPI has no 13.4 cccl wheel; 13.3.5.0.6, the
#   newest, is header-only and compiles candle's kernels with nvcc 13.4.
# The toolkit lands under the venv's site-packages/nvidia/cu13.
#
# A toolkit already on the machine (nvcc on PATH, or CUDA_ROOT set) is used as it is.

# shellcheck source=scripts/cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/cache.sh"

cuda_toolkit_pins=(
    "nvidia-cuda-nvcc==13.4.92"
    "nvidia-cuda-crt==13.4.*"
    "nvidia-nvvm==13.4.*"
    "nvidia-cuda-runtime==13.4.*"
    "nvidia-cuda-cccl==13.3.5.0.6"
)
cuda_runtime_pins=(
    "nvidia-cublas==13.4.*"
    "nvidia-curand==10.4.*"
    "nvidia-cuda-nvrtc==13.4.92"
)

cuda_toolkit() {
    local root="${CUDA_ROOT:-}"
    if [ -z "$root" ] && command -v nvcc >/dev/null; then
        root="$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)"
    fi
    if [ -z "$root" ]; then
        local python="${PYTHON:-python3}" venv pins=("${cuda_toolkit_pins[@]}")
        if ! command -v "$python" >/dev/null; then
            echo "neither nvcc nor $python found: install a CUDA 13.4 toolkit, or python3 for NVIDIA's nvcc wheels" >&2
            return 1
        fi
        venv="$(cache_path "cuda-venv-$(cache_key "${cuda_toolkit_pins[*]}" \
            "$("$python" -c 'import sys; print(sys.version, sys.executable)')")" "$PWD/target/cuda-venv")"
        [ "${1:-}" = runtime ] && pins+=("${cuda_runtime_pins[@]}")
        cache_lock "$venv"
        if [ ! -f "$venv/.pins" ] || [ "$(cat "$venv/.pins")" != "${pins[*]}" ]; then
            echo "  installing ${pins[*]} into $venv"
            rm -f "$venv/.pins"
            { [ -x "$venv/bin/pip" ] || "$python" -m venv "$venv"; } &&
                "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" || {
                echo "pip could not install NVIDIA's CUDA wheels into $venv: check the network and the pins in scripts/cuda-toolkit.sh" >&2
                cache_unlock
                return 1
            }
            echo "${pins[*]}" >"$venv/.pins"
        fi
        cache_unlock
        root="$("$venv/bin/python" -c \
            'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
    fi
    if [ ! -x "$root/bin/nvcc" ]; then
        echo "nvcc not found at $root/bin/nvcc: fix CUDA_ROOT, or delete the venv (${venv:-target/cuda-venv}) if the wheels' layout changed" >&2
        return 1
    fi
    export PATH="$root/bin:$PATH"
    export CUDA_ROOT="$root" CUDA_PATH="$root" CUDA_HOME="$root"
    export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvcc --version | tail -n 2
    echo "  CUDA_ROOT=$CUDA_ROOT"
}
