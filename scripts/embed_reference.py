#!/usr/bin/env python3
"""Makes the fixture inference/tests/data/reference/smollm2-embed.jsonl: the embeddings native
llama.cpp computes for a few inputs on a model, per pooling, as inference/tests/embed.rs reads
them (one line per input and pooling: {pooling, text, embedding}).

    python3 scripts/embed_reference.py --llama-bin "$AGENTD_TEST_LLAMA_BIN" --model "$AGENTD_TEST_MODEL"
    python3 scripts/embed_reference.py --llama-bin DIR --model FILE --check

How: for each pooling (mean, cls, last), `llama-server --embedding --pooling P` (from
--llama-bin, which scripts/build-llamacpp.sh prints) serves the model at 1 thread on 127.0.0.1,
and `/v1/embeddings` gets each input alone (`{"input": TEXT}`): llama-server evaluates the
inputs of one request together in one batch, whose numbers differ (by up to ~1e-4 in cosine)
from each input's own run, which is what `llama-embedding` with one prompt and the engine
compute. The vectors are llama-server's: pooled over the hidden states after the output norm,
normalized to Euclidean length 1 (its default, `--embd-normalize 2`).

--check compares with the fixture (cosine >= 0.99999 per line) instead of writing it.

--families (with --python, the interpreter with numpy and gguf) makes
inference/tests/data/reference/embed-families.jsonl instead: for each file of
scripts/synth_embed.py (bert with CLS pooling, nomic-bert with mean pooling, bert-rerank with
its classification head), its sha256, and per input the ids of `/tokenize` (special tokens
added: [CLS] ... [SEP]) and llama-server's vector (`--embedding`, the file's pooling) — or,
for the reranker (`--reranking`), the `/v1/rerank` scores of documents for a query.
Otherwise standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

FIXTURE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "inference",
    "tests",
    "data",
    "reference",
    "smollm2-embed.jsonl",
)

# Short and long, ASCII and not, one token and hundreds.
TEXTS = [
    "The sky is blue.",
    "Rust is a systems programming language.",
    "x",
    "日本語のテキストです。",
    "Research is bounded, the final answer is reserved, and every limit has an owner. " * 12,
]
POOLINGS = ["mean", "cls", "last"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """llama-server on `model` with `flags`, at 1 thread, until the block ends."""

    def __init__(self, llama_bin: str, model: str, flags: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [os.path.join(llama_bin, "llama-server"), "-m", model, "-t", "1", "-c", "2048",
             "-np", "1", "--port", str(self.port), "--host", "127.0.0.1", *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.close()
                sys.exit(f"llama-server did not come up on {model}")
            time.sleep(0.2)

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def embeddings(llama_bin: str, model: str, pooling: str) -> list[list[float]]:
    with Server(llama_bin, model, ["--embedding", "--pooling", pooling]) as srv:
        return [srv.post("/v1/embeddings", {"input": t})["data"][0]["embedding"] for t in TEXTS]


FAMILY_FIXTURE = os.path.join(os.path.dirname(FIXTURE), "embed-families.jsonl")
FAMILY_TEXTS = [
    "the sky is blue",
    "Research is bounded; the final answer is reserved, and every limit has an owner!",
    "retrieval ranks documents by query score",
    "x",
    "the printing press: books and ideas travelled across europe faster than ever. " * 8,
    "Café naïve RÉSUMÉ, ÀÉÎ ÕÜ",
    "日本語のテキスト and 中文",
    "don't\tstop\nnow — 3.14 $5 <b>x</b> 🙂 ok",
]
RERANK_QUERY = "what colour is the sky?"


def families(llama_bin: str, python: str) -> list[dict]:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "synth_embed.py")
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ["bert", "nomic-bert", "bert-rerank"]:
            path = os.path.join(tmp, f"{family}.gguf")
            subprocess.run([python, script, "--family", family, "--out", path], check=True)
            with open(path, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            rerank = family == "bert-rerank"
            flags = ["--reranking"] if rerank else ["--embedding"]
            with Server(llama_bin, path, flags) as srv:
                if rerank:
                    r = srv.post("/v1/rerank", {"query": RERANK_QUERY, "documents": FAMILY_TEXTS})
                    scores = [0.0] * len(FAMILY_TEXTS)
                    for x in r["results"]:
                        scores[x["index"]] = x["relevance_score"]
                    lines.append({"family": family, "sha256": sha, "query": RERANK_QUERY,
                                  "documents": FAMILY_TEXTS, "scores": scores})
                    continue
                for text in FAMILY_TEXTS:
                    ids = srv.post("/tokenize", {"content": text, "add_special": True})["tokens"]
                    vec = srv.post("/v1/embeddings", {"input": text})["data"][0]["embedding"]
                    lines.append({"family": family, "sha256": sha, "text": text, "ids": ids,
                                  "embedding": [round(v, 7) for v in vec]})
    return lines


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def write_or_check(path: str, lines: list[dict], check: bool, same) -> None:
    """Writes `lines` to the fixture at `path`, or (with `check`) compares them with it line by
    line with `same(want, got)` and exits 1 on a difference."""
    if check:
        with open(path, encoding="utf-8") as f:
            want = [json.loads(l) for l in f if l.strip()]
        bad = [w.get("text", w.get("family")) for w, g in zip(want, lines) if not same(w, g)]
        if bad or len(want) != len(lines):
            sys.exit(f"differs from {path}: {bad} ({len(want)} lines there, {len(lines)} made)")
        print(f"{len(lines)} lines agree with {path}")
        return
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"wrote {len(lines)} lines to {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--model")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--families", action="store_true")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    if args.families:
        write_or_check(
            FAMILY_FIXTURE,
            families(args.llama_bin, args.python),
            args.check,
            lambda w, g: w.get("ids") == g.get("ids") and w["sha256"] == g["sha256"]
            and (cosine(w["embedding"], g["embedding"]) >= 0.99999 if "embedding" in w
                 else max(abs(a - b) for a, b in zip(w["scores"], g["scores"])) < 1e-4),
        )
        return
    if not args.model:
        sys.exit("--model FILE is needed (or --families)")
    lines = []
    for pooling in POOLINGS:
        for text, vec in zip(TEXTS, embeddings(args.llama_bin, args.model, pooling)):
            lines.append({"pooling": pooling, "text": text, "embedding": [round(v, 7) for v in vec]})
    write_or_check(
        FIXTURE,
        lines,
        args.check,
        lambda w, g: w["pooling"] == g["pooling"] and w["text"] == g["text"]
        and cosine(w["embedding"], g["embedding"]) >= 0.99999,
    )


if __name__ == "__main__":
    main()
