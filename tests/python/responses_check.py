"""Drives `agentd serve` with the official `openai` SDK's Responses API and
the `openai-agents` SDK, as the Codex CLI and agent frameworks do.
Usage: responses_check.py scripted BASE_URL TOKEN   (tests/data/agents/responses.jsonl)
       responses_check.py model BASE_URL TOKEN      (the real default model)

scripted: a plain response, a streamed one (events in the documented order,
sequence numbers rising), a function call and its output carried by
`previous_response_id`, a streamed call, tools of other types accepted and
left out, a kept response read back and deleted, input_tokens, an unknown
previous response refused, and the Agents SDK's Runner with a function
tool that runs. model: a json_schema `text.format` held to its schema, and
a prompt beyond the context refused the way clients expect (400 with
`context_length_exceeded`; streamed, `response.failed` with that code)."""
import asyncio
import json
import sys

import httpx
import jsonschema
import openai

mode, base, token = sys.argv[1:4]
client = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0, timeout=120)
weather = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def order_ok(types):
    """The documented order: created, in_progress, items (added … done), then the end."""
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete", "response.failed"), types
    depth = 0
    for t in types[2:-1]:
        if t == "response.output_item.added":
            assert depth == 0, types
            depth = 1
        elif t == "response.output_item.done":
            assert depth == 1, types
            depth = 0
        else:
            assert depth == 1, (t, types)
    assert depth == 0, types


if mode == "scripted":
    # Plain.
    r = client.responses.create(model="scripted", input="say hello")
    assert r.status == "completed" and r.output_text == "Hello from the script.", r
    assert r.object == "response" and r.created_at > 0 and r.model, r
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
    assert r.usage.input_tokens_details.cached_tokens >= 0, r.usage

    # Streamed: the events in order, numbered upward, the text in deltas.
    events = list(client.responses.create(model="scripted", input="say hello", stream=True,
                                          instructions="Be brief."))
    types = [e.type for e in events]
    order_ok(types)
    assert "response.output_text.delta" in types and "response.content_part.added" in types, types
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello from the script.", text
    assert events[-1].response.status == "completed" and events[-1].response.output_text == text

    # A function call; its output goes back with previous_response_id. Tools
    # of other types are accepted and left out.
    others = [{"type": "web_search"}, {"type": "local_shell"},
              {"type": "custom", "name": "apply_patch", "description": "Patch files."}]
    r1 = client.responses.create(model="scripted", input="Weather in Paris?",
                                 tools=[weather, *others], tool_choice="auto")
    calls = [o for o in r1.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r1.output
    assert json.loads(calls[0].arguments) == {"city": "Paris"}, calls[0]
    assert [t.type for t in r1.tools] == ["function"], r1.tools
    r2 = client.responses.create(
        model="scripted", previous_response_id=r1.id, tools=[weather],
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "sunny, 24 C"}])
    assert r2.output_text == "It is sunny in Paris.", r2
    assert r2.previous_response_id == r1.id

    # A streamed call: added, its arguments, done — sent once complete.
    events = list(client.responses.create(model="scripted", input="Weather in Rome?",
                                          tools=[weather], stream=True))
    types = [e.type for e in events]
    order_ok(types)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Rome"}, types
    item = [e.item for e in events if e.type == "response.output_item.done"][0]
    assert item.type == "function_call" and item.status == "completed", item

    # Kept responses: read back, counted, deleted.
    got = client.responses.retrieve(r1.id)
    assert got.id == r1.id and got.output[0].type == "function_call", got
    n = httpx.post(f"{base}/v1/responses/input_tokens", headers={"Authorization": f"Bearer {token}"},
                   json={"model": "scripted", "input": "How many tokens is this?"}).json()
    assert n["object"] == "response.input_tokens" and n["input_tokens"] > 0, n
    client.responses.delete(r1.id)
    try:
        client.responses.retrieve(r1.id)
        raise AssertionError("a deleted response was returned")
    except openai.NotFoundError:
        pass
    try:
        client.responses.create(model="scripted", input="x", previous_response_id="resp_nope")
        raise AssertionError("an unknown previous response was accepted")
    except openai.BadRequestError as e:
        assert "resp_nope" in str(e), e

    # The Agents SDK: one function tool, run by the SDK, then the answer.
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    ran = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        ran.append((a, b))
        return a + b

    model = OpenAIResponsesModel(model="scripted", openai_client=openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key=token, max_retries=0))
    agent = Agent(name="adder", instructions="Use the tool.", tools=[add], model=model)
    result = asyncio.run(Runner.run(agent, "What is 2 + 3?"))
    assert ran == [(2, 3)], ran
    assert result.final_output == "The sum is 5.", result.final_output
    print("responses (scripted) ok")
else:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    r = client.responses.create(
        model="default", input="Plan a trip to Paris.", max_output_tokens=80,
        text={"format": {"type": "json_schema", "name": "trip", "schema": schema, "strict": True}})
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), schema)

    # Beyond the context: refused at once, the way clients expect.
    long = "word " * 12000
    try:
        client.responses.create(model="default", input=long)
        raise AssertionError("a prompt beyond the context was accepted")
    except openai.BadRequestError as e:
        assert e.code == "context_length_exceeded", (e.code, str(e))
    events = list(client.responses.create(model="default", input=long, stream=True))
    assert events[-1].type == "response.failed", [e.type for e in events]
    assert events[-1].response.error.code == "context_length_exceeded", events[-1]
    print("responses (model) ok")
