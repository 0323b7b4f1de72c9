//! What a local chat turn's output must follow, as the fronts ask for it,
//! and its translation into an `inference` constraint: llguidance grammars
//! (Lark with inline `%json` schemas) in the model's native call format.
//!
//! A front fills [`ChatParams::constraint`](super::local::ChatParams) with
//! a [`Constraint`]; the local provider compiles it (cached per grammar
//! text in the engine, whose vocabulary is fixed) when the turn begins. A
//! schema llguidance cannot enforce, or that is not valid JSON Schema, is
//! refused with [`Refusal`] (HTTP 400 naming the keyword), never turned
//! into unconstrained output.
//!
//! Whitespace between JSON tokens is bounded: at most
//! `toolparse::MAX_WS` characters at any place where JSON allows it.
//!
//! What a format writes is toolparse's (`Format::call_grammar`, the Lark
//! text of its calls in its native markup; `Format::call_openers`, the
//! texts that open a call): this module picks the rule a choice starts
//! with and hands the text to the engine. A format without a grammar
//! refuses `required` and named choices; under `auto` it stays
//! unconstrained; every format's final turn masks every call opener.

use inference::{Constraint as Engine, Grammars};
use prompts::ToolDef;
use serde_json::{json, Value};
use toolparse::{Format, GrammarTool};

/// The bounds of a forced call's free-text value, in bytes.
const TEXT_BYTES: (usize, usize) = (32, 256);

/// What a turn's output must follow. The tools are the turn's own
/// (`tools` of the request), already narrowed by the front.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Constraint {
    /// Free text (calls parsed as usual).
    #[default]
    None,
    /// One JSON object, any keys (OpenAI `json_object`, Ollama `"json"`).
    JsonObject,
    /// One JSON value valid against this schema (OpenAI `json_schema`,
    /// Ollama `format: {schema}`).
    JsonSchema(Value),
    /// Calls in the model's native format to the turn's tools, each one's
    /// arguments valid against that tool's `parameters`.
    ToolCalls(ToolChoice),
    /// No call can begin: every token that would complete the format's
    /// call-start marker is masked (the research loop's final turn).
    NoCalls,
    /// The whole output is exactly one of these texts (a grounded answer
    /// composed of sentences the run read).
    OneOf(Vec<String>),
}

/// Which calls [`Constraint::ToolCalls`] enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// The model decides; a call it starts is held to the grammar from its
    /// start marker on (a lazy grammar).
    Auto,
    /// One or more calls and nothing else (OpenAI `required`, Anthropic
    /// `any`).
    Required,
    /// Exactly one call to this tool (OpenAI `{"type": "function", …}`,
    /// Anthropic `{"type": "tool", "name"}`).
    Named(String),
}

/// Why a constraint was refused: the request asked for something the
/// grammar cannot enforce, or that is not valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The JSON Schema keyword at fault, when one is.
    pub(crate) keyword: Option<String>,
    pub(crate) message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn refuse(keyword: Option<&str>, message: impl Into<String>) -> Refusal {
    Refusal { keyword: keyword.map(str::to_owned), message: message.into() }
}

/// Keywords that constrain nothing (the enforced ones are matched in
/// [`check_schema`]).
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$comment",
    "$schema",
    "$id",
    "$anchor",
    "deprecated",
    "readOnly",
    "writeOnly",
    "strict",
    "name",
    "x-guidance",
];
const TYPES: &[&str] = &["string", "number", "integer", "boolean", "object", "array", "null"];

/// Checks that `schema` is valid JSON Schema the grammar can enforce:
/// every keyword known and of the right shape. `at` says where it is.
pub(crate) fn check_schema(schema: &Value, at: &str) -> Result<(), Refusal> {
    let obj = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(o) => o,
        _ => return Err(refuse(None, format!("{at} must be a JSON Schema object"))),
    };
    for (k, v) in obj {
        let here = format!("{at}.{k}");
        let kw = Some(k.as_str());
        match k.as_str() {
            "type" => {
                let ok = |t: &Value| t.as_str().is_some_and(|t| TYPES.contains(&t));
                let valid = match v {
                    Value::Array(a) => !a.is_empty() && a.iter().all(ok),
                    t => ok(t),
                };
                if !valid {
                    return Err(refuse(
                        kw,
                        format!(
                            "{here} must be one of {} (or a non-empty array of them), not {v}",
                            TYPES.join(", ")
                        ),
                    ));
                }
            }
            "enum" => {
                if v.as_array().is_none_or(|a| a.is_empty()) {
                    return Err(refuse(kw, format!("{here} must be a non-empty array")));
                }
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                let Some(a) = v.as_array().filter(|a| !a.is_empty()) else {
                    return Err(refuse(kw, format!("{here} must be a non-empty array of schemas")));
                };
                for (i, s) in a.iter().enumerate() {
                    check_schema(s, &format!("{here}[{i}]"))?;
                }
            }
            "properties" | "$defs" | "definitions" | "patternProperties" => {
                let Some(m) = v.as_object() else {
                    return Err(refuse(kw, format!("{here} must be an object of schemas")));
                };
                for (name, s) in m {
                    check_schema(s, &format!("{here}.{name}"))?;
                }
            }
            "items" | "additionalProperties" => check_schema(v, &here)?,
            "required" => {
                if !v.as_array().is_some_and(|a| a.iter().all(Value::is_string)) {
                    return Err(refuse(kw, format!("{here} must be an array of strings")));
                }
            }
            "minItems" | "maxItems" | "minLength" | "maxLength" | "minProperties"
            | "maxProperties" => {
                if v.as_u64().is_none() {
                    return Err(refuse(
                        kw,
                        format!("{here} must be a non-negative integer, not {v}"),
                    ));
                }
            }
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => {
                if !v.is_number() {
                    return Err(refuse(kw, format!("{here} must be a number, not {v}")));
                }
            }
            "multipleOf" => {
                if !v.as_f64().is_some_and(|x| x > 0.0) {
                    return Err(refuse(kw, format!("{here} must be a number above 0, not {v}")));
                }
            }
            "pattern" | "format" | "$ref" => {
                if !v.is_string() {
                    return Err(refuse(kw, format!("{here} must be a string")));
                }
                if k == "$ref" && !v.as_str().is_some_and(|r| r.starts_with('#')) {
                    return Err(refuse(
                        kw,
                        format!(
                        "{here}: only local references (\"#/$defs/…\") can be enforced, not {v}"
                    ),
                    ));
                }
            }
            "const" => {}
            k if ANNOTATIONS.contains(&k) => {}
            k => {
                return Err(refuse(
                    kw,
                    format!(
                        "{here}: the keyword `{k}` cannot be enforced by the grammar; remove it"
                    ),
                ))
            }
        }
    }
    // Bounds that cannot all hold.
    let n = |k: &str| obj.get(k).and_then(Value::as_f64);
    for (lo, hi) in [("minItems", "maxItems"), ("minLength", "maxLength"), ("minimum", "maximum")] {
        if let (Some(a), Some(b)) = (n(lo), n(hi)) {
            if a > b {
                return Err(refuse(Some(lo), format!("{at}: `{lo}` {a} is above `{hi}` {b}")));
            }
        }
    }
    Ok(())
}

/// A Lark grammar whose only sentences are `texts` (string literals in
/// JSON's escaping, which llguidance's Lark reads).
pub(crate) fn one_of(texts: &[String]) -> String {
    let alts: Vec<String> =
        texts.iter().map(|t| serde_json::to_string(t).unwrap_or_else(|_| "\"\"".into())).collect();
    format!("start: {}\n", alts.join("\n    | "))
}

/// Translates `c` for the engine of `grammars` with the turn's `tools` in
/// `format`; `vocab` names single tokens; `max_tokens` is the turn's
/// budget (a forced call's free-text values are bounded by it, so the call
/// can end within it). `Ok(None)`: nothing to enforce.
pub(crate) fn compile(
    c: &Constraint,
    tools: &[ToolDef],
    format: Format,
    grammars: &Grammars,
    vocab: &dyn Fn(&str) -> Option<u32>,
    max_tokens: usize,
) -> Result<Option<Engine>, Refusal> {
    let build = |lark: &str| grammars.compile(lark).map_err(|e| llg_refusal(&e.to_string()));
    match c {
        Constraint::None => Ok(None),
        Constraint::JsonObject => {
            let s = toolparse::bounded(json!({"type": "object"}));
            Ok(Some(Engine::Grammar(build(&format!("start: %json {s}\n"))?)))
        }
        Constraint::JsonSchema(schema) => {
            check_schema(schema, "response_format.json_schema.schema")?;
            let s = toolparse::bounded(schema.clone());
            Ok(Some(Engine::Grammar(build(&format!("start: %json {s}\n"))?)))
        }
        Constraint::OneOf(texts) if texts.is_empty() => Ok(None),
        Constraint::OneOf(texts) => Ok(Some(Engine::Grammar(build(&one_of(texts))?))),
        Constraint::NoCalls => {
            let mut markers = Vec::new();
            for m in format.call_openers() {
                markers.push(grammars.marker(m).map_err(|e| refuse(None, e.to_string()))?);
            }
            Ok(if markers.is_empty() { None } else { Some(Engine::Forbid(markers)) })
        }
        Constraint::ToolCalls(choice) => {
            let chosen: Vec<&ToolDef> = match choice {
                ToolChoice::Named(n) => tools.iter().filter(|t| &t.name == n).collect(),
                _ => tools.iter().collect(),
            };
            if chosen.is_empty() {
                return match choice {
                    ToolChoice::Auto => Ok(None),
                    _ => Err(refuse(None, "`tool_choice` needs at least one tool in `tools`")),
                };
            }
            for (i, t) in chosen.iter().enumerate() {
                check_schema(
                    &t.parameters,
                    &format!("tools[{i}].function.parameters ({})", t.name),
                )?;
            }
            let gt: Vec<GrammarTool<'_>> = chosen
                .iter()
                .map(|t| GrammarTool {
                    name: &t.name,
                    parameters: &t.parameters,
                    // A forced call's raw-text values take at most half a
                    // small budget in bytes (a token has one byte at the
                    // least), so the call can end within it; a larger
                    // budget, or a call the model starts itself, is not
                    // bounded (llguidance's bounded lexemes that must not
                    // hold their closing tag grow costly past a few hundred
                    // bytes).
                    text_bytes: (*choice != ToolChoice::Auto && max_tokens / 2 <= TEXT_BYTES.1)
                        .then(|| (max_tokens / 2).max(TEXT_BYTES.0)),
                })
                .collect();
            let special = |text: &str| {
                vocab(text).map(|id| format!("<[{id}]>")).unwrap_or_else(|| toolparse::lit(text))
            };
            let Some(g) = format.call_grammar(&gt, &special) else {
                return match choice {
                    ToolChoice::Auto => Ok(None),
                    _ => Err(refuse(None, format!(
                        "the `{}` call format has no grammar here, so `tool_choice` cannot be enforced for this model; use `auto`",
                        format.name()
                    ))),
                };
            };
            let start = match choice {
                ToolChoice::Auto => "body",
                ToolChoice::Required => "calls",
                ToolChoice::Named(_) => "one",
            };
            let grammar = build(&format!("start: {start}\n{}", g.rules))?;
            Ok(Some(match choice {
                ToolChoice::Auto => Engine::Lazy {
                    marker: grammars.marker(&g.opener).map_err(|e| refuse(None, e.to_string()))?,
                    grammar,
                },
                _ => Engine::Grammar(grammar),
            }))
        }
    }
}

/// A refusal from llguidance's message, naming the keyword it names.
fn llg_refusal(msg: &str) -> Refusal {
    // llguidance names what it cannot do: "Unimplemented keys: [\"x\"]",
    // "unknown format: x", "invalid regex …".
    let keyword = msg
        .split("Unimplemented keys: [\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .map(str::to_owned)
        .or_else(|| msg.contains("regex").then(|| "pattern".to_owned()))
        .or_else(|| msg.contains("format").then(|| "format".to_owned()));
    let first = msg.lines().next().unwrap_or(msg);
    Refusal {
        message: match &keyword {
            Some(k) => format!("the schema cannot be enforced (keyword `{k}`): {first}"),
            None => format!("the schema cannot be enforced: {first}"),
        },
        keyword,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_and_unsupported_schemas_name_their_keyword() {
        let cases = [
            (json!({"type": "strin"}), "type"),
            (json!({"type": "array", "minItems": -1}), "minItems"),
            (json!({"type": "string", "pattern": 5}), "pattern"),
            (json!({"type": "array", "uniqueItems": true}), "uniqueItems"),
            (json!({"properties": {"a": {"not": {"type": "string"}}}}), "not"),
            (json!({"$ref": "https://example.com/s.json"}), "$ref"),
            (json!({"minimum": 5, "maximum": 1}), "minimum"),
        ];
        for (schema, kw) in cases {
            let e = check_schema(&schema, "schema").expect_err(&schema.to_string());
            assert_eq!(e.keyword.as_deref(), Some(kw), "{schema}: {e}");
            assert!(e.message.contains(kw), "{e}");
        }
        check_schema(&json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"enum": [1]}}}), "s").unwrap();
    }

    #[test]
    fn references_follow_a_schema_to_its_new_home() {
        let mut v = json!({"properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#"}}});
        toolparse::rehome(&mut v, "args");
        assert_eq!(v["properties"]["a"]["$ref"], "#/$defs/args/$defs/A");
        assert_eq!(v["properties"]["b"]["$ref"], "#/$defs/args");
    }
}
