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
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
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


def embeddings(llama_bin: str, model: str, pooling: str) -> list[list[float]]:
    port = free_port()
    server = subprocess.Popen(
        [
            os.path.join(llama_bin, "llama-server"),
            "-m", model, "-t", "1", "-c", "2048", "-np", "1",
            "--port", str(port), "--host", "127.0.0.1",
            "--embedding", "--pooling", pooling,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                sys.exit(f"llama-server did not come up on {model}")
            time.sleep(0.2)
        out = []
        for text in TEXTS:
            req = urllib.request.Request(
                url + "/v1/embeddings",
                json.dumps({"input": text}).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as r:
                out.append(json.load(r)["data"][0]["embedding"])
        return out
    finally:
        server.terminate()
        server.wait()


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    lines = []
    for pooling in POOLINGS:
        for text, vec in zip(TEXTS, embeddings(args.llama_bin, args.model, pooling)):
            lines.append({"pooling": pooling, "text": text, "embedding": [round(v, 7) for v in vec]})
    if args.check:
        with open(FIXTURE, encoding="utf-8") as f:
            want = [json.loads(l) for l in f if l.strip()]
        bad = [
            (w["pooling"], w["text"][:30], cosine(w["embedding"], g["embedding"]))
            for w, g in zip(want, lines)
            if w["text"] != g["text"] or cosine(w["embedding"], g["embedding"]) < 0.99999
        ]
        if bad or len(want) != len(lines):
            sys.exit(f"differs from {FIXTURE}: {bad}")
        print(f"{len(lines)} lines agree with {FIXTURE}")
        return
    with open(FIXTURE, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"wrote {len(lines)} lines to {FIXTURE}")


if __name__ == "__main__":
    main()
