//! Llama 3.1 / 3.2 / 3.3 JSON calls (vLLM `llama3_json`, SGLang `llama3`).
//!
//! ```text
//! {"name": "get_weather", "parameters": {"city": "Paris"}}
//! ```
//!
//! ```text
//! Let me look that up.<|python_tag|>{"name": "search", "parameters": {"q": "x"}}; {"name": "get_time", "parameters": {}}<|eom_id|>
//! ```
//!
//! ```text
//! <|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>
//! ```
//!
//! A call is a JSON object with a string `name` and a `parameters` (or
//! `arguments`) object (a string holding a JSON object and `null` are
//! accepted; a `"type": "function"` key is allowed). It may follow
//! `<|python_tag|>`, stand alone, or follow text; several calls are
//! separated by `;`, whitespace or newlines, or written as a JSON array.
//! The end of an object is found by scanning JSON, so marker text inside an
//! argument string does not end it. A JSON value that is not a call (no
//! `name`/`parameters`, or a name that was not offered when tools were
//! offered) stays content, verbatim. The built-in tool form
//! `NAME.call(key="value", …)` after `<|python_tag|>` is a call when NAME
//! was offered (or no tools were given). `<|eom_id|>`, `<|eot_id|>` and the
//! other turn tokens are stripped. Truncated inside a call, nothing of it
//! is returned.

use crate::cx::Cx;
use crate::formats::{text_step, AtMarker, Machine, Shown, Step};
use crate::json::{self, Scan, ValueEnd};
use crate::scan::{floor_boundary, starts_with, ws_len, Prefix};
use crate::schema::Tools;
use crate::{DropReason, FinishReason, Options};
use serde_json::{Map, Value};

const PYTHON_TAG: &str = "<|python_tag|>";
const CALL_OPEN: &str = ".call(";

/// Markers recognised in content: the python tag, the two characters that
/// may open a JSON call, and turn tokens that are stripped.
const CONTENT_MARKERS: [&str; 16] = [
    PYTHON_TAG,
    "{",
    "[",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|finetune_right_pad_id|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|eot|>",
    "<|eom|>",
    "<|header_start|>",
    "<|header_end|>",
];

/// The most text held after `<|python_tag|>` while deciding what follows.
const HEAD_CAP: usize = 256;

#[derive(Debug)]
pub(crate) enum State {
    Content,
    /// After `<|python_tag|>`: the input starts with what follows it.
    AfterTag,
    /// A JSON value that may be a call; the input starts with it.
    Candidate {
        scan: ValueEnd,
        /// It followed `<|python_tag|>` or a call: cut off, it is a call.
        expected: bool,
    },
    /// `NAME.call(`; the input starts with the keyword arguments.
    Builtin {
        name: String,
        scan: ParenEnd,
    },
    /// After a call: `;` and the whitespace around it separate calls, and
    /// so does whitespace before the next call; before other text the
    /// whitespace is content.
    AfterCall,
}

#[derive(Debug)]
pub(crate) struct Llama3Json {
    state: State,
}

impl Llama3Json {
    pub(crate) fn new(_opts: &Options) -> Llama3Json {
        Llama3Json { state: State::Content }
    }
}

/// A call from a parsed JSON value: (name, arguments text).
fn call_from_value(v: Value, tools: &Tools) -> Option<(String, String)> {
    let Value::Object(mut obj) = v else { return None };
    let Some(Value::String(name)) = obj.remove("name") else { return None };
    if name.is_empty() || (!tools.0.is_empty() && tools.get(&name).is_none()) {
        return None;
    }
    match obj.remove("type") {
        None => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(_) => return None,
    }
    let args = match obj.remove("parameters").or_else(|| obj.remove("arguments"))? {
        Value::Null => "{}".to_owned(),
        v @ Value::Object(_) => v.to_string(),
        Value::String(s) => json::to_text(&json::strict_object(&s).ok()?),
        _ => return None,
    };
    Some((name, args))
}

/// The calls a complete JSON value holds: one object, or a non-empty array
/// of them. `None` when it is not (all) calls.
fn calls_from_json(text: &str, tools: &Tools) -> Option<Vec<(String, String)>> {
    match json::strict_value(text.trim()).ok()? {
        Value::Array(items) if !items.is_empty() => {
            items.into_iter().map(|v| call_from_value(v, tools)).collect()
        }
        v @ Value::Object(_) => call_from_value(v, tools).map(|c| vec![c]),
        _ => None,
    }
}

/// Whether an unfinished JSON value reads like the start of a call.
fn looks_like_call(text: &str) -> bool {
    let t = text.trim_start();
    let t = t.strip_prefix('[').map(str::trim_start).unwrap_or(t);
    let Some(t) = t.strip_prefix('{') else { return false };
    let t = t.trim_start();
    t.starts_with("\"name\"") || t.starts_with("\"type\"")
}

/// Whether `open` (`{` or `[`), followed by `rest`, opens a value that may
/// be a call: `{"…` or `[{…`. `None`: not known yet.
fn opens_candidate(open: &str, rest: &str, eof: bool) -> Option<bool> {
    let want = if open == "{" { '"' } else { '{' };
    match rest[ws_len(rest)..].chars().next() {
        Some(c) => Some(c == want),
        None if eof => Some(false),
        None => None,
    }
}

impl Machine for Llama3Json {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Content => {
                text_step(input, &CONTENT_MARKERS, eof, cx, Shown::Content, |m, after| match m {
                    "{" | "[" => match opens_candidate(m, after, eof) {
                        None => AtMarker::Wait,
                        Some(false) => AtMarker::Text,
                        Some(true) => {
                            self.state =
                                State::Candidate { scan: ValueEnd::default(), expected: false };
                            AtMarker::Reread
                        }
                    },
                    PYTHON_TAG => {
                        self.state = State::AfterTag;
                        AtMarker::Markup
                    }
                    _ => AtMarker::Markup,
                })
            }
            State::AfterTag => {
                // Only the first HEAD_CAP bytes decide, whatever the
                // deltas: what they leave open is no call.
                let (look, eof) = if input.len() > HEAD_CAP {
                    (&input[..floor_boundary(input, HEAD_CAP)], false)
                } else {
                    (input, eof)
                };
                let w = ws_len(look);
                let rest = &look[w..];
                if rest.starts_with('{') || rest.starts_with('[') {
                    self.state = State::Candidate { scan: ValueEnd::default(), expected: true };
                    return Step::Transition;
                }
                let ident =
                    rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
                let after = &rest[ident..];
                let decided = if ident == 0 {
                    if rest.is_empty() && !eof {
                        None
                    } else {
                        Some(false)
                    }
                } else if after.is_empty() && !eof {
                    None
                } else {
                    match starts_with(after, CALL_OPEN, eof) {
                        Prefix::Yes => Some(true),
                        Prefix::NeedMore => None,
                        Prefix::No => Some(false),
                    }
                };
                match decided {
                    None if input.len() <= HEAD_CAP => Step::Wait,
                    Some(true) => {
                        let name = rest[..ident].to_owned();
                        self.state = State::Builtin { name, scan: ParenEnd::default() };
                        Step::took(w + ident + CALL_OPEN.len())
                    }
                    // Not a call: the text is content (the tag is gone).
                    _ => {
                        self.state = State::Content;
                        Step::Transition
                    }
                }
            }
            State::Candidate { scan, expected } => match scan.scan(input) {
                Scan::Done(body_end) => {
                    let raw = &input[..body_end];
                    match calls_from_json(raw, cx.tools()) {
                        Some(calls) => {
                            for (name, args) in calls {
                                cx.call(None, &name, args);
                            }
                            self.state = State::AfterCall;
                        }
                        None => {
                            cx.content(raw);
                            self.state = State::Content;
                        }
                    }
                    Step::took(body_end)
                }
                Scan::Partial if !eof => Step::Wait,
                Scan::Partial => {
                    let call = *expected || looks_like_call(input);
                    if end == Some(FinishReason::Length) && call {
                        cx.drop_call(DropReason::Truncated);
                    } else {
                        cx.content(input);
                    }
                    self.state = State::Content;
                    Step::moved(input.len())
                }
                Scan::Invalid => {
                    self.state = State::Content;
                    Step::Transition
                }
            },
            State::Builtin { name, scan } => match scan.scan(input) {
                Some(close) => {
                    let name = std::mem::take(name);
                    let raw = &input[..close];
                    let tools = cx.tools();
                    let offered = tools.0.is_empty() || tools.get(&name).is_some();
                    match kwargs(raw, &name, tools) {
                        Some(args) if offered => {
                            cx.call(None, &name, args);
                            self.state = State::AfterCall;
                        }
                        _ => {
                            cx.malformed(&format!("{name}{CALL_OPEN}{raw})"));
                            self.state = State::Content;
                        }
                    }
                    Step::took(close + 1)
                }
                None if !eof => Step::Wait,
                None => {
                    if end == Some(FinishReason::Length) {
                        cx.drop_call(DropReason::Truncated);
                    } else {
                        let name = std::mem::take(name);
                        cx.malformed(&format!("{name}{CALL_OPEN}{input}"));
                    }
                    self.state = State::Content;
                    Step::moved(input.len())
                }
            },
            State::AfterCall => {
                let w = ws_len(input);
                let rest = &input[w..];
                if rest.starts_with(';') {
                    // `;` separates calls: it and the space before it are
                    // markup; the space after it is decided like any space
                    // after a call (markup before a call, else content).
                    return Step::took(w + 1);
                }
                if rest.is_empty() && !eof {
                    // Whitespace so far: a separator if a call follows.
                    return Step::Wait;
                }
                self.state = if rest.starts_with('{') || rest.starts_with('[') {
                    // The value's leading whitespace goes with it: markup if
                    // it is a call, content if it is not.
                    State::Candidate { scan: ValueEnd::default(), expected: true }
                } else {
                    State::Content
                };
                Step::Transition
            }
        }
    }

    /// `NAME.call(` once consumed; a JSON value waits unconsumed.
    fn held(&self) -> usize {
        match &self.state {
            State::Builtin { name, .. } => name.len() + CALL_OPEN.len(),
            _ => 0,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        match &self.state {
            // A JSON value not known to be a call stays content.
            State::Candidate { expected, .. } if !*expected && !looks_like_call(text) => {
                cx.content(text)
            }
            State::Candidate { .. } | State::Builtin { .. } => cx.malformed(text),
            State::Content | State::AfterTag | State::AfterCall => cx.content(text),
        }
        self.state = State::Content;
    }
}

/// Finds the `)` that closes a Python call's argument list, incrementally
/// (strings in either quote, nested brackets).
#[derive(Debug, Default)]
pub(crate) struct ParenEnd {
    pos: usize,
    depth: u32,
    quote: Option<u8>,
    esc: bool,
}

impl ParenEnd {
    /// The offset of the closing `)`, once seen.
    fn scan(&mut self, text: &str) -> Option<usize> {
        let b = text.as_bytes();
        while self.pos < b.len() {
            let c = b[self.pos];
            self.pos += 1;
            if let Some(q) = self.quote {
                if self.esc {
                    self.esc = false;
                } else if c == b'\\' {
                    self.esc = true;
                } else if c == q {
                    self.quote = None;
                }
                continue;
            }
            match c {
                b'"' | b'\'' => self.quote = Some(c),
                b'(' | b'[' | b'{' => self.depth += 1,
                b')' if self.depth == 0 => {
                    self.pos -= 1;
                    return Some(self.pos);
                }
                b')' | b']' | b'}' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
        None
    }
}

/// Splits `s` at top-level commas (outside strings and brackets).
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut quote, mut esc, mut start) = (0u32, None, false, 0);
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// A Python string literal's value.
fn py_string(lit: &str) -> Option<String> {
    let q = lit.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let body = lit.strip_prefix(q)?.strip_suffix(q)?;
    if q == '"' {
        if let Ok(Value::String(s)) = json::strict_value(lit) {
            return Some(s);
        }
    }
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            if c == q {
                return None;
            }
            out.push(c);
            continue;
        }
        match chars.next()? {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '0' => out.push('\0'),
            e => out.push(e),
        }
    }
    Some(out)
}

/// Keyword arguments `key=value, …` as a JSON object text.
fn kwargs(raw: &str, tool: &str, tools: &Tools) -> Option<String> {
    let mut map = Map::new();
    if raw.trim().is_empty() {
        return Some("{}".to_owned());
    }
    for part in split_top(raw) {
        let (key, value) = part.split_once('=')?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        let value = value.trim();
        let v = match py_string(value) {
            Some(s) => Value::String(s),
            None if value.starts_with('"') || value.starts_with('\'') => return None,
            None => match value {
                "True" => Value::Bool(true),
                "False" => Value::Bool(false),
                "None" => Value::Null,
                _ => match tools.types_of(tool, key) {
                    [] => json::strict_value(value)
                        .unwrap_or_else(|_| Value::String(value.to_owned())),
                    types => json::coerce(value, types),
                },
            },
        };
        if map.insert(key.to_owned(), v).is_some() {
            return None;
        }
    }
    Some(json::to_text(&map))
}

/// Calls as Llama 3 writes them: `{"name", "parameters"}` objects (after
/// `<|python_tag|>` when the model starts one), `; `-separated.
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    _special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use crate::grammar::{alternatives, call_object_json};
    let mut rules = alternatives(tools, |_, t| call_object_json(t, "parameters"));
    rules.push_str("one: fn\n");
    rules.push_str("calls: fn (\"; \" fn)*\n");
    rules.push_str("body: calls\n");
    Some(crate::grammar::CallGrammar { rules, opener: PYTHON_TAG.to_owned() })
}

/// Calls as Llama 3 writes them (what [`grammar`] generates): each a JSON
/// object `{"name": NAME, "parameters": ARGS}`, separated by `; `, without
/// `<|python_tag|>` (the template writes bare objects).
pub(crate) fn write(calls: &[(&str, &Value)]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|(name, args)| serde_json::json!({"name": name, "parameters": args}).to_string())
        .collect();
    calls.join("; ")
}

#[cfg(test)]
mod tests {
    use crate::{Accumulator, FinishReason, Format, Options};

    fn check(text: &str, reason: FinishReason) -> Accumulator {
        let opts = Options::default();
        crate::formats::testing::whole_and_by_char(Format::Llama3Json, &opts, text, reason)
    }

    #[test]
    fn long_arguments_pushed_by_char_stay_linear() {
        let body = "y".repeat(200_000);
        let text = format!(r#"{{"name": "w", "parameters": {{"c": "{body}"}}}}"#);
        // `check` parses it whole and one char at a time.
        let (acc, work) = crate::scan::work::measure(|| check(&text, FinishReason::Stop));
        assert_eq!(acc.calls.len(), 1);
        assert!(work <= 8 * text.len() as u64, "{work} bytes scanned for {}", text.len());
    }
}
