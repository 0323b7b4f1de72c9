#!/usr/bin/env bash
# Runs the daemon's fuzz targets (cargo-fuzz, nightly, AddressSanitizer):
#   ./run.sh [SECONDS per target, default 600] [TARGET...]
# tool_args: the built-in tools with arbitrary names and argument text;
# request_body: the HTTP dialects' request bodies. Seeds: each target's
# regression inputs, and every request body of daemon/tests/data/wire.jsonl
# under each dialect byte. Crashes are copied to
# ../tests/data/TARGET/ as regression inputs, which `cargo test -p agentd`
# replays; the exit status is non-zero when there was one.
set -uo pipefail
cd "$(dirname "$0")"
secs="${1:-600}"
shift || true
targets=(tool_args request_body)
[ $# -gt 0 ] && targets=("$@")
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "../tests/data/$t"
    cp -n ../tests/data/"$t"/* "corpus/$t/" 2>/dev/null || true
    if [ "$t" = request_body ]; then
        python3 - "corpus/$t" <<'PY'
import hashlib, json, pathlib, sys
out = pathlib.Path(sys.argv[1])
bodies = []
for line in pathlib.Path('../tests/data/wire.jsonl').read_text().splitlines():
    if line.strip():
        bodies.append(json.loads(line)['body'])
for b in bodies:
    text = json.dumps(b).encode()
    for dialect in range(5):
        data = bytes([dialect]) + text
        (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
PY
    fi
    if ls "artifacts/$t"/crash-* >/dev/null 2>&1; then
        mkdir -p "artifacts/$t/old" && mv "artifacts/$t"/crash-* "artifacts/$t/old/"
    fi
    echo "== $t: ${secs}s"
    start=$(date +%s)
    cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=4096 \
        -max_len=65536 -print_final_stats=1 2>&1 | tail -n 16
    echo "== $t ran $(( $(date +%s) - start ))s"
    if ls "artifacts/$t"/crash-* >/dev/null 2>&1; then
        status=1
        for c in "artifacts/$t"/crash-*; do cp "$c" "../tests/data/$t/"; done
        echo "!! crash in $t (copied to daemon/tests/data/$t/)"
    fi
done
exit $status
