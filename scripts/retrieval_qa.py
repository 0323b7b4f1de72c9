#!/usr/bin/env python3
"""The share of research-qa questions whose answering file is among the first three search
results, as `search_sources` ranks them (`agentd search`): full text alone, and with vectors
fused in when an embedding model is given.

    python3 scripts/retrieval_qa.py [--agentd target/release/agentd] [--embed-model NAME|PATH]

The questions are tests/data/research-qa/*.jsonl (`q` and the answering `file`); the corpus is
tests/data/research-qa/npm-docs. With --embed-model the same questions run again with
AGENTD_CORPUS_EMBED_MODEL set (the vectors are made on the first search and kept beside the
index). Prints one line per setting: hits in the top 3, the share, and the mean rank of the
answering file where found (top 10).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QA = os.path.join(ROOT, "tests", "data", "research-qa")


def questions():
    out = []
    for name in ("npm-docs.jsonl", "npm-docs-spoken.jsonl"):
        with open(os.path.join(QA, name), encoding="utf-8") as f:
            out += [json.loads(l) for l in f if l.strip()]
    return out


def run(agentd, model):
    env = dict(os.environ)
    env.pop("AGENTD_CORPUS_EMBED_MODEL", None)
    if model:
        env["AGENTD_CORPUS_EMBED_MODEL"] = model
    top3, ranks, qs = 0, [], questions()
    for q in qs:
        out = subprocess.run(
            [agentd, "search", "--corpus", os.path.join(QA, "npm-docs"), "--limit", "10", q["q"]],
            env=env, capture_output=True, text=True, check=True).stdout
        files = [os.path.basename(json.loads(l)["path"]) for l in out.splitlines() if l.strip()]
        if q["file"] in files:
            r = files.index(q["file"]) + 1
            ranks.append(r)
            top3 += r <= 3
    label = f"with vectors ({model})" if model else "full text only"
    mean = sum(ranks) / len(ranks) if ranks else float("nan")
    print(f"{label}: {top3}/{len(qs)} answering files in the top 3 ({top3 / len(qs):.0%}), "
          f"found in the top 10 for {len(ranks)}, mean rank {mean:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agentd", default=os.path.join(ROOT, "target", "release", "agentd"))
    ap.add_argument("--embed-model")
    a = ap.parse_args()
    run(a.agentd, None)
    if a.embed_model:
        run(a.agentd, a.embed_model)


if __name__ == "__main__":
    sys.exit(main())
