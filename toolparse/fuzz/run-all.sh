#!/usr/bin/env bash
# Usage: run-all.sh [SECONDS [FAMILY...]]
# Fuzzes every streaming entry point for SECONDS per family (default 600),
# splitting a family's time between its format variants, one target at a
# time on one core (-jobs=1 -workers=1). Crashes are copied
# to ../tests/data/fuzz/ as regression inputs (TARGET-crash-HASH), which
# tests/fuzz_regressions.rs replays. Needs nightly and cargo-fuzz.
set -uo pipefail
cd "$(dirname "$0")"
secs=${1:-600}
shift || true
# Optional family names after SECONDS: only those families.
declare -A fam=(
  [qwen3-hermes]="hermes" [qwen3-xml]="qwen3_xml" [llama]="llama3_json llama4_pythonic"
  [mistral]="mistral" [deepseek]="deepseek_v3 deepseek_v31 deepseek_v32 deepseek_v4 deepseek_v41"
  [gpt-oss]="gpt_oss" [glm]="glm45 glm47" [kimi]="kimi_k2 kimi_k3" [gemma4]="gemma4"
)
mkdir -p ../tests/data/fuzz corpus
status=0
families=(qwen3-hermes qwen3-xml llama mistral deepseek gpt-oss glm kimi gemma4)
[ $# -gt 0 ] && families=("$@")
for f in "${families[@]}"; do
  targets=(${fam[$f]})
  each=$(( secs / ${#targets[@]} ))
  for t in "${targets[@]}"; do
    mkdir -p "corpus/parse_$t"
    # Seed the corpus with the family's recorded outputs and regression cases
    # (3 header bytes + text).
    python3 - "$f" "corpus/parse_$t" <<'PY'
import json, sys, pathlib, hashlib
fam, out = sys.argv[1], pathlib.Path(sys.argv[2])
for p in [*pathlib.Path('../tests/data/toolcalls', fam).glob('*.jsonl'),
          *pathlib.Path('../tests/data/regressions', fam).glob('*.jsonl')]:
    for line in p.read_text().splitlines():
        fx = json.loads(line)
        data = bytes([0, 7, 0]) + fx['raw_output'].encode()
        (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
PY
    # Crashes of earlier runs were copied already: only new ones count.
    if ls "artifacts/parse_$t"/crash-* >/dev/null 2>&1; then
      mkdir -p "artifacts/parse_$t/old"
      mv "artifacts/parse_$t"/crash-* "artifacts/parse_$t/old/"
    fi
    echo "== parse_$t: ${each}s"
    rm -f fuzz-0.log
    start=$(date +%s)
    cargo +nightly fuzz run "parse_$t" "corpus/parse_$t" -- -max_total_time="$each" \
        -jobs=1 -workers=1 -dict="dicts/$f.dict" -max_len=4096 -print_final_stats=1 2>&1 | tail -n 4
    # With -jobs the fuzzer's own output is in fuzz-0.log.
    [ -f fuzz-0.log ] && tail -n 14 fuzz-0.log
    echo "== parse_$t ran $(( $(date +%s) - start ))s"
    if ls "artifacts/parse_$t"/crash-* >/dev/null 2>&1; then
      status=1
      # Named TARGET-crash-HASH: tests/fuzz_regressions.rs replays them.
      for c in "artifacts/parse_$t"/crash-*; do
        cp "$c" "../tests/data/fuzz/$t-$(basename "$c")"
      done
      echo "!! crash in parse_$t (copied to tests/data/fuzz/)"
    fi
  done
done
exit $status
