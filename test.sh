#!/usr/bin/env bash
# The whole test suite: formatting, lints, the release build, every crate's
# tests (unit, data-driven, property, end-to-end against the built agentd,
# including the real default model), the tool-call conformance check, and
# the README's first command. Exit status is non-zero when anything fails.
# See README.md for what it needs and how long it takes.
set -euo pipefail
cd "$(dirname "$0")"

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo build --release"
cargo build --release --locked --workspace --bins

step "the default model (agentd pull: the Hub, else the pip mirror; cached in target/)"
export AGENTD_TEST_HOME="${AGENTD_TEST_HOME:-$PWD/target/agentd-test-home}"
AGENTD_TEST_MODEL="$(AGENTD_HOME="$AGENTD_TEST_HOME" target/release/agentd pull)"
export AGENTD_TEST_MODEL
echo "model: $AGENTD_TEST_MODEL"

step "cargo test --release (the real-model tests included)"
cargo test --release --locked --workspace

step "tool-call conformance (toolcalls.py)"
shared="${AGENTD_SHARED:-../shared}"
if [ -f "$shared/conformance/toolcalls.py" ]; then
    python3 "$shared/conformance/toolcalls.py" --cmd "target/release/agentd toolparse replay"
else
    echo "($shared not found: using the vendored copy of the fixtures and judge)"
    python3 tests/conformance/toolcalls.py toolparse/tests/data/toolcalls \
        --cmd "target/release/agentd toolparse replay"
fi

step "the README's first command: agentd ask on the real model"
AGENTD_HOME="$AGENTD_TEST_HOME" target/release/agentd ask --corpus docs \
    "What happens when research reaches the round limit?"

step "all tests passed"
