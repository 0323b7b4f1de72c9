#!/usr/bin/env python3
"""Makes the fixture inference/tests/data/reference/kv-greedy.jsonl: the ids native llama.cpp
generates greedily with a quantized K/V cache (`-ctk T -ctv T`), as inference/tests/kv_cache.rs
reads them.

    $AGENTD_TEST_PYTHON scripts/kv_reference.py --llama-bin "$AGENTD_TEST_LLAMA_BIN" \\
        --model "$AGENTD_TEST_MODEL" --q4km "$AGENTD_TEST_Q4KM" --gemma "$AGENTD_TEST_GEMMA"
    ... --check     (compare with the fixture instead of writing it; exit 1 on a difference)

How: `llama-server` (from --llama-bin, which scripts/build-llamacpp.sh prints) serves each file
at 1 thread with one slot, a 4,096-token context and `-ctk T -ctv T` (flash attention left at
its default, which the CPU build turns on: a quantized V cache needs it), and `/completion`
gets each prompt of the existing greedy fixtures as token ids, `top_k: 1`, up to 32 tokens,
`cache_prompt: false`; a second request with `n_probs: 2` must give the same ids and gives the
smallest gap between the best and second-best log-probability over the steps (`min_gap`).

Lines: `{model, kv, question, prompt_ids, greedy_ids, stop_type, min_gap, sha256}` for
- the default model (`smollm2-greedy.jsonl` and `smollm2-greedy-long.jsonl`: 74 to 623 tokens,
  which with an f16 cache would take the tiled path) with q8_0 and q4_0;
- the Q4_K_M requantization (`smollm2-q4_k_m-greedy.jsonl`) and gemma3
  (`gemma3-270m-greedy.jsonl`: sliding-window layers, head size 256, one KV head) with q8_0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import family_reference as fr  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = os.path.join(ROOT, "inference/tests/data/reference")
FIXTURE = os.path.join(REF, "kv-greedy.jsonl")
N_PREDICT = 32
CTX = 4096

# (model key, the existing fixtures whose prompts run, the cache types)
RUNS = [
    ("smollm2", ["smollm2-greedy.jsonl", "smollm2-greedy-long.jsonl"], ["q8_0", "q4_0"]),
    ("smollm2-q4_k_m", ["smollm2-q4_k_m-greedy.jsonl"], ["q8_0"]),
    ("gemma3", ["gemma3-270m-greedy.jsonl"], ["q8_0"]),
]


def cases(fixture: str) -> list[dict]:
    with open(os.path.join(REF, fixture)) as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--model", required=True, help="the default model (SmolLM2-135M Q4_1)")
    ap.add_argument("--q4km", required=True, help="smollm2-135m-q4_k_m.gguf")
    ap.add_argument("--gemma", required=True, help="gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    files = {"smollm2": a.model, "smollm2-q4_k_m": a.q4km, "gemma3": a.gemma}
    lines = []
    with tempfile.TemporaryDirectory() as work:
        for key, fixtures, types in RUNS:
            digest = fr.sha256(files[key])
            for kv in types:
                log = os.path.join(work, f"{key}-{kv}.log")
                server = fr.Server(a.llama_bin, files[key], CTX, log,
                                   extra=["-ctk", kv, "-ctv", kv], n_predict=N_PREDICT)
                try:
                    for fixture in fixtures:
                        for c in cases(fixture):
                            ids = c["prompt_ids"]
                            got, gap, stop = fr.greedy(server, ids, all_probs=False)
                            lines.append({"model": key, "kv": kv, "question": c["question"],
                                          "prompt_ids": ids, "greedy_ids": got,
                                          "stop_type": stop, "min_gap": round(gap, 4),
                                          "sha256": digest})
                            print(f"{key} {kv} {c['question'][:40]!r}: {len(ids)} + {len(got)}"
                                  f" ids, min gap {gap:.3f}", file=sys.stderr)
                finally:
                    server.close()
    text = "".join(json.dumps(x) + "\n" for x in lines)
    if a.check:
        with open(FIXTURE) as f:
            old = f.read()
        if old != text:
            print("kv-greedy.jsonl differs from what llama.cpp gives now", file=sys.stderr)
            sys.exit(1)
        print("kv-greedy.jsonl: llama.cpp gives the same ids", file=sys.stderr)
        return
    with open(FIXTURE, "w") as f:
        f.write(text)
    print(f"wrote {len(lines)} lines to {FIXTURE}", file=sys.stderr)


if __name__ == "__main__":
    main()
