"""Writes the fixtures of this folder: cases in the conformance format
(tests/conformance/REPLAY.md at the workspace root) for the bug classes of
issue 19, judged by toolcalls.py and by tests/fixtures.rs. Run it from
anywhere: python3 generate.py"""
import json, shutil, pathlib
root = pathlib.Path(__file__).resolve().parent.parent
src = root / 'toolcalls'
out = root / 'regressions'
W = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
T = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
def tool(name, props=None, req=()):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props or {}, "required": list(req)}}}
cases = {}
def add(family, id, model, raw, calls=None, content=None, reasoning=None, err=None, tools=(W, T), gen=None, tags=()):
    fx = {"id": f"{family}/regression-{id}", "family": family, "models": [model], "tools": list(tools),
          "raw_output": raw, "tags": ["regression", *tags]}
    if gen is not None:
        fx["generation_prompt"] = gen
    if err:
        fx["expected_error"] = {"reason": err, "accept": ["no_tool_calls", "content_passthrough", "exception"]}
    else:
        fx["expected"] = {"content": content, "reasoning_content": reasoning,
                          "tool_calls": [{"name": n, "arguments": a} for n, a in (calls or [])]}
    cases.setdefault(family, []).append(fx)

PARIS = ("get_weather", {"city": "Paris"})
TIME = ("get_time", {})
# --- content around calls is kept verbatim (edges of the reply trimmed) ---
H = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HT = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
add("qwen3-hermes", "ws-between-calls", "Qwen/Qwen3-4B-Instruct-2507",
    f"Let me check.\n{H}\n{HT}\nBoth are on their way. \n", [PARIS, TIME], "Let me check.\n\n\nBoth are on their way.")
add("qwen3-hermes", "ws-text-after-call", "Qwen/Qwen3-4B-Instruct-2507",
    f"{H}\n\n  Indented after.", [PARIS], "Indented after.")
X = '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>'
add("qwen3-xml", "ws-between-text", "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    f"First, the weather.\n\n{X}\n\nThen  nothing else.", [PARIS], "First, the weather.\n\n\n\nThen  nothing else.")
add("llama", "ws-json-call-in-text", "meta-llama/Llama-3.3-70B-Instruct",
    'Here:  {"name": "get_weather", "parameters": {"city": "Paris"}}  and then more.', [PARIS], "Here:    and then more.")
add("llama", "ws-json-calls-separated", "meta-llama/Llama-3.3-70B-Instruct",
    '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}\n\nDone.', [PARIS, TIME], "Done.")
add("llama", "ws-pythonic-around-list", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "Checking.\n[get_weather(city='Paris'), get_time()]\nDone, \n in order.", [PARIS, TIME], "Checking.\n\nDone, \n in order.")
add("mistral", "ws-v11-text-after", "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
    'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} And  more.', [PARIS], "Sure.  And  more.")
add("deepseek", "ws-v31-around-block", "deepseek-ai/DeepSeek-V3.1",
    'Before \n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n after.',
    [PARIS], "Before \n\n after.")
add("deepseek", "ws-dsml-around-block", "deepseek-ai/DeepSeek-V3.2",
    'I will look.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>\n\nMeanwhile,  hold on.',
    [PARIS], "I will look.\n\n\n\nMeanwhile,  hold on.")
add("glm", "ws-between-calls", "zai-org/GLM-4.7",
    "Done thinking.</think>One.\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>\n<tool_call>get_time</tool_call>\nTwo.",
    [PARIS, TIME], "One.\n\n\nTwo.", reasoning="Done thinking.")
add("kimi", "ws-around-section", "moonshotai/Kimi-K2-Instruct-0905",
    'Checking  now. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|> And after.',
    [PARIS], "Checking  now.  And after.")
add("gemma4", "ws-between-calls", "google/gemma-4-31B-it",
    "Let me look.\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>\n<|tool_call>call:get_time{}<tool_call|>\nDone.",
    [PARIS, TIME], "Let me look.\n\n\nDone.")
add("gpt-oss", "ws-preamble-kept", "openai/gpt-oss-20b",
    "<|channel|>commentary<|message|>Let me check:\n  the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
    [PARIS], "Let me check:\n  the weather.")
# --- a Llama 4 pythonic list cut before it closes yields no call ---
add("llama", "pythonic-cut-in-second-call", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "[get_weather(city='Paris'), get_time(", err="max_tokens hit inside the list: no call stands", tags=("truncated",))
add("llama", "pythonic-cut-before-bracket", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "[get_weather(city='Paris')", err="max_tokens hit before the list closed", tags=("truncated",))
add("llama", "pythonic-cut-after-comma", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "<|python_start|>[get_weather(city='Paris'), ", err="max_tokens hit before the list closed", tags=("truncated",))
add("mistral", "v3-array-cut-in-second-call", "mistralai/Mistral-7B-Instruct-v0.3",
    '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "argu',
    err="max_tokens hit inside the array: no call stands", tags=("truncated",))
# --- a self-closing DSML invoke is a call with {} arguments ---
for model, block, sp in [("deepseek-ai/DeepSeek-V3.2", "function_calls", ""), ("deepseek-ai/DeepSeek-V4-Flash", "tool_calls", ""), ("deepseek-ai/DeepSeek-V4.1-Flash", " calls", " ")]:
    tag = model.split('/')[1].lower()
    add("deepseek", f"dsml-self-closing-invoke-{tag}", model,
        f'<｜DSML｜{block}>\n<｜DSML｜{sp}invoke name="get_time"/>\n</｜DSML｜{block}>', [TIME])
    add("deepseek", f"dsml-self-closing-invoke-then-call-{tag}", model,
        f'On it.\n\n<｜DSML｜{block}>\n<｜DSML｜{sp}invoke name="get_time" />\n<｜DSML｜{sp}invoke name="get_weather">\n<｜DSML｜{sp}parameter name="city" string="true">Paris</｜DSML｜{sp}parameter>\n</｜DSML｜{sp}invoke>\n</｜DSML｜{block}>',
        [TIME, PARIS], "On it.")
# --- gpt-oss built-in recipients are calls, in the role or the channel ---
BS = tool("browser.search", {"query": {"type": "string"}}, ["query"])
BO = tool("browser.open", {"id": {"type": "integer"}})
CE = tool("container.exec", {"cmd": {"type": "array"}})
PY = tool("python", {"code": {"type": "string"}})
BT = (BS, BO, CE, PY, W)
add("gpt-oss", "builtin-browser-search-in-role", "openai/gpt-oss-20b",
    '<|channel|>analysis<|message|>Search it.<|end|><|start|>assistant to=browser.search<|channel|>analysis <|constrain|>json<|message|>{"query": "weather Paris"}',
    [("browser.search", {"query": "weather Paris"})], reasoning="Search it.", tools=BT)
add("gpt-oss", "builtin-browser-open-in-channel", "openai/gpt-oss-20b",
    '<|channel|>analysis<|message|>Open the first hit.<|end|><|start|>assistant<|channel|>analysis to=browser.open code<|message|>{"id": 1}',
    [("browser.open", {"id": 1})], reasoning="Open the first hit.", tools=BT)
add("gpt-oss", "builtin-container-exec-in-role", "openai/gpt-oss-20b",
    ' to=container.exec<|channel|>commentary json<|message|>{"cmd": ["ls", "-la"]}',
    [("container.exec", {"cmd": ["ls", "-la"]})], tools=BT)
add("gpt-oss", "builtin-python-code-in-channel", "openai/gpt-oss-20b",
    '<|channel|>analysis<|message|>Compute it.<|end|><|start|>assistant<|channel|>analysis to=python code<|message|>print(2 + 2)',
    [("python", {"code": "print(2 + 2)"})], reasoning="Compute it.", tools=BT)
add("gpt-oss", "builtin-python-code-in-role", "openai/gpt-oss-20b",
    ' to=python<|channel|>analysis code<|message|>import math\nprint(math.pi)<|call|>',
    [("python", {"code": "import math\nprint(math.pi)"})], tools=BT)
add("gpt-oss", "prompt-ends-in-call-header", "openai/gpt-oss-20b",
    '{"city": "Paris"}', [PARIS], tools=BT,
    gen="<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>")
# --- noise between Kimi section markers ---
add("kimi", "noise-whitespace-between-markers", "moonshotai/Kimi-K2-Instruct-0905",
    'Let me check.<|tool_calls_section_begin|>\n  <|tool_call_begin|> functions.get_weather:0 \n<|tool_call_argument_begin|>\n {"city": "Paris"} \n<|tool_call_end|>\n\n<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>\n <|tool_calls_section_end|>',
    [PARIS, TIME], "Let me check.")
add("kimi", "noise-stray-text-in-section", "moonshotai/Kimi-K2.6",
    'Need both.</think><|tool_calls_section_begin|>calls:\n<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|> and <|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>done<|tool_calls_section_end|>',
    [PARIS, TIME], reasoning="Need both.")
add("kimi", "noise-fenced-arguments", "moonshotai/Kimi-K2-Instruct-0905",
    '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>\n```json\n{"city": "Paris"}\n```\n<|tool_call_end|><|tool_calls_section_end|>',
    [PARIS])
add("kimi", "noise-stray-word-in-header", "moonshotai/Kimi-K2-Instruct-0905",
    '<|tool_calls_section_begin|><|tool_call_begin|>call functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    [PARIS])
add("kimi", "noise-stray-text-after-arguments", "moonshotai/Kimi-K2-Instruct-0905",
    '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"} (city)<|tool_call_end|><|tool_calls_section_end|>',
    [PARIS])
# --- a call cut inside its close marker is cut ---
add("qwen3-hermes", "cut-inside-close-tag", "Qwen/Qwen3-4B-Instruct-2507",
    f"{H[:-4]}", err="max_tokens hit inside </tool_call>: the call never closed", tags=("truncated",))
add("gemma4", "cut-inside-close-marker", "google/gemma-4-31B-it",
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_ca", err="max_tokens hit inside <tool_call|>", tags=("truncated",))
for family, fxs in cases.items():
    d = out / family
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / family / 'family.json', d / 'family.json')
    (d / 'issue19.jsonl').write_text(''.join(json.dumps(f, ensure_ascii=False) + '\n' for f in fxs))
print(sum(len(v) for v in cases.values()), "cases")
