"""Drives `agentd serve --tool-format FORMAT` (any model) with the official
`openai` SDK: `tool_choice` "required" and a named function each give a call
whose arguments validate against the tool's schema, even on a prompt that
asks not to call; `tool_choice: "none"` gives no call and no call-opener text
of the format in the content, on a prompt that asks for a call.
Usage: formats_check.py BASE_URL TOKEN MODEL FORMAT OPENERS_JSON"""
import json
import sys

import jsonschema
from openai import OpenAI

base, token, model, fmt, openers = sys.argv[1:6]
openers = json.loads(openers)
client = OpenAI(base_url=base, api_key=token, max_retries=0, timeout=300)
failures = []

weather = {"type": "object", "properties": {"city": {"type": "string"},
           "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}
clock = {"type": "object", "properties": {"zone": {"type": "string"}, "hours": {"type": "integer"}},
         "required": ["zone"]}
tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                      "parameters": weather}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                      "parameters": clock}},
]
schemas = {"get_weather": weather, "get_time": clock}
no_call = [{"role": "user", "content": "Do not use any tool. Just say hello in one word."}]
call = [{"role": "user", "content": "Call get_weather for Paris right now."}]


def calls_of(r, what):
    m = r.choices[0].message
    out = []
    for c in m.tool_calls or []:
        try:
            args = json.loads(c.function.arguments)
            jsonschema.validate(args, schemas[c.function.name])
            out.append((c.function.name, args))
        except Exception as e:  # noqa: BLE001 - reported as a failure
            failures.append(f"{fmt} {what}: invalid call {c.function.name} {c.function.arguments!r}: {e}")
    return out


r = client.chat.completions.create(model=model, messages=no_call, tools=tools, tool_choice="required",
                                   max_tokens=160, temperature=0)
got = calls_of(r, "required")
if not got:
    failures.append(f"{fmt} required: no call: {r.choices[0].message}")

r = client.chat.completions.create(model=model, messages=no_call, tools=tools, max_tokens=160, temperature=0,
                                   tool_choice={"type": "function", "function": {"name": "get_time"}})
got = calls_of(r, "named")
if [n for n, _ in got] != ["get_time"]:
    failures.append(f"{fmt} named: wanted one get_time call, got {got}: {r.choices[0].message}")

r = client.chat.completions.create(model=model, messages=call, tools=tools, tool_choice="none",
                                   max_tokens=96, temperature=0)
m = r.choices[0].message
if m.tool_calls:
    failures.append(f"{fmt} none: a call came back: {m.tool_calls}")
leaked = [o for o in openers if o.strip() and o.strip() in (m.content or "")]
if leaked:
    failures.append(f"{fmt} none: opener text {leaked} in content {m.content!r}")

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"{fmt}: required, named and none hold")
