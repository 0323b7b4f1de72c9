#!/usr/bin/env bash
# Regenerates the kernel fixtures (../*.agkf) with llama.cpp's own CPU backend: see mulmat.c.
# Needs the native llama.cpp build of scripts/build-llamacpp.sh (its sources and shared libraries).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
BIN="$("$here/../../../../../scripts/build-llamacpp.sh")"
SRC="$(dirname "$(dirname "$BIN")")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/mulmat" "$here/mulmat.c" -I"$SRC/ggml/include" -L"$BIN" -lggml -lggml-base -lggml-cpu -lm \
    -Wl,-rpath,"$BIN"
out="$here/.."
seed=1
# Shapes: 16 rows (two 8-row repack groups), 512 or 576 columns (576 = 18 blocks of 32: not a
# multiple of 256, as SmolLM2's hidden size); n = 1 (decode: gemv), n = 7 (prompt: gemm for
# four columns, gemv for three) and n = 9 (a product wide enough for the tiled kernel).
for t in q4_0 q4_1 q5_0 q5_1 q8_0; do
    for n in 1 7; do
        "$tmp/mulmat" "$t" 16 576 "$n" "$seed" "$out/$t-16x576-n$n.agkf"
        seed=$((seed + 1))
    done
done
for t in q4_K q5_K q6_K; do
    for n in 1 7; do
        "$tmp/mulmat" "$t" 16 512 "$n" "$seed" "$out/$t-16x512-n$n.agkf"
        seed=$((seed + 1))
    done
done
# f16/bf16/f32 weights are not bit-exact with ggml (it rounds activations to f16 and sums in
# its own order); the tests compare them within a tolerance.
for t in f16 bf16 f32; do
    "$tmp/mulmat" "$t" 16 576 7 "$seed" "$out/$t-16x576-n7.agkf"
    seed=$((seed + 1))
done
# Products of 17 columns: the engine's wide path for blocks of 32 (rows decoded once).
for t in q5_0 q8_0 q4_1 q5_1 q4_0; do
    "$tmp/mulmat" "$t" 12 576 17 "$seed" "$out/$t-12x576-n17.agkf"
    seed=$((seed + 1))
done
# Products of 8 columns or more: ggml's tiled K-quant kernel (Q6_K, Q5_K, Q4_K not repacked).
for t in q6_K q5_K; do
    "$tmp/mulmat" "$t" 16 512 9 "$seed" "$out/$t-16x512-n9.agkf"
    seed=$((seed + 1))
done
"$tmp/mulmat" q4_K 12 512 9 "$seed" "$out/q4_K-12x512-n9.agkf"
seed=$((seed + 1))
# Row counts that are not a multiple of 8: ggml does not repack, vec_dot numerics.
for t in q4_0 q4_K; do
    cols=576; [ "$t" = q4_K ] && cols=512
    "$tmp/mulmat" "$t" 12 "$cols" 7 "$seed" "$out/$t-12x$cols-n7.agkf"
    seed=$((seed + 1))
done
# A wide repacked Q4_K product: 24 rows (three groups of 8, the engine's eight-rows-in-lanes
# path), 19 columns (16 in ggml's groups of four, 3 on its gemv).
"$tmp/mulmat" q4_K 24 512 19 100 "$out/q4_K-24x512-n19.agkf"
