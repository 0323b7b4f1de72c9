#!/usr/bin/env python3
"""Makes the fixture inference/tests/data/reference/families.jsonl: for every family of
scripts/synth_families.py, the file's sha256 and the 16 ids native llama.cpp generates greedily
after a short prompt (10 ids) and a long one (1,100 ids), as inference/tests/families.rs reads
them. The reference README (inference/tests/data/reference/README.md) says how it was made.

    $AGENTD_TEST_PYTHON scripts/family_reference.py --llama-bin "$AGENTD_TEST_LLAMA_BIN"
    $AGENTD_TEST_PYTHON scripts/family_reference.py --llama-bin DIR --family qwen2 --check
    $AGENTD_TEST_PYTHON scripts/family_reference.py --llama-bin DIR --family qwen2 --mutate drop-bias

How: each file is written into a temporary folder, `llama-server` (from --llama-bin, which
scripts/build-llamacpp.sh prints) serves it at 1 thread on 127.0.0.1 with one slot (-np 1) and
the context of the line (-c), and `/completion` gets the prompt as token ids (llama.cpp adds no
BOS to ids), `top_k: 1`, `n_predict: 16`, `cache_prompt: false`. The ids come from that
request; a second one with `n_probs: 2` gives llama.cpp's top-2 log-probabilities at every step,
whose difference (`min_gap`, in nats: the smallest over the 16 steps) says how far the file is
from a tie — both requests must give the same ids.

The context is 2048 for every line (the long prompt and 16 more fit) except phi3's short
prompt, run at 512, its original context: llama.cpp takes phi3's short rope factors when the
context per sequence is at most the original context (`rope.scaling.original_context_length`)
and the long ones otherwise, so the two lines cover both. The test loads the engine with the
line's context.

The refusal families (unknown, bad-scaling) get one line each, with no prompt: what the engine
must name when it refuses the file, and whether this llama.cpp loads it.

--check compares with the fixture instead of writing it (exit 1 on a difference). --mutate NAME
(see scripts/synth_families.py) prints the ids llama.cpp gives on the file written without that
thing, beside the fixture's: a mutation that changes no id would let an engine that ignores the
thing pass.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth_families as synth  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "inference/tests/data/reference/families.jsonl")
N_PREDICT = 16
CTX = 2048
# The smallest gap between llama.cpp's best and second-best log-probability (nats) a fixture
# line may have at any of its steps: about 1.5% of the logits' spread (synth.LOGIT_STD), far
# above the differences two correct engines' rounding makes, so they agree on every id.
MIN_GAP = 0.25
# What the engine must name when it refuses these.
REFUSALS = {"unknown": "deepseek2", "bad-scaling": "dynamic"}
# Families compared with llama.cpp (the twins are for speed, not correctness: they are plain
# llama/qwen3 files, so they are not in the fixture).
COMPARED = ["llama3", "qwen2", "qwen2-yarn", "qwen3", "gemma2", "phi3", "qwen3moe"]


def prompts() -> dict[str, list[int]]:
    """The short and the long prompt: seeded random ordinary token ids."""
    rng = np.random.default_rng(20260)
    ids = np.array(synth.PROMPT_IDS)
    return {
        "short": [int(x) for x in rng.choice(ids, 10)],
        "long": [int(x) for x in rng.choice(ids, 1100)],
    }


def contexts(family: str) -> dict[str, int]:
    if family == "phi3":
        return {"short": 512, "long": CTX}
    return {"short": CTX, "long": CTX}


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """llama-server on one file and one context, at 1 thread."""

    def __init__(self, bin_dir: str, model: str, ctx: int, log: str, extra: list[str] = (),
                 n_predict: int = N_PREDICT):
        self.port = free_port()
        self.n_predict = n_predict
        self.log = open(log, "wb")
        self.p = subprocess.Popen(
            [os.path.join(bin_dir, "llama-server"), "-m", model, "-t", "1", "-tb", "1",
             "-c", str(ctx), "-np", "1", "--host", "127.0.0.1", "--port", str(self.port),
             *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.logpath = log
        deadline = time.time() + 120
        while True:
            if self.p.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.p.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.time() > deadline:
                self.close()
                raise RuntimeError("llama-server did not come up in 120 s")
            time.sleep(0.2)

    def tail(self) -> str:
        self.log.flush()
        with open(self.logpath, "rb") as f:
            return f.read()[-3000:].decode("utf-8", "replace")

    def completion(self, ids: list[int], n_probs: int = 0) -> dict:
        body = {"prompt": ids, "n_predict": self.n_predict, "top_k": 1, "cache_prompt": False,
                "return_tokens": True, "seed": 0}
        if n_probs:
            body["n_probs"] = n_probs
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def llama_version(bin_dir: str) -> str:
    out = subprocess.run([os.path.join(bin_dir, "llama-server"), "--version"],
                         capture_output=True, text=True, timeout=60)
    lines = [x.strip() for x in (out.stdout + out.stderr).splitlines() if x.strip()]
    version = next((x for x in lines if x.startswith("version:")), "version: ?")
    build = os.path.basename(os.path.dirname(os.path.abspath(bin_dir)))
    return f"llama.cpp {version.removeprefix('version: ')}, {build}, llama-server -t 1 -np 1"


def greedy(server: Server, ids: list[int], all_probs: bool = True) -> tuple[list[int], float, str]:
    """llama.cpp's greedy ids after `ids`, the smallest top-2 gap and the stop type. With
    `all_probs` false, steps whose probabilities llama-server leaves out (it holds back a token
    that ends inside a UTF-8 character) are allowed."""
    r = server.completion(ids)
    if r.get("tokens_evaluated") != len(ids):
        raise RuntimeError(f"llama.cpp evaluated {r.get('tokens_evaluated')} tokens of {len(ids)}")
    got = [int(t) for t in r["tokens"]]
    p = server.completion(ids, n_probs=2)
    if [int(t) for t in p["tokens"]] != got:
        raise RuntimeError("asking for probabilities changed llama.cpp's ids")
    steps = p.get("completion_probabilities", [])
    if len(steps) != len(got) and (all_probs or not steps):
        raise RuntimeError(f"llama.cpp gave probabilities for {len(steps)} of {len(got)} tokens")
    gap = float("inf")
    for step in steps:
        top = step["top_logprobs"]
        if len(top) >= 2:
            gap = min(gap, top[0]["logprob"] - top[1]["logprob"])
    return got, gap, r.get("stop_type", "")


def run_family(family: str, bin_dir: str, work: str, build: str,
               mutate: str | None = None, seed: int | None = None) -> list[dict]:
    path = os.path.join(work, f"{family}.gguf")
    synth.write(family, path, mutate=mutate, seed=seed)
    digest = sha256(path)
    if family in REFUSALS:
        line = {"family": family, "sha256": digest, "refuse": REFUSALS[family]}
        log = os.path.join(work, f"{family}.log")
        try:
            Server(bin_dir, path, 512, log).close()
            line["llama_cpp"] = f"loads ({build})"
        except RuntimeError:
            with open(log, encoding="utf-8", errors="replace") as f:
                why = [x for x in f if "GGML_ASSERT" in x or "error loading model:" in x][:1]
            # The message without the source folder's path.
            why = why[0].strip().split("/")[-1] if why else "exits"
            line["llama_cpp"] = f"refuses: {why} ({build})"
        return [line]
    lines = []
    servers: dict[int, Server] = {}
    try:
        for name, ids in prompts().items():
            ctx = contexts(family)[name]
            if ctx not in servers:
                servers[ctx] = Server(bin_dir, path, ctx, os.path.join(work, f"{family}-{ctx}.log"))
            got, gap, stop = greedy(servers[ctx], ids)
            lines.append({"family": family, "sha256": digest, "prompt": name, "n_ctx": ctx,
                          "prompt_ids": ids, "greedy_ids": got, "min_gap": round(gap, 3),
                          "stop_type": stop, "llama_cpp": build})
    finally:
        for s in servers.values():
            s.close()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", default=os.environ.get("AGENTD_TEST_LLAMA_BIN"),
                    help="folder of llama-server (scripts/build-llamacpp.sh prints it)")
    ap.add_argument("--family", action="append", help="only these (default: all)")
    ap.add_argument("--check", action="store_true", help="compare with the fixture")
    ap.add_argument("--mutate", choices=list(synth.MUTATIONS))
    ap.add_argument("--search-seed", action="store_true",
                    help="for each --family, print the first seed from the family's own up "
                         f"whose file keeps llama.cpp's min_gap at {MIN_GAP} nats or more")
    ap.add_argument("--min-gap", type=float, default=MIN_GAP, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=FIXTURE)
    a = ap.parse_args()
    if not a.llama_bin:
        ap.error("--llama-bin (or AGENTD_TEST_LLAMA_BIN) is needed")
    families = a.family or COMPARED + list(REFUSALS)
    build = llama_version(a.llama_bin)
    if a.search_seed:
        with tempfile.TemporaryDirectory() as work:
            for family in families:
                seed = synth.SEEDS[family]
                while True:
                    gaps = [v["min_gap"] for v in run_family(family, a.llama_bin, work, build,
                                                             seed=seed)]
                    print(f"{family} seed {seed}: min_gap {gaps}", file=sys.stderr)
                    if min(gaps) >= a.min_gap:
                        print(f"{family}: {seed}")
                        break
                    seed += 1
        return
    old = {}
    if os.path.exists(a.out):
        with open(a.out) as f:
            for line in f:
                if line.strip():
                    v = json.loads(line)
                    old[(v["family"], v.get("prompt"))] = v
    new: list[dict] = []
    with tempfile.TemporaryDirectory() as work:
        for family in families:
            t = time.time()
            lines = run_family(family, a.llama_bin, work, build, a.mutate)
            for v in lines:
                was = old.get((family, v.get("prompt")))
                note = ""
                if "greedy_ids" in v and was is not None:
                    a_, b_ = v["greedy_ids"], was["greedy_ids"]
                    same = next((i for i, (x, y) in enumerate(zip(a_, b_)) if x != y),
                                min(len(a_), len(b_)))
                    note = f", {same}/{len(was['greedy_ids'])} ids as the fixture"
                print(f"{family} {v.get('prompt', '')}: "
                      f"{v.get('greedy_ids', v.get('llama_cpp'))} "
                      f"min_gap {v.get('min_gap', '-')}{note}", file=sys.stderr)
            print(f"  ({time.time() - t:.1f} s)", file=sys.stderr)
            new.extend(lines)
    if a.mutate:
        return
    close = [f"{v['family']} {v['prompt']} ({v['min_gap']})" for v in new
             if v.get("min_gap", a.min_gap) < a.min_gap]
    if close:
        sys.exit(f"greedy choices within {MIN_GAP} nats of a tie: {', '.join(close)}; pick "
                 "another seed for the family in scripts/synth_families.py (--search-seed)")
    if a.check:
        bad = []
        for v in new:
            was = old.get((v["family"], v.get("prompt")))
            # The ids, the file and the prompt; not the build's name or its gaps.
            keys = ("sha256", "n_ctx", "prompt_ids", "greedy_ids", "refuse")
            if was is None or any(v.get(k) != was.get(k) for k in keys):
                bad.append(f"{v['family']} {v.get('prompt', '')}")
        if bad:
            sys.exit("differs from the fixture: " + ", ".join(bad))
        print("the fixture holds", file=sys.stderr)
        return
    if a.family:
        # Replace only the families given, keeping the others' lines and the order.
        mine = {(v["family"], v.get("prompt")) for v in new}
        kept = [v for k, v in old.items() if k not in mine and k[0] not in a.family]
        new = kept + new
        order = {f: i for i, f in enumerate(COMPARED + list(REFUSALS))}
        new.sort(key=lambda v: (order.get(v["family"], 99), v.get("prompt") != "short"))
    with open(a.out, "w") as f:
        for v in new:
            f.write(json.dumps(v, separators=(",", ":")) + "\n")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
