//! What each format writes, for an engine that constrains a model to it:
//! the texts that open a call (what a turn with no calls masks, what a lazy
//! grammar waits for) and the grammar of valid calls to given tools, as
//! Lark text in llguidance's dialect (`%json {…}` inlines a JSON Schema,
//! `<[id]>` is one token). Text only: toolparse runs no engine, so the
//! caller compiles the grammar with its own vocabulary.
//!
//! Every format answers with three rules over its native markup:
//!
//! - `one`: exactly one call, opener included (a named `tool_choice`);
//! - `calls`: one or more calls, opener included (`tool_choice: required`);
//! - `body`: what follows the opener up to the end of the calls (a lazy
//!   grammar under `tool_choice: auto`, engaged when the model writes the
//!   opener itself).
//!
//! A sentence of each is a call list the format's [`crate::Parser`] reads
//! back as exactly those calls, with arguments valid against each tool's
//! schema (the tests hold every format to this on its fixtures).

use crate::Format;
use serde_json::{json, Map, Value};

/// A tool a grammar calls: its name and the JSON Schema of its arguments,
/// already checked by the caller as one its engine can enforce.
#[derive(Debug, Clone, Copy)]
pub struct GrammarTool<'a> {
    /// The function name.
    pub name: &'a str,
    /// The arguments' JSON Schema (an object schema).
    pub parameters: &'a Value,
    /// The most bytes one free-text value may take (the raw-text values
    /// of XML-style and Gemma's formats), so that a call a grammar forces
    /// ends within the reply's budget; `None`: unbounded.
    pub text_bytes: Option<usize>,
}

impl GrammarTool<'_> {
    /// The regex of a free-text value's content: any text, at most
    /// `text_bytes` bytes of it (at least `min` characters).
    pub fn text_body(&self, min: usize) -> String {
        match self.text_bytes {
            Some(n) => format!("(?s:.{{{min},{}}})", n.max(min)),
            None if min == 0 => "(?s:.*)".to_owned(),
            None => format!("(?s:.{{{min},}})"),
        }
    }
}

/// A format's call grammar for a set of tools: Lark rules defining `one`,
/// `calls` and `body` (no `start`: the caller picks which one starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallGrammar {
    /// The rules.
    pub rules: String,
    /// The text that opens the calls: the lazy grammar's trigger.
    pub opener: String,
}

/// How the caller's vocabulary writes a control token: `<[id]>` when it is
/// one token there, else its text as a Lark string literal.
pub type Special<'a> = &'a dyn Fn(&str) -> String;

/// A JSON string literal, as Lark reads it.
pub fn lit(s: &str) -> String {
    Value::from(s).to_string()
}

/// The whitespace llguidance allows between JSON tokens: at most this many
/// characters in one run.
pub const MAX_WS: usize = 20;

/// `schema` with llguidance's bounded whitespace at its top level.
pub fn bounded(mut schema: Value) -> Value {
    let ws = json!({"whitespace_pattern": format!("[\\x20\\x0A\\x0D\\x09]{{1,{MAX_WS}}}")});
    match &mut schema {
        Value::Object(o) => {
            o.insert("x-guidance".into(), ws);
            schema
        }
        other => json!({"allOf": [other.clone()], "x-guidance": ws}),
    }
}

/// Rewrites the local references of a schema placed at `#/$defs/{name}`.
pub fn rehome(v: &mut Value, name: &str) {
    match v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                if k == "$ref" {
                    if let Some(r) = x.as_str().and_then(|r| r.strip_prefix('#')) {
                        *x = Value::from(format!("#/$defs/{name}{r}"));
                    }
                } else {
                    rehome(x, name);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rehome(x, name)),
        _ => {}
    }
}

/// `schema` with every object that declares `properties` and says
/// nothing of others held to them (`additionalProperties: false`, as
/// OpenAI's strict mode reads a tool's parameters): a forced call names
/// the keys the tool declares, where an open object would let a small
/// model invent keys until its token limit.
pub fn closed(mut schema: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(o) => {
                if o.contains_key("properties")
                    && !o.contains_key("additionalProperties")
                    && !o.contains_key("patternProperties")
                {
                    o.insert("additionalProperties".into(), Value::Bool(false));
                }
                o.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut schema);
    schema
}

/// A `%json` rule body for the arguments of `tool` alone.
pub fn args_json(tool: &GrammarTool<'_>) -> String {
    format!("%json {}", bounded(closed(tool.parameters.clone())))
}

/// A `%json` rule body for one call object `{"name": NAME, ARGS_KEY:
/// arguments}` (the JSON-object formats: Hermes, Llama 3, Mistral v3).
pub fn call_object_json(tool: &GrammarTool<'_>, args_key: &str) -> String {
    let mut params = closed(tool.parameters.clone());
    rehome(&mut params, "args");
    let mut props = Map::new();
    props.insert("name".into(), json!({"const": tool.name}));
    props.insert(args_key.into(), json!({"$ref": "#/$defs/args"}));
    let schema = bounded(json!({
        "type": "object",
        "properties": props,
        "required": ["name", args_key],
        "additionalProperties": false,
        "$defs": {"args": params},
    }));
    format!("%json {schema}")
}

/// Rules `fn0 … fnN` (each `rule(i, tool)`) and `fn: fn0 | … | fnN`.
pub fn alternatives(
    tools: &[GrammarTool<'_>],
    rule: impl Fn(usize, &GrammarTool<'_>) -> String,
) -> String {
    let mut rules = String::new();
    let mut alts = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        rules.push_str(&format!("fn{i}: {}\n", rule(i, t)));
        alts.push(format!("fn{i}"));
    }
    rules.push_str(&format!("fn: {}\n", alts.join(" | ")));
    rules
}

/// The names an object schema requires.
pub(crate) fn required(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The members of an object written as a literal (Gemma's notation, a
/// Python dict or keyword list): `members` in order, `(required, expression)`
/// each, separated by `sep`, the required ones always and the others
/// optionally. Writes the rules `{id}_{i}` (the members from `i` on) and
/// `{id}_{i}c` (the same after a member, so with a separator) into `rules`;
/// returns the expression of the whole sequence (optional when no member
/// is required).
pub(crate) fn member_chain(
    rules: &mut String,
    id: &str,
    members: &[(bool, String)],
    sep: &str,
) -> String {
    let name = |i: usize, c: bool| format!("{id}_{i}{}", if c { "c" } else { "" });
    let empty_from = |i: usize| members[i..].iter().all(|(req, _)| !req);
    for i in (0..members.len()).rev() {
        for c in [false, true] {
            let (req, m) = &members[i];
            let sep = if c { sep } else { "" };
            let next = if i + 1 == members.len() {
                String::new()
            } else if empty_from(i + 1) {
                format!(" {}?", name(i + 1, true))
            } else {
                format!(" {}", name(i + 1, true))
            };
            let with = format!("{sep}{m}{next}");
            // Each rule writes at least one member; an optional member may
            // be left out for the ones after it.
            let body = if *req || i + 1 == members.len() {
                with
            } else {
                format!("{with} | {}", name(i + 1, c))
            };
            rules.push_str(&format!("{}: {body}\n", name(i, c)));
        }
    }
    if empty_from(0) {
        format!("{}?", name(0, false))
    } else {
        name(0, false)
    }
}

impl Format {
    /// The texts that open a call in this format: a turn that may not call
    /// masks every token that would complete one; a lazy grammar engages
    /// at the first ([`CallGrammar::opener`]).
    pub fn call_openers(self) -> &'static [&'static str] {
        match self {
            Format::Hermes | Format::Qwen3Xml | Format::Glm45 | Format::Glm47 => &["<tool_call>"],
            Format::Llama3Json => &["<|python_tag|>"],
            Format::Llama4Pythonic => &["<|python_start|>"],
            Format::Mistral => &["[TOOL_CALLS]"],
            Format::DeepSeekV3 | Format::DeepSeekV31 => {
                &["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"]
            }
            Format::DeepSeekV32 => &["<｜DSML｜function_calls>"],
            Format::DeepSeekV4 => &["<｜DSML｜tool_calls>"],
            Format::DeepSeekV41 => &["<｜DSML｜ calls>"],
            Format::GptOss => &[" to=functions.", "<|channel|>commentary to="],
            Format::KimiK2 => &["<|tool_calls_section_begin|>", "<|tool_call_begin|>"],
            Format::KimiK3 => &["<|open|>tools<|sep|>"],
            Format::Gemma4 => &["<|tool_call>"],
        }
    }

    /// The grammar of calls to `tools` in this format (`special` writes
    /// control tokens in the caller's vocabulary), or `None` where the
    /// format has none yet.
    pub fn call_grammar(
        self,
        tools: &[GrammarTool<'_>],
        special: Special<'_>,
    ) -> Option<CallGrammar> {
        crate::formats::call_grammar(self, tools, special)
    }
}

impl Format {
    /// The text a model of this format writes for `calls` (name, arguments
    /// as a JSON object), in order: what its parser reads back as exactly
    /// those calls, and a sentence of its [`Format::call_grammar`]'s
    /// `calls` rule. Where a template cannot show tool calls, the history
    /// (and the instructions telling a model how to call) use it. It is
    /// the text that follows the format's generation prompt (for gpt-oss,
    /// after `<|start|>assistant`).
    pub fn write_calls(self, calls: &[(&str, &serde_json::Value)]) -> String {
        crate::formats::write_calls(self, calls)
    }
}
