//! Kimi K2.x section tokens: Kimi-K2-Instruct, K2-Thinking, K2.5, K2.6 (the
//! generation prompt of the thinking models ends with `<think>`).
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
//! not end the call; whitespace, a ```` ```json ```` fence around it and
//! stray text between it and `<|tool_call_end|>` are noise. A section (also the singular `<|tool_call_section_begin|>`
//! spelling) is markup: whitespace and stray text between its markers are
//! dropped, never content. A call outside a section is accepted too, and
//! text around a section is content, verbatim. Reasoning ends at `</think>`
//! or where the tool section begins; a leading `<think>` is consumed.

use super::{prompt_thinks, text_step, AtMarker, Machine, Shown, Step, THINK, UNTHINK};
use crate::cx::Cx;
use crate::json::{self, Scan, ValueEnd};
use crate::scan::{find_first, lead_any, push_capped, starts_with, ws_len, Find, Lead, Prefix};
use crate::{DropReason, FinishReason, Options};

const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const SECTION_BEGIN_1: &str = "<|tool_call_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const SECTION_END_1: &str = "<|tool_call_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARG_BEGIN: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";
const FENCE: &str = "```";

/// Turn tokens a model should not write; stripped.
const TURN_TOKENS: [&str; 6] =
    ["<|im_end|>", "<|im_assistant|>", "<|im_system|>", "<|im_user|>", "<|im_middle|>", "[EOS]"];

const REASONING_MARKERS: [&str; 10] = [
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

/// Markers in content and inside a section: all but the call, section and
/// reasoning openers and the section's end are stripped.
const CONTENT_MARKERS: [&str; 14] = [
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

const HEADER_MARKERS: [&str; 5] = [ARG_BEGIN, CALL_END, CALL_BEGIN, SECTION_END, SECTION_END_1];

/// What ends a call after its arguments: its end marker, or (the marker
/// missing) the next call or the section's end.
const CALL_ENDS: [&str; 4] = [CALL_END, CALL_BEGIN, SECTION_END, SECTION_END_1];

/// A call header (`functions.NAME:IDX`, or a call written without the
/// argument token) longer than this is malformed.
const HEADER_CAP: usize = 64 << 10;
/// Whitespace held after a call's JSON while deciding what follows; a
/// longer run decides on its own.
const WS_HOLD: usize = 4096;

#[derive(Debug)]
pub(crate) enum State {
    Reasoning,
    Content,
    /// Inside a tool section, between calls: text here is markup.
    Section,
    /// After `<|tool_call_begin|>`: the header text so far. `section`: the
    /// call is inside a section (the parser goes back to it afterwards).
    Header {
        header: String,
        section: bool,
    },
    /// After `<|tool_call_argument_begin|>`: the input starts with the JSON;
    /// `raw` is the call's markup so far (shown if it proves malformed).
    /// `searched`: no close marker starts before this offset (invalid JSON).
    Args {
        scan: ValueEnd,
        raw: String,
        searched: usize,
        section: bool,
    },
}

#[derive(Debug)]
pub(crate) struct KimiK2 {
    state: State,
}

impl KimiK2 {
    pub(crate) fn new(opts: &Options) -> KimiK2 {
        let reasoning = prompt_thinks(opts)
            || (opts.generation_prompt.is_none() && opts.thinking == Some(true));
        KimiK2 { state: if reasoning { State::Reasoning } else { State::Content } }
    }

    /// Where the parser goes after a call.
    fn after_call(section: bool) -> State {
        if section {
            State::Section
        } else {
            State::Content
        }
    }
}

impl Machine for KimiK2 {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Reasoning => {
                text_step(input, &REASONING_MARKERS, eof, cx, Shown::Reasoning, |m, _| {
                    match m {
                        UNTHINK => self.state = State::Content,
                        SECTION_BEGIN | SECTION_BEGIN_1 => self.state = State::Section,
                        _ => {}
                    }
                    AtMarker::Markup
                })
            }
            State::Content | State::Section => {
                let section = matches!(self.state, State::Section);
                // Text inside a section is markup: dropped.
                let shown = if section { Shown::Dropped } else { Shown::Content };
                text_step(input, &CONTENT_MARKERS, eof, cx, shown, |m, _| {
                    match m {
                        CALL_BEGIN => self.state = State::Header { header: String::new(), section },
                        SECTION_BEGIN | SECTION_BEGIN_1 => self.state = State::Section,
                        SECTION_END | SECTION_END_1 => self.state = State::Content,
                        THINK if !section => self.state = State::Reasoning,
                        _ => {}
                    }
                    AtMarker::Markup
                })
            }
            State::Header { header, section } => {
                let section = *section;
                let (text, marker) = match find_first(input, &HEADER_MARKERS, eof) {
                    Find::Found { at, idx } => (&input[..at], Some(HEADER_MARKERS[idx])),
                    Find::Clear { safe } => (&input[..safe], None),
                };
                if let Err(k) = push_capped(header, text, HEADER_CAP) {
                    cx.malformed(&format!("{CALL_BEGIN}{header}"));
                    self.state = Self::after_call(section);
                    return Step::took(k);
                }
                let Some(m) = marker else {
                    if !eof {
                        return Step::up_to(text.len());
                    }
                    // The text ended inside the header.
                    if end == Some(FinishReason::Stop) && !header.is_empty() {
                        cx.malformed(&format!("{CALL_BEGIN}{header}"));
                    }
                    self.state = Self::after_call(section);
                    return Step::moved(text.len());
                };
                let used = text.len() + m.len();
                self.state = match (m, call_id(header)) {
                    (ARG_BEGIN, Some((id, name))) => {
                        let raw = format!("{CALL_BEGIN}{header}{ARG_BEGIN}");
                        cx.start_call(Some(id), &name);
                        State::Args { scan: ValueEnd::default(), raw, searched: 0, section }
                    }
                    (CALL_END, id) => {
                        // Arguments written without their token, or none.
                        let inline = inline_call(header);
                        match inline.or_else(|| id.map(|(id, name)| (id, name, "{}".to_owned()))) {
                            Some((id, name, args)) => cx.call(Some(id), &name, args),
                            None => cx.malformed(&format!("{CALL_BEGIN}{header}{m}")),
                        }
                        Self::after_call(section)
                    }
                    _ => {
                        cx.malformed(&format!("{CALL_BEGIN}{header}{m}"));
                        Self::after_call(section)
                    }
                };
                Step::took(used)
            }
            State::Args { scan, raw, searched, section } => {
                let section = *section;
                match args_step(scan, raw, searched, input, end, cx) {
                    None => Step::Wait,
                    Some(n) => {
                        self.state = Self::after_call(section);
                        Step::moved(n)
                    }
                }
            }
        }
    }

    /// The call markup consumed so far, from `<|tool_call_begin|>`.
    fn held(&self) -> usize {
        match &self.state {
            State::Header { header, .. } => CALL_BEGIN.len() + header.len(),
            State::Args { raw, .. } => raw.len(),
            State::Reasoning | State::Content | State::Section => 0,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        cx.malformed(text);
        self.state = State::Content;
    }
}

/// The id and function name of a call header (`functions.NAME:IDX`). Stray
/// words around the id are noise: the one word that looks like an id wins.
fn call_id(header: &str) -> Option<(String, String)> {
    let words: Vec<&str> = header.split_whitespace().collect();
    let id = match words.as_slice() {
        [id] => *id,
        _ => {
            let mut ids = words.iter().filter(|w| looks_like_id(w));
            match (ids.next(), ids.next()) {
                (Some(id), None) => *id,
                _ => return None,
            }
        }
    };
    let base = match id.rsplit_once(':') {
        Some((base, idx)) if idx.chars().all(|c| c.is_ascii_digit()) => base,
        _ => id,
    };
    let name = base.strip_prefix("functions.").unwrap_or(base);
    if name.is_empty() {
        return None;
    }
    Some((id.to_owned(), name.to_owned()))
}

/// `functions.NAME:IDX`, `functions.NAME` or `NAME:IDX`.
fn looks_like_id(word: &str) -> bool {
    let indexed = word.rsplit_once(':').is_some_and(|(base, idx)| {
        !base.is_empty() && !idx.is_empty() && idx.chars().all(|c| c.is_ascii_digit())
    });
    indexed || word.strip_prefix("functions.").is_some_and(|n| !n.is_empty())
}

/// The JSON arguments of a call body: whitespace and a ```` ```json ````
/// fence around the object are noise.
fn fenced_object(body: &str) -> Option<String> {
    let body = body.trim();
    let body = body.strip_prefix("```json").or_else(|| body.strip_prefix(FENCE)).unwrap_or(body);
    let body = body.strip_suffix(FENCE).unwrap_or(body);
    json::object_text(body).ok()
}

/// A call written without `<|tool_call_argument_begin|>`: the id, then
/// whitespace and the JSON arguments, possibly in a ```json fence.
fn inline_call(header: &str) -> Option<(String, String, String)> {
    let h = header.trim();
    let split = h.find(char::is_whitespace)?;
    let (id, name) = call_id(&h[..split])?;
    let args = fenced_object(&h[split..])?;
    Some((id, name, args))
}

/// One step inside call arguments; `None` waits, else the bytes consumed
/// (the call is then over).
fn args_step(
    scan: &mut ValueEnd,
    raw: &str,
    searched: &mut usize,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> Option<usize> {
    let eof = end.is_some();
    match scan.scan(input) {
        Scan::Done(body_end) => {
            let body = &input[..body_end];
            let Ok(args) = json::object_text(body) else {
                cx.malformed(&format!("{raw}{body}"));
                return Some(body_end);
            };
            let after = &input[body_end..];
            let mut ws = ws_len(after);
            if ws > WS_HOLD {
                // Decided at a fixed distance after the JSON, whatever the deltas.
                cx.complete_call(args);
                return Some(body_end);
            }
            match starts_with(&after[ws..], FENCE, eof) {
                Prefix::Yes => {
                    // A closing fence after the JSON is noise.
                    ws += FENCE.len();
                    ws += ws_len(&after[ws..]);
                }
                Prefix::NeedMore if ws < after.len() => return None,
                _ => {}
            }
            let rest = &after[ws..];
            if rest.is_empty() {
                if !eof {
                    return None;
                }
                if end == Some(FinishReason::Length) {
                    cx.drop_call(DropReason::Truncated);
                } else {
                    cx.complete_call(args);
                }
                return Some(input.len());
            }
            match lead_any(rest, &CALL_ENDS, eof) {
                Lead::Is(0) => {
                    cx.complete_call(args);
                    Some(body_end + ws + CALL_END.len())
                }
                Lead::Is(_) => {
                    // The close marker is missing; the next markup follows.
                    cx.complete_call(args);
                    Some(body_end + ws)
                }
                Lead::More => None,
                Lead::No => {
                    // Stray text after the arguments, before the call's end
                    // marker, is noise.
                    let from = (*searched).max(body_end + ws);
                    match find_first(&input[from..], &CALL_ENDS, eof) {
                        Find::Found { at, idx } => {
                            cx.complete_call(args);
                            let at = from + at;
                            Some(if idx == 0 { at + CALL_END.len() } else { at })
                        }
                        Find::Clear { safe } if !eof => {
                            *searched = from + safe;
                            None
                        }
                        Find::Clear { .. } => {
                            unfinished(raw, input, end, cx);
                            Some(input.len())
                        }
                    }
                }
            }
        }
        Scan::Partial => {
            if !eof {
                return None;
            }
            unfinished(raw, input, end, cx);
            Some(input.len())
        }
        Scan::Invalid => fenced_step(raw, searched, input, end, cx),
    }
}

/// The text ended inside the arguments: cut by the token limit, the call
/// is dropped; ended by a stop, its markup is shown.
fn unfinished(raw: &str, input: &str, end: Option<FinishReason>, cx: &mut Cx) {
    if end == Some(FinishReason::Length) {
        cx.drop_call(DropReason::Truncated);
    } else {
        cx.malformed(&format!("{raw}{input}"));
    }
}

/// Call arguments that do not start with JSON: decided at the close marker,
/// where the body (fenced, or empty) must be a JSON object.
fn fenced_step(
    raw: &str,
    searched: &mut usize,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> Option<usize> {
    let eof = end.is_some();
    match find_first(&input[*searched..], &[CALL_END], eof) {
        Find::Found { at, .. } => {
            let at = *searched + at;
            let used = at + CALL_END.len();
            let body = &input[..at];
            let args =
                if body.trim().is_empty() { Some("{}".to_owned()) } else { fenced_object(body) };
            match args {
                Some(args) => cx.complete_call(args),
                None => cx.malformed(&format!("{raw}{}", &input[..used])),
            }
            Some(used)
        }
        Find::Clear { safe } if !eof => {
            *searched += safe;
            None
        }
        Find::Clear { .. } => {
            unfinished(raw, input, end, cx);
            Some(input.len())
        }
    }
}

/// The grammar of calls in this format (see `grammar.rs`): a section of
/// calls (`section_grammar`).
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    Some(section_grammar(tools, special))
}

/// The grammar of calls in this format: a section of calls, each
/// `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>`, the
/// JSON arguments and `<|tool_call_end|>`, then the section's end (the
/// lazy trigger is the section opener). Short runs of whitespace between
/// the markers are allowed (models write them; the parser drops them).
fn section_grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    special: crate::grammar::Special<'_>,
) -> crate::grammar::CallGrammar {
    use crate::grammar::{alternatives, args_json, lit};
    let (begin, arg, end) = (special(CALL_BEGIN), special(ARG_BEGIN), special(CALL_END));
    let mut rules = alternatives(tools, |_, t| {
        let id = lit(&format!("functions.{}:", t.name));
        format!("{begin} WS? {id} IDX WS? {arg} WS? {} WS? {end}", args_json(t))
    });
    let (open, close) = (special(SECTION_BEGIN), special(SECTION_END));
    rules.push_str("WS: /[ \\n]{1,3}/\n");
    rules.push_str("IDX: /[0-9]{1,5}/\n");
    rules.push_str(&format!("one: {open} WS? fn WS? {close}\n"));
    rules.push_str(&format!("calls: {open} body\n"));
    rules.push_str(&format!("body: WS? fn (WS? fn)* WS? {close}\n"));
    crate::grammar::CallGrammar { rules, opener: SECTION_BEGIN.to_owned() }
}

/// Calls as Kimi K2 writes them (what [`grammar`] generates): a section
/// `<|tool_calls_section_begin|>` … `<|tool_calls_section_end|>` holding
/// `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>`
/// per call, IDX counting from 0.
pub(crate) fn write(calls: &[(&str, &serde_json::Value)]) -> String {
    let mut out = SECTION_BEGIN.to_owned();
    for (i, (name, args)) in calls.iter().enumerate() {
        out.push_str(&format!("{CALL_BEGIN}functions.{name}:{i}{ARG_BEGIN}{args}{CALL_END}"));
    }
    out.push_str(SECTION_END);
    out
}

#[cfg(test)]
mod tests {
    use crate::formats::testing::{prompted, whole_and_by_char};
    use crate::{Accumulator, FinishReason, Format, Parser};

    #[test]
    fn long_whitespace_runs_decide_the_same_for_every_split() {
        let ws = " ".repeat(5000);
        let t = format!(
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{{}}{ws}<|tool_call_end|>"
        );
        assert_eq!(
            whole_and_by_char(Format::KimiK2, &prompted(None), &t, FinishReason::Stop).calls.len(),
            1
        );
    }

    #[test]
    fn k2_long_invalid_arguments_stay_linear() {
        let big = "x".repeat(200_000);
        let t = format!(
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{big}<|tool_call_end|>"
        );
        let mut p = Parser::new(Format::KimiK2, prompted(None));
        let mut acc = Accumulator::default();
        for c in t.as_bytes().chunks(1) {
            acc.extend(p.push(std::str::from_utf8(c).unwrap()));
        }
        acc.extend(p.finish(FinishReason::Stop));
        assert!(acc.calls.is_empty());
        assert!(acc.content.contains(&big));
    }
}
