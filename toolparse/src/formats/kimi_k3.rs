//! Kimi K3 XTML control tokens (Kimi-K3). The generation prompt ends with
//! `<|open|>think<|sep|>`, or with `<|open|>response<|sep|>` when thinking
//! is off.
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
//! reasoning, `response` (and text outside any element) is content, kept
//! verbatim; `tools` is markup, so text between its calls is dropped. An
//! argument body is raw text: `type="string"` keeps it verbatim, other types
//! are JSON, and a missing or unusable type falls back to the tool schema; a
//! repeated key makes the call malformed. Argument bodies are written with
//! ordinary tokens, so a `<|close|>argument<|sep|>` in the text ends the
//! argument only where the next argument, the end of the call (or tools,
//! message) or the end of the text follows it.

use super::keyed::KeyedCall;
use super::{Machine, Step};
use crate::cx::Cx;
use crate::json;
use crate::scan::{find_first, follow_within, Find, Follow};
use crate::{DropReason, FinishReason, Options};
use serde_json::Value;
use std::mem::discriminant;

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
/// Whitespace held after `<|close|>argument<|sep|>` while deciding what
/// follows; a longer run decides on its own.
const WS_HOLD: usize = 4096;

#[derive(Debug)]
pub(crate) enum State {
    /// Message level: stray text is content.
    Top,
    /// Inside `think` (reasoning) or `response` (content).
    Text { reasoning: bool },
    /// Inside `tools`, between calls.
    Tools,
    /// Inside a call (started), between arguments.
    Call(OpenCall),
    /// Inside an argument body.
    Arg { call: OpenCall, key: String, ty: Option<String>, value: String },
}

/// An open call.
#[derive(Debug)]
pub(crate) struct OpenCall {
    call: KeyedCall,
    /// A duplicate key: the call is malformed.
    bad: bool,
    /// Bytes consumed since its `<|open|>call` tag began.
    held: usize,
}

#[derive(Debug)]
pub(crate) struct KimiK3 {
    state: State,
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
fn k3_initial(gen: Option<&str>, thinking: Option<bool>) -> State {
    let Some(gen) = gen else {
        return if thinking == Some(true) { State::Text { reasoning: true } } else { State::Top };
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
        Some("think") => State::Text { reasoning: true },
        Some("response") => State::Text { reasoning: false },
        Some("tools") => State::Tools,
        _ => State::Top,
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

impl KimiK3 {
    pub(crate) fn new(opts: &Options) -> KimiK3 {
        KimiK3 { state: k3_initial(opts.generation_prompt.as_deref(), opts.thinking) }
    }
}

impl State {
    fn open_call_mut(&mut self) -> Option<&mut OpenCall> {
        match self {
            State::Call(call) | State::Arg { call, .. } => Some(call),
            _ => None,
        }
    }
}

/// An element tag at message level: the state it leads to.
fn top_tag(close: bool, tag: &str, cx: &mut Cx) -> State {
    if close {
        return State::Top;
    }
    let (name, attrs) = parse_tag(tag);
    match name.as_str() {
        "think" => State::Text { reasoning: true },
        "response" => State::Text { reasoning: false },
        "tools" => State::Tools,
        "call" => open_call(&attrs, cx),
        _ => State::Top,
    }
}

fn open_call(attrs: &[(String, String)], cx: &mut Cx) -> State {
    match attr(attrs, "tool").or_else(|| attr(attrs, "name")) {
        Some(name) if !name.trim().is_empty() => {
            State::Call(OpenCall { call: KeyedCall::start(name.trim(), cx), bad: false, held: 0 })
        }
        _ => State::Tools,
    }
}

fn finish_call(call: OpenCall, cx: &mut Cx) {
    if call.bad {
        cx.malformed("");
    } else {
        call.call.finish(cx);
    }
}

impl Machine for KimiK3 {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        let mut state = std::mem::replace(&mut self.state, State::Top);
        let before = discriminant(&state);
        let prior = state.open_call_mut().map_or(0, |c| c.held);
        let (n, mut next, opened) = match state {
            State::Arg { call, key, ty, value } => {
                let (n, next) = arg_step(call, key, ty, value, input, end, cx);
                (n, next, None)
            }
            other => markup_step(other, input, end, cx),
        };
        if let Some(call) = next.open_call_mut() {
            // The held region starts at the call's `<|open|>call` tag.
            call.held = match opened {
                Some(at) => n - at,
                None => prior + n,
            };
        }
        if eof && input.is_empty() {
            // The end: an open call that did not close.
            next = match next {
                State::Call(call) if end == Some(FinishReason::Stop) => {
                    finish_call(call, cx);
                    State::Top
                }
                State::Call(_) | State::Arg { .. } => {
                    cx.drop_call(DropReason::Truncated);
                    State::Top
                }
                other => other,
            };
        }
        let changed = discriminant(&next) != before;
        self.state = next;
        if changed {
            Step::moved(n)
        } else {
            Step::up_to(n)
        }
    }

    fn held(&self) -> usize {
        match &self.state {
            State::Call(call) | State::Arg { call, .. } => call.held,
            State::Top | State::Text { .. } | State::Tools => 0,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        match std::mem::replace(&mut self.state, State::Top) {
            State::Text { reasoning: true } => {
                cx.reasoning(text);
                self.state = State::Text { reasoning: true };
            }
            State::Text { reasoning: false } => {
                cx.content(text);
                self.state = State::Text { reasoning: false };
            }
            State::Call(_) | State::Arg { .. } => cx.malformed(text),
            State::Top | State::Tools => cx.content(text),
        }
    }
}

/// Steps every state but an argument body; also says where a call opened
/// by this step began.
fn markup_step(
    state: State,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (usize, State, Option<usize>) {
    let eof = end.is_some();
    let (at, idx) = match find_first(input, &K3_MARKERS, eof) {
        Find::Found { at, idx } => (at, idx),
        Find::Clear { safe } => {
            match &state {
                State::Text { reasoning: true } => cx.reasoning(&input[..safe]),
                State::Top | State::Text { reasoning: false } => cx.content(&input[..safe]),
                // Text between calls and arguments is markup.
                _ => {}
            }
            return (safe, state, None);
        }
    };
    let before = &input[..at];
    let emit_before = |cx: &mut Cx| match &state {
        State::Text { reasoning: true } => cx.reasoning(before),
        State::Top | State::Text { reasoning: false } => cx.content(before),
        _ => {}
    };
    let m = K3_MARKERS[idx];
    if m == EOM {
        emit_before(cx);
        return (at + m.len(), close_open_call(state, cx), None);
    }
    let rest = &input[at + m.len()..];
    let (tag, len) = match read_tag(rest, eof) {
        TagRead::Tag(tag, len) => (tag, len),
        TagRead::NeedMore => {
            emit_before(cx);
            return (at, state, None);
        }
        TagRead::Cut => {
            // The text ended inside markup: nothing of it is shown.
            emit_before(cx);
            return (input.len(), state, None);
        }
        TagRead::NotTag => {
            emit_before(cx);
            match &state {
                State::Text { reasoning: true } => cx.reasoning(m),
                State::Text { reasoning: false } => cx.content(m),
                _ => {}
            }
            return (at + m.len(), state, None);
        }
    };
    let close = m == CLOSE;
    let used = at + m.len() + len;
    let (name, attrs) = parse_tag(tag);
    emit_before(cx);
    let next = match state {
        State::Top => top_tag(close, tag, cx),
        State::Text { reasoning } => {
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
                return (used, State::Text { reasoning }, None);
            }
            top_tag(close, tag, cx)
        }
        State::Tools => match (close, name.as_str()) {
            (false, "call") => open_call(&attrs, cx),
            (false, "argument") | (true, "call") => State::Tools,
            _ => top_tag(close, tag, cx),
        },
        State::Call(call) => match (close, name.as_str()) {
            (false, "argument") => {
                let key = attr(&attrs, "key").or_else(|| attr(&attrs, "name"));
                match key {
                    Some(key) => State::Arg {
                        key: key.to_owned(),
                        ty: attr(&attrs, "type").map(str::to_owned),
                        call,
                        value: String::new(),
                    },
                    None => State::Call(OpenCall { bad: true, ..call }),
                }
            }
            (true, "call") => {
                finish_call(call, cx);
                State::Tools
            }
            (true, "tools") | (true, "message") => {
                finish_call(call, cx);
                State::Top
            }
            (false, "call") => {
                // The previous call did not close: it is complete as it is.
                finish_call(call, cx);
                open_call(&attrs, cx)
            }
            _ => State::Call(call),
        },
        // Argument bodies are stepped by `arg_step`.
        other @ State::Arg { .. } => other,
    };
    let opened = (!close && name == "call" && matches!(next, State::Call(_))).then_some(at);
    (used, next, opened)
}

/// Steps inside an argument body.
#[allow(clippy::too_many_arguments)]
fn arg_step(
    call: OpenCall,
    key: String,
    ty: Option<String>,
    mut value: String,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (usize, State) {
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
            return (input.len(), State::Top);
        }
        return (at, State::Arg { call, key, ty, value });
    }
    let rest = &input[at + CLOSE_ARG.len()..];
    let real = match follow_within(rest, &AFTER_ARG, eof, WS_HOLD) {
        Follow::Accept => true,
        Follow::Reject => false,
        Follow::Wait => return (at, State::Arg { call, key, ty, value }),
    };
    let used = at + CLOSE_ARG.len();
    if !real {
        value.push_str(CLOSE_ARG);
        return (used, State::Arg { call, key, ty, value });
    }
    let mut call = call;
    let v = typed_value(&value, ty.as_deref(), cx, call.call.name(), &key);
    if call.call.insert(key, v, cx).is_err() {
        call.bad = true;
    }
    (used, State::Call(call))
}

/// `<|end_of_msg|>` ends the message: an open call ends with it.
fn close_open_call(state: State, cx: &mut Cx) -> State {
    match state {
        State::Call(call) => {
            finish_call(call, cx);
            State::Top
        }
        _ => State::Top,
    }
}

/// An attribute value as the template writes it (XML entities for `&`,
/// `"` and `<`, which `parse_tag` decodes).
fn escape_attr(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;")
}

/// The `type` attribute names a JSON value of these types may carry: any
/// known name but `string` reads the body as strict JSON, so the names of
/// the declared types (an integer may be called a number, a number an
/// integer), or all of them where none is declared.
fn json_type_names(types: &[crate::JsonType]) -> Vec<&'static str> {
    use crate::JsonType::*;
    const ALL: [&str; 6] = ["integer", "number", "boolean", "null", "object", "array"];
    let mut names: Vec<&'static str> = Vec::new();
    for t in types {
        let more: &[&str] = match t {
            Integer | Number => &["integer", "number"],
            Boolean => &["boolean"],
            Null => &["null"],
            Object => &["object"],
            Array => &["array"],
            String => &[],
        };
        for n in more {
            if !names.contains(n) {
                names.push(n);
            }
        }
    }
    if names.is_empty() {
        names.extend(ALL);
    }
    names
}

/// Calls as Kimi K3 writes them: `<|open|>tools<|sep|>`, each call
/// `<|open|>call tool="NAME" index="N"<|sep|>`, its arguments
/// `<|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>`
/// (the schema's properties in order, required ones always, optional ones
/// optionally; a tool without properties takes none) and
/// `<|close|>call<|sep|>`, then `<|close|>tools<|sep|>`. A value the
/// schema lets be a string is written `type="string"`, raw text that holds
/// no `<|close|>argument<|sep|>` followed by `<` (what the parser could
/// take for its end); other values are JSON under the name of one of their
/// declared types (strings inside JSON are not checked for that close).
/// No whitespace between the elements, as the template writes them.
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use super::qwen3_xml::{in_order, props, rx, value_form, ValueForm, TEXT_MAX};
    use crate::grammar::{alternatives, bounded, lit};
    let (open, close, sep) = (special(OPEN), special(CLOSE), special(SEP));
    // The text of the argument close up to its first control token: a text
    // value's lexeme ends with it (it is empty where `<|close|>` is one
    // token, which no text lexeme can take).
    let tail = if close != lit(CLOSE) {
        String::new()
    } else if sep != lit(SEP) {
        format!("{CLOSE}argument")
    } else {
        CLOSE_ARG.to_owned()
    };
    let rest: Vec<&str> = if tail.is_empty() {
        vec![close.as_str(), "\"argument\"", sep.as_str()]
    } else if tail.len() < CLOSE_ARG.len() {
        vec![sep.as_str()]
    } else {
        Vec::new()
    };
    let forbidden = format!("~/(?s:.*)({}\\s*<)(?s:.*)/", rx(CLOSE_ARG));
    let (body0, body1) = tools
        .first()
        .map_or_else(|| ("(?s:.*)".into(), "(?s:.+)".into()), |t| (t.text_body(0), t.text_body(1)));
    let mut rules = String::new();
    if tail.is_empty() {
        rules.push_str(&format!("KTEXT: /{body1}/ & {forbidden}\n"));
        rules.push_str(&format!("ktext[max_tokens={TEXT_MAX}]: KTEXT\n"));
        rules.push_str(&format!("text: ktext? {}\n", rest.join(" ")));
    } else {
        rules.push_str(&format!("KTEXT: /{body0}{}/ & {forbidden}\n", rx(&tail)));
        rules.push_str(&format!("ktext[max_tokens={TEXT_MAX}]: KTEXT\n"));
        rules.push_str(&format!("text: ktext {}\n", rest.join(" ")));
    }
    let end_arg = format!("{close} \"argument\" {sep}");
    let mut args = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let spec = crate::ToolSpec::from_json_schema(t.name, t.parameters);
        let props = props(t.parameters);
        let mut p = Vec::new();
        for (k, prop) in props.iter().enumerate() {
            let key = escape_attr(prop.key);
            let tag = |ty: &str| {
                format!("{open} {} {sep}", lit(&format!("argument key=\"{key}\" type=\"{ty}\"")))
            };
            p.push(match value_form(t.parameters, prop.key, prop.schema, true) {
                ValueForm::Choice(c) => {
                    let alts: Vec<String> = c.iter().map(|c| lit(c)).collect();
                    format!("{} ({}) {end_arg}", tag("string"), alts.join(" | "))
                }
                ValueForm::Text => format!("{} text", tag("string")),
                ValueForm::Json(schema, _) => {
                    let id = format!("j{i}_{k}");
                    rules.push_str(&format!("{id}: %json {}\n", bounded(schema)));
                    let names: Vec<String> = json_type_names(spec.types_of(prop.key))
                        .iter()
                        .map(|n| lit(&format!("argument key=\"{key}\" type=\"{n}\"")))
                        .collect();
                    format!("{open} ({}) {sep} {id} {end_arg}", names.join(" | "))
                }
            });
        }
        args.push(in_order(&props, &p));
    }
    rules.push_str(&alternatives(tools, |i, t| {
        let head = lit(&format!("call tool=\"{}\" index=\"", escape_attr(t.name)));
        format!("{open} {head} IDX \"\\\"\" {sep} {} {close} \"call\" {sep}", args[i])
    }));
    rules.push_str("IDX: /[0-9]{1,4}/\n");
    let (begin, end) = (format!("{open} \"tools\" {sep}"), format!("{close} \"tools\" {sep}"));
    rules.push_str(&format!("one: {begin} fn {end}\n"));
    rules.push_str(&format!("calls: {begin} body\n"));
    rules.push_str(&format!("body: fn+ {end}\n"));
    Some(crate::grammar::CallGrammar { rules, opener: format!("{OPEN}tools{SEP}") })
}

/// Calls as Kimi K3 writes them (what [`grammar`] generates): the `tools`
/// element holding `<|open|>call tool="NAME" index="IDX"<|sep|>` (IDX
/// counting from 1), one
/// `<|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>`
/// per argument (a string raw with type `string`, other values as JSON
/// with their JSON type), then `<|close|>call<|sep|>`.
pub(crate) fn write(calls: &[(&str, &Value)]) -> String {
    let mut out = format!("{OPEN}tools{SEP}");
    for (i, (name, args)) in calls.iter().enumerate() {
        let name = escape_attr(name);
        out.push_str(&format!("{OPEN}call tool=\"{name}\" index=\"{}\"{SEP}", i + 1));
        for (k, v) in args.as_object().into_iter().flatten() {
            let ty = match v {
                Value::String(_) => "string",
                Value::Number(n) if n.is_f64() => "number",
                Value::Number(_) => "integer",
                Value::Bool(_) => "boolean",
                Value::Null => "null",
                Value::Object(_) => "object",
                Value::Array(_) => "array",
            };
            let key = escape_attr(k);
            let v = super::qwen3_xml::raw_or_json(v);
            out.push_str(&format!("{OPEN}argument key=\"{key}\" type=\"{ty}\"{SEP}{v}{CLOSE_ARG}"));
        }
        out.push_str(&format!("{CLOSE}call{SEP}"));
    }
    out.push_str(&format!("{CLOSE}tools{SEP}"));
    out
}

#[cfg(test)]
mod tests {
    use super::{CLOSE, OPEN, SEP};
    use crate::formats::testing::{prompted, whole_and_by_char};
    use crate::{Accumulator, FinishReason, Format};
    use serde_json::Value;

    const K3_GEN: &str = "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";

    fn k3(text: &str, reason: FinishReason) -> Accumulator {
        whole_and_by_char(Format::KimiK3, &prompted(Some(K3_GEN)), text, reason)
    }

    /// The grammar's verdicts on texts where `{O}`, `{C}`, `{S}` are the
    /// control tokens, written as text and as tokens of their own, and the
    /// parser's calls (name, arguments) for each accepted one.
    #[test]
    fn grammar_holds_values_to_what_the_parser_reads() {
        use crate::grammar::{lit, GrammarTool};
        use serde_json::json;
        let f = json!({"type": "object", "properties": {
            "s": {"type": "string"}, "n": {"type": ["integer", "null"]},
            "e": {"enum": ["a", "b"], "type": "string"}}, "required": ["s"]});
        let tools = [GrammarTool { name: "f", parameters: &f, text_bytes: None }];
        let marks = [(OPEN, 250u32, "{O}"), (CLOSE, 251, "{C}"), (SEP, 252, "{S}")];
        let as_token = |t: &str| {
            marks.iter().find(|m| m.0 == t).map_or_else(|| lit(t), |m| format!("<[{}]>", m.1))
        };
        let text_g = super::grammar(&tools, &|t: &str| lit(t)).expect("a grammar").rules;
        let tok_g = super::grammar(&tools, &as_token).expect("a grammar").rules;
        let head = "{O}tools{S}{O}call tool=\"f\" index=\"1\"{S}";
        let tail = "{C}call{S}{C}tools{S}";
        let arg = |k: &str, ty: &str, v: &str| {
            format!("{{O}}argument key=\"{k}\" type=\"{ty}\"{{S}}{v}{{C}}argument{{S}}")
        };
        let cases: Vec<(String, Option<Value>)> = vec![
            (arg("s", "string", "x"), Some(json!({"s": "x"}))),
            (arg("s", "string", ""), Some(json!({"s": ""}))),
            (
                arg("s", "string", "a<|close|>argument<|sep|> b"),
                Some(json!({"s": "a<|close|>argument<|sep|> b"})),
            ),
            (arg("s", "string", "a") + &arg("n", "number", "3"), Some(json!({"s": "a", "n": 3}))),
            (
                arg("s", "string", "a") + &arg("n", "null", "null"),
                Some(json!({"s": "a", "n": null})),
            ),
            (arg("s", "string", "a") + &arg("e", "string", "b"), Some(json!({"s": "a", "e": "b"}))),
            // What the parser would end early, or reads otherwise.
            (arg("s", "string", "a<|close|>argument<|sep|><|close|>call<|sep|>"), None),
            (arg("s", "string", "a<|close|>argument<|sep|> \n<|open|>argument"), None),
            (arg("s", "string", "a") + &arg("n", "string", "3"), None),
            (arg("s", "string", "a") + &arg("n", "boolean", "true"), None),
            (arg("s", "string", "a") + &arg("n", "number", "\"3\""), None),
            (arg("s", "string", "a") + &arg("e", "string", "c"), None),
            (arg("n", "number", "3"), None),
            (arg("n", "number", "3") + &arg("s", "string", "a"), None),
        ];
        for (args, want) in cases {
            let text = format!("{head}{args}{tail}");
            let plain = marks.iter().fold(text.clone(), |t, m| t.replace(m.2, m.0));
            assert_eq!(
                crate::formats::testing::sentence(
                    &text_g,
                    &plain.bytes().map(u32::from).collect::<Vec<_>>()
                ),
                want.is_some(),
                "{plain:?}"
            );
            let toks = crate::formats::testing::tokens(&text, &marks);
            assert_eq!(
                crate::formats::testing::sentence(&tok_g, &toks),
                want.is_some(),
                "tokens: {plain:?}"
            );
            if let Some(want) = want {
                let got = k3(&format!("<|close|>think<|sep|>{plain}"), FinishReason::Stop);
                assert_eq!(got.calls.len(), 1, "{plain:?}");
                let args: Value = serde_json::from_str(&got.calls[0].arguments).expect("json");
                assert_eq!(args, want, "{plain:?}");
            }
        }
    }

    #[test]
    fn long_whitespace_runs_decide_the_same_for_every_split() {
        let ws = " ".repeat(5000);
        let t = format!("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>x<|close|>argument<|sep|>{ws}<|close|>call<|sep|>");
        k3(&t, FinishReason::Stop);
    }
}
