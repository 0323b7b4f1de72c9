#!/usr/bin/env python3
"""Prompt-lookup speculation on grounded answers, measured: for each question of a
research-qa set, the model reads the file that answers it and answers in free text,
once with `--draft 0` (no drafts) and once with `--draft N`; the two outputs must be
the same token for token, and the decode speeds are compared.

Prints one line per question (tokens, tokens/s without and with drafts, drafts
confirmed) and the totals: decode tokens/s of each (all tokens over all decode
time), their ratio and the share of drafted tokens confirmed. Exits 1 when any
output differs. The prompt is ChatML (the default model's template).

Standard library only:

    python3 benches/speculate.py --agentd target/release/agentd \\
        --corpus tests/data/research-qa/npm-docs \\
        --questions tests/data/research-qa/npm-docs.jsonl
"""

import argparse
import json
import os
import subprocess
import sys

SYSTEM = "Answer the question from the document. Quote the document's own words."


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def generate(a, prompt, draft):
    cmd = [a.agentd, "generate", "--json", "--threads", str(a.threads), "--max-tokens",
           str(a.max_tokens), "--draft", str(draft)]
    if a.model:
        cmd += ["--model", a.model]
    cmd.append(prompt)
    env = dict(os.environ)
    if a.home:
        env["AGENTD_HOME"] = a.home
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        sys.exit(f"agentd generate failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agentd", default="target/release/agentd")
    ap.add_argument("--model", help="registry name or .gguf path (default: the default model)")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--questions", required=True, help="JSON lines with `q` and the answering `file`")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--doc-chars", type=int, default=6000, help="the document's first characters")
    ap.add_argument("--home", help="AGENTD_HOME for the runs")
    a = ap.parse_args()
    total = {"plain": [0, 0.0], "draft": [0, 0.0]}
    drafted = accepted = differ = 0
    for item in load(a.questions):
        with open(os.path.join(a.corpus, item["file"]), encoding="utf-8") as f:
            doc = f.read()[: a.doc_chars]
        prompt = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nDocument:\n{doc}\n\n"
                  f"Question: {item['q']}<|im_end|>\n<|im_start|>assistant\n")
        plain = generate(a, prompt, 0)
        spec = generate(a, prompt, a.draft)
        same = plain["ids"] == spec["ids"]
        differ += not same
        for k, r in (("plain", plain), ("draft", spec)):
            total[k][0] += r["decode"]["tokens"]
            total[k][1] += r["decode"]["seconds"]
        d = spec["decode"]
        drafted += d["drafted"]
        accepted += d["accepted"]
        rate = lambda r: r["decode"]["tokens"] / max(r["decode"]["seconds"], 1e-9)
        print(f"{'same' if same else 'DIFFERS'} {d['tokens']:4} tokens {rate(plain):7.1f} -> "
              f"{rate(spec):7.1f} tok/s, {d['accepted']:3}/{d['drafted']:3} confirmed  {item['q'][:60]!r}",
              flush=True)
    tp = total["plain"][0] / max(total["plain"][1], 1e-9)
    td = total["draft"][0] / max(total["draft"][1], 1e-9)
    share = accepted / drafted if drafted else 0.0
    print(f"speculate: decode {tp:.1f} -> {td:.1f} tokens/s ({td / tp:.2f}x) with --draft {a.draft}; "
          f"drafts confirmed {accepted}/{drafted} ({share:.0%}); outputs differing: {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
