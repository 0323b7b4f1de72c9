#!/usr/bin/env bash
# The check for a machine with an NVIDIA GPU: build agentd with `--features cuda`, hold the
# GPU's forward pass to llama.cpp's reference answers (the candle-path reference test, on
# `cuda`), then `agentd bench` on the GPU and on the CPU fast path, tokens/s side by side.
#
# Needs the NVIDIA driver (nvidia-smi) and either a CUDA 13.4 toolkit or python3 with network
# access for NVIDIA's pip wheels (scripts/cuda-toolkit.sh, cached in the per-user set-up cache,
# ~/.cache/agentd-ci/cuda-venv-KEY, or target/cuda-venv with AGENTD_CACHE=; on an offline
# machine bring that folder along). The model: AGENTD_TEST_MODEL, else `agentd pull`.
# Everything builds in target/gpu-check, apart from the CPU build's cache.
# Usage: scripts/gpu-check.sh [--device cuda:N]
set -euo pipefail
cd "$(dirname "$0")/.."

device="cuda"
if [ "${1:-}" = --device ] && [ -n "${2:-}" ]; then device="$2"; fi
step() { printf '\n==> %s\n' "$*"; }
started=$SECONDS

step "the GPU"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
    echo "no NVIDIA GPU here (nvidia-smi is missing or lists none): run this on a machine with one;" >&2
    echo "without a GPU, .ci/cuda-check compile-checks the CUDA build" >&2
    exit 1
fi
if [ -z "${CUDA_COMPUTE_CAP:-}" ]; then
    cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')"
    export CUDA_COMPUTE_CAP="$cap"
fi
echo "  CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"

step "CUDA toolkit and the libraries cudarc loads at run time"
# shellcheck source=scripts/cuda-toolkit.sh
. scripts/cuda-toolkit.sh
cuda_toolkit runtime

target_dir="$PWD/target/gpu-check"
step "cargo build --release -p agentd --features cuda"
cargo build --release --locked -p agentd --features cuda --target-dir "$target_dir"
agentd="$target_dir/release/agentd"

step "the model"
model="${AGENTD_TEST_MODEL:-}"
[ -n "$model" ] || model="$("$agentd" pull)"
echo "  $model"

step "reference test on $device: the candle path against llama.cpp's greedy answers"
AGENTD_TEST_MODEL="$model" AGENTD_TEST_DEVICE="$device" AGENTD_TEST_STRICT=1 \
    cargo test --release --locked -p inference --features cuda --target-dir "$target_dir" \
    --test reference -- --exact the_candle_path_follows_llama_cpp_within_rounding --nocapture

step "agentd bench: $device beside the CPU fast path"
bench() { "$agentd" bench --model "$model" --device "$1" --prompt-tokens 512 --gen-tokens 128 --json; }
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p"; }
gpu="$(bench "$device")"
cpu="$(bench cpu)"
printf '  %-8s %12s %12s\n' device "pp tok/s" "tg tok/s"
for row in "$device|$gpu" "cpu|$cpu"; do
    json="${row#*|}"
    printf '  %-8s %12.1f %12.1f\n' "${row%%|*}" "$(field pp_tok_s <<<"$json")" "$(field tg_tok_s <<<"$json")"
done

step "GPU check passed ($((SECONDS - started)) s)"
