#!/usr/bin/env python3
"""Makes the fixture inference/tests/data/reference/quant-greedy.jsonl: the ids native llama.cpp
generates greedily on the default checkpoint requantized to the weight types that have kernels of
their own (each type's numbers are llama.cpp's for that type), as inference/tests/reference.rs
reads them.

    $AGENTD_TEST_PYTHON scripts/quant_reference.py --llama-bin "$AGENTD_TEST_LLAMA_BIN" \\
        --file smollm2-q4_0="$AGENTD_TEST_Q4_0"
    ... --check     (compare with the fixture instead of writing it; exit 1 on a difference)

How: each file is `llama-quantize --allow-requantize` of the default model (SmolLM2-135M Q4_1) to
the type its key names (`scripts/test-deps.sh` makes them; the requantization is deterministic
and the sha256 is on every line). `llama-server` (from --llama-bin) serves it at 1 thread with
one slot and a 4,096-token context (f16 cache, flash attention at its default), and
`/completion` gets each prompt of `smollm2-greedy.jsonl` and `smollm2-greedy-long.jsonl` (6 to
623 tokens: prompts of more than 16 tokens run the many-column prompt kernels) as token ids,
`top_k: 1`, up to 32 tokens, `cache_prompt: false`; a second request with `n_probs: 2` must give
the same ids and gives the smallest gap between the best and second-best log-probability
(`min_gap`).

Lines: `{model, question, prompt_ids, greedy_ids, stop_type, min_gap, sha256}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import family_reference as fr  # noqa: E402
from kv_reference import REF, cases  # noqa: E402

FIXTURE = os.path.join(REF, "quant-greedy.jsonl")
PROMPTS = ["smollm2-greedy.jsonl", "smollm2-greedy-long.jsonl"]
N_PREDICT = 32
CTX = 4096


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--file", action="append", required=True, metavar="KEY=PATH",
                    help="a requantized file and its key (smollm2-q4_0, ...)")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    files = dict(f.split("=", 1) for f in a.file)
    lines = []
    with tempfile.TemporaryDirectory() as work:
        for key, path in files.items():
            digest = fr.sha256(path)
            server = fr.Server(a.llama_bin, path, CTX, os.path.join(work, f"{key}.log"),
                               n_predict=N_PREDICT)
            try:
                for fixture in PROMPTS:
                    for c in cases(fixture):
                        ids = c["prompt_ids"]
                        got, gap, stop = fr.greedy(server, ids, all_probs=False)
                        lines.append({"model": key, "question": c["question"], "prompt_ids": ids,
                                      "greedy_ids": got, "stop_type": stop,
                                      "min_gap": round(gap, 4), "sha256": digest})
                        print(f"{key} {c['question'][:40]!r}: {len(ids)} + {len(got)} ids,"
                              f" min gap {gap:.3f}", file=sys.stderr)
            finally:
                server.close()
    text = "".join(json.dumps(x) + "\n" for x in lines)
    if a.check:
        with open(FIXTURE) as f:
            old = [json.loads(x) for x in f if x.strip()]
        new = [x for x in lines]
        keys = set(files)
        if [x for x in old if x["model"] in keys] != new:
            print("quant-greedy.jsonl differs from what llama.cpp gives now", file=sys.stderr)
            sys.exit(1)
        print("quant-greedy.jsonl: llama.cpp gives the same ids", file=sys.stderr)
        return
    if os.path.exists(FIXTURE):
        # Lines of keys not run this time stay.
        with open(FIXTURE) as f:
            keep = [x for x in f if x.strip() and json.loads(x)["model"] not in files]
        text = "".join(keep) + text
    with open(FIXTURE, "w") as f:
        f.write(text)
    print(f"wrote {len(lines)} lines to {FIXTURE}", file=sys.stderr)


if __name__ == "__main__":
    main()
