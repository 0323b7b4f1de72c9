"""Drives one `agentd serve --ollama` that serves several models with the
official `ollama` Python client, as a desktop chat app with a model picker
would: every model listed, each one chatted with (the reply names it), at
most `server/max-loaded-models` (2 here) loaded with the least recently
used one unloaded first, `keep_alive: 0` unloading right after the reply,
concurrent first requests loading a model once, two models answering at
the same time, and an unknown model refused with 404.
Usage: models_check.py HOST SOCKET MODEL... (three or more; SOCKET: the
daemon's Unix socket, where /metrics is served)"""
import sys
import threading
import time

import httpx
import ollama

host, socket = sys.argv[1:3]
models = sys.argv[3:]
assert len(models) >= 3, "name three models or more"
# The first is least recently used once all have answered; the last two
# are then the loaded ones.
a, b, c = models[0], models[-2], models[-1]
metrics = httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://agentd")
client = ollama.Client(host=host, timeout=300)
say = [{"role": "user", "content": "Say hi."}]
opts = {"num_predict": 4, "temperature": 0}


def loaded():
    return sorted(m.model.removesuffix(":latest") for m in client.ps().models)


def loads(model):
    for line in metrics.get("/metrics").text.splitlines():
        if line.startswith(f'agentd_model_loads_total{{model="{model}"}}'):
            return int(line.split()[-1])
    return 0


listed = [m.model for m in client.list().models]
for m in models:
    assert f"{m}:latest" in listed, (m, listed)

# Details of models not loaded come from their files: a picker that shows
# every model's details loads none of them.
before_show = loaded()
for m in models:
    info = client.show(m)
    assert info.details.family and info.details.quantization_level, (m, info.details)
    assert "completion" in info.capabilities, (m, info.capabilities)
    ctx = [v for k, v in info.modelinfo.items() if k.endswith(".context_length")]
    assert ctx and ctx[0] > 0, (m, info.modelinfo)
for t in client.list().models:
    assert t.details.family and t.details.parameter_size, t
assert loaded() == before_show, (before_show, loaded())
assert all(loads(m) == 0 for m in models[1:]), [loads(m) for m in models]

# Each model answers, under its own name; never more than two loaded, and
# the least recently used one is the one unloaded.
for m in models:
    r = client.chat(model=m, messages=say, options=opts)
    assert r.model.removesuffix(":latest") == m, (m, r.model)
    assert r.message.content is not None
    assert len(loaded()) <= 2, loaded()
assert loaded() == sorted([b, c]), f"{models[:-2]} were least recently used: {loaded()}"

# keep_alive 0: unloaded right after the reply.
r = client.chat(model=b, messages=say, options=opts, keep_alive=0)
assert r.model.removesuffix(":latest") == b
deadline = time.time() + 3
while b in loaded() and time.time() < deadline:
    time.sleep(0.05)
assert b not in loaded(), loaded()

# Twelve concurrent first requests to an unloaded model load it once.
assert a not in loaded(), loaded()
before = loads(a)
errors = []


def chat(model):
    try:
        r = ollama.Client(host=host, timeout=300).chat(model=model, messages=say, options=opts)
        assert r.model.removesuffix(":latest") == model, r.model
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(repr(e))


threads = [threading.Thread(target=chat, args=(a,)) for _ in range(12)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
assert loads(a) == before + 1, (before, loads(a))

# Two models at once: both complete.
threads = [threading.Thread(target=chat, args=(m,)) for m in (a, c)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
assert len(loaded()) <= 2, loaded()

# Ollama's load and unload requests: a prompt-less generate.
r = client.generate(model=c, prompt="", keep_alive=0)
assert r.done_reason == "unload", r
assert c not in loaded(), loaded()

# An unknown model: 404 naming it.
try:
    client.chat(model="no-such-model", messages=say)
    raise AssertionError("an unknown model was served")
except ollama.ResponseError as e:
    assert e.status_code == 404 and "no-such-model" in str(e), (e.status_code, str(e))

print("models ok")
