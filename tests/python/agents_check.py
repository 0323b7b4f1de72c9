"""Drives `agentd serve --provider scripted` with the requests coding agents
send, through the official SDKs: Claude Code's shape on the Messages API
(`system` messages inside `messages` beside the top-level `system`,
`?beta=true`, an `anthropic-beta` header, a `claude-…` model name, a server
tool among the tools, `thinking` enabled, fields this server does not know),
streamed and not, with the scripted tool call coming back as a `tool_use`
block and its result carried into the next request; and the same script
over the OpenAI chat route. The script's lines play in request order:
research (with tools) → a Bash call, then its summary; without tools → the
final line.
Usage: agents_check.py BASE_URL TOKEN LOG"""
import json
import sys

import anthropic
import openai

base, token, log = sys.argv[1:4]
client = anthropic.Anthropic(base_url=base, api_key=token, max_retries=0, timeout=60)
bash = {"name": "Bash", "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}
server_tool = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
system = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
first = [
    {"role": "system", "content": "Environment: linux, cwd /tmp."},
    {"role": "user", "content": [{"type": "text", "text": "say hello",
                                  "cache_control": {"type": "ephemeral"}}]},
]
shape = dict(
    model="claude-sonnet-4-5-20250929", max_tokens=256, system=system,
    tools=[bash, server_tool], extra_query={"beta": "true"},
    extra_headers={"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"},
    extra_body={"thinking": {"type": "enabled", "budget_tokens": 1024},
                "metadata": {"user_id": "u"}, "context_management": {"edits": []}},
)

# Turn 1, streamed as Claude Code streams: the scripted call is a tool_use.
with client.messages.stream(messages=first, **shape) as s:
    events = [e.type for e in s]
    m = s.get_final_message()
assert events[0] == "message_start" and events[-1] == "message_stop", events
assert m.stop_reason == "tool_use", m
use = [b for b in m.content if b.type == "tool_use"]
assert len(use) == 1 and use[0].name == "Bash" and use[0].input == {"command": "echo hello"}, m.content
assert m.usage.input_tokens > 0, m.usage

# Turn 2: the tool's result goes back; the reply is text.
second = first + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                  "content": [{"type": "text", "text": "hello"}]}]},
]
r = client.messages.create(messages=second, **shape)
assert r.stop_reason == "end_turn", r
assert r.content[-1].type == "text" and "printed hello" in r.content[-1].text, r.content

# What the script heard: the system messages joined into one system prompt,
# the server tool left out, the tool result carried.
heard = [json.loads(line) for line in open(log)]
msgs = heard[1]["messages"]
assert msgs[0]["role"] == "system", msgs
assert "You are Claude Code." in msgs[0]["content"] and "cwd /tmp" in msgs[0]["content"], msgs[0]
assert sum(1 for x in msgs if x["role"] == "system") == 1, msgs
assert any(x["role"] == "tool" and x["content"] == "hello" for x in msgs), msgs

# A request without tools takes the script's final line.
r = client.messages.create(model="claude-haiku-4-5", max_tokens=64,
                           messages=[{"role": "user", "content": "hi"}])
assert r.content[0].text == "Hello from the script.", r.content

# The OpenAI chat route reaches the same backend.
oa = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0, timeout=60)
c = oa.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}])
assert c.choices[0].message.content == "Hello from the script.", c
print("agents ok")
