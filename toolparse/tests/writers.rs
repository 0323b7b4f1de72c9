//! Each format's writer (`Format::write_calls`): for every format and a
//! set of call lists, the written text is read back by the format's parser
//! as exactly those calls (names in order, arguments equal as JSON values),
//! with no content, no reasoning and no leaked markers, whole and one
//! character at a time; and it is a sentence of the `calls` rule of the
//! format's own call grammar, compiled by llguidance as `tests/grammar.rs`
//! does.

mod common;

use common::{grammar_factory as factory, same_json};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Map, Value};
use toolparse::{
    lit, Accumulator, FinishReason, Format, GrammarTool, Options, Parser, ToolSpec, Tools,
};

/// Whether `text`, whole, is a sentence of `lark` (over one byte per token).
fn sentence(f: &ParserFactory, lark: &str, text: &str) -> Result<bool, String> {
    let parser =
        f.create_parser(TopLevelGrammar::from_lark(lark.to_owned())).map_err(|e| e.to_string())?;
    let mut m = Matcher::new(Ok(parser));
    for b in text.bytes() {
        if m.consume_token(u32::from(b)).is_err() {
            return Ok(false);
        }
    }
    Ok(m.is_accepting().unwrap_or(false))
}

/// The generation prompt each format's fixtures use, closing any reasoning
/// block (the calls follow it directly).
fn generation_prompt(format: Format) -> &'static str {
    match format {
        Format::Hermes => "<|im_start|>assistant\n",
        Format::Qwen3Xml => "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        Format::Llama3Json => "<|start_header_id|>assistant<|end_header_id|>\n\n",
        Format::Llama4Pythonic => "<|header_start|>assistant<|header_end|>\n\n",
        Format::Mistral => "[/INST]",
        Format::DeepSeekV3 => "<｜Assistant｜>",
        Format::DeepSeekV31 | Format::DeepSeekV32 | Format::DeepSeekV4 | Format::DeepSeekV41 => {
            "<｜Assistant｜></think>"
        }
        Format::GptOss => "<|start|>assistant",
        Format::Glm45 => "<|assistant|>",
        Format::Glm47 => "<|assistant|><think></think>",
        Format::KimiK2 => "<|im_assistant|>assistant<|im_middle|>",
        Format::KimiK3 => "<|open|>message role=\"assistant\"<|sep|>",
        Format::Gemma4 => "<|turn>model\n<|channel>thought\n<channel|>",
        other => panic!("{}: no generation prompt for its writer's test", other.name()),
    }
}

/// The markers no visible text may hold after a parse of written calls.
const MARKERS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "<parameter=",
    "<|python_tag|>",
    "<|python_start|>",
    "<|python_end|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<｜tool▁",
    "｜DSML｜",
    "<|channel|>",
    "<|message|>",
    "<|call|>",
    "<|start|>",
    "<|constrain|>",
    "<arg_key>",
    "<arg_value>",
    "<|tool_call",
    "<|tool_calls_section",
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|\"|>",
];

/// The call lists written: each call's name and arguments.
fn cases() -> Vec<(&'static str, Vec<(&'static str, Value)>)> {
    vec![
        ("one call", vec![("get_weather", json!({"city": "Paris"}))]),
        (
            "two calls to different tools",
            vec![
                ("get_weather", json!({"city": "Paris", "days": 3})),
                ("search", json!({"query": "weather in Tokyo", "limit": 5})),
            ],
        ),
        (
            "nested objects and arrays",
            vec![(
                "configure",
                json!({
                    "options": {"depth": 2, "flags": ["a", "b"], "inner": {"on": true}},
                    "items": [1, "two", {"three": 3}, [4, 5], null, false],
                }),
            )],
        ),
        (
            "numbers, booleans and null",
            vec![(
                "set",
                json!({"count": 42, "neg": -7, "ratio": 2.5, "small": 0.125,
                       "on": true, "off": false, "none": null}),
            )],
        ),
        (
            "unicode, quotes, backslashes",
            vec![(
                "write_file",
                json!({"path": "C:\\temp\\naïve — 日本.txt",
                       "content": "say \"hi\" and 'bye' \\ café ☕ {not: json} [x]"}),
            )],
        ),
        (
            "newlines in strings",
            vec![(
                "write_file",
                json!({"path": "notes.md", "content": "line one\nline two\n\n\tindented\nlast"}),
            )],
        ),
        ("an empty string", vec![("write_file", json!({"path": "empty.txt", "content": ""}))]),
        ("an empty object", vec![("get_time", json!({}))]),
        (
            "an empty object between calls",
            vec![
                ("get_time", json!({})),
                ("get_weather", json!({"city": "Oslo"})),
                ("get_time", json!({})),
            ],
        ),
    ]
}

/// The JSON Schema of a value's type (objects and arrays left open).
fn schema_of(v: &Value) -> Value {
    match v {
        Value::String(_) => json!({"type": "string"}),
        Value::Number(n) if n.is_f64() => json!({"type": "number"}),
        Value::Number(_) => json!({"type": "integer"}),
        Value::Bool(_) => json!({"type": "boolean"}),
        Value::Null => json!({"type": "null"}),
        Value::Array(_) => json!({"type": "array"}),
        Value::Object(_) => json!({"type": "object"}),
    }
}

/// The tools a call list calls, each with an object schema typing the
/// properties its calls pass (in their order; those every call passes
/// required).
fn tools_of(calls: &[(&str, Value)]) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Map<String, Value>, Vec<String>)> = Vec::new();
    for (name, args) in calls {
        let args = args.as_object().expect("arguments are an object");
        let keys: Vec<String> = args.keys().cloned().collect();
        match out.iter_mut().find(|t| t.0 == *name) {
            Some((_, props, required)) => {
                for (k, v) in args {
                    props.entry(k.clone()).or_insert_with(|| schema_of(v));
                }
                required.retain(|k| keys.contains(k));
            }
            None => {
                let props = args.iter().map(|(k, v)| (k.clone(), schema_of(v))).collect();
                out.push(((*name).to_owned(), props, keys));
            }
        }
    }
    out.into_iter()
        .map(|(name, props, required)| {
            (name, json!({"type": "object", "properties": props, "required": required}))
        })
        .collect()
}

fn parse(format: Format, tools: &[(String, Value)], deltas: &[&str]) -> Accumulator {
    let opts = Options {
        generation_prompt: Some(generation_prompt(format).to_owned()),
        tools: Tools(tools.iter().map(|(n, p)| ToolSpec::from_json_schema(n, p)).collect()),
        ..Options::default()
    };
    let mut p = Parser::new(format, opts);
    let mut acc = Accumulator::default();
    for d in deltas {
        acc.extend(p.push(d));
    }
    acc.extend(p.finish(FinishReason::Stop));
    acc
}

/// What is wrong with a parse of the written `calls`, if anything.
fn misread(acc: &Accumulator, calls: &[(&str, Value)]) -> Option<String> {
    if !acc.content.trim().is_empty() || !acc.reasoning.trim().is_empty() {
        return Some(format!("content {:?}, reasoning {:?}", acc.content, acc.reasoning));
    }
    if let Some(m) = MARKERS
        .iter()
        .find(|m| acc.calls.iter().any(|c| c.name.contains(*m) || c.arguments.contains(*m)))
    {
        // Arguments may hold marker text only where the calls did.
        let written = calls.iter().any(|(_, a)| a.to_string().contains(*m));
        if !written {
            return Some(format!("marker {m:?} leaked into a call"));
        }
    }
    let got: Vec<(String, Value)> = acc
        .calls
        .iter()
        .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap_or(Value::Null)))
        .collect();
    let want: Vec<(String, Value)> =
        calls.iter().map(|(n, a)| ((*n).to_owned(), a.clone())).collect();
    let same = got.len() == want.len()
        && got.iter().zip(&want).all(|((n1, a1), (n2, a2))| n1 == n2 && same_json(a1, a2));
    (!same).then(|| format!("calls {got:?}, want {want:?}"))
}

#[test]
fn every_format_reads_back_what_it_writes_and_its_grammar_accepts_it() {
    let f = factory();
    let mut failures = Vec::new();
    for &format in Format::all() {
        for (label, calls) in cases() {
            let refs: Vec<(&str, &Value)> = calls.iter().map(|(n, a)| (*n, a)).collect();
            let text = format.write_calls(&refs);
            let tools = tools_of(&calls);
            let whole = parse(format, &tools, &[&text]);
            if let Some(e) = misread(&whole, &calls) {
                failures.push(format!("{} / {label}: whole: {e}\n  text: {text:?}", format.name()));
                continue;
            }
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
            if let Some(e) = misread(&parse(format, &tools, &chars), &calls) {
                failures
                    .push(format!("{} / {label}: by char: {e}\n  text: {text:?}", format.name()));
                continue;
            }
            let gt: Vec<GrammarTool<'_>> = tools
                .iter()
                .map(|(name, parameters)| GrammarTool { name, parameters, text_bytes: None })
                .collect();
            let g = format.call_grammar(&gt, &|t: &str| lit(t)).expect("a grammar");
            let lark = format!("start: calls\n{}", g.rules);
            match sentence(&f, &lark, &text) {
                Ok(true) => {}
                Ok(false) => failures.push(format!(
                    "{} / {label}: not a sentence of its grammar\n  text: {text:?}",
                    format.name()
                )),
                Err(e) => panic!("{} / {label}: the grammar does not compile: {e}", format.name()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Hermes writes calls exactly as the prompt template wrote them before
/// (`prompts/src/template.rs`): `<tool_call>\n{json}\n</tool_call>`, the
/// object as `serde_json::json!` serializes it, calls separated by `\n`.
#[test]
fn hermes_writes_what_the_template_wrote() {
    let a = json!({"city": "Paris", "n": [1, 2]});
    let b = json!({});
    let text = Format::Hermes.write_calls(&[("get_weather", &a), ("get_time", &b)]);
    let one = json!({"name": "get_weather", "arguments": a});
    let two = json!({"name": "get_time", "arguments": b});
    assert_eq!(text, format!("<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{two}\n</tool_call>"));
}
