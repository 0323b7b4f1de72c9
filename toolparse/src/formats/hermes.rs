//! Hermes-style JSON calls: Qwen2.5, Qwen3 (hybrid, Instruct-2507,
//! Thinking-2507), SmolLM2 and NousResearch Hermes models.
//!
//! ```text
//! <think>
//! The user wants the weather.
//! </think>
//!
//! Let me check.
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! <tool_call>
//! {"name": "get_time", "arguments": {}}
//! </tool_call>
//! ```
//!
//! The body is one JSON object with `name` and `arguments` (`parameters` is
//! accepted too; `arguments` may also be a string holding a JSON object).
//! The end of the body is found by scanning JSON, so `</tool_call>` inside an
//! argument string does not end the call. A body that is not such an object
//! falls back to content. A prompt that ends inside `<think>` starts the
//! parser in reasoning.

use super::{prompt_thinks, text_step, AtMarker, Machine, Shown, Step, THINK, UNTHINK};
use crate::cx::Cx;
use crate::json::{self, Scan, ValueEnd};
use crate::scan::{find_first, starts_with, ws_len, Find, Prefix};
use crate::{DropReason, FinishReason, Options};
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Markers recognised in content. Turn tokens a model should not write are
/// stripped so they never show.
const CONTENT_MARKERS: [&str; 6] =
    [OPEN, THINK, UNTHINK, "<|im_end|>", "<|im_start|>", "<|endoftext|>"];

#[derive(Debug)]
pub(crate) enum State {
    Content,
    Reasoning,
    /// After `<tool_call>`: the input starts with the body.
    Call(ValueEnd),
}

#[derive(Debug)]
pub(crate) struct Hermes {
    state: State,
}

impl Hermes {
    pub(crate) fn new(opts: &Options) -> Hermes {
        let state = if prompt_thinks(opts) { State::Reasoning } else { State::Content };
        Hermes { state }
    }
}

/// A parsed call body: name and arguments object text.
pub(crate) fn call_from_object(body: &str) -> Option<(String, String)> {
    let Ok(Value::Object(mut obj)) = json::strict_value(body.trim()) else {
        return None;
    };
    let Some(Value::String(name)) = obj.remove("name") else {
        return None;
    };
    let args = match obj.remove("arguments").or_else(|| obj.remove("parameters")) {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(Value::String(s)) => {
            let m = json::strict_object(&s).ok()?;
            json::to_text(&m)
        }
        Some(_) => return None,
    };
    if name.is_empty() {
        return None;
    }
    Some((name, args))
}

impl Machine for Hermes {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Reasoning => text_step(input, &[UNTHINK], eof, cx, Shown::Reasoning, |_, _| {
                self.state = State::Content;
                AtMarker::Markup
            }),
            State::Content => {
                text_step(input, &CONTENT_MARKERS, eof, cx, Shown::Content, |m, _| {
                    match m {
                        OPEN => self.state = State::Call(ValueEnd::default()),
                        THINK => self.state = State::Reasoning,
                        _ => {}
                    }
                    AtMarker::Markup
                })
            }
            State::Call(scan) => {
                let n = match scan.scan(input) {
                    Scan::Done(body_end) => {
                        let after = &input[body_end..];
                        let ws = ws_len(after);
                        match starts_with(&after[ws..], CLOSE, eof) {
                            Prefix::NeedMore => return Step::Wait,
                            Prefix::Yes => {
                                let used = body_end + ws + CLOSE.len();
                                match call_from_object(&input[..body_end]) {
                                    Some((name, args)) => cx.call(None, &name, args),
                                    None => cx.malformed(&format!("{OPEN}{}", &input[..used])),
                                }
                                used
                            }
                            Prefix::No if ws == after.len() && !eof => {
                                // Only whitespace so far: the close tag may follow.
                                return Step::Wait;
                            }
                            Prefix::No => {
                                // No close tag: the JSON alone decides, unless the
                                // token limit cut the text right after it (or in its
                                // close tag: then nothing of the tag is shown).
                                let cut = end == Some(FinishReason::Length)
                                    && CLOSE.starts_with(&after[ws..]);
                                match call_from_object(&input[..body_end]) {
                                    Some((name, args)) if !cut => cx.call(None, &name, args),
                                    Some(_) => cx.drop_call(DropReason::Truncated),
                                    None => cx.malformed(&format!("{OPEN}{}", &input[..body_end])),
                                }
                                if cut {
                                    input.len()
                                } else {
                                    body_end
                                }
                            }
                        }
                    }
                    Scan::Partial => {
                        if !eof {
                            return Step::Wait;
                        }
                        unfinished(input, end, cx);
                        input.len()
                    }
                    Scan::Invalid => match find_first(input, &[CLOSE], eof) {
                        Find::Found { at, .. } => {
                            let used = at + CLOSE.len();
                            cx.malformed(&format!("{OPEN}{}", &input[..used]));
                            used
                        }
                        Find::Clear { .. } if !eof => return Step::Wait,
                        Find::Clear { .. } => {
                            unfinished(input, end, cx);
                            input.len()
                        }
                    },
                };
                self.state = State::Content;
                Step::moved(n)
            }
        }
    }

    fn held(&self) -> usize {
        match self.state {
            State::Call(_) => OPEN.len(),
            State::Content | State::Reasoning => 0,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        cx.malformed(text);
        self.state = State::Content;
    }
}

/// The text ended inside a call: cut by the token limit, nothing is kept;
/// ended by a stop, the markup is shown as it is.
fn unfinished(input: &str, end: Option<FinishReason>, cx: &mut Cx) {
    if end == Some(FinishReason::Length) {
        cx.drop_call(DropReason::Truncated);
    } else {
        cx.malformed(&format!("{OPEN}{input}"));
    }
}

/// Calls as Hermes writes them: `<tool_call>` + `{"name", "arguments"}`
/// + `</tool_call>`, newline-separated.
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    _special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use crate::grammar::{alternatives, call_object_json, lit};
    let mut rules = alternatives(tools, |_, t| call_object_json(t, "arguments"));
    let (open, close) = (lit(OPEN), lit(CLOSE));
    rules.push_str("NL: /[ \\n]{1,2}/\n");
    rules.push_str(&format!("call: {open} NL? fn NL? {close}\n"));
    rules.push_str("one: call\n");
    rules.push_str("calls: call (NL? call)*\n");
    rules.push_str(&format!("body: NL? fn NL? {close} (NL? call)*\n"));
    Some(crate::grammar::CallGrammar { rules, opener: OPEN.to_owned() })
}

/// Calls as the model writes them (and as a template that cannot show
/// them writes them into the history): `<tool_call>\n{"name": NAME,
/// "arguments": ARGS}\n</tool_call>` each, the object as `serde_json`
/// writes it, the calls separated by a newline.
pub(crate) fn write(calls: &[(&str, &Value)]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|(name, args)| {
            let call = serde_json::json!({"name": name, "arguments": args});
            format!("{OPEN}\n{call}\n{CLOSE}")
        })
        .collect();
    calls.join("\n")
}
