"""Drives a running `agentd serve` over TCP with the official `openai` SDK,
as a client application would: non-streaming and streaming completions,
with and without tools. Usage: sdk_check.py BASE_URL TOKEN MODEL"""
import json
import sys

from openai import OpenAI

base, token, model = sys.argv[1:4]
client = OpenAI(base_url=base, api_key=token, max_retries=0, timeout=300)

models = client.models.list()
assert any(m.id == model for m in models.data), models

msgs = [{"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=16)
assert r.object == "chat.completion", r
assert r.choices[0].message.role == "assistant"
assert r.choices[0].finish_reason in ("stop", "length")
assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0

text = ""
finish = None
stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, stream=True,
                                        stream_options={"include_usage": True})
usage = None
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage
    for c in chunk.choices:
        text += c.delta.content or ""
        finish = c.finish_reason or finish
assert text, "streamed no text"
assert finish in ("stop", "length"), finish
assert usage is not None and usage.completion_tokens > 0

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
wmsgs = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
r = client.chat.completions.create(model=model, messages=wmsgs, tools=tools, max_tokens=64)
m = r.choices[0].message
if m.tool_calls:
    assert r.choices[0].finish_reason == "tool_calls"
    for c in m.tool_calls:
        assert c.type == "function" and c.function.name
        json.loads(c.function.arguments)
# Markup never reaches content, with or without tools.
assert "<tool_call>" not in (m.content or "")
r = client.chat.completions.create(model=model, messages=wmsgs, tools=tools, tool_choice="none", max_tokens=64)
assert r.choices[0].message.tool_calls in (None, [])
assert "<tool_call>" not in (r.choices[0].message.content or "")

# A tool result goes back the OpenAI way and the conversation continues.
follow = wmsgs + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"},
]
seen_calls = 0
for chunk in client.chat.completions.create(model=model, messages=follow, tools=tools, max_tokens=48, stream=True):
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            seen_calls += 1
            json.loads(tc.function.arguments)
        assert "<tool_call>" not in (c.delta.content or "")

try:
    client.chat.completions.create(model="no-such-model", messages=msgs, max_tokens=4)
    raise AssertionError("unknown model accepted")
except Exception as e:  # openai.NotFoundError
    assert getattr(e, "status_code", None) == 404, e

print("sdk ok")
