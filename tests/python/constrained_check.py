"""Drives a running `agentd serve` with the official `openai` SDK and checks
that the grammar keeps the contract: `tool_choice` required and named give a
call whose arguments validate (python `jsonschema`) even when the prompt says
not to call; `response_format` json_schema replies validate for every schema
in tests/data/schemas/; `json_object` gives an object; an invalid or
unenforceable schema is a 400 naming its keyword.
Usage: constrained_check.py BASE_URL TOKEN MODEL SCHEMA_DIR"""
import json
import pathlib
import sys

import jsonschema
import openai
from openai import OpenAI

base, token, model, schema_dir = sys.argv[1:5]
client = OpenAI(base_url=base, api_key=token, max_retries=0, timeout=300)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


tools = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
            "required": ["a", "b"], "additionalProperties": False}}},
]
schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
refusals = [
    "Do not call any tool. Just say hello.",
    "Never use tools. What is 2 + 2? Answer in words.",
    "Tell me a joke. Do not call functions under any circumstances.",
]

for i, prompt in enumerate(refusals):
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], tools=tools,
            tool_choice=choice, max_tokens=120)
        calls = r.choices[0].message.tool_calls or []
        what = f"tool_choice={choice!r} prompt {i}"
        check(len(calls) >= 1, f"{what}: no call in {r.choices[0].message!r}")
        check(r.choices[0].finish_reason == "tool_calls", f"{what}: finish {r.choices[0].finish_reason}")
        for c in calls:
            if isinstance(choice, dict):
                check(c.function.name == "add", f"{what}: called {c.function.name}")
            try:
                args = json.loads(c.function.arguments)
                jsonschema.validate(args, schemas[c.function.name])
            except Exception as e:  # noqa: BLE001
                check(False, f"{what}: arguments {c.function.arguments!r}: {e}")

# Streaming: argument deltas and finish_reason tool_calls, unchanged.
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": refusals[0]}], tools=tools,
    tool_choice="required", max_tokens=120, stream=True)
args, finish, names = {}, None, {}
for chunk in stream:
    for ch in chunk.choices:
        for tc in ch.delta.tool_calls or []:
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
            if tc.function.name:
                names[tc.index] = tc.function.name
        finish = ch.finish_reason or finish
check(finish == "tool_calls", f"stream finish {finish}")
check(len(args) >= 1, "stream: no call")
for k, a in args.items():
    try:
        jsonschema.validate(json.loads(a), schemas[names[k]])
    except Exception as e:  # noqa: BLE001
        check(False, f"stream call {k}: {a!r}: {e}")

for path in sorted(pathlib.Path(schema_dir).glob("*.json")):
    case = json.loads(path.read_text())
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": case["prompt"] + " Answer in JSON."}],
        max_tokens=200,
        response_format={"type": "json_schema",
                         "json_schema": {"name": path.stem, "schema": case["schema"], "strict": True}})
    text = r.choices[0].message.content
    try:
        jsonschema.validate(json.loads(text), case["schema"])
    except Exception as e:  # noqa: BLE001
        check(False, f"schema {path.stem}: {text!r}: {e}")

r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Describe Paris in JSON."}], max_tokens=120,
    response_format={"type": "json_object"})
try:
    check(isinstance(json.loads(r.choices[0].message.content), dict), "json_object: not an object")
except Exception as e:  # noqa: BLE001
    check(False, f"json_object: {r.choices[0].message.content!r}: {e}")

for schema, keyword in [({"type": "strin"}, "type"),
                        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
                        ({"type": "object", "properties": {"a": {"not": {}}}}, "not")]:
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        check(False, f"invalid schema {schema} was accepted")
    except openai.BadRequestError as e:
        check(keyword in str(e), f"400 for {schema} does not name {keyword}: {e}")

bad_tool = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "string", "not": {"const": ""}}}}}}]
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                   tools=bad_tool, tool_choice="required", max_tokens=8)
    check(False, "an unenforceable tool schema was accepted")
except openai.BadRequestError as e:
    check("not" in str(e), f"400 does not name `not`: {e}")

if failures:
    print(f"{len(failures)} failures", file=sys.stderr)
    sys.exit(1)
print("constrained: all checks passed")
