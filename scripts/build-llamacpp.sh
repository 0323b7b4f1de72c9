#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-bench, llama-server, llama-quantize, llama-cli) natively
# for this CPU, once, into a cache, and prints the folder holding the binaries. This is the
# peer the engine is measured against, and the test suite uses llama-quantize (to make the
# Q4_K_M reference file) and llama-server (as an upstream engine for `serve --provider openai`).
#
#   BIN=$(scripts/build-llamacpp.sh)     # ~6 min the first time on 2 cores, then instant
#
# The cache: $AGENTD_PEER_CACHE, else ~/.cache/agentd-peers; test.sh sets it to an entry of its
# per-user cache named by this file's sha256 (scripts/test-deps.sh), so editing the version or
# the flags here builds afresh there.
#
# Source: the llama.cpp that llama-cpp-python 0.3.36 vendors (commit 0c1e570), fetched from PyPI
# as an sdist (the reference fixtures were produced with it). The Python tools it needs
# (cmake, ninja, scikit-build-core) come from $AGENTD_TEST_PYTHON's environment when set
# (test.sh's venv), never the system's.
#
# Built for the instruction sets this CPU has (read from /proc/cpuinfo), in a build folder per
# set, so one cache serves machines of different kinds: AVX-512 (VNNI, VBMI, BF16) where the CPU
# has it (the flags as Linux spells them: avx512f, avx512bw, avx512vl, avx512_vnni), else
# AVX2 + FMA + F16C. AMX is always off: some of these machines report AMX in
# cpuid, but the first AMX tile instruction dies with SIGILL (GGML_NATIVE=ON would turn it on),
# and a build with AVX-512 dies with SIGILL on the machines that lack it.
set -euo pipefail
CACHE="${AGENTD_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentd-peers}"
SRC="$CACHE/llama_cpp_python-0.3.36/vendor/llama.cpp"
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
# has NAME...: the CPU reports one of the names. Linux writes some flags with an underscore
# (avx512_vnni, avx512_bf16, avx_vnni) and others without (avx512vbmi, avx512bw); each check
# names both spellings, so a kernel that writes the other one still gets the build it should.
has() {
  local f
  for f in "$@"; do
    case " $flags " in *" $f "*) return 0 ;; esac
  done
  return 1
}
ISA_FLAGS=(-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
VARIANT=avx2
if has avx512f && has avx512bw && has avx512vl && has avx512_vnni avx512vnni; then
  VARIANT=avx512
  ISA_FLAGS+=(-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON)
  has avx512vbmi avx512_vbmi && ISA_FLAGS+=(-DGGML_AVX512_VBMI=ON)
  has avx512_bf16 avx512bf16 && ISA_FLAGS+=(-DGGML_AVX512_BF16=ON)
fi
# AGENTD_LLAMACPP_VARIANT=avx2|avx512 prints or builds that folder instead (the AVX2 build on
# an AVX-512 machine, to compare the two; an avx512 build dies with SIGILL where it is missing).
case "${AGENTD_LLAMACPP_VARIANT:-}" in
"") ;;
avx2) VARIANT=avx2 ISA_FLAGS=(-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON) ;;
avx512) [ "$VARIANT" = avx512 ] || { echo "this CPU lacks AVX-512 (F, BW, VL, VNNI)" >&2; exit 1; } ;;
*) echo "AGENTD_LLAMACPP_VARIANT must be avx2 or avx512" >&2; exit 1 ;;
esac
has avx_vnni avxvnni && ISA_FLAGS+=(-DGGML_AVX_VNNI=ON)
BUILD="$SRC/build-$VARIANT"
BIN="$BUILD/bin"
if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-quantize" ]; then
  echo "$BIN"; exit 0
fi
PY="${AGENTD_TEST_PYTHON:-python3}"
PYBIN="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")"
export PATH="$PYBIN:$PATH"
mkdir -p "$CACHE"
{
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    "$PY" -m pip install -q --disable-pip-version-check cmake ninja
  fi
  if [ ! -d "$SRC" ]; then
    "$PY" -c 'import scikit_build_core' 2>/dev/null ||
      "$PY" -m pip install -q --disable-pip-version-check scikit-build-core
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
      --no-build-isolation llama-cpp-python==0.3.36 -d "$CACHE"
    # Unpacked aside and moved into place, so an interrupted unpack never leaves a partial
    # source tree in a cache that later runs (and other clones) would take as complete.
    rm -rf "$CACHE/.unpack"
    mkdir -p "$CACHE/.unpack"
    tar xzf "$CACHE/llama_cpp_python-0.3.36.tar.gz" -C "$CACHE/.unpack"
    mv "$CACHE/.unpack/llama_cpp_python-0.3.36" "$CACHE/"
    rmdir "$CACHE/.unpack"
  fi
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DGGML_NATIVE=OFF "${ISA_FLAGS[@]}" \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  cmake --build "$BUILD" --target llama-bench llama-server llama-quantize llama-cli -j"$(nproc)"
} >&2
echo "$BIN"
