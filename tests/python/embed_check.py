"""Drives `agentd serve --ollama` with the official `openai` and `ollama`
Python clients and LangChain's `OllamaEmbeddings` as retrieval apps call them: `embeddings.create` (the SDK's
default base64 encoding and float, one input and several, token ids,
`dimensions`), Ollama's `embed` and the older `embeddings`, LangChain's
`embed_documents` and `embed_query`; every vector
compared with llama.cpp's for the same input (the fixture
inference/tests/data/reference/smollm2-embed.jsonl, mean pooling: cosine
>= 0.99999), and bad requests refused with 400.
Usage: embed_check.py HOST MODEL FIXTURE"""
import json
import math
import sys

import ollama
import openai
from langchain_ollama import OllamaEmbeddings

host, model, fixture = sys.argv[1:4]
want = {}
with open(fixture, encoding="utf-8") as f:
    for line in f:
        c = json.loads(line)
        if c["pooling"] == "mean":
            want[c["text"]] = c["embedding"]
texts = list(want)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def agrees(text, got, where):
    assert len(got) == len(want[text]), (where, len(got))
    c = cosine(got, want[text])
    assert c >= 0.99999, (where, text[:40], c)
    assert abs(math.sqrt(sum(x * x for x in got)) - 1) < 1e-4, (where, "unit length")


oa = openai.OpenAI(base_url=f"{host}/v1", api_key="unused", timeout=300)
r = oa.embeddings.create(model=model, input=texts)  # base64 on the wire
assert [d.index for d in r.data] == list(range(len(texts))), r.data
for t, d in zip(texts, r.data):
    agrees(t, d.embedding, "openai base64")
assert r.usage.prompt_tokens > len(texts), r.usage
one = oa.embeddings.create(model=model, input=texts[0], encoding_format="float")
agrees(texts[0], one.data[0].embedding, "openai float")
cut = oa.embeddings.create(model=model, input=texts[0], dimensions=64).data[0].embedding
assert len(cut) == 64 and abs(math.sqrt(sum(x * x for x in cut)) - 1) < 1e-4, len(cut)
ids = oa.embeddings.create(model=model, input=[[504, 3158, 314]]).data[0].embedding
assert len(ids) == len(one.data[0].embedding)
for bad in ({"input": ""}, {"input": []}, {"input": "a", "dimensions": 100000},
            {"input": "a", "encoding_format": "hex"}):
    try:
        oa.embeddings.create(model=model, **bad)
        raise AssertionError(f"accepted {bad}")
    except openai.BadRequestError:
        pass

ol = ollama.Client(host=host, timeout=300)
assert "embedding" in ol.show(model).capabilities, ol.show(model).capabilities
e = ol.embed(model=model, input=texts)
for t, v in zip(texts, e.embeddings):
    agrees(t, v, "ollama embed")
assert e.prompt_eval_count == r.usage.prompt_tokens, (e.prompt_eval_count, r.usage)
agrees(texts[1], ol.embed(model=model, input=texts[1]).embeddings[0], "ollama one")
agrees(texts[0], ol.embeddings(model=model, prompt=texts[0]).embedding, "ollama legacy")
try:
    ol.embed(model=model, input="")
    raise AssertionError("ollama accepted an empty input")
except ollama.ResponseError as err:
    assert err.status_code == 400, err
# LangChain's Ollama embeddings, as retrieval pipelines index documents.
lc = OllamaEmbeddings(model=model, base_url=host)
for t, v in zip(texts, lc.embed_documents(texts)):
    agrees(t, v, "langchain documents")
agrees(texts[2], lc.embed_query(texts[2]), "langchain query")
print(f"embeddings: {len(texts)} inputs agree with llama.cpp through openai, ollama and langchain")
