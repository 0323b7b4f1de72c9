//! Kimi: K2.x section tokens (Kimi-K2-Instruct, K2-Thinking, K2.5, K2.6)
//! and K3 XTML control tokens (Kimi-K3).
//!
//! K2.x (the generation prompt of the thinking models ends with `<think>`):
//!
//! ```text
//! The user wants the weather.</think>Let me check.<|tool_calls_section_begin|>
//! <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>
//! <|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>
//! <|tool_calls_section_end|>
//! ```
//!
//! The call id is what the model wrote (`functions.get_weather:0`); the name
//! is inside it (`functions.` and `:IDX` stripped). The arguments are one
//! JSON object found by scanning JSON, so marker text inside a string does
//! not end the call. The section tokens (also the singular
//! `<|tool_call_section_begin|>` spelling) are boundaries; a call outside a
//! section is accepted too. Reasoning ends at `</think>` or where the tool
//! section begins; a leading `<think>` is consumed.
//!
//! K3 (the generation prompt ends with `<|open|>think<|sep|>`, or with
//! `<|open|>response<|sep|>` when thinking is off):
//!
//! ```text
//! The user wants the weather.<|close|>think<|sep|>
//! <|open|>response<|sep|>Let me check.<|close|>response<|sep|>
//! <|open|>tools<|sep|>
//! <|open|>call tool="get_weather" index="1"<|sep|>
//! <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
//! <|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>
//! <|close|>call<|sep|>
//! <|close|>tools<|sep|><|close|>message<|sep|>
//! ```
//!
//! Elements are `<|open|>NAME attrs<|sep|>` … `<|close|>NAME<|sep|>`;
//! attribute values escape `&` and `"` as XML entities. `think` is
//! reasoning, `response` (and text outside any element) is content. An
//! argument body is raw text: `type="string"` keeps it verbatim, other types
//! are JSON, and a missing or unusable type falls back to the tool schema.
//! Argument bodies are written with ordinary tokens, so a `<|close|>argument<|sep|>`
//! in the text ends the argument only where the next argument, the end of
//! the call (or tools, message) or the end of the text follows it.

use super::{prompt_opens, Machine};
use crate::cx::Cx;
use crate::json::{self, Scan, ValueEnd};
use crate::registry::Format;
use crate::scan::{find_first, starts_with, ws_len, Find, Prefix};
use crate::{DropReason, FinishReason, Options};
use serde_json::{Map, Value};

#[derive(Debug)]
pub(crate) struct Kimi(Inner);

#[derive(Debug)]
enum Inner {
    K2(K2),
    K3(K3),
}

impl Kimi {
    pub(crate) fn new(format: Format, opts: &Options) -> Kimi {
        match format {
            Format::KimiK3 => Kimi(Inner::K3(K3::new(opts))),
            _ => Kimi(Inner::K2(K2::new(opts))),
        }
    }
}

impl Machine for Kimi {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        match &mut self.0 {
            Inner::K2(m) => m.step(input, end, cx),
            Inner::K3(m) => m.step(input, end, cx),
        }
    }

    fn held(&self) -> usize {
        match &self.0 {
            Inner::K2(m) => m.held(),
            Inner::K3(m) => m.held,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        match &mut self.0 {
            Inner::K2(m) => {
                cx.malformed(text);
                m.state = K2State::Content;
            }
            Inner::K3(m) => m.overflow(text, cx),
        }
    }
}

/// The first char boundary of `s` at or after `i` (or its length).
fn ceil_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

// ---------------------------------------------------------------------------
// K2.x

const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const SECTION_BEGIN_1: &str = "<|tool_call_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const SECTION_END_1: &str = "<|tool_call_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARG_BEGIN: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";
const THINK: &str = "<think>";
const UNTHINK: &str = "</think>";

/// Turn tokens a model should not write; stripped.
const TURN_TOKENS: [&str; 6] =
    ["<|im_end|>", "<|im_assistant|>", "<|im_system|>", "<|im_user|>", "<|im_middle|>", "[EOS]"];

const K2_REASONING_MARKERS: [&str; 10] = [
    UNTHINK,
    THINK,
    SECTION_BEGIN,
    SECTION_BEGIN_1,
    TURN_TOKENS[0],
    TURN_TOKENS[1],
    TURN_TOKENS[2],
    TURN_TOKENS[3],
    TURN_TOKENS[4],
    TURN_TOKENS[5],
];

const K2_CONTENT_MARKERS: [&str; 14] = [
    CALL_BEGIN,
    SECTION_BEGIN,
    SECTION_BEGIN_1,
    SECTION_END,
    SECTION_END_1,
    ARG_BEGIN,
    CALL_END,
    THINK,
    UNTHINK,
    TURN_TOKENS[0],
    TURN_TOKENS[1],
    TURN_TOKENS[2],
    TURN_TOKENS[3],
    TURN_TOKENS[4],
];

const K2_HEADER_MARKERS: [&str; 5] = [ARG_BEGIN, CALL_END, CALL_BEGIN, SECTION_END, SECTION_END_1];

/// A call header (`functions.NAME:IDX`, or a call written without the
/// argument token) longer than this is malformed.
const K2_HEADER_CAP: usize = 64 << 10;

#[derive(Debug)]
enum K2State {
    Reasoning,
    Content,
    /// After `<|tool_call_begin|>`: the header text so far.
    Header(String),
    /// After `<|tool_call_argument_begin|>`: the input starts with the JSON;
    /// `raw` is the call's markup so far (shown if it proves malformed).
    /// `searched`: no close marker starts before this offset (invalid JSON).
    Args {
        scan: ValueEnd,
        raw: String,
        searched: usize,
    },
}

#[derive(Debug)]
struct K2 {
    state: K2State,
}

impl K2 {
    fn new(opts: &Options) -> K2 {
        let gen = opts.generation_prompt.as_deref();
        let reasoning =
            prompt_opens(gen, THINK, UNTHINK) || (gen.is_none() && opts.thinking == Some(true));
        let state = if reasoning { K2State::Reasoning } else { K2State::Content };
        K2 { state }
    }

    /// The call markup consumed so far, from `<|tool_call_begin|>`.
    fn held(&self) -> usize {
        match &self.state {
            K2State::Header(header) => CALL_BEGIN.len() + header.len(),
            K2State::Args { raw, .. } => raw.len(),
            K2State::Reasoning | K2State::Content => 0,
        }
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        let eof = end.is_some();
        match &mut self.state {
            K2State::Reasoning => match find_first(input, &K2_REASONING_MARKERS, eof) {
                Find::Found { at, idx } => {
                    cx.reasoning(&input[..at]);
                    cx.boundary();
                    let m = K2_REASONING_MARKERS[idx];
                    if m == UNTHINK || m == SECTION_BEGIN || m == SECTION_BEGIN_1 {
                        self.state = K2State::Content;
                    }
                    at + m.len()
                }
                Find::Clear { safe } => {
                    cx.reasoning(&input[..safe]);
                    safe
                }
            },
            K2State::Content => match find_first(input, &K2_CONTENT_MARKERS, eof) {
                Find::Found { at, idx } => {
                    cx.content(&input[..at]);
                    cx.boundary();
                    let m = K2_CONTENT_MARKERS[idx];
                    match m {
                        CALL_BEGIN => self.state = K2State::Header(String::new()),
                        THINK => self.state = K2State::Reasoning,
                        _ => {}
                    }
                    at + m.len()
                }
                Find::Clear { safe } => {
                    cx.content(&input[..safe]);
                    safe
                }
            },
            K2State::Header(header) => {
                let (text, marker) = match find_first(input, &K2_HEADER_MARKERS, eof) {
                    Find::Found { at, idx } => (&input[..at], Some(K2_HEADER_MARKERS[idx])),
                    Find::Clear { safe } => (&input[..safe], None),
                };
                if header.len() + text.len() > K2_HEADER_CAP {
                    let k = ceil_boundary(text, K2_HEADER_CAP + 1 - header.len());
                    header.push_str(&text[..k]);
                    cx.malformed(&format!("{CALL_BEGIN}{header}"));
                    self.state = K2State::Content;
                    return k;
                }
                header.push_str(text);
                let Some(m) = marker else {
                    if eof {
                        // The text ended inside the header.
                        if end == Some(FinishReason::Stop) && !header.is_empty() {
                            cx.malformed(&format!("{CALL_BEGIN}{header}"));
                        }
                        self.state = K2State::Content;
                    }
                    return text.len();
                };
                let used = text.len() + m.len();
                let parsed = k2_name(header);
                match (m, parsed) {
                    (ARG_BEGIN, Some((id, name))) => {
                        let raw = format!("{CALL_BEGIN}{header}{ARG_BEGIN}");
                        cx.start_call(Some(id), &name);
                        self.state = K2State::Args { scan: ValueEnd::default(), raw, searched: 0 };
                    }
                    (CALL_END, Some((id, name))) => {
                        // A call without an argument part: no arguments.
                        cx.call(Some(id), &name, "{}".to_owned());
                        self.state = K2State::Content;
                    }
                    (CALL_END, None) => {
                        match k2_inline(header) {
                            Some((id, name, args)) => cx.call(Some(id), &name, args),
                            None => cx.malformed(&format!("{CALL_BEGIN}{header}{m}")),
                        }
                        self.state = K2State::Content;
                    }
                    _ => {
                        cx.malformed(&format!("{CALL_BEGIN}{header}{m}"));
                        self.state = K2State::Content;
                    }
                }
                used
            }
            K2State::Args { scan, raw, searched } => {
                let (n, done) = k2_args(scan, raw, searched, input, end, cx);
                if done {
                    self.state = K2State::Content;
                }
                n
            }
        }
    }
}

/// The id and function name of a K2 call header (`functions.NAME:IDX`).
fn k2_name(header: &str) -> Option<(String, String)> {
    let id = header.trim();
    let base = match id.rsplit_once(':') {
        Some((base, idx)) if idx.chars().all(|c| c.is_ascii_digit()) => base,
        _ => id,
    };
    let name = base.strip_prefix("functions.").unwrap_or(base).trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    Some((id.to_owned(), name.to_owned()))
}

/// A call written without `<|tool_call_argument_begin|>`: the id, then
/// whitespace and the JSON arguments, possibly in a ```json fence.
fn k2_inline(header: &str) -> Option<(String, String, String)> {
    let h = header.trim();
    let split = h.find(char::is_whitespace)?;
    let (id, name) = k2_name(&h[..split])?;
    let body = h[split..].trim();
    let body = body.strip_prefix("```json").or_else(|| body.strip_prefix("```")).unwrap_or(body);
    let body = body.strip_suffix("```").unwrap_or(body);
    let args = json::object_text(body).ok()?;
    Some((id, name, args))
}

/// One step inside K2 call arguments; returns bytes consumed and whether
/// the call is over (the machine goes back to content).
#[allow(clippy::too_many_arguments)]
fn k2_args(
    scan: &mut ValueEnd,
    raw: &str,
    searched: &mut usize,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (usize, bool) {
    let eof = end.is_some();
    match scan.scan(input) {
        Scan::Done(body_end) => {
            let body = &input[..body_end];
            let Ok(args) = json::object_text(body) else {
                cx.malformed(&format!("{raw}{body}"));
                return (body_end, true);
            };
            let after = &input[body_end..];
            let ws = ws_len(after);
            let rest = &after[ws..];
            if ws > WS_HOLD {
                // Decided at a fixed distance after the JSON, whatever the deltas.
                cx.call_args(&args);
                cx.end_call(args);
                return (body_end, true);
            }
            if rest.is_empty() {
                if !eof {
                    return (0, false);
                }
                if end == Some(FinishReason::Length) {
                    cx.drop_call(DropReason::Truncated);
                } else {
                    cx.call_args(&args);
                    cx.end_call(args);
                }
                return (input.len(), true);
            }
            match starts_with(rest, CALL_END, eof) {
                Prefix::Yes => {
                    cx.call_args(&args);
                    cx.end_call(args);
                    return (body_end + ws + CALL_END.len(), true);
                }
                Prefix::NeedMore => return (0, false),
                Prefix::No => {}
            }
            for m in [CALL_BEGIN, SECTION_END, SECTION_END_1] {
                match starts_with(rest, m, eof) {
                    Prefix::Yes => {
                        // The close marker is missing; the next markup follows.
                        cx.call_args(&args);
                        cx.end_call(args);
                        return (body_end + ws, true);
                    }
                    Prefix::NeedMore => return (0, false),
                    Prefix::No => {}
                }
            }
            cx.malformed(&format!("{raw}{body}"));
            (body_end, true)
        }
        Scan::Partial => {
            if !eof {
                return (0, false);
            }
            if end == Some(FinishReason::Length) {
                cx.drop_call(DropReason::Truncated);
            } else {
                cx.malformed(&format!("{raw}{input}"));
            }
            (input.len(), true)
        }
        Scan::Invalid => match find_first(&input[*searched..], &[CALL_END], eof) {
            Find::Found { at, .. } => {
                let at = *searched + at;
                let used = at + CALL_END.len();
                if input[..at].trim().is_empty() {
                    cx.call_args("{}");
                    cx.end_call("{}".to_owned());
                } else {
                    cx.malformed(&format!("{raw}{}", &input[..used]));
                }
                (used, true)
            }
            Find::Clear { safe } if !eof => {
                *searched += safe;
                (0, false)
            }
            Find::Clear { .. } => {
                if end == Some(FinishReason::Length) {
                    cx.drop_call(DropReason::Truncated);
                } else {
                    cx.malformed(&format!("{raw}{input}"));
                }
                (input.len(), true)
            }
        },
    }
}

// ---------------------------------------------------------------------------
// K3 XTML

const OPEN: &str = "<|open|>";
const CLOSE: &str = "<|close|>";
const SEP: &str = "<|sep|>";
const EOM: &str = "<|end_of_msg|>";
const CLOSE_ARG: &str = "<|close|>argument<|sep|>";

const K3_MARKERS: [&str; 3] = [OPEN, CLOSE, EOM];

/// What may follow a real `<|close|>argument<|sep|>`.
const AFTER_ARG: [&str; 5] = [
    "<|open|>argument",
    "<|close|>call<|sep|>",
    "<|close|>tools<|sep|>",
    "<|close|>message<|sep|>",
    EOM,
];

/// A tag (`NAME attrs` between the marker and `<|sep|>`) longer than this
/// is not a tag.
const TAG_CAP: usize = 1024;
/// Whitespace held after `<|close|>argument<|sep|>` (or after K2 JSON)
/// while deciding what follows; a longer run decides on its own.
const WS_HOLD: usize = 4096;

#[derive(Debug)]
enum K3State {
    /// Message level: stray text is content.
    Top,
    /// Inside `think` (reasoning) or `response` (content).
    Text { reasoning: bool },
    /// Inside `tools`, between calls.
    Tools,
    /// Inside a call (started), between arguments.
    Call(CallAcc),
    /// Inside an argument body.
    Arg { call: CallAcc, key: String, ty: Option<String>, value: String },
}

#[derive(Debug, Default)]
struct CallAcc {
    name: String,
    args: Map<String, Value>,
    /// A duplicate key: the call is malformed.
    bad: bool,
}

#[derive(Debug)]
struct K3 {
    state: K3State,
    /// Bytes consumed since the open call's `<|open|>call` tag began.
    held: usize,
    /// Set by a step that opened a call: where its tag began in the input.
    opened: Option<usize>,
}

/// A tag read after `<|open|>` / `<|close|>`.
enum TagRead<'a> {
    /// The tag text and the bytes it takes with its `<|sep|>`.
    Tag(&'a str, usize),
    NeedMore,
    /// The text ended inside the tag.
    Cut,
    NotTag,
}

fn read_tag(rest: &str, eof: bool) -> TagRead<'_> {
    match find_first(rest, &[SEP, OPEN, CLOSE, EOM], eof) {
        Find::Found { at, idx: 0 } if at <= TAG_CAP => TagRead::Tag(&rest[..at], at + SEP.len()),
        Find::Found { .. } => TagRead::NotTag,
        Find::Clear { safe } => {
            if safe > TAG_CAP || rest.len() > TAG_CAP + SEP.len() {
                TagRead::NotTag
            } else if eof {
                TagRead::Cut
            } else {
                TagRead::NeedMore
            }
        }
    }
}

/// A tag's name and attributes (entity-decoded).
fn parse_tag(tag: &str) -> (String, Vec<(String, String)>) {
    let tag = tag.trim();
    let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
    let name = tag[..name_end].to_owned();
    let mut attrs = Vec::new();
    let mut rest = &tag[name_end..];
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].trim().to_owned();
        let after = &rest[eq + 2..];
        let Some(q) = after.find('"') else { break };
        attrs.push((key, unescape(&after[..q])));
        rest = &after[q + 1..];
    }
    (name, attrs)
}

fn attr<'a>(attrs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Decodes XML entities in an attribute value.
fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let decoded = tail.find(';').filter(|&j| j <= 10).and_then(|j| {
            let ent = &tail[1..j];
            let c = match ent {
                "amp" => Some('&'),
                "quot" => Some('"'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "apos" => Some('\''),
                _ => ent
                    .strip_prefix("#x")
                    .or_else(|| ent.strip_prefix("#X"))
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                    .and_then(char::from_u32),
            };
            c.map(|c| (c, j + 1))
        });
        match decoded {
            Some((c, len)) => {
                out.push(c);
                rest = &tail[len..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The state a K3 generation prompt leaves: the innermost open element.
fn k3_initial(gen: Option<&str>, thinking: Option<bool>) -> K3State {
    let Some(gen) = gen else {
        return if thinking == Some(true) {
            K3State::Text { reasoning: true }
        } else {
            K3State::Top
        };
    };
    let mut stack: Vec<String> = Vec::new();
    let mut rest = gen;
    while let Find::Found { at, idx } = find_first(rest, &[OPEN, CLOSE], true) {
        let m = [OPEN, CLOSE][idx];
        let after = &rest[at + m.len()..];
        let Some(sep) = after.find(SEP) else { break };
        let (name, _) = parse_tag(&after[..sep]);
        if m == OPEN {
            stack.push(name);
        } else if let Some(p) = stack.iter().rposition(|n| *n == name) {
            stack.truncate(p);
        }
        rest = &after[sep + SEP.len()..];
    }
    match stack.last().map(String::as_str) {
        Some("think") => K3State::Text { reasoning: true },
        Some("response") => K3State::Text { reasoning: false },
        Some("tools") => K3State::Tools,
        _ => K3State::Top,
    }
}

/// Types an argument body by its `type` attribute, else by the schema.
fn typed_value(value: &str, ty: Option<&str>, cx: &Cx, tool: &str, key: &str) -> Value {
    match ty {
        Some("string") => Value::String(value.to_owned()),
        Some(t) if crate::JsonType::from_name(t).is_some() => json::strict_value(value.trim())
            .unwrap_or_else(|_| json::coerce(value, cx.tools().types_of(tool, key))),
        _ => json::coerce(value, cx.tools().types_of(tool, key)),
    }
}

impl K3 {
    fn new(opts: &Options) -> K3 {
        K3 {
            state: k3_initial(opts.generation_prompt.as_deref(), opts.thinking),
            held: 0,
            opened: None,
        }
    }

    /// An element tag at message level: the state it leads to.
    fn top_tag(close: bool, tag: &str, cx: &mut Cx) -> K3State {
        cx.boundary();
        if close {
            return K3State::Top;
        }
        let (name, attrs) = parse_tag(tag);
        match name.as_str() {
            "think" => K3State::Text { reasoning: true },
            "response" => K3State::Text { reasoning: false },
            "tools" => K3State::Tools,
            "call" => Self::open_call(&attrs, cx),
            _ => K3State::Top,
        }
    }

    fn open_call(attrs: &[(String, String)], cx: &mut Cx) -> K3State {
        match attr(attrs, "tool").or_else(|| attr(attrs, "name")) {
            Some(name) if !name.trim().is_empty() => {
                let name = name.trim().to_owned();
                cx.start_call(None, &name);
                K3State::Call(CallAcc { name, ..CallAcc::default() })
            }
            _ => K3State::Tools,
        }
    }

    fn finish_call(call: CallAcc, cx: &mut Cx) {
        if call.bad {
            cx.malformed("");
            return;
        }
        let args = json::to_text(&call.args);
        cx.call_args(&args);
        cx.end_call(args);
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        let eof = end.is_some();
        let state = std::mem::replace(&mut self.state, K3State::Top);
        let (n, next) = match state {
            K3State::Arg { call, key, ty, value } => {
                self.arg_step(call, key, ty, value, input, end, cx)
            }
            other => self.markup_step(other, input, end, cx),
        };
        self.state = next;
        if eof && input.is_empty() {
            // The end: an open call that did not close.
            match std::mem::replace(&mut self.state, K3State::Top) {
                K3State::Call(call) if end == Some(FinishReason::Stop) => {
                    Self::finish_call(call, cx)
                }
                K3State::Call(_) | K3State::Arg { .. } => cx.drop_call(DropReason::Truncated),
                other => self.state = other,
            }
        }
        let in_call = matches!(self.state, K3State::Call(_) | K3State::Arg { .. });
        self.held = match self.opened.take() {
            Some(at) if in_call => n - at,
            _ if in_call => self.held + n,
            _ => 0,
        };
        n
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        match std::mem::replace(&mut self.state, K3State::Top) {
            K3State::Text { reasoning: true } => {
                cx.reasoning(text);
                self.state = K3State::Text { reasoning: true };
            }
            K3State::Text { reasoning: false } => {
                cx.content(text);
                self.state = K3State::Text { reasoning: false };
            }
            K3State::Call(_) | K3State::Arg { .. } => cx.malformed(text),
            K3State::Top | K3State::Tools => cx.content(text),
        }
        self.held = 0;
        self.opened = None;
    }

    /// Steps every state but an argument body.
    fn markup_step(
        &mut self,
        state: K3State,
        input: &str,
        end: Option<FinishReason>,
        cx: &mut Cx,
    ) -> (usize, K3State) {
        let eof = end.is_some();
        let (at, idx) = match find_first(input, &K3_MARKERS, eof) {
            Find::Found { at, idx } => (at, idx),
            Find::Clear { safe } => {
                match &state {
                    K3State::Text { reasoning: true } => cx.reasoning(&input[..safe]),
                    K3State::Top | K3State::Text { reasoning: false } | K3State::Tools => {
                        cx.content(&input[..safe])
                    }
                    // Text between arguments is not part of the call.
                    _ => {}
                }
                return (safe, state);
            }
        };
        let before = &input[..at];
        let emit_before = |cx: &mut Cx| match &state {
            K3State::Text { reasoning: true } => cx.reasoning(before),
            K3State::Top | K3State::Text { reasoning: false } | K3State::Tools => {
                cx.content(before)
            }
            _ => {}
        };
        let m = K3_MARKERS[idx];
        if m == EOM {
            emit_before(cx);
            cx.boundary();
            return (at + m.len(), close_open_call(state, cx));
        }
        let rest = &input[at + m.len()..];
        let (tag, len) = match read_tag(rest, eof) {
            TagRead::Tag(tag, len) => (tag, len),
            TagRead::NeedMore => {
                emit_before(cx);
                return (at, state);
            }
            TagRead::Cut => {
                // The text ended inside markup: nothing of it is shown.
                emit_before(cx);
                cx.boundary();
                return (input.len(), state);
            }
            TagRead::NotTag => {
                emit_before(cx);
                match &state {
                    K3State::Text { reasoning: true } => cx.reasoning(m),
                    K3State::Text { reasoning: false } => cx.content(m),
                    _ => cx.boundary(),
                }
                return (at + m.len(), state);
            }
        };
        let close = m == CLOSE;
        let used = at + m.len() + len;
        let (name, attrs) = parse_tag(tag);
        emit_before(cx);
        let next = match state {
            K3State::Top => Self::top_tag(close, tag, cx),
            K3State::Text { reasoning } => {
                let structural = if close {
                    matches!(name.as_str(), "think" | "response" | "message" | "tools")
                } else {
                    matches!(name.as_str(), "think" | "response" | "tools" | "call" | "message")
                };
                if !structural {
                    // Marker text inside reasoning or content.
                    let shown = &input[at..used];
                    if reasoning {
                        cx.reasoning(shown);
                    } else {
                        cx.content(shown);
                    }
                    return (used, K3State::Text { reasoning });
                }
                Self::top_tag(close, tag, cx)
            }
            K3State::Tools => match (close, name.as_str()) {
                (false, "call") => {
                    cx.boundary();
                    Self::open_call(&attrs, cx)
                }
                (false, "argument") => {
                    cx.boundary();
                    K3State::Tools
                }
                (true, "call") => {
                    cx.boundary();
                    K3State::Tools
                }
                _ => Self::top_tag(close, tag, cx),
            },
            K3State::Call(call) => match (close, name.as_str()) {
                (false, "argument") => {
                    let key = attr(&attrs, "key").or_else(|| attr(&attrs, "name"));
                    match key {
                        Some(key) => K3State::Arg {
                            key: key.to_owned(),
                            ty: attr(&attrs, "type").map(str::to_owned),
                            call,
                            value: String::new(),
                        },
                        None => K3State::Call(CallAcc { bad: true, ..call }),
                    }
                }
                (true, "call") => {
                    Self::finish_call(call, cx);
                    K3State::Tools
                }
                (true, "tools") | (true, "message") => {
                    Self::finish_call(call, cx);
                    K3State::Top
                }
                (false, "call") => {
                    // The previous call did not close: it is complete as it is.
                    Self::finish_call(call, cx);
                    Self::open_call(&attrs, cx)
                }
                _ => K3State::Call(call),
            },
            // Argument bodies are stepped by `arg_step`.
            other @ K3State::Arg { .. } => other,
        };
        if !close && name == "call" && matches!(next, K3State::Call(_)) {
            self.opened = Some(at);
        }
        (used, next)
    }

    /// Steps inside an argument body.
    #[allow(clippy::too_many_arguments)]
    fn arg_step(
        &mut self,
        call: CallAcc,
        key: String,
        ty: Option<String>,
        mut value: String,
        input: &str,
        end: Option<FinishReason>,
        cx: &mut Cx,
    ) -> (usize, K3State) {
        let eof = end.is_some();
        let (text, found) = match find_first(input, &[CLOSE_ARG], eof) {
            Find::Found { at, .. } => (&input[..at], true),
            Find::Clear { safe } => (&input[..safe], false),
        };
        value.push_str(text);
        let at = text.len();
        if !found {
            if eof {
                if end == Some(FinishReason::Length) {
                    cx.drop_call(DropReason::Truncated);
                } else {
                    cx.malformed(&value);
                }
                return (input.len(), K3State::Top);
            }
            return (at, K3State::Arg { call, key, ty, value });
        }
        let rest = &input[at + CLOSE_ARG.len()..];
        let ws = ws_len(rest);
        let real = if ws > WS_HOLD {
            false
        } else if ws == rest.len() {
            if !eof {
                return (at, K3State::Arg { call, key, ty, value });
            }
            true
        } else {
            let mut verdict = Some(false);
            for f in AFTER_ARG {
                match starts_with(&rest[ws..], f, eof) {
                    Prefix::Yes => {
                        verdict = Some(true);
                        break;
                    }
                    Prefix::NeedMore => verdict = None,
                    Prefix::No => {}
                }
            }
            match verdict {
                Some(v) => v,
                None => return (at, K3State::Arg { call, key, ty, value }),
            }
        };
        let used = at + CLOSE_ARG.len();
        if !real {
            value.push_str(CLOSE_ARG);
            return (used, K3State::Arg { call, key, ty, value });
        }
        let mut call = call;
        let v = typed_value(&value, ty.as_deref(), cx, &call.name, &key);
        if call.args.contains_key(&key) {
            call.bad = true;
        } else {
            call.args.insert(key, v);
        }
        (used, K3State::Call(call))
    }
}

/// `<|end_of_msg|>` ends the message: an open call ends with it.
fn close_open_call(state: K3State, cx: &mut Cx) -> K3State {
    match state {
        K3State::Call(call) => {
            K3::finish_call(call, cx);
            K3State::Top
        }
        _ => K3State::Top,
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        parse, Accumulator, FinishReason, Format, JsonType, Options, Parser, ToolSpec, Tools,
    };

    fn opts(gen: Option<&str>) -> Options {
        Options { generation_prompt: gen.map(str::to_owned), ..Options::default() }
    }

    fn run_with(format: Format, o: Options, text: &str, reason: FinishReason) -> Accumulator {
        let whole = parse(format, o.clone(), text, reason);
        let mut p = Parser::new(format, o);
        let mut acc = Accumulator::default();
        for c in text.chars() {
            acc.extend(p.push(&c.to_string()));
        }
        acc.extend(p.finish(reason));
        assert_eq!(acc, whole, "split changes the result");
        whole
    }

    const K2_GEN: &str = "<|im_assistant|>assistant<|im_middle|><think>";
    const K3_GEN: &str = "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";

    fn k2(text: &str, reason: FinishReason) -> Accumulator {
        run_with(Format::KimiK2, opts(Some(K2_GEN)), text, reason)
    }

    fn k3(text: &str, reason: FinishReason) -> Accumulator {
        run_with(Format::KimiK3, opts(Some(K3_GEN)), text, reason)
    }

    #[test]
    fn k2_id_and_name() {
        let a = k2("Think.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>", FinishReason::Stop);
        assert_eq!(a.reasoning, "Think.");
        assert_eq!(a.calls[0].id.as_deref(), Some("functions.get_weather:0"));
        assert_eq!(a.calls[0].name, "get_weather");
        assert_eq!(a.calls[0].arguments, r#"{"city": "Paris"}"#);
    }

    #[test]
    fn k2_reasoning_runs_into_the_section() {
        let a = k2("Need it<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>", FinishReason::Stop);
        assert_eq!(a.reasoning, "Need it");
        assert_eq!(a.calls.len(), 1);
    }

    #[test]
    fn k2_truncated_inside_second_call() {
        let t = "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{\"x\": 1}<|tool_call_end|>\n<|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{\"y\": \"<|tool_call_end|>";
        let a = run_with(Format::KimiK2, opts(None), t, FinishReason::Length);
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].name, "a");
        assert_eq!(a.content, "");
    }

    #[test]
    fn k2_whitespace_and_singular_section_token() {
        let t = "Sure.\n<|tool_call_section_begin|>\n<|tool_call_begin|> functions.search:3 <|tool_call_argument_begin|> {\"q\": \"é\"} <|tool_call_end|>\n<|tool_call_section_end|>";
        let a = run_with(Format::KimiK2, opts(None), t, FinishReason::Stop);
        assert_eq!(a.content, "Sure.");
        assert_eq!(a.calls[0].name, "search");
        assert_eq!(a.calls[0].id.as_deref(), Some("functions.search:3"));
    }

    #[test]
    fn k2_fenced_arguments_without_argument_token() {
        let t = "<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.search\n```json\n{\"q\": \"x\"}\n```\n<|tool_call_end|>\n<|tool_calls_section_end|>";
        let a = run_with(Format::KimiK2, opts(None), t, FinishReason::Stop);
        assert_eq!(a.calls[0].name, "search");
        assert_eq!(a.calls[0].arguments, r#"{"q": "x"}"#);
    }

    #[test]
    fn k2_invalid_arguments_are_content() {
        let t = "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>nope<|tool_call_end|><|tool_calls_section_end|>";
        let a = run_with(Format::KimiK2, opts(None), t, FinishReason::Stop);
        assert!(a.calls.is_empty());
        assert!(a.content.contains("nope"));
    }

    #[test]
    fn long_whitespace_runs_decide_the_same_for_every_split() {
        let ws = " ".repeat(5000);
        let t = format!(
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{{}}{ws}<|tool_call_end|>"
        );
        assert_eq!(run_with(Format::KimiK2, opts(None), &t, FinishReason::Stop).calls.len(), 1);
        let t = format!("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>x<|close|>argument<|sep|>{ws}<|close|>call<|sep|>");
        k3(&t, FinishReason::Stop);
    }

    #[test]
    fn k2_long_invalid_arguments_stay_linear() {
        let big = "x".repeat(200_000);
        let t = format!(
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{big}<|tool_call_end|>"
        );
        let mut p = Parser::new(Format::KimiK2, opts(None));
        let mut acc = Accumulator::default();
        for c in t.as_bytes().chunks(1) {
            acc.extend(p.push(std::str::from_utf8(c).unwrap()));
        }
        acc.extend(p.finish(FinishReason::Stop));
        assert!(acc.calls.is_empty());
        assert!(acc.content.contains(&big));
    }

    #[test]
    fn k3_call_with_typed_values() {
        let t = "Plan.<|close|>think<|sep|><|open|>response<|sep|>Ok.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>2.5<|close|>argument<|sep|><|open|>argument key=\"o\" type=\"object\"<|sep|>{\"a\": [1]}<|close|>argument<|sep|><|open|>argument key=\"s\" type=\"string\"<|sep|>42<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>";
        let a = k3(t, FinishReason::Stop);
        assert_eq!(a.reasoning, "Plan.");
        assert_eq!(a.content, "Ok.");
        assert_eq!(a.calls[0].name, "f");
        let v: serde_json::Value = serde_json::from_str(&a.calls[0].arguments).unwrap();
        assert_eq!(v, serde_json::json!({"n": 2.5, "o": {"a": [1]}, "s": "42"}));
    }

    #[test]
    fn k3_marker_text_in_value() {
        let t = "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"w\" index=\"1\"<|sep|><|open|>argument key=\"c\" type=\"string\"<|sep|>a<|close|>argument<|sep|>b<|open|>x<|sep|><|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>";
        let a = k3(t, FinishReason::Stop);
        let v: serde_json::Value = serde_json::from_str(&a.calls[0].arguments).unwrap();
        assert_eq!(v["c"], "a<|close|>argument<|sep|>b<|open|>x<|sep|>");
    }

    #[test]
    fn k3_untyped_value_uses_the_schema() {
        let tools = Tools(vec![ToolSpec::new("f").param("n", &[JsonType::Integer])]);
        let o = Options { tools, ..opts(Some(K3_GEN)) };
        let t = "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"n\"<|sep|>7<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>";
        let a = run_with(Format::KimiK3, o, t, FinishReason::Stop);
        assert_eq!(a.calls[0].arguments, r#"{"n":7}"#);
    }

    #[test]
    fn k3_truncated_inside_second_call() {
        let t = "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"a\" index=\"1\"<|sep|><|close|>call<|sep|><|open|>call tool=\"b\" index=\"2\"<|sep|><|open|>argument key=\"x\" type=\"string\"<|sep|>par";
        let a = k3(t, FinishReason::Length);
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].name, "a");
        assert_eq!(a.content, "");
        // Cut right after an argument closed: the call never closed.
        let t2 = "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"b\"<|sep|><|open|>argument key=\"x\" type=\"string\"<|sep|>v<|close|>argument<|sep|>";
        assert!(k3(t2, FinishReason::Length).calls.is_empty());
    }

    #[test]
    fn k3_entities_in_attributes() {
        let t = "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a&amp;b &quot;c&quot; &#233;\" type=\"string\"<|sep|>x<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>";
        let a = k3(t, FinishReason::Stop);
        let v: serde_json::Value = serde_json::from_str(&a.calls[0].arguments).unwrap();
        assert_eq!(v["a&b \"c\" é"], "x");
    }

    #[test]
    fn k3_markers_in_reasoning_stay_text() {
        let a = k3("I use <|close|>foo<|sep|> here.<|close|>think<|sep|><|open|>response<|sep|>Hi<|close|>response<|sep|>", FinishReason::Stop);
        assert_eq!(a.reasoning, "I use <|close|>foo<|sep|> here.");
        assert_eq!(a.content, "Hi");
    }

    #[test]
    fn k3_truncated_tag_is_not_shown() {
        let a = k3("Thinking<|close|>thi", FinishReason::Length);
        assert_eq!(a.reasoning, "Thinking");
        assert_eq!(a.content, "");
    }
}
