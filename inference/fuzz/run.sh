#!/usr/bin/env bash
# Runs the GGUF fuzz targets (cargo-fuzz, nightly): ./run.sh [SECONDS per target, default 60].
# The seed corpus is tests' small GGUF files; crashes land in artifacts/ — keep each as a
# regression input under ../tests/data/gguf/ (the loader's tests replay every file there).
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
for t in gguf_header gguf_load; do
    mkdir -p "corpus/$t"
    cp -n ../tests/data/gguf/*.gguf "corpus/$t/" 2>/dev/null || true
    cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536
done
