#!/usr/bin/env python3
"""The main job, measured: `agentd ask --corpus DIR --events` on a question set
(one JSON object per line: {"q", "file", "any"}), each answer judged as the
research-qa fixture's README says:

- strict: outcome `answered`, `grounded`, a key phrase in the answer, and a
  citation of a handle whose search result is the answering file;
- useful: the delivered text (answer, labelled excerpt, or spoken sentences
  for --voice questions) holds a key phrase and cites or names the file;
- junk: the delivered text is empty or loops.

Prints one line per question and the counts, with the median seconds per
question. With --check, exits 1 when strict < --min-strict of the written
questions, useful < --min-useful of all, junk > 0 or the median > --max-median.

Standard library only, so it runs with any python3:

    python3 benches/research_qa.py --agentd target/release/agentd \
        --corpus tests/data/research-qa/npm-docs \
        --written tests/data/research-qa/npm-docs.jsonl \
        --spoken tests/data/research-qa/npm-docs-spoken.jsonl
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def words(text):
    return re.findall(r"\w+", text.lower())


def loops(text):
    """The same sentence of 4+ words twice, or a 4-word phrase 3 times."""
    seen = set()
    for s in re.split(r"[.!?\n]", text):
        w = words(s)
        if len(w) >= 4:
            key = " ".join(w)
            if key in seen:
                return True
            seen.add(key)
    w = words(text)
    counts = {}
    for i in range(len(w) - 3):
        g = tuple(w[i : i + 4])
        counts[g] = counts.get(g, 0) + 1
        if counts[g] >= 3:
            return True
    return False


def names_file(text, file):
    """The text names the file: its name, or its name without the folder
    prefix and extension (`commands_npm-ci.md` -> `npm-ci`)."""
    low = text.lower()
    stem = file.lower().rsplit(".", 1)[0]
    short = stem.split("_", 1)[-1]
    return file.lower() in low or stem in low or (len(short) > 3 and short in low)


def ask(agentd, corpus, q, voice, threads, home, timeout, extra=()):
    cmd = [agentd, "ask", "--corpus", corpus, "--events", "--threads", str(threads), *extra]
    if voice:
        cmd.append("--voice")
    cmd.append(q)
    env = dict(os.environ)
    if home:
        env["AGENTD_HOME"] = home
    t = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        stdout, code = out.stdout, out.returncode
    except subprocess.TimeoutExpired as e:
        stdout, code = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), -1
    secs = time.monotonic() - t
    events = []
    for line in stdout.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return events, secs, code


def judge(item, events, voice):
    done = next((e for e in events if e.get("type") == "done"), {}) or {}
    answer = done.get("answer") or ""
    handles = {}
    for e in events:
        if e.get("type") == "tool_result" and e.get("name") == "search_sources":
            try:
                for r in json.loads(e.get("content") or "{}").get("results", []):
                    handles[r.get("handle")] = r.get("path", "")
            except json.JSONDecodeError:
                pass
    cited = set(re.findall(r"\[(S\d+)\]", answer))
    file = item["file"]
    cites_file = any(os.path.basename(handles.get(h, "")) == file for h in cited)
    phrases = [p.lower() for p in item["any"]]
    has = lambda text: any(p in text.lower() for p in phrases)
    strict = (
        done.get("outcome") == "answered"
        and done.get("grounded") is True
        and has(answer)
        and cites_file
    )
    if voice:
        delivered = " ".join(
            e.get("text", "") for e in events if e.get("type") == "sentence" and e.get("kind") != "progress"
        )
        if not delivered.strip():
            delivered = answer
    else:
        delivered = answer
    useful = has(delivered) and (cites_file or names_file(delivered, file))
    junk = not delivered.strip() or loops(delivered)
    return strict, useful, junk, done


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agentd", default="target/release/agentd")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--written", help="questions asked in writing (JSON lines)")
    ap.add_argument("--spoken", help="questions asked with --voice (JSON lines)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--home", help="AGENTD_HOME for the runs")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--check", action="store_true", help="exit 1 below the bars")
    ap.add_argument("--min-strict", type=float, default=0.60)
    ap.add_argument("--min-useful", type=float, default=0.85)
    ap.add_argument("--max-median", type=float, default=20.0)
    ap.add_argument("--ask-arg", action="append", default=[],
                    help="an argument added to each `agentd ask` (repeat it), e.g. --ask-arg=--draft=0")
    ap.add_argument("--save", help="write each question's answer and decoding here (JSON lines)")
    a = ap.parse_args()
    sets = []
    if a.written:
        sets += [(q, False) for q in load(a.written)]
    if a.spoken:
        sets += [(q, True) for q in load(a.spoken)]
    if not sets:
        ap.error("give --written and/or --spoken")
    strict = useful = junk = written = 0
    times = []
    decode = {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0}
    save = open(a.save, "w", encoding="utf-8") if a.save else None
    for item, voice in sets:
        events, secs, code = ask(a.agentd, a.corpus, item["q"], voice, a.threads, a.home, a.timeout,
                                 a.ask_arg)
        s, u, j, done = judge(item, events, voice)
        d = done.get("decode") or {}
        for k in decode:
            decode[k] += d.get(k, 0)
        if save:
            save.write(json.dumps({"q": item["q"], "voice": voice, "answer": done.get("answer"),
                                   "decode": d}) + "\n")
        times.append(secs)
        if not voice:
            written += 1
            strict += s
        useful += u
        junk += j
        flags = ("S" if s else "-") + ("U" if u else "-") + ("J" if j else "-")
        text = (done.get("answer") or "").replace("\n", " ")
        print(
            f"{flags} {secs:5.1f}s {'voice ' if voice else ''}{done.get('outcome', 'exit %d' % code):9} "
            f"{item['q'][:60]!r} -> {text[:140]!r}",
            flush=True,
        )
    median = statistics.median(times)
    total = len(sets)
    print(
        f"research-qa: strict {strict}/{written} written, useful {useful}/{total}, junk {junk}, "
        f"median {median:.1f} s per question ({a.threads} threads)"
    )
    if decode["seconds"] > 0:
        rate = decode["accepted"] / decode["drafted"] if decode["drafted"] else 0.0
        print(
            f"research-qa decoding: {decode['tokens']} tokens in {decode['seconds']:.2f} s "
            f"({decode['tokens'] / decode['seconds']:.1f} tokens/s), drafts confirmed "
            f"{decode['accepted']}/{decode['drafted']} ({rate:.0%})"
        )
    if save:
        save.close()
    if a.check:
        bad = []
        if written and strict < a.min_strict * written:
            bad.append(f"strict {strict}/{written} is below {a.min_strict:.0%}")
        if useful < a.min_useful * total:
            bad.append(f"useful {useful}/{total} is below {a.min_useful:.0%}")
        if junk:
            bad.append(f"{junk} junk answers")
        if median > a.max_median:
            bad.append(f"median {median:.1f} s is over {a.max_median} s")
        if bad:
            print("research-qa: FAILED: " + "; ".join(bad))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
