#!/usr/bin/env bash
# Runs the matmul pool's tests (inference/src/pool.rs, std only) under Miri,
# on several scheduler seeds, in a throwaway crate that includes the file
# by path (Miri on the whole inference crate would interpret candle too).
# Needs: rustup toolchain install nightly --component miri
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${MIRI_POOL_DIR:-$root/target/miri-pool}
mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "miri-pool"
version = "0.0.0"
edition = "2021"
[workspace]
TOML
printf '#[path = "%s/inference/src/pool.rs"]\npub mod pool;\n' "$root" > "$dir/src/lib.rs"
cd "$dir"
MIRIFLAGS="${MIRIFLAGS:--Zmiri-many-seeds=0..4}" cargo +nightly miri test "$@"
