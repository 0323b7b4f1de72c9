"""Drives `agentd serve --ollama` serving the BERT-family files of scripts/synth_embed.py
beside a chat model, as retrieval apps and rerankers call it: the official `openai` client's
`embeddings.create` and the `ollama` client's `embed` on `bert` (CLS pooling) and `nomic-bert`
(mean pooling), every vector compared with llama.cpp's (the fixture
inference/tests/data/reference/embed-families.jsonl: cosine >= 0.9999); `POST /v1/rerank` on
`bert-rerank` in llama-server's shape (scores equal to llama-server's within 1e-5, best first,
`top_n`, `return_documents`, the Cohere `{"text": ...}` documents); `/api/show` naming an
encoder an embedding model only; a chat request to an encoder and a rerank request to a
model without a head refused with 400.
Usage: encoder_check.py HOST FIXTURE"""
import json
import math
import sys
import urllib.error
import urllib.request

import ollama
import openai

host, fixture = sys.argv[1:3]
lines = [json.loads(l) for l in open(fixture, encoding="utf-8") if l.strip()]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def post(path, body):
    req = urllib.request.Request(host + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


oa = openai.OpenAI(base_url=f"{host}/v1", api_key="unused", timeout=300)
ol = ollama.Client(host=host, timeout=300)
worst, n = 1.0, 0
for family in ("bert", "nomic-bert"):
    mine = [l for l in lines if l["family"] == family]
    texts = [l["text"] for l in mine]
    got = oa.embeddings.create(model=family, input=texts).data
    assert [d.index for d in got] == list(range(len(texts)))
    via_ollama = ol.embed(model=family, input=texts).embeddings
    for l, a, b in zip(mine, got, via_ollama):
        for v, where in ((a.embedding, "openai"), (b, "ollama")):
            c = cosine(v, l["embedding"])
            assert c >= 0.9999, (family, where, l["text"][:40], c)
            worst, n = min(worst, c), n + 1
    caps = ol.show(family).capabilities
    assert caps == ["embedding"], (family, caps)
    try:
        oa.chat.completions.create(model=family, messages=[{"role": "user", "content": "hi"}])
        raise AssertionError(f"{family} generated")
    except openai.BadRequestError as e:
        assert "embedding model" in str(e), e

r = next(l for l in lines if l["family"] == "bert-rerank")
docs, want = r["documents"], r["scores"]
status, out = post("/v1/rerank", {"model": "bert-rerank", "query": r["query"], "documents": docs})
assert status == 200, out
res = out["results"]
assert len(res) == len(docs) and out["usage"]["prompt_tokens"] > len(docs), out
assert [x["relevance_score"] for x in res] == sorted((x["relevance_score"] for x in res),
                                                     reverse=True), res
for x in res:
    w = want[x["index"]]
    assert abs(x["relevance_score"] - w) <= 1e-5 * max(1.0, abs(w)), (x, w)
best = max(range(len(want)), key=lambda i: want[i])
status, top = post("/rerank", {"model": "bert-rerank", "query": r["query"],
                               "documents": [{"text": d} for d in docs], "top_n": 2,
                               "return_documents": True})
assert status == 200 and len(top["results"]) == 2, top
assert top["results"][0]["index"] == best and top["results"][0]["document"]["text"] == docs[best]
for bad in ({"model": "bert", "query": "q", "documents": ["a"]},
            {"model": "bert-rerank", "query": "q", "documents": []},
            {"model": "bert-rerank", "query": "q", "documents": ["a"], "top_n": 0}):
    status, err = post("/v1/rerank", bad)
    assert status == 400, (bad, status, err)

print(f"encoders agree with llama.cpp: {n} vectors (worst cosine {worst:.7f}), "
      f"{len(docs)} rerank scores")
