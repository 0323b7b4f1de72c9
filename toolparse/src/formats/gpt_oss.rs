//! gpt-oss: the Harmony response format (openai/gpt-oss-20b, -120b).
//!
//! ```text
//! <|channel|>analysis<|message|>The user wants the weather.<|end|>
//! <|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>
//! <|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}
//! ```
//!
//! The generation prompt ends with `<|start|>assistant`, so the text starts
//! with the rest of a message header (a channel, or ` to=functions.NAME`); a
//! prompt that ends with a whole call header (a forced tool choice,
//! `… to=functions.NAME<|channel|>commentary json<|message|>`) starts the
//! text in that call's body.
//! A message is `header<|message|>body` and ends with `<|end|>`, or with
//! the stop tokens `<|call|>` / `<|return|>`, which are usually not in the
//! text at all (the body then ends with the text).
//!
//! Headers: the recipient ` to=functions.NAME` may sit in the role part
//! (`<|start|>assistant to=functions.x<|channel|>commentary json`) or in the
//! channel part (`<|channel|>commentary to=functions.x <|constrain|>json`);
//! the content type (`<|constrain|>json`, a bare ` json`, or none) is
//! ignored. A message to an offered tool is a call, named by the recipient
//! (`functions.` dropped), on any channel: a function
//! (`to=functions.get_weather`) or a built-in tool (`to=python`,
//! `to=browser.search`, `to=browser.open`, `to=container.exec`) offered
//! under that very name; when no tools were given, every recipient is
//! offered. A message to any other recipient (a built-in the caller never
//! offered, a function name outside the offered tools) is no call: its
//! body is text of its channel, as if it had no recipient (`analysis` is
//! reasoning, other channels content). A call's body is one JSON object found
//! by scanning JSON, so marker text inside an argument string does not end
//! it; a built-in tool's body that is no JSON object (`to=python code`
//! writes Python) is its input text, up to the message's end, and the
//! arguments are `{"code": TEXT}`:
//!
//! ```text
//! <|start|>assistant<|channel|>analysis to=python code<|message|>print(2 + 2)<|call|>
//! ```
//!
//! Without a recipient, the `analysis` channel is reasoning and every other
//! channel (`final`, `commentary` preambles) is content.
//!
//! Marker-like text inside reasoning or content stays text where it cannot
//! be markup: `<|call|>` and `<|return|>` end a text body only at the end of
//! the text or before `<|start|>`; `<|channel|>` never ends one. A header cut
//! off by the end of the text is dropped; text outside any message is
//! content.

use super::{text_step, AtMarker, Machine, Shown, Step};
use crate::cx::Cx;
use crate::json::{self, Scan, ValueEnd};
use crate::scan::{
    find_first, follow_within, push_capped, starts_with, ws_len, Find, Follow, Prefix,
};
use crate::schema::Tools;
use crate::{DropReason, FinishReason, Options};

const START: &str = "<|start|>";
const END: &str = "<|end|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";

/// Markers recognised between messages; all but `<|start|>` and
/// `<|channel|>` are stray and stripped.
const FREE_MARKERS: [&str; 7] = [START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN];
/// Markers recognised inside a header.
const HEADER_MARKERS: [&str; 7] = [MESSAGE, START, END, CALL, RETURN, CHANNEL, CONSTRAIN];
/// Markers that may end a text body.
const BODY_ENDS: [&str; 3] = [END, CALL, RETURN];

/// A header longer than this (bytes) is not a header: its text is content.
const HEADER_CAP: usize = 1024;
/// Whitespace held after `<|call|>`/`<|return|>` (or after a call's JSON)
/// while deciding what follows; a longer run decides on its own.
const WS_HOLD: usize = 4096;

#[derive(Debug)]
pub(crate) enum State {
    /// Outside any message: stray text is content.
    Free,
    /// Inside a header (after `<|start|>`): its text so far.
    Header(String),
    /// In a message body shown as reasoning or content.
    Text(Shown),
    /// In a call's body: the input starts with its JSON. `builtin`: the
    /// recipient is a built-in tool, whose body may be text instead.
    Call { scan: ValueEnd, builtin: bool },
    /// In a built-in tool's text body; no end marker starts before
    /// `searched`.
    Code { searched: usize },
    /// The generation prompt ended in the header of a call to `name`: the
    /// call starts with the text.
    Prefilled { name: String, builtin: bool },
}

#[derive(Debug)]
pub(crate) struct GptOss {
    state: State,
}

impl GptOss {
    pub(crate) fn new(opts: &Options) -> GptOss {
        GptOss { state: initial(opts.generation_prompt.as_deref(), &opts.tools) }
    }
}

/// The start state from the end of the prompt: inside a header after
/// `<|start|>assistant`, inside a body after a prefilled `<|message|>`.
fn initial(gen: Option<&str>, tools: &Tools) -> State {
    let Some(gen) = gen else { return State::Free };
    let Some(p) = gen.rfind(START) else { return State::Free };
    let tail = &gen[p + START.len()..];
    if BODY_ENDS.iter().any(|m| tail.contains(m)) {
        return State::Free;
    }
    match tail.find(MESSAGE) {
        None => State::Header(tail.to_owned()),
        Some(m) => match parse_header(&tail[..m]) {
            Header { recipient: None, channel } => State::Text(channel_shown(channel.as_deref())),
            // The prompt opened a call's body (a forced tool choice): the
            // text is its body.
            Header { recipient: Some(r), channel } => match call_name(&r, tools) {
                Some((name, builtin)) => State::Prefilled { name: name.to_owned(), builtin },
                // A recipient that was not offered: the body is text.
                None => State::Text(channel_shown(channel.as_deref())),
            },
        },
    }
}

/// What a header says.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    channel: Option<String>,
    recipient: Option<String>,
}

/// Reads the recipient (`to=NAME`, in the role or the channel part) and the
/// channel from a header's text.
fn parse_header(h: &str) -> Header {
    let word = |s: &str| -> String {
        let end = s.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(s.len());
        s[..end].to_owned()
    };
    let mut recipient = None;
    let mut from = 0;
    while let Some(i) = h[from..].find("to=") {
        let at = from + i;
        let before = h[..at].chars().next_back();
        if before.is_none_or(|c| c.is_whitespace() || c == '>') {
            let name = word(&h[at + 3..]);
            if !name.is_empty() {
                recipient = Some(name);
                break;
            }
        }
        from = at + 3;
    }
    let channel = h.find(CHANNEL).map(|i| word(h[i + CHANNEL.len()..].trim_start()));
    // Messages addressed back to the user or the assistant are not calls.
    let recipient = recipient.filter(|r| !matches!(r.as_str(), "assistant" | "user" | "all"));
    Header { channel, recipient }
}

fn channel_shown(channel: Option<&str>) -> Shown {
    match channel {
        Some("analysis") => Shown::Reasoning,
        _ => Shown::Content,
    }
}

/// The call name of a recipient (`functions.NAME` → `NAME`; a built-in
/// tool keeps its name) and whether it is a built-in tool; `None` when the
/// recipient was not offered, so its message is no call: when tools were
/// given, only a name among them is a call (a caller that offers no
/// `python` runs none, whatever the model was trained to call); when none
/// were given, every recipient is.
fn call_name<'a>(recipient: &'a str, tools: &Tools) -> Option<(&'a str, bool)> {
    let (name, builtin) = match recipient.strip_prefix("functions.") {
        Some(name) => (name, false),
        None => (recipient, true),
    };
    (tools.0.is_empty() || tools.get(name).is_some()).then_some((name, builtin))
}

/// A header's visible text when it turns out not to be a header.
fn strip_markers(s: &str) -> String {
    let mut out = s.to_owned();
    for m in FREE_MARKERS {
        out = out.replace(m, "");
    }
    out
}

impl Machine for GptOss {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Free => text_step(input, &FREE_MARKERS, eof, cx, Shown::Content, |m, _| {
                match m {
                    START => self.state = State::Header(String::new()),
                    CHANNEL => self.state = State::Header(CHANNEL.to_owned()),
                    MESSAGE => self.state = State::Text(Shown::Content),
                    _ => {}
                }
                AtMarker::Markup
            }),
            State::Header(header) => {
                let (text, marker) = match find_first(input, &HEADER_MARKERS, eof) {
                    Find::Found { at, idx } => (&input[..at], Some(HEADER_MARKERS[idx])),
                    Find::Clear { safe } => (&input[..safe], None),
                };
                // A header that runs past the cap is not a header. The
                // `<|channel|>` and `<|constrain|>` markers it keeps count, so
                // the cut is at a fixed offset from its start (and the header
                // never holds more than the cap).
                let kept = match marker {
                    Some(m @ (CHANNEL | CONSTRAIN)) => text.len() + m.len(),
                    _ => text.len(),
                };
                if let Err(k) = push_capped(header, &input[..kept], HEADER_CAP) {
                    let shown = strip_markers(header);
                    cx.content(&shown);
                    self.state = State::Free;
                    return Step::took(k);
                }
                let Some(m) = marker else { return Step::up_to(text.len()) };
                match m {
                    MESSAGE => {
                        let h = parse_header(header);
                        let call = h.recipient.as_deref().and_then(|r| call_name(r, cx.tools()));
                        self.state = match call {
                            Some((name, builtin)) => {
                                cx.start_call(None, name);
                                State::Call { scan: ValueEnd::default(), builtin }
                            }
                            // No recipient, or one that was not offered.
                            None => State::Text(channel_shown(h.channel.as_deref())),
                        };
                    }
                    START => self.state = State::Header(String::new()),
                    // Kept in the header above.
                    CHANNEL | CONSTRAIN => {}
                    // The message ended inside its header: nothing to show.
                    _ => self.state = State::Free,
                }
                Step::took(text.len() + m.len())
            }
            State::Text(shown) => {
                let shown = *shown;
                text_step(input, &BODY_ENDS, eof, cx, shown, |m, after| {
                    match body_ends(m, after, eof) {
                        // The end of text or a header may follow.
                        None => AtMarker::Wait,
                        Some(true) => {
                            self.state = State::Free;
                            AtMarker::Markup
                        }
                        // Marker text inside the body (e.g. reasoning about `<|call|>`).
                        Some(false) => AtMarker::Text,
                    }
                })
            }
            State::Call { scan, builtin } => {
                let builtin = *builtin;
                match call_step(scan, builtin, input, end, cx) {
                    None => Step::Wait,
                    Some((n, next)) => {
                        self.state = next;
                        Step::moved(n)
                    }
                }
            }
            State::Prefilled { name, builtin } => {
                cx.start_call(None, name);
                self.state = State::Call { scan: ValueEnd::default(), builtin: *builtin };
                Step::Transition
            }
            State::Code { searched } => loop {
                match find_first(&input[*searched..], &BODY_ENDS, eof) {
                    Find::Found { at, idx } => {
                        let at = *searched + at;
                        let m = BODY_ENDS[idx];
                        let Some(ends) = body_ends(m, &input[at + m.len()..], eof) else {
                            *searched = at;
                            return Step::Wait;
                        };
                        if !ends {
                            // Marker text inside the code: the search goes on.
                            *searched = at + m.len();
                            continue;
                        }
                        cx.complete_call(code_args(&input[..at]));
                        self.state = State::Free;
                        return Step::took(at + m.len());
                    }
                    Find::Clear { safe } if !eof => {
                        *searched += safe;
                        return Step::Wait;
                    }
                    Find::Clear { .. } => {
                        // The stop token is not in the text: under Stop the
                        // body is complete; cut by the token limit, it is not.
                        if end == Some(FinishReason::Length) {
                            cx.drop_call(DropReason::Truncated);
                        } else {
                            cx.complete_call(code_args(input));
                        }
                        self.state = State::Free;
                        return Step::moved(input.len());
                    }
                }
            },
        }
    }

    /// A call body waits without consuming; a header is bounded by
    /// [`HEADER_CAP`] on its own and is not counted.
    fn held(&self) -> usize {
        0
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        match self.state {
            // Marker text and whitespace in a body: body text.
            State::Text(shown) => shown.emit(cx, text),
            // A call body: the rest of the body follows as content.
            State::Call { .. } | State::Code { .. } | State::Prefilled { .. } => {
                cx.malformed(text);
                self.state = State::Text(Shown::Content);
            }
            State::Free | State::Header(_) => {
                cx.malformed(text);
                self.state = State::Free;
            }
        }
    }
}

/// Whether the end marker `m` of a text body, followed by `rest`, ends it:
/// `<|end|>` always; `<|call|>` and `<|return|>` at the end of the text or
/// before the next `<|start|>`. `None`: not known yet.
fn body_ends(m: &str, rest: &str, eof: bool) -> Option<bool> {
    if m == END {
        return Some(true);
    }
    match follow_within(rest, &[START], eof, WS_HOLD) {
        Follow::Accept => Some(true),
        Follow::Reject => Some(false),
        Follow::Wait => None,
    }
}

/// The arguments of a built-in tool whose body is text.
fn code_args(body: &str) -> String {
    json::to_text(&serde_json::Map::from_iter([("code".to_owned(), serde_json::Value::from(body))]))
}

/// One step inside a call body; returns bytes consumed and the next state
/// (`None`: stay and wait for more text).
fn call_step(
    scan: &mut ValueEnd,
    builtin: bool,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> Option<(usize, State)> {
    let eof = end.is_some();
    match scan.scan(input) {
        Scan::Done(body_end) => {
            let body = &input[..body_end];
            let args = match json::object_text(body) {
                Ok(args) => args,
                Err(_) if builtin => return Some((0, State::Code { searched: 0 })),
                Err(_) => {
                    cx.malformed(body);
                    return Some((body_end, State::Text(Shown::Content)));
                }
            };
            let after = &input[body_end..];
            let ws = ws_len(after);
            let rest = &after[ws..];
            if ws > WS_HOLD {
                // Decided at a fixed distance after the JSON, whatever the deltas.
                cx.complete_call(args);
                return Some((body_end, State::Free));
            }
            if rest.is_empty() {
                if !eof {
                    return None;
                }
                // The <|call|> stop token is not in the text: under Stop the
                // body is complete; cut by the token limit, it is not.
                if end == Some(FinishReason::Length) {
                    cx.drop_call(DropReason::Truncated);
                } else {
                    cx.complete_call(args);
                }
                return Some((input.len(), State::Free));
            }
            for m in [CALL, END, RETURN] {
                match starts_with(rest, m, eof) {
                    Prefix::Yes => {
                        cx.complete_call(args);
                        return Some((body_end + ws + m.len(), State::Free));
                    }
                    Prefix::NeedMore => return None,
                    Prefix::No => {}
                }
            }
            for m in [START, CHANNEL] {
                match starts_with(rest, m, eof) {
                    Prefix::Yes => {
                        // The next message began without <|call|>.
                        cx.complete_call(args);
                        return Some((body_end + ws, State::Free));
                    }
                    Prefix::NeedMore => return None,
                    Prefix::No => {}
                }
            }
            // Text after the JSON: not a call body (a built-in tool's text).
            if builtin {
                return Some((0, State::Code { searched: 0 }));
            }
            cx.malformed(body);
            Some((body_end, State::Text(Shown::Content)))
        }
        Scan::Partial => {
            if !eof {
                return None;
            }
            if builtin && end == Some(FinishReason::Stop) && !input.trim().is_empty() {
                return Some((0, State::Code { searched: 0 }));
            }
            if end == Some(FinishReason::Length) {
                cx.drop_call(DropReason::Truncated);
            } else if input.trim().is_empty() {
                cx.complete_call("{}".to_owned());
            } else {
                cx.malformed(input);
            }
            Some((input.len(), State::Free))
        }
        Scan::Invalid => {
            // An empty body followed by the end marker: no arguments.
            let ws = ws_len(input);
            let rest = &input[ws..];
            for m in [CALL, END, RETURN] {
                match starts_with(rest, m, eof) {
                    Prefix::Yes => {
                        cx.complete_call("{}".to_owned());
                        return Some((ws + m.len(), State::Free));
                    }
                    Prefix::NeedMore => return None,
                    Prefix::No => {}
                }
            }
            if builtin {
                // Not JSON: a built-in tool's text (code).
                return Some((0, State::Code { searched: 0 }));
            }
            // Not JSON: the body is content.
            cx.malformed("");
            Some((0, State::Text(Shown::Content)))
        }
    }
}

/// The grammar of calls in this format (see `grammar.rs`): a call is a
/// commentary message to `functions.NAME` whose body is the JSON
/// arguments, with the recipient in the role part (` to=functions.NAME`
/// then `<|channel|>commentary`) or in the channel part
/// (`<|channel|>commentary to=functions.NAME`), the content type
/// `<|constrain|>json`, ` json` or none; more calls are more messages, each
/// after `<|call|><|start|>assistant`. The lazy trigger is
/// ` to=functions.`, which both headers contain: what follows it is the
/// name, then the rest of either header.
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use crate::grammar::{args_json, lit};
    let (channel, message) = (special(CHANNEL), special(MESSAGE));
    // After the recipient: the name, the rest of the header, then that
    // tool's arguments.
    let mut rules = String::new();
    let (mut role, mut chan) = (Vec::new(), Vec::new());
    for (i, t) in tools.iter().enumerate() {
        rules.push_str(&format!("args{i}: {}\n", args_json(t)));
        let name = lit(t.name);
        role.push(format!("{name} role_tail args{i}"));
        chan.push(format!("{name} chan_tail args{i}"));
    }
    let recipient = lit(" to=functions.");
    let content_type = format!("(\" \" {} \"json\" | \" json\")", special(CONSTRAIN));
    rules.push_str(&format!("role_tail: {channel} \"commentary\" {content_type}? {message}\n"));
    rules.push_str(&format!("chan_tail: {content_type}? {message}\n"));
    rules.push_str(&format!("in_role: {}\n", role.join(" | ")));
    rules.push_str(&format!("in_channel: {}\n", chan.join(" | ")));
    rules.push_str(&format!(
        "call: {recipient} in_role | {channel} \"commentary\" {recipient} in_channel\n"
    ));
    let next = format!("{} {} \"assistant\" call", special(CALL), special(START));
    let call_end = special(CALL);
    rules.push_str(&format!("one: call {call_end}?\n"));
    rules.push_str(&format!("calls: call ({next})* {call_end}?\n"));
    rules.push_str(&format!("body: (in_role | in_channel) ({next})* {call_end}?\n"));
    Some(crate::grammar::CallGrammar { rules, opener: " to=functions.".to_owned() })
}

/// Calls as gpt-oss writes them after the generation prompt's
/// `<|start|>assistant` (what [`grammar`] generates): one commentary
/// message per call,
/// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`,
/// each after the first opened by `<|start|>assistant` (a history writes
/// that role header before the first one too).
pub(crate) fn write(calls: &[(&str, &serde_json::Value)]) -> String {
    let mut out = String::new();
    for (i, (name, args)) in calls.iter().enumerate() {
        if i > 0 {
            out.push_str(START);
            out.push_str("assistant");
        }
        out.push_str(&format!(
            "{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}{args}{CALL}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::formats::testing::prompted;
    use crate::{Accumulator, FinishReason, Format, Parser};

    fn run(text: &str, reason: FinishReason) -> Accumulator {
        let opts = prompted(Some("<|start|>assistant"));
        crate::formats::testing::whole_and_by_char(Format::GptOss, &opts, text, reason)
    }

    #[test]
    fn long_whitespace_runs_decide_the_same_for_every_split() {
        let ws = " ".repeat(5000);
        let t = format!("<|channel|>analysis<|message|>a<|call|>{ws}<|start|>assistant<|channel|>final<|message|>b");
        run(&t, FinishReason::Stop);
        let t = format!("<|channel|>commentary to=functions.f json<|message|>{{}}{ws}<|call|>");
        assert_eq!(run(&t, FinishReason::Stop).calls.len(), 1);
    }

    #[test]
    fn long_call_is_linear_and_complete() {
        let big = "x".repeat(200_000);
        let t = format!("<|channel|>commentary to=functions.w json<|message|>{{\"s\": \"{big}\"}}");
        let mut p = Parser::new(Format::GptOss, prompted(Some("<|start|>assistant")));
        let mut acc = Accumulator::default();
        for c in t.as_bytes().chunks(1) {
            acc.extend(p.push(std::str::from_utf8(c).unwrap()));
        }
        acc.extend(p.finish(FinishReason::Stop));
        assert_eq!(acc.calls.len(), 1);
    }

    #[test]
    fn every_header_the_call_grammar_writes_reads_back_as_its_call() {
        // Both recipient placements, each content type, one call or two
        // messages of calls after `<|call|><|start|>assistant`.
        let headers = |name: &str| {
            ["<|constrain|>json", "json", ""].map(|ct| {
                let ct = if ct.is_empty() { String::new() } else { format!(" {ct}") };
                [
                    format!(" to=functions.{name}<|channel|>commentary{ct}<|message|>"),
                    format!("<|channel|>commentary to=functions.{name}{ct}<|message|>"),
                ]
            })
        };
        for first in headers("w").iter().flatten() {
            for second in headers("t").iter().flatten() {
                let one = format!("{first}{{\"c\": \"x\"}}");
                let calls = run(&one, FinishReason::Stop).calls;
                assert_eq!(calls.len(), 1, "{one}");
                assert_eq!(
                    (calls[0].name.as_str(), calls[0].arguments.as_str()),
                    ("w", "{\"c\": \"x\"}")
                );
                let two = format!("{one}<|call|><|start|>assistant{second}{{}}<|call|>");
                let calls = run(&two, FinishReason::Stop).calls;
                let got: Vec<_> =
                    calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect();
                assert_eq!(got, [("w", "{\"c\": \"x\"}"), ("t", "{}")], "{two}");
            }
        }
    }
}
