//! Mistral `[TOOL_CALLS]` calls, every tokenizer version: Mistral 7B v0.3
//! and Nemo (v3 JSON array), Mistral Small 3.x, Devstral, Ministral 3,
//! Magistral (v11/v13 `NAME[ARGS]{json}`), with `[THINK]` reasoning.
//!
//! ```text
//! [THINK]The user wants the weather.[/THINK]Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}
//! ```
//!
//! ```text
//! [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]
//! ```
//!
//! After `[TOOL_CALLS]` comes either
//! - a JSON array of `{"name", "arguments"}` objects (v3 and v7; a single
//!   object is accepted too; `"arguments"` may be a string holding a JSON
//!   object; an `"id"` string becomes the call id), or
//! - `NAME[ARGS]{json}` (v11+), optionally `NAME[CALL_ID]ID[ARGS]{json}`;
//!   `NAME{json}` (the text form when `[ARGS]` was detokenized away) is
//!   accepted too. Parallel calls repeat `[TOOL_CALLS]`. There is no close
//!   marker: a call ends where its JSON value ends (found by scanning JSON,
//!   so marker text inside an argument string does not end it), and
//!   whatever follows is content again.
//!
//! `[TOOL_CALLS]` followed by something that cannot start a call is a stray
//! marker: it is dropped and the text stays content. A name with no
//! arguments at the end of the text is dropped. A call whose JSON closed
//! but is not a valid call is malformed (its text becomes content).
//! Truncated inside a call, nothing of it is returned; a v3 array is one
//! JSON value, so truncated before it closes none of its calls is returned.
//!
//! Reasoning: `[THINK]…[/THINK]` (v13 reasoning models) and the plain-text
//! `<think>…</think>` of Magistral 2506; a generation prompt that ends
//! inside either starts the parser in reasoning. Marker text inside
//! reasoning is reasoning (only the close tag ends it). Turn tokens (`</s>`,
//! `[INST]`, `[/INST]`, `[TOOL_RESULTS]`, …) that are not calls are stripped.

use super::{prompt_opens, prompt_thinks, text_step, AtMarker, Machine, Shown, Step};
use super::{THINK as TEXT_THINK, UNTHINK as TEXT_UNTHINK};
use crate::cx::Cx;
use crate::json::{self, Scan, ValueEnd};
use crate::scan::{starts_with, ws_len, Prefix};
use crate::{DropReason, FinishReason, Options};
use serde_json::Value;

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";
const THINK: &str = "[THINK]";
const UNTHINK: &str = "[/THINK]";
const EOS: &str = "</s>";

/// Markers recognised in content. All but the call and reasoning openers
/// are stray control tokens: stripped, never shown.
const CONTENT_MARKERS: [&str; 17] = [
    TOOL_CALLS,
    THINK,
    TEXT_THINK,
    UNTHINK,
    TEXT_UNTHINK,
    EOS,
    ARGS,
    CALL_ID,
    "[INST]",
    "[/INST]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
];

/// The most text held between `[TOOL_CALLS]` and the start of the
/// arguments (name, call id, separators) before it is taken as no call.
const HEAD_CAP: usize = 512;

#[derive(Debug)]
pub(crate) enum State {
    Content,
    /// Inside reasoning, until this close tag.
    Reasoning(&'static str),
    /// After `[TOOL_CALLS]`: the input starts with what follows it.
    Head,
    /// A `NAME[ARGS]` call is open; the input starts with its JSON.
    Args {
        scan: ValueEnd,
        /// Bytes of the input already reported as argument fragments.
        emitted: usize,
        /// The markup before the JSON, for a malformed call's content.
        prefix: String,
    },
    /// A v3 JSON array (or single object) of calls; the input starts with it.
    Array(ValueEnd),
    /// Right after a `NAME[ARGS]{json}` call: another `NAME[ARGS]` without
    /// a repeated `[TOOL_CALLS]` is a call too.
    AfterCall,
}

#[derive(Debug)]
pub(crate) struct Mistral {
    state: State,
}

impl Mistral {
    pub(crate) fn new(opts: &Options) -> Mistral {
        let gen = opts.generation_prompt.as_deref();
        let state = if prompt_opens(gen, THINK, UNTHINK) {
            State::Reasoning(UNTHINK)
        } else if prompt_thinks(opts) {
            State::Reasoning(TEXT_UNTHINK)
        } else {
            State::Content
        };
        Mistral { state }
    }
}

/// What the text after `[TOOL_CALLS]` turned out to be.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// Not decided yet.
    Wait,
    /// A JSON array or object of calls (v3).
    Json,
    /// `NAME[CALL_ID]ID[ARGS]`: the arguments start at `args_at`.
    Call { name: String, id: Option<String>, args_at: usize },
    /// The text ended before the arguments began: no call.
    Dangling,
    /// Not a call: the marker was stray.
    Stray,
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/' | '@' | '$')
}

fn is_id_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-')
}

/// Where the arguments start in `s` (after optional whitespace): `[ARGS]`
/// or a bare `{`. `Err(Head)` says to wait, that the text ended, or that
/// this is not a call.
fn args_start(input: &str, at: usize, eof: bool) -> Result<usize, Head> {
    let at = at + ws_len(&input[at..]);
    let rest = &input[at..];
    if rest.is_empty() {
        return Err(if eof { Head::Dangling } else { Head::Wait });
    }
    if rest.starts_with('{') {
        return Ok(at);
    }
    match starts_with(rest, ARGS, eof) {
        Prefix::Yes => Ok(at + ARGS.len()),
        Prefix::NeedMore => Err(Head::Wait),
        Prefix::No => Err(Head::Stray),
    }
}

fn parse_head(input: &str, eof: bool) -> Head {
    if input.len() <= HEAD_CAP {
        return parse_head_uncapped(input, eof);
    }
    // Only the first HEAD_CAP bytes decide, whatever the deltas: what they
    // leave open is no call.
    let mut n = HEAD_CAP;
    while !input.is_char_boundary(n) {
        n -= 1;
    }
    match parse_head_uncapped(&input[..n], false) {
        Head::Wait => Head::Stray,
        head => head,
    }
}

fn parse_head_uncapped(input: &str, eof: bool) -> Head {
    let i = ws_len(input);
    let rest = &input[i..];
    let Some(first) = rest.chars().next() else {
        return if eof { Head::Dangling } else { Head::Wait };
    };
    if first == '{' {
        return Head::Json;
    }
    if first == '[' {
        // `[{…}]` or `[]`; anything else (a marker) is not an array of calls.
        let inner = &rest[1..];
        return match inner[ws_len(inner)..].chars().next() {
            Some('{') | Some(']') => Head::Json,
            Some(_) => Head::Stray,
            None if eof => Head::Stray,
            None => Head::Wait,
        };
    }
    let name_len = rest.find(|c| !is_name_char(c)).unwrap_or(rest.len());
    if name_len == 0 {
        return Head::Stray;
    }
    let name = rest[..name_len].to_owned();
    let after_name = i + name_len;
    if after_name == input.len() && !eof {
        return Head::Wait; // the name may go on
    }
    let at = after_name + ws_len(&input[after_name..]);
    match starts_with(&input[at..], CALL_ID, eof) {
        Prefix::NeedMore if at < input.len() => return Head::Wait,
        Prefix::Yes => {
            let id_at = at + CALL_ID.len();
            let id_at = id_at + ws_len(&input[id_at..]);
            let id_rest = &input[id_at..];
            let id_len = id_rest.find(|c| !is_id_char(c)).unwrap_or(id_rest.len());
            if id_at + id_len == input.len() && !eof {
                return Head::Wait; // the id may go on
            }
            let id = (id_len > 0).then(|| id_rest[..id_len].to_owned());
            return match args_start(input, id_at + id_len, eof) {
                Ok(args_at) => Head::Call { name, id, args_at },
                Err(h) => h,
            };
        }
        _ => {}
    }
    match args_start(input, after_name, eof) {
        Ok(args_at) => Head::Call { name, id: None, args_at },
        Err(h) => h,
    }
}

/// One call object of a v3 array: (id, name, arguments text).
type CallParts = (Option<String>, String, String);

fn call_from_value(v: Value) -> Option<CallParts> {
    let Value::Object(mut obj) = v else { return None };
    let Some(Value::String(name)) = obj.remove("name") else { return None };
    if name.is_empty() {
        return None;
    }
    let args = match obj.remove("arguments").or_else(|| obj.remove("parameters")) {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(Value::String(s)) => json::to_text(&json::strict_object(&s).ok()?),
        Some(_) => return None,
    };
    let id = match obj.remove("id") {
        Some(Value::String(s)) if !s.is_empty() => Some(s),
        _ => None,
    };
    Some((id, name, args))
}

/// The calls of a complete v3 body (an array of calls, or one call).
fn calls_from_json(text: &str) -> Option<Vec<CallParts>> {
    match json::strict_value(text.trim()).ok()? {
        Value::Array(items) => items.into_iter().map(call_from_value).collect(),
        v @ Value::Object(_) => call_from_value(v).map(|c| vec![c]),
        _ => None,
    }
}

impl Machine for Mistral {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Content => {
                text_step(input, &CONTENT_MARKERS, eof, cx, Shown::Content, |m, _| {
                    match m {
                        TOOL_CALLS => self.state = State::Head,
                        THINK => self.state = State::Reasoning(UNTHINK),
                        TEXT_THINK => self.state = State::Reasoning(TEXT_UNTHINK),
                        _ => {}
                    }
                    AtMarker::Markup
                })
            }
            State::Reasoning(close) => {
                // Only the close tag ends reasoning; `</s>` is stripped.
                let close = *close;
                text_step(input, &[close, EOS], eof, cx, Shown::Reasoning, |m, _| {
                    if m == close {
                        self.state = State::Content;
                    }
                    AtMarker::Markup
                })
            }
            State::Head => match parse_head(input, eof) {
                Head::Wait => Step::Wait,
                Head::Json => {
                    self.state = State::Array(ValueEnd::default());
                    Step::Transition
                }
                Head::Call { name, id, args_at } => {
                    cx.start_call(id, &name);
                    let prefix = format!("{TOOL_CALLS}{}", &input[..args_at]);
                    self.state = State::Args { scan: ValueEnd::default(), emitted: 0, prefix };
                    Step::moved(args_at)
                }
                Head::Dangling => {
                    self.state = State::Content;
                    Step::moved(input.len())
                }
                Head::Stray => {
                    self.state = State::Content;
                    Step::Transition
                }
            },
            State::AfterCall => match parse_head(input, eof) {
                _ if input.starts_with(char::is_whitespace) => {
                    self.state = State::Content;
                    Step::Transition
                }
                Head::Wait => Step::Wait,
                Head::Call { name, id, args_at } if input[..args_at].ends_with(ARGS) => {
                    cx.start_call(id, &name);
                    let prefix = input[..args_at].to_owned();
                    self.state = State::Args { scan: ValueEnd::default(), emitted: 0, prefix };
                    Step::took(args_at)
                }
                _ => {
                    self.state = State::Content;
                    Step::Transition
                }
            },
            State::Args { scan, emitted, prefix } => match scan.scan(input) {
                Scan::Done(body_end) => {
                    cx.call_args(&input[(*emitted).min(body_end)..body_end]);
                    let raw = &input[..body_end];
                    match json::object_text(raw) {
                        Ok(args) => {
                            cx.end_call(args);
                            self.state = State::AfterCall;
                        }
                        Err(_) => {
                            cx.malformed(&format!("{prefix}{raw}"));
                            self.state = State::Content;
                        }
                    }
                    Step::took(body_end)
                }
                Scan::Partial if !eof => {
                    cx.call_args(&input[*emitted..]);
                    *emitted = input.len();
                    Step::Wait
                }
                Scan::Partial => {
                    if end == Some(FinishReason::Length) || input.trim().is_empty() {
                        cx.drop_call(DropReason::Truncated);
                    } else {
                        cx.malformed(&format!("{prefix}{input}"));
                    }
                    self.state = State::Content;
                    Step::moved(input.len())
                }
                Scan::Invalid => {
                    // `[ARGS]` not followed by JSON: the markup is shown,
                    // the text after it is content again.
                    cx.malformed(prefix);
                    self.state = State::Content;
                    Step::Transition
                }
            },
            State::Array(scan) => match scan.scan(input) {
                Scan::Done(body_end) => {
                    let raw = &input[..body_end];
                    match calls_from_json(raw) {
                        Some(calls) => {
                            for (id, name, args) in calls {
                                cx.call(id, &name, args);
                            }
                        }
                        None => cx.malformed(&format!("{TOOL_CALLS}{raw}")),
                    }
                    self.state = State::Content;
                    Step::took(body_end)
                }
                Scan::Partial if !eof => Step::Wait,
                Scan::Partial => {
                    // The array never closed: cut by the token limit, none of
                    // its calls stands (it is one JSON value, not a list of
                    // finished calls); left open by a stop, it is shown.
                    if end == Some(FinishReason::Stop) {
                        cx.malformed(&format!("{TOOL_CALLS}{input}"));
                    }
                    self.state = State::Content;
                    Step::moved(input.len())
                }
                Scan::Invalid => {
                    self.state = State::Content;
                    Step::Transition
                }
            },
        }
    }

    /// The call markup consumed so far, from `[TOOL_CALLS]`.
    fn held(&self) -> usize {
        match &self.state {
            State::Head | State::Array(_) => TOOL_CALLS.len(),
            State::Args { prefix, .. } => prefix.len(),
            State::Content | State::Reasoning(_) | State::AfterCall => 0,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        cx.malformed(text);
        self.state = State::Content;
    }
}

/// Calls as Mistral writes them: v11 and later `[TOOL_CALLS]NAME[ARGS]{…}`
/// per call, or v3's `[TOOL_CALLS] [{"name", "arguments"}, …]`.
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use crate::grammar::{alternatives, args_json, call_object_json, lit};
    let mut rules = alternatives(tools, |_, t| call_object_json(t, "arguments"));
    let (m, args) = (special(TOOL_CALLS), special(ARGS));
    // v11: one rule per tool, its name then its arguments.
    let mut v11 = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        rules.push_str(&format!("named{i}: {} {args} {}\n", lit(t.name), args_json(t)));
        v11.push(format!("named{i}"));
    }
    rules.push_str(&format!("named: {}\n", v11.join(" | ")));
    rules.push_str("list: \" \"? \"[\" fn (\", \" fn)* \"]\"\n");
    rules.push_str(&format!("one: {m} \" \"? \"[\" fn \"]\" | {m} named\n"));
    rules.push_str(&format!("calls: {m} list | {m} named ({m} named)*\n"));
    rules.push_str(&format!("body: list | named ({m} named)*\n"));
    Some(crate::grammar::CallGrammar { rules, opener: TOOL_CALLS.to_owned() })
}

/// Calls as Mistral's v11+ tokenizers write them (what [`grammar`]
/// generates): `[TOOL_CALLS]NAME[ARGS]{json}` for each call, one after the
/// other.
pub(crate) fn write(calls: &[(&str, &Value)]) -> String {
    calls.iter().map(|(name, args)| format!("{TOOL_CALLS}{name}{ARGS}{args}")).collect()
}

#[cfg(test)]
mod tests {
    use crate::{Accumulator, FinishReason, Format, Options, Parser};

    /// The same text pushed one char at a time.
    fn by_char(text: &str, reason: FinishReason) -> Accumulator {
        let mut p = Parser::new(Format::Mistral, Options::default());
        let mut acc = Accumulator::default();
        for c in text.chars() {
            acc.extend(p.push(&c.to_string()));
        }
        acc.extend(p.finish(reason));
        acc
    }

    #[test]
    fn long_arguments_pushed_by_char_stay_linear() {
        let body = "x".repeat(200_000);
        let text = format!("[TOOL_CALLS]w[ARGS]{{\"c\": \"{body}\"}}");
        let (acc, work) = crate::scan::work::measure(|| by_char(&text, FinishReason::Stop));
        assert_eq!(acc.calls.len(), 1);
        assert!(work <= 4 * text.len() as u64, "{work} bytes scanned for {}", text.len());
    }
}
