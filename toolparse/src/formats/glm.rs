//! GLM calls: GLM-4.5/4.6 (newline variant) and GLM-4.7/5.x (compact).
//!
//! ```text
//! GLM-4.5, 4.6 (generation prompt `<|assistant|>`):
//!
//! <think>The user wants the weather.</think>
//! Let me check.
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Paris</arg_value>
//! <arg_key>days</arg_key>
//! <arg_value>3</arg_value>
//! </tool_call>
//!
//! GLM-4.7, 5.x (generation prompt `<|assistant|><think>`):
//!
//! The user wants the weather.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>
//! ```
//!
//! Both variants are parsed alike: whitespace (and a literal `\n`, which
//! some engines' regexes allow) between the name and the tags is ignored.
//! String values are raw text between `<arg_value>` and `</arg_value>`,
//! whitespace included; other values are JSON (the template writes them with
//! `tojson`), so a value is typed by the tool's schema ([`crate::json::coerce`]:
//! `3` is an integer only where the schema says so, `0042` for a string stays
//! `"0042"`); a parameter the schema does not declare is JSON when it parses
//! as JSON, else the raw string.
//!
//! A value ends at `</arg_value>`; `<tool_call>`, `</tool_call>` and
//! `<arg_key>` inside a value are data. A missing last `</arg_value>` is
//! recovered: a `</tool_call>` followed by the end of the text (or by a new
//! `<tool_call>`) closes both. A call needs its `</tool_call>`: cut by the
//! token limit it is dropped, ended by a stop it is shown as content.
//!
//! A prompt ending inside `<think>` starts the parser in reasoning. A call
//! written inside the reasoning (`<tool_call>NAME` then `<arg_key>` or
//! `</tool_call>`) is parsed as a call; other `<tool_call>` text there stays
//! reasoning. Turn tokens (`<|user|>`, `<|observation|>`, …) are stripped.

use super::keyed::KeyedCall;
use super::{prompt_thinks, text_step, AtMarker, Machine, Shown, Step, THINK, UNTHINK};
use crate::cx::Cx;
use crate::json;
use crate::registry::Format;
use crate::scan::{find_first, follow, lead_any, Find, Follow, Lead, Prefix};
use crate::{DropReason, FinishReason, Options};
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const KEY: &str = "<arg_key>";
const KEY_END: &str = "</arg_key>";
const VAL: &str = "<arg_value>";
const VAL_END: &str = "</arg_value>";

/// Turn tokens a model should not write; stripped wherever they show.
const STRAY: [&str; 7] = [
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|endoftext|>",
    "<tool_response>",
    "</tool_response>",
];

const CONTENT_MARKERS: [&str; 11] = [
    OPEN, CLOSE, THINK, UNTHINK, STRAY[0], STRAY[1], STRAY[2], STRAY[3], STRAY[4], STRAY[5],
    STRAY[6],
];

const REASONING_MARKERS: [&str; 9] =
    [UNTHINK, OPEN, STRAY[0], STRAY[1], STRAY[2], STRAY[3], STRAY[4], STRAY[5], STRAY[6]];

/// The longest function name or key waited for.
const NAME_MAX: usize = 256;

#[derive(Debug)]
pub(crate) enum State {
    Content,
    Reasoning,
    Call(Box<Call>),
}

#[derive(Debug)]
enum Phase {
    /// After `<tool_call>`: the name, up to a newline or a tag.
    Name,
    /// Between arguments: `<arg_key>` or `</tool_call>`.
    Params,
    /// After `<arg_key>`: the key up to `</arg_key>`.
    Key,
    /// After `</arg_key>`: `<arg_value>` for `key`.
    Between { key: String },
    /// Inside the value of `key`; `scan`: the resume offset of the search for
    /// its end (relative to the value start).
    Value { key: String, scan: usize },
    /// Invalid markup: everything up to `</tool_call>` is shown as content.
    Garbage,
}

#[derive(Debug)]
pub(crate) struct Call {
    /// Opened inside reasoning: the parser returns to reasoning afterwards.
    think: bool,
    phase: Phase,
    /// The markup consumed so far, shown if the call turns out malformed.
    raw: String,
    /// The started call, once its name is known.
    call: Option<KeyedCall>,
}

impl Call {
    fn new(think: bool) -> Box<Call> {
        Box::new(Call { think, phase: Phase::Name, raw: OPEN.to_owned(), call: None })
    }

    fn eat(&mut self, s: &str) {
        self.raw.push_str(s);
    }

    fn add_param(&mut self, key: String, value: &str, cx: &mut Cx) {
        let Some(call) = &mut self.call else { return };
        let types = cx.tools().types_of(call.name(), &key);
        let typed = if types.is_empty() {
            json::strict_value(value.trim()).unwrap_or_else(|_| Value::from(value))
        } else {
            json::coerce(value, types)
        };
        call.replace(key, typed, cx);
    }

    fn finish(&mut self, cx: &mut Cx) {
        if let Some(call) = self.call.take() {
            call.finish(cx);
        }
        self.raw.clear();
    }

    fn fail(&mut self, extra: &str, cx: &mut Cx) {
        let mut raw = std::mem::take(&mut self.raw);
        raw.push_str(extra);
        self.call = None;
        cx.malformed(&raw);
    }

    /// The text ended before `</tool_call>`.
    fn unfinished(&mut self, rest: &str, end: Option<FinishReason>, cx: &mut Cx) {
        if end == Some(FinishReason::Length) {
            self.call = None;
            cx.drop_call(DropReason::Truncated);
        } else {
            self.fail(rest, cx);
        }
    }

    /// Runs the call's phases over `input`; returns the bytes consumed and
    /// whether the call is over.
    fn run(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> (usize, bool) {
        let eof = end.is_some();
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            match &mut self.phase {
                // A name (or key) is accepted only within NAME_MAX bytes, as
                // it is waited for, whatever the deltas.
                Phase::Name => match skip_ws(rest, eof).map(|w| (w, rest[w..].find(['\n', '<']))) {
                    Some((w, Some(i))) if w + i > NAME_MAX => self.phase = Phase::Garbage,
                    None | Some((_, None)) if rest.len() <= NAME_MAX && !eof => {
                        return (pos, false);
                    }
                    None | Some((_, None)) if rest.len() <= NAME_MAX => {
                        self.unfinished(rest, end, cx);
                        return (input.len(), true);
                    }
                    None | Some((_, None)) => self.phase = Phase::Garbage,
                    Some((w, Some(i))) => {
                        let i = w + i;
                        let name = trim_ws(&rest[..i]);
                        if name.is_empty() {
                            self.phase = Phase::Garbage;
                            continue;
                        }
                        self.call = Some(KeyedCall::start(name, cx));
                        self.eat(&rest[..i]);
                        pos += i;
                        self.phase = Phase::Params;
                    }
                },
                Phase::Params | Phase::Between { .. } => {
                    let Some(ws) = skip_ws(rest, eof) else {
                        return (pos, false);
                    };
                    self.eat(&rest[..ws]);
                    pos += ws;
                    let t = &rest[ws..];
                    let key = match &mut self.phase {
                        Phase::Between { key } => Some(std::mem::take(key)),
                        _ => None,
                    };
                    let lits: &[&str] = if key.is_none() { &[KEY, CLOSE, OPEN] } else { &[VAL] };
                    match (key, lead_any(t, lits, eof)) {
                        (key, Lead::More) => {
                            if let Some(key) = key {
                                self.phase = Phase::Between { key };
                            }
                            return (pos, false);
                        }
                        (_, Lead::No) if t.is_empty() => {
                            self.unfinished(t, end, cx);
                            return (input.len(), true);
                        }
                        (_, Lead::No) => self.phase = Phase::Garbage,
                        (None, Lead::Is(0)) => {
                            self.eat(KEY);
                            pos += KEY.len();
                            self.phase = Phase::Key;
                        }
                        (None, Lead::Is(1)) => {
                            self.finish(cx);
                            return (pos + CLOSE.len(), true);
                        }
                        (None, Lead::Is(_)) => {
                            // A new call while this one is open: `</tool_call>`
                            // is missing in between.
                            self.finish(cx);
                            self.eat(OPEN);
                            pos += OPEN.len();
                            self.phase = Phase::Name;
                        }
                        (Some(key), Lead::Is(_)) => {
                            self.eat(VAL);
                            pos += VAL.len();
                            self.phase = Phase::Value { key, scan: 0 };
                        }
                    }
                }
                Phase::Key => match find_first(rest, &[KEY_END], eof) {
                    Find::Found { at, .. } if at <= NAME_MAX => {
                        let key = trim_ws(&rest[..at]).to_owned();
                        self.eat(&rest[..at + KEY_END.len()]);
                        pos += at + KEY_END.len();
                        self.phase = Phase::Between { key };
                    }
                    Find::Clear { safe } if safe <= NAME_MAX && !eof => {
                        return (pos, false);
                    }
                    Find::Clear { .. } if eof && rest.len() <= NAME_MAX => {
                        self.unfinished(rest, end, cx);
                        return (input.len(), true);
                    }
                    _ => self.phase = Phase::Garbage,
                },
                Phase::Value { key, scan } => loop {
                    match find_first(&rest[*scan..], &[VAL_END, CLOSE], eof) {
                        Find::Found { at, idx } => {
                            let abs = *scan + at;
                            let verdict = if idx == 0 {
                                Follow::Accept
                            } else {
                                follow(&rest[abs + CLOSE.len()..], &[OPEN], eof)
                            };
                            match verdict {
                                Follow::Accept => {
                                    let key = std::mem::take(key);
                                    let value = &rest[..abs];
                                    self.eat(value);
                                    self.add_param(key, value, cx);
                                    pos += abs;
                                    if idx == 0 {
                                        self.eat(VAL_END);
                                        pos += VAL_END.len();
                                    }
                                    self.phase = Phase::Params;
                                    break;
                                }
                                Follow::Wait => {
                                    *scan = abs;
                                    return (pos, false);
                                }
                                Follow::Reject => *scan = abs + 1,
                            }
                        }
                        Find::Clear { safe } => {
                            *scan += safe;
                            if eof {
                                self.unfinished(rest, end, cx);
                                return (input.len(), true);
                            }
                            return (pos, false);
                        }
                    }
                },
                Phase::Garbage => match find_first(rest, &[CLOSE], eof) {
                    Find::Found { at, .. } => {
                        let used = at + CLOSE.len();
                        self.fail(&rest[..used], cx);
                        return (pos + used, true);
                    }
                    Find::Clear { safe } => {
                        self.eat(&rest[..safe]);
                        pos += safe;
                        if eof {
                            self.unfinished(&rest[safe..], end, cx);
                            return (input.len(), true);
                        }
                        return (pos, false);
                    }
                },
            }
        }
    }
}

/// Trims whitespace and literal `\n` sequences from both ends.
fn trim_ws(s: &str) -> &str {
    let mut s = s.trim();
    loop {
        let t = s.strip_prefix("\\n").or_else(|| s.strip_suffix("\\n")).map(str::trim);
        match t {
            Some(t) => s = t,
            None => return s,
        }
    }
}

/// Length of the leading whitespace and literal `\n` sequences of `s`;
/// `None` when a lone `\` at the end may still become `\n`.
fn skip_ws(s: &str, eof: bool) -> Option<usize> {
    let mut i = 0;
    loop {
        let t = &s[i..];
        let ws = t.len() - t.trim_start().len();
        if ws > 0 {
            i += ws;
        } else if t.starts_with("\\n") {
            i += 2;
        } else if t == "\\" && !eof {
            return None;
        } else {
            return Some(i);
        }
    }
}

/// Whether `after` (the text after `<tool_call>` inside reasoning) starts a
/// call: a name right away, then `<arg_key>` or `</tool_call>`.
fn call_ahead(after: &str, eof: bool) -> Prefix {
    let n =
        after.find(|c: char| !(c.is_alphanumeric() || "_-.:/".contains(c))).unwrap_or(after.len());
    if n == 0 {
        return if after.is_empty() && !eof { Prefix::NeedMore } else { Prefix::No };
    }
    if n > NAME_MAX {
        return Prefix::No;
    }
    let rest = &after[n..];
    let Some(ws) = skip_ws(rest, eof) else { return Prefix::NeedMore };
    match lead_any(&rest[ws..], &[KEY, CLOSE], eof) {
        Lead::Is(_) => Prefix::Yes,
        Lead::More => Prefix::NeedMore,
        Lead::No => Prefix::No,
    }
}

#[derive(Debug)]
pub(crate) struct Glm {
    state: State,
}

impl Glm {
    /// Both variants ([`Format::Glm45`], [`Format::Glm47`]) parse alike; the
    /// generation prompt says whether the text starts inside `<think>`.
    pub(crate) fn new(_format: Format, opts: &Options) -> Glm {
        let state = if prompt_thinks(opts) { State::Reasoning } else { State::Content };
        Glm { state }
    }
}

impl Machine for Glm {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Reasoning => {
                text_step(input, &REASONING_MARKERS, eof, cx, Shown::Reasoning, |tag, after| {
                    match tag {
                        OPEN => AtMarker::opener_in_reasoning(call_ahead(after, eof), || {
                            self.state = State::Call(Call::new(true));
                        }),
                        UNTHINK => {
                            self.state = State::Content;
                            AtMarker::Markup
                        }
                        _ => AtMarker::Markup,
                    }
                })
            }
            State::Content => {
                text_step(input, &CONTENT_MARKERS, eof, cx, Shown::Content, |tag, _| {
                    match tag {
                        OPEN => self.state = State::Call(Call::new(false)),
                        THINK => self.state = State::Reasoning,
                        _ => {}
                    }
                    AtMarker::Markup
                })
            }
            State::Call(call) => {
                let (used, done) = call.run(input, end, cx);
                if !done {
                    return Step::up_to(used);
                }
                self.state = if call.think { State::Reasoning } else { State::Content };
                Step::moved(used)
            }
        }
    }

    fn held(&self) -> usize {
        match &self.state {
            State::Call(call) => call.raw.len(),
            State::Content | State::Reasoning => 0,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        cx.malformed(text);
        self.state = State::Content;
    }
}

/// Calls as GLM writes them: `<tool_call>NAME`, then each parameter as
/// `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` (the properties in
/// schema order, optional ones optional; a tool without properties takes
/// none), then `</tool_call>`; GLM-4.5 puts a newline after the name and
/// after each tag pair, GLM-4.7 nothing. A string value is raw text without
/// `</arg_value>` (nor `</tool_call>` before another tag); other values are
/// JSON (strings inside them are not checked for those tags).
///
/// The last value of the last call may also end at `</tool_call>` itself
/// (the missing `</arg_value>` the parser recovers, sound there because
/// the text ends after it); `body`, which text may follow, has no such end.
pub(crate) fn grammar(
    format: crate::Format,
    tools: &[crate::grammar::GrammarTool<'_>],
    _special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use super::qwen3_xml::{in_order, props, value_expr};
    use crate::grammar::lit;
    let sep = if format == Format::Glm45 { "\n" } else { "" };
    let forbidden = ["<\\/arg_value>(?s:.)", "<\\/tool_call>\\s*<"];
    let mut rules = String::new();
    let (mut fns, mut open_fns) = (Vec::new(), Vec::new());
    for (i, t) in tools.iter().enumerate() {
        let props = props(t.parameters);
        let (mut p, mut last) = (Vec::new(), Vec::new());
        for (k, prop) in props.iter().enumerate() {
            let key = lit(&format!("<arg_key>{}</arg_key>{sep}", prop.key));
            let v = value_expr(
                &format!("{i}_{k}"),
                t,
                t.parameters,
                prop,
                true,
                VAL,
                VAL_END,
                &forbidden,
                &mut rules,
            );
            p.push(format!("{key} {v} {}", lit(sep)).replace(" \"\"", ""));
            let x = value_expr(
                &format!("{i}_{k}_x"),
                t,
                t.parameters,
                prop,
                true,
                VAL,
                CLOSE,
                &forbidden,
                &mut rules,
            );
            last.push(format!("{key} {x}"));
        }
        let name = lit(&format!("{}{sep}", t.name));
        rules.push_str(&format!("fn{i}: {name} {} {}\n", in_order(&props, &p), lit(CLOSE)));
        fns.push(format!("fn{i}"));
        // Ending at parameter k (written without its `</arg_value>`): the
        // ones after it are all optional.
        let mut alts = Vec::new();
        for k in 0..props.len() {
            if props[k + 1..].iter().all(|p| !p.required) {
                alts.push(format!("{} {}", in_order(&props[..k], &p[..k]), last[k]));
            }
        }
        if !alts.is_empty() {
            rules.push_str(&format!("open{i}: {name} ({})\n", alts.join(" | ")));
            open_fns.push(format!("open{i}"));
        }
    }
    rules.push_str(&format!("fn: {}\n", fns.join(" | ")));
    let open = lit(OPEN);
    rules.push_str("NL: /\\n{1,2}/\n");
    rules.push_str(&format!("call: {open} fn\n"));
    if open_fns.is_empty() {
        rules.push_str("last: call\n");
    } else {
        rules.push_str(&format!("last: call | {open} ({})\n", open_fns.join(" | ")));
    }
    rules.push_str("one: last\n");
    rules.push_str("calls: (call NL?)* last\n");
    rules.push_str("body: fn (NL? call)*\n");
    Some(crate::grammar::CallGrammar { rules, opener: OPEN.to_owned() })
}

/// Calls as GLM writes them (what [`grammar`] generates):
/// `<tool_call>NAME`, each argument as
/// `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` (a string raw,
/// other values as JSON), then `</tool_call>`. GLM-4.5/4.6 put a newline
/// after the name, each key and each value, and between calls; GLM-4.7
/// writes them without.
pub(crate) fn write(format: Format, calls: &[(&str, &Value)]) -> String {
    let sep = if format == Format::Glm45 { "\n" } else { "" };
    let calls: Vec<String> = calls
        .iter()
        .map(|(name, args)| {
            let mut s = format!("{OPEN}{name}{sep}");
            for (k, v) in args.as_object().into_iter().flatten() {
                let v = super::qwen3_xml::raw_or_json(v);
                s.push_str(&format!("<arg_key>{k}</arg_key>{sep}{VAL}{v}{VAL_END}{sep}"));
            }
            s.push_str(CLOSE);
            s
        })
        .collect();
    calls.join(sep)
}

#[cfg(test)]
mod tests {
    use crate::{Format, JsonType, Options, ToolSpec, Tools};

    fn opts(gen: Option<&str>) -> Options {
        use JsonType::*;
        let tools = Tools(vec![
            ToolSpec::new("get_weather").param("city", &[String]).param("days", &[Integer]),
            ToolSpec::new("write_file").param("path", &[String]).param("content", &[String]),
        ]);
        Options { generation_prompt: gen.map(str::to_owned), tools, ..Options::default() }
    }

    #[test]
    fn random_markup_never_panics_and_ignores_splits() {
        let toks = [
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<think>",
            "</think>",
            "<|user|>",
            "get_weather",
            "city",
            "\n",
            " ",
            "Paris",
            "3",
            "{\"a\": [1]}",
            "<",
            "é🌸",
            "\\n",
            "\\",
        ];
        crate::formats::testing::random_markup(
            Format::Glm47,
            &toks,
            &[None, Some("<think>")],
            &opts,
            400,
            24,
        );
    }
}
