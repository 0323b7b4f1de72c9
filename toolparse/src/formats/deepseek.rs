//! DeepSeek tool calls: V3 / R1, V3.1, and the DSML markup of V3.2, V4 and
//! V4.1.
//!
//! V3 and R1 (the type, then the name, then fenced JSON):
//!
//! ````text
//! <think>
//! The user wants the weather.
//! </think>
//!
//! Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//! ```json
//! {"city": "Paris"}
//! ```<｜tool▁call▁end｜>
//! <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time
//! ```json
//! {}
//! ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ````
//!
//! V3.1 (the name, then bare JSON):
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! V3.2 DSML (V4 writes `tool_calls` for the block, V4.1 writes `<｜DSML｜ calls>`,
//! `<｜DSML｜ invoke` and `<｜DSML｜ parameter` with a space):
//!
//! ```text
//! I'll look it up.
//!
//! <｜DSML｜function_calls>
//! <｜DSML｜invoke name="search">
//! <｜DSML｜parameter name="query" string="true">café "best"</｜DSML｜parameter>
//! <｜DSML｜parameter name="filters" string="false">{"max": 3}</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜function_calls>
//! ```
//!
//! V3 and V3.1 share one parser: after `<｜tool▁sep｜>` the text up to the
//! first `{` is the name (V3: the header is the type `function` and a
//! ```` ```json ```` fence follows the name; V3.1: the header is the name and
//! nothing follows the separator). The end of the JSON is found by scanning
//! it, so marker text inside an argument string does not end a call; then an
//! optional closing fence and `<｜tool▁call▁end｜>` must follow. A call without
//! `<｜tool▁calls▁begin｜>` is accepted, and so is a block without
//! `<｜tool▁calls▁end｜>` (text after the last call is content again). R1
//! distill spellings of the block opener (`<｜tool_calls_begin｜>`, …) are
//! accepted too.
//!
//! DSML: each `invoke` becomes a call when its close tag arrives (so a reply
//! cut inside the second invoke keeps the first). `string="true"` values are
//! raw text, verbatim (typed by the tool schema only when it rules out a
//! string); `string="false"` values are JSON (a value that is not JSON, or a
//! parameter without the attribute, is typed by the tool schema).
//! A value ends only at its `</｜DSML｜parameter>`, so tag text inside it is
//! kept. Any of the three block names and both tag spellings are accepted in
//! every DSML sub-format; an invoke body that is a JSON object (instead of
//! parameters) is accepted as the arguments. The DSML sub-formats also read
//! V3.1 calls (DeepSeek-V3.2-Exp wrote those).
//!
//! Reasoning is `<think>` … `</think>`; a generation prompt that ends inside
//! `<think>` starts the parser in reasoning. A call block that starts inside
//! reasoning ends it. Markup that is not a valid call is shown verbatim as
//! content (stripped in suppress mode); stray turn tokens are stripped.

use super::{prompt_opens, Machine};
use crate::cx::Cx;
use crate::json::{self, JsonType, Scan, ValueEnd};
use crate::registry::Format;
use crate::scan::{find_first, starts_with, ws_len, Find, Prefix};
use crate::{DropReason, FinishReason, Options};
use serde_json::Value;

const THINK: &str = "<think>";
const UNTHINK: &str = "</think>";
const EOS: &str = "<｜end▁of▁sentence｜>";

/// Turn tokens of the chat template: never shown.
const TURN_TOKENS: [&str; 5] =
    [EOS, "<｜begin▁of▁sentence｜>", "<｜Assistant｜>", "<｜User｜>", "<｜System｜>"];

// V3 / V3.1 markers.
const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
/// Spellings of the block opener seen from R1 distills.
const CALLS_BEGIN_ALT: [&str; 4] = [
    "<｜tool_calls_begin｜>",
    "<｜tool calls begin｜>",
    "<｜tool\\_calls\\_begin｜>",
    "<｜tool▁calls｜>",
];
const V3_STRAY: [&str; 7] = [
    CALLS_END,
    CALL_END,
    SEP,
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
];

// DSML markers.
const DSML: &str = "｜DSML｜";
const DSML_OPENS: [&str; 3] =
    ["<｜DSML｜function_calls>", "<｜DSML｜tool_calls>", "<｜DSML｜ calls>"];
const DSML_CLOSES: [&str; 3] =
    ["</｜DSML｜function_calls>", "</｜DSML｜tool_calls>", "</｜DSML｜ calls>"];

/// The tag spellings of one DSML invoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Style {
    invoke: &'static str,
    invoke_close: &'static str,
    param: &'static str,
    param_close: &'static str,
}

/// V3.2 and V4.
const PLAIN: Style = Style {
    invoke: "<｜DSML｜invoke",
    invoke_close: "</｜DSML｜invoke>",
    param: "<｜DSML｜parameter",
    param_close: "</｜DSML｜parameter>",
};

/// V4.1: tag names with a leading space.
const SPACED: Style = Style {
    invoke: "<｜DSML｜ invoke",
    invoke_close: "</｜DSML｜ invoke>",
    param: "<｜DSML｜ parameter",
    param_close: "</｜DSML｜ parameter>",
};

/// The longest name or tag text accepted before its terminator (bytes).
const TAG_CAP: usize = 1024;

/// What a marker found in visible text does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Think,
    Unthink,
    Strip,
    /// V3 `<｜tool▁calls▁begin｜>` (or a spelling of it).
    V3Block,
    /// V3 `<｜tool▁call▁begin｜>` outside a block.
    V3Call,
    DsmlBlock,
    /// A DSML invoke outside a block.
    DsmlInvoke(Style),
}

#[derive(Debug)]
struct Markers {
    text: Vec<&'static str>,
    act: Vec<Act>,
}

impl Markers {
    fn new(list: Vec<(&'static str, Act)>) -> Markers {
        let (text, act) = list.into_iter().unzip();
        Markers { text, act }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Content,
    Reasoning,
    /// Inside a call block, between calls.
    Block,
    /// Broken markup inside a block: shown verbatim up to the block end.
    Junk,
    /// V3: after `<｜tool▁call▁begin｜>`, up to `<｜tool▁sep｜>`.
    Header,
    /// V3: after `<｜tool▁sep｜>`, up to the JSON.
    Name,
    /// JSON arguments (V3, or a DSML invoke body written as JSON).
    Json,
    /// After the JSON: up to the call's close marker.
    Tail,
    /// DSML: the attributes of an invoke tag.
    InvokeTag,
    /// DSML: inside an invoke, between parameters.
    Body,
    /// DSML: the attributes of a parameter tag.
    ParamTag,
    /// DSML: a parameter value.
    Value,
}

/// What one step of the state machine did.
enum Go {
    /// Consumed this many bytes (0 only when the state changed).
    Took(usize),
    /// Needs more text.
    Wait,
}

/// Whether text starts with one of several literals.
enum Lead {
    Hit(usize),
    Need,
    Miss,
}

fn lead(hay: &str, lits: &[&str], eof: bool) -> Lead {
    let mut need = false;
    for (i, lit) in lits.iter().enumerate() {
        match starts_with(hay, lit, eof) {
            Prefix::Yes => return Lead::Hit(i),
            Prefix::NeedMore => need = true,
            Prefix::No => {}
        }
    }
    if need {
        Lead::Need
    } else {
        Lead::Miss
    }
}

/// The end of a call after its JSON arguments.
enum Close {
    /// The close marker ends at this offset.
    At(usize),
    Need,
    Bad,
}

/// Whitespace, an optional closing fence (V3), whitespace, then `close`.
fn close_after_json(s: &str, fence: bool, close: &str, eof: bool) -> Close {
    let mut pos = ws_len(s);
    if fence {
        match starts_with(&s[pos..], "```", eof) {
            Prefix::Yes => {
                pos += 3;
                pos += ws_len(&s[pos..]);
            }
            Prefix::NeedMore => return Close::Need,
            Prefix::No => {}
        }
    }
    match starts_with(&s[pos..], close, eof) {
        Prefix::Yes => Close::At(pos + close.len()),
        Prefix::NeedMore => Close::Need,
        Prefix::No => Close::Bad,
    }
}

/// The function name of a V3 / V3.1 call from the text before and after
/// `<｜tool▁sep｜>` (up to the JSON).
fn call_name(header: &str, between: &str) -> Option<String> {
    let mut name = between.trim();
    if let Some(i) = name.find("```") {
        let lang = name[i + 3..].trim();
        if !(lang.is_empty() || lang.eq_ignore_ascii_case("json")) {
            return None;
        }
        name = name[..i].trim();
    }
    if name.is_empty() {
        name = header.trim();
    }
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '<' || c == '>') {
        return None;
    }
    Some(name.to_owned())
}

/// `key="value"` pairs of a tag; `None` when the text is not only that.
fn attributes(tag: &str) -> Option<Vec<(&str, &str)>> {
    let mut out = Vec::new();
    let mut s = tag.trim();
    while !s.is_empty() {
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return None;
        }
        let r = s[eq + 1..].trim_start();
        let q = r.chars().next()?;
        if q != '"' && q != '\'' {
            return None;
        }
        let len = r[1..].find(q)?;
        out.push((key, &r[1..1 + len]));
        s = r[1 + len + 1..].trim_start();
    }
    Some(out)
}

fn attr<'a>(attrs: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    attrs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

#[derive(Debug)]
pub(crate) struct DeepSeek {
    state: State,
    /// The block in progress is DSML (else V3 / V3.1).
    dsml: bool,
    content_markers: Markers,
    reasoning_markers: Markers,
    /// The markup text of the call (or block opening) in progress, shown as
    /// content if it turns out malformed.
    raw: String,
    /// Calls completed in the current block.
    calls_in_block: usize,
    /// V3 header before `<｜tool▁sep｜>`; DSML tag attributes.
    header: String,
    /// V3 text between `<｜tool▁sep｜>` and the JSON.
    between: String,
    json: String,
    scan: ValueEnd,
    style: Style,
    /// The DSML call in progress.
    name: String,
    /// DSML arguments so far (`{"k":v,"k2":v2`), and their keys.
    args: String,
    keys: Vec<String>,
    param: String,
    string: Option<bool>,
    value: String,
}

impl DeepSeek {
    pub(crate) fn new(format: Format, opts: &Options) -> DeepSeek {
        let dsml = matches!(format, Format::DeepSeekV32 | Format::DeepSeekV4 | Format::DeepSeekV41);
        let style = if format == Format::DeepSeekV41 { SPACED } else { PLAIN };
        let mut starts: Vec<(&'static str, Act)> = Vec::new();
        let mut stray: Vec<(&'static str, Act)> = Vec::new();
        if dsml {
            starts.extend(DSML_OPENS.iter().map(|m| (*m, Act::DsmlBlock)));
            stray.push((PLAIN.invoke, Act::DsmlInvoke(PLAIN)));
            stray.push((SPACED.invoke, Act::DsmlInvoke(SPACED)));
            stray.extend(DSML_CLOSES.iter().map(|m| (*m, Act::Strip)));
            for s in [PLAIN, SPACED] {
                stray.push((s.invoke_close, Act::Strip));
                stray.push((s.param_close, Act::Strip));
            }
            stray.push((DSML, Act::Strip));
        }
        // Every sub-format reads V3 / V3.1 calls: DSML models keep those
        // tokens (V3.2-Exp wrote V3.1 calls).
        starts.push((CALLS_BEGIN, Act::V3Block));
        starts.extend(CALLS_BEGIN_ALT.iter().map(|m| (*m, Act::V3Block)));
        stray.push((CALL_BEGIN, Act::V3Call));
        stray.extend(V3_STRAY.iter().map(|m| (*m, Act::Strip)));
        let turn: Vec<(&'static str, Act)> = TURN_TOKENS.iter().map(|m| (*m, Act::Strip)).collect();

        let mut content = vec![(THINK, Act::Think), (UNTHINK, Act::Strip)];
        content.extend(starts.iter().copied());
        content.extend(stray.iter().copied());
        content.extend(turn.iter().copied());
        let mut reasoning = vec![(UNTHINK, Act::Unthink), (THINK, Act::Strip)];
        reasoning.extend(starts.iter().copied());
        reasoning.extend(stray.iter().copied());
        reasoning.extend(turn.iter().copied());

        let gen = opts.generation_prompt.as_deref();
        let state =
            if prompt_opens(gen, THINK, UNTHINK) { State::Reasoning } else { State::Content };
        DeepSeek {
            state,
            dsml,
            content_markers: Markers::new(content),
            reasoning_markers: Markers::new(reasoning),
            raw: String::new(),
            calls_in_block: 0,
            header: String::new(),
            between: String::new(),
            json: String::new(),
            scan: ValueEnd::default(),
            style,
            name: String::new(),
            args: String::new(),
            keys: Vec::new(),
            param: String::new(),
            string: None,
            value: String::new(),
        }
    }

    /// Visible text (content or reasoning) up to the next marker.
    fn text(&mut self, input: &str, eof: bool, cx: &mut Cx) -> Go {
        let reasoning = self.state == State::Reasoning;
        let markers = if reasoning { &self.reasoning_markers } else { &self.content_markers };
        match find_first(input, &markers.text, eof) {
            Find::Found { at, idx } => {
                let (marker, act) = (markers.text[idx], markers.act[idx]);
                if reasoning {
                    cx.reasoning(&input[..at]);
                } else {
                    cx.content(&input[..at]);
                }
                cx.boundary();
                self.act(marker, act);
                Go::Took(at + marker.len())
            }
            Find::Clear { safe } => {
                if reasoning {
                    cx.reasoning(&input[..safe]);
                } else {
                    cx.content(&input[..safe]);
                }
                if safe == 0 {
                    Go::Wait
                } else {
                    Go::Took(safe)
                }
            }
        }
    }

    fn act(&mut self, marker: &str, act: Act) {
        let begin = |me: &mut DeepSeek, state: State| {
            me.raw.clear();
            me.raw.push_str(marker);
            me.calls_in_block = 0;
            me.header.clear();
            me.state = state;
        };
        match act {
            Act::Think => self.state = State::Reasoning,
            Act::Unthink => self.state = State::Content,
            Act::Strip => {}
            Act::V3Block => {
                begin(self, State::Block);
                self.dsml = false;
            }
            Act::V3Call => {
                begin(self, State::Header);
                self.dsml = false;
            }
            Act::DsmlBlock => {
                begin(self, State::Block);
                self.dsml = true;
            }
            Act::DsmlInvoke(style) => {
                begin(self, State::InvokeTag);
                self.dsml = true;
                self.style = style;
            }
        }
    }

    /// The markup so far is not a valid call: show it, and show what follows
    /// up to the end of the block as it is.
    fn fail(&mut self, cx: &mut Cx) -> Go {
        cx.malformed(&self.raw);
        self.raw.clear();
        self.state = State::Junk;
        Go::Took(0)
    }

    /// The text ended inside a call (all of it is in `raw` now): cut by the
    /// token limit, nothing is kept; ended by a stop, the markup is shown.
    fn unfinished(&mut self, end: Option<FinishReason>, cx: &mut Cx) {
        if end == Some(FinishReason::Length) {
            cx.drop_call(DropReason::Truncated);
        } else {
            cx.malformed(&self.raw);
        }
        self.raw.clear();
        self.state = State::Content;
    }

    /// The markers that end a run of broken markup.
    fn junk_ends(&self) -> Vec<&'static str> {
        if self.dsml {
            let mut v = DSML_CLOSES.to_vec();
            v.extend([PLAIN.invoke, SPACED.invoke, EOS]);
            v
        } else {
            vec![CALLS_END, CALL_BEGIN, EOS]
        }
    }

    fn junk(&mut self, input: &str, eof: bool, cx: &mut Cx) -> Go {
        let ends = self.junk_ends();
        match find_first(input, &ends, eof) {
            Find::Found { at, idx } => {
                let m = ends[idx];
                if m == EOS {
                    cx.malformed(&input[..at]);
                    cx.boundary();
                    self.state = State::Content;
                    Go::Took(at + m.len())
                } else if m == CALL_BEGIN || m == PLAIN.invoke || m == SPACED.invoke {
                    cx.malformed(&input[..at]);
                    self.state = State::Block;
                    Go::Took(at)
                } else {
                    let used = at + m.len();
                    cx.malformed(&input[..used]);
                    self.state = State::Content;
                    Go::Took(used)
                }
            }
            Find::Clear { safe } => {
                cx.malformed(&input[..safe]);
                if safe == 0 {
                    Go::Wait
                } else {
                    Go::Took(safe)
                }
            }
        }
    }

    /// Between calls of a block.
    fn block(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let eof = end.is_some();
        let ws = ws_len(input);
        if ws > 0 {
            self.raw.push_str(&input[..ws]);
            return Go::Took(ws);
        }
        if input.is_empty() {
            if eof {
                // Only the opener and whitespace: nothing to show.
                self.raw.clear();
                self.state = State::Content;
                return Go::Took(0);
            }
            return Go::Wait;
        }
        let lits: Vec<&str> = if self.dsml {
            let mut v = vec![PLAIN.invoke, SPACED.invoke];
            v.extend(DSML_CLOSES);
            v.push(EOS);
            v
        } else {
            vec![CALL_BEGIN, CALLS_END, EOS]
        };
        match lead(input, &lits, eof) {
            Lead::Need => Go::Wait,
            Lead::Hit(i) => {
                let m = lits[i];
                if m == CALL_BEGIN || m == PLAIN.invoke || m == SPACED.invoke {
                    self.raw.push_str(m);
                    self.header.clear();
                    if self.dsml {
                        self.style = if m == SPACED.invoke { SPACED } else { PLAIN };
                        self.state = State::InvokeTag;
                    } else {
                        self.state = State::Header;
                    }
                } else {
                    self.raw.clear();
                    cx.boundary();
                    self.state = State::Content;
                }
                Go::Took(m.len())
            }
            Lead::Miss if self.calls_in_block == 0 => self.fail(cx),
            Lead::Miss => {
                // The block was not closed: the text after the calls is content.
                self.raw.clear();
                cx.boundary();
                self.state = State::Content;
                Go::Took(0)
            }
        }
    }

    /// V3: the header up to `<｜tool▁sep｜>`.
    fn header(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let eof = end.is_some();
        match find_first(input, &[SEP, CALL_END, CALLS_END, CALL_BEGIN, EOS], eof) {
            Find::Found { at, idx } => {
                self.header.push_str(&input[..at]);
                self.raw.push_str(&input[..at]);
                if self.header.len() > TAG_CAP {
                    // As when waiting for it: too long, whatever the deltas.
                    self.fail(cx);
                    return Go::Took(at);
                }
                if idx == 0 {
                    self.raw.push_str(SEP);
                    self.between.clear();
                    self.state = State::Name;
                    Go::Took(at + SEP.len())
                } else {
                    self.fail(cx);
                    Go::Took(at)
                }
            }
            Find::Clear { safe } => {
                self.header.push_str(&input[..safe]);
                self.raw.push_str(&input[..safe]);
                if eof {
                    self.unfinished(end, cx);
                    return Go::Took(input.len());
                }
                if self.header.len() > TAG_CAP {
                    self.fail(cx);
                    return Go::Took(safe);
                }
                if safe == 0 {
                    Go::Wait
                } else {
                    Go::Took(safe)
                }
            }
        }
    }

    /// V3: the name (and fence) up to the JSON.
    fn name(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let eof = end.is_some();
        match find_first(input, &["{", CALL_END, CALLS_END, CALL_BEGIN, EOS], eof) {
            Find::Found { at, idx } => {
                self.between.push_str(&input[..at]);
                self.raw.push_str(&input[..at]);
                if self.between.len() > TAG_CAP {
                    self.fail(cx);
                    return Go::Took(at);
                }
                let name = call_name(&self.header, &self.between);
                match (idx, name) {
                    (0, Some(name)) => {
                        cx.start_call(None, &name);
                        self.json.clear();
                        self.scan = ValueEnd::default();
                        self.state = State::Json;
                        Go::Took(at)
                    }
                    (1, Some(name)) => {
                        // No JSON at all: a call without arguments.
                        cx.call(None, &name, "{}".to_owned());
                        self.call_done();
                        Go::Took(at + CALL_END.len())
                    }
                    _ => {
                        self.fail(cx);
                        Go::Took(at)
                    }
                }
            }
            Find::Clear { safe } => {
                self.between.push_str(&input[..safe]);
                self.raw.push_str(&input[..safe]);
                if eof {
                    self.unfinished(end, cx);
                    return Go::Took(input.len());
                }
                if self.between.len() > TAG_CAP {
                    self.fail(cx);
                    return Go::Took(safe);
                }
                if safe == 0 {
                    Go::Wait
                } else {
                    Go::Took(safe)
                }
            }
        }
    }

    /// A call is complete: back to the block.
    fn call_done(&mut self) {
        self.calls_in_block += 1;
        self.raw.clear();
        self.state = State::Block;
    }

    fn json(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let old = self.json.len();
        self.json.push_str(input);
        match self.scan.scan(&self.json) {
            Scan::Done(e) => {
                let take = e.saturating_sub(old).min(input.len());
                self.json.truncate(old + take);
                self.raw.push_str(&input[..take]);
                cx.call_args(&input[..take]);
                self.state = State::Tail;
                Go::Took(take)
            }
            Scan::Partial => {
                self.raw.push_str(input);
                cx.call_args(input);
                if end.is_some() {
                    self.unfinished(end, cx);
                    return Go::Took(input.len());
                }
                if input.is_empty() {
                    return Go::Wait;
                }
                Go::Took(input.len())
            }
            Scan::Invalid => {
                self.json.truncate(old);
                self.fail(cx)
            }
        }
    }

    /// After the JSON arguments: the close marker.
    fn tail(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let eof = end.is_some();
        let close = if self.dsml { self.style.invoke_close } else { CALL_END };
        match close_after_json(input, !self.dsml, close, eof) {
            Close::At(n) => {
                self.raw.push_str(&input[..n]);
                match json::object_text(&self.json) {
                    Ok(args) => {
                        cx.end_call(args);
                        self.call_done();
                    }
                    Err(_) => {
                        // The call closed but its arguments are not an object.
                        cx.malformed(&self.raw);
                        self.raw.clear();
                        self.state = State::Junk;
                    }
                }
                Go::Took(n)
            }
            Close::Need => Go::Wait,
            Close::Bad if eof && input.trim().trim_matches('`').trim().is_empty() => {
                self.raw.push_str(input);
                self.unfinished(end, cx);
                Go::Took(input.len())
            }
            Close::Bad => self.fail(cx),
        }
    }

    /// DSML: the attributes of an invoke or parameter tag, up to `>`.
    fn tag(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let eof = end.is_some();
        match find_first(input, &[">", "<"], eof) {
            Find::Found { at, idx } => {
                self.header.push_str(&input[..at]);
                self.raw.push_str(&input[..at]);
                if idx != 0 || self.header.len() > TAG_CAP {
                    self.fail(cx);
                    return Go::Took(at);
                }
                self.raw.push('>');
                let ok = if self.state == State::InvokeTag {
                    self.open_invoke(cx)
                } else {
                    self.open_param()
                };
                if !ok {
                    self.fail(cx);
                }
                Go::Took(at + 1)
            }
            Find::Clear { safe } => {
                self.header.push_str(&input[..safe]);
                self.raw.push_str(&input[..safe]);
                if eof {
                    self.unfinished(end, cx);
                    return Go::Took(input.len());
                }
                if self.header.len() > TAG_CAP {
                    self.fail(cx);
                    return Go::Took(safe);
                }
                if safe == 0 {
                    Go::Wait
                } else {
                    Go::Took(safe)
                }
            }
        }
    }

    fn open_invoke(&mut self, cx: &mut Cx) -> bool {
        let Some(attrs) = attributes(&self.header) else { return false };
        let Some(name) = attr(&attrs, "name") else { return false };
        let name = name.trim();
        if name.is_empty() {
            return false;
        }
        cx.start_call(None, name);
        self.name = name.to_owned();
        self.args.clear();
        self.keys.clear();
        self.state = State::Body;
        true
    }

    fn open_param(&mut self) -> bool {
        let Some(attrs) = attributes(&self.header) else { return false };
        let Some(name) = attr(&attrs, "name") else { return false };
        if self.keys.iter().any(|k| k == name) {
            return false;
        }
        self.param = name.to_owned();
        self.string = match attr(&attrs, "string") {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        };
        self.value.clear();
        self.state = State::Value;
        true
    }

    /// DSML: inside an invoke, between parameters.
    fn body(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let eof = end.is_some();
        let ws = ws_len(input);
        if ws > 0 {
            self.raw.push_str(&input[..ws]);
            return Go::Took(ws);
        }
        if input.is_empty() {
            if eof {
                self.unfinished(end, cx);
                return Go::Took(0);
            }
            return Go::Wait;
        }
        let lits = [self.style.param, self.style.invoke_close, "{"];
        let n = if self.keys.is_empty() { 3 } else { 2 };
        match lead(input, &lits[..n], eof) {
            Lead::Need => Go::Wait,
            Lead::Hit(0) => {
                self.raw.push_str(self.style.param);
                self.header.clear();
                self.state = State::ParamTag;
                Go::Took(self.style.param.len())
            }
            Lead::Hit(1) => {
                let close = self.style.invoke_close;
                self.raw.push_str(close);
                let tail = if self.keys.is_empty() { "{}" } else { "}" };
                self.args.push_str(tail);
                cx.call_args(tail);
                cx.end_call(std::mem::take(&mut self.args));
                self.call_done();
                Go::Took(close.len())
            }
            Lead::Hit(_) => {
                // The invoke body is a JSON object.
                self.json.clear();
                self.scan = ValueEnd::default();
                self.state = State::Json;
                Go::Took(0)
            }
            Lead::Miss => self.fail(cx),
        }
    }

    /// DSML: a parameter value, up to its close tag.
    fn value(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let eof = end.is_some();
        let close = self.style.param_close;
        match find_first(input, &[close], eof) {
            Find::Found { at, .. } => {
                self.value.push_str(&input[..at]);
                self.raw.push_str(&input[..at + close.len()]);
                let types = cx.tools().types_of(&self.name, &self.param);
                let v = match self.string {
                    // Raw text, unless the schema rules out a string (the
                    // model marked a number or flag as a string).
                    Some(true) if !types.is_empty() && !types.contains(&JsonType::String) => {
                        json::coerce(&self.value, types)
                    }
                    Some(true) => Value::String(std::mem::take(&mut self.value)),
                    Some(false) => json::strict_value(self.value.trim())
                        .unwrap_or_else(|_| json::coerce(&self.value, types)),
                    None => json::coerce(&self.value, types),
                };
                let key = std::mem::take(&mut self.param);
                let frag = format!(
                    "{}{}:{}",
                    if self.keys.is_empty() { "{" } else { "," },
                    Value::String(key.clone()),
                    v
                );
                self.args.push_str(&frag);
                cx.call_args(&frag);
                self.keys.push(key);
                self.state = State::Body;
                Go::Took(at + close.len())
            }
            Find::Clear { safe } => {
                self.value.push_str(&input[..safe]);
                self.raw.push_str(&input[..safe]);
                if eof {
                    self.unfinished(end, cx);
                    return Go::Took(input.len());
                }
                if safe == 0 {
                    Go::Wait
                } else {
                    Go::Took(safe)
                }
            }
        }
    }

    fn once(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Go {
        let eof = end.is_some();
        match self.state {
            State::Content | State::Reasoning => self.text(input, eof, cx),
            State::Block => self.block(input, end, cx),
            State::Junk => self.junk(input, eof, cx),
            State::Header => self.header(input, end, cx),
            State::Name => self.name(input, end, cx),
            State::Json => self.json(input, end, cx),
            State::Tail => self.tail(input, end, cx),
            State::InvokeTag | State::ParamTag => self.tag(input, end, cx),
            State::Body => self.body(input, end, cx),
            State::Value => self.value(input, end, cx),
        }
    }
}

impl Machine for DeepSeek {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            let before = self.state;
            match self.once(rest, end, cx) {
                Go::Wait => break,
                Go::Took(n) => {
                    pos += n.min(rest.len());
                    if n == 0 && self.state == before {
                        // No progress: a bug, never a hang.
                        break;
                    }
                }
            }
        }
        pos
    }

    fn held(&self) -> usize {
        match self.state {
            State::Content | State::Reasoning | State::Junk => 0,
            _ => self.raw.len(),
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        cx.malformed(text);
        for buf in [
            &mut self.raw,
            &mut self.header,
            &mut self.between,
            &mut self.json,
            &mut self.args,
            &mut self.param,
            &mut self.value,
        ] {
            *buf = String::new();
        }
        self.keys = Vec::new();
        self.state = State::Content;
    }
}

#[cfg(test)]
mod tests {
    use crate::json::JsonType;
    use crate::schema::{ToolSpec, Tools};
    use crate::{Accumulator, FinishReason, Format, Mode, Options, Parser};
    use serde_json::{json, Value};

    fn opts(gen: &str) -> Options {
        Options { generation_prompt: Some(gen.to_owned()), ..Options::default() }
    }

    fn feed(format: Format, o: &Options, deltas: &[&str], reason: FinishReason) -> Accumulator {
        let mut p = Parser::new(format, o.clone());
        let mut acc = Accumulator::default();
        for d in deltas {
            acc.extend(p.push(d));
        }
        acc.extend(p.finish(reason));
        acc
    }

    /// Parses `text` whole, char by char and in 3-char pieces; all must agree.
    fn parse_with(format: Format, o: &Options, text: &str, reason: FinishReason) -> Accumulator {
        let whole = feed(format, o, &[text], reason);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let by_char: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(feed(format, o, &by_char, reason), whole, "char split of {text:?}");
        let v: Vec<char> = text.chars().collect();
        let threes: Vec<String> = v.chunks(3).map(|c| c.iter().collect()).collect();
        let threes: Vec<&str> = threes.iter().map(String::as_str).collect();
        assert_eq!(feed(format, o, &threes, reason), whole, "3-char split of {text:?}");
        whole
    }

    fn parse(format: Format, text: &str) -> Accumulator {
        parse_with(format, &opts("<｜Assistant｜></think>"), text, FinishReason::Stop)
    }

    fn args(acc: &Accumulator, i: usize) -> Value {
        serde_json::from_str(&acc.calls[i].arguments).expect("arguments are JSON")
    }

    fn names(acc: &Accumulator) -> Vec<&str> {
        acc.calls.iter().map(|c| c.name.as_str()).collect()
    }

    const V3_CALL: &str = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>";

    #[test]
    fn v3_text_before_and_parallel_calls() {
        let text = format!(
            "Checking both.\n<｜tool▁calls▁begin｜>{V3_CALL}\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{{}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        );
        let acc = parse(Format::DeepSeekV3, &text);
        assert_eq!(acc.content, "Checking both.");
        assert_eq!(names(&acc), ["get_weather", "get_time"]);
        assert_eq!(args(&acc, 0), json!({"city": "Paris"}));
        assert_eq!(args(&acc, 1), json!({}));
    }

    #[test]
    fn v3_without_newlines_or_fence() {
        let a = parse(
            Format::DeepSeekV3,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f```json{\"a\":1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        );
        assert_eq!(names(&a), ["f"]);
        let b = parse(
            Format::DeepSeekV3,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{\"a\":1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        );
        assert_eq!(names(&b), ["f"]);
        assert_eq!(args(&b, 0), json!({"a": 1}));
    }

    #[test]
    fn v3_r1_think_in_output_and_prefilled() {
        let text = format!(
            "<think>\nPlan.\n</think>\n\nOn it.<｜tool▁calls▁begin｜>{V3_CALL}<｜tool▁calls▁end｜>"
        );
        let acc =
            parse_with(Format::DeepSeekV3, &opts("<｜Assistant｜>"), &text, FinishReason::Stop);
        assert_eq!(acc.reasoning, "Plan.");
        assert_eq!(acc.content, "On it.");
        assert_eq!(acc.calls.len(), 1);
        let text =
            format!("Plan.\n</think>\n\n<｜tool▁calls▁begin｜>{V3_CALL}<｜tool▁calls▁end｜>");
        let acc = parse_with(
            Format::DeepSeekV3,
            &opts("<｜Assistant｜><think>\n"),
            &text,
            FinishReason::Stop,
        );
        assert_eq!(acc.reasoning, "Plan.");
        assert_eq!(acc.content, "");
        assert_eq!(acc.calls.len(), 1);
    }

    #[test]
    fn v3_marker_text_inside_json_string() {
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>echo\n```json\n{\"t\": \"```<｜tool▁call▁end｜><｜tool▁calls▁end｜>}\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let acc = parse(Format::DeepSeekV3, text);
        assert_eq!(args(&acc, 0), json!({"t": "```<｜tool▁call▁end｜><｜tool▁calls▁end｜>}"}));
        assert_eq!(acc.content, "");
    }

    #[test]
    fn v3_malformed_is_shown_verbatim_and_stripped_in_suppress_mode() {
        for text in [
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```<｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1, \"a\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1} junk\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ] {
            let acc = parse(Format::DeepSeekV3, text);
            assert!(acc.calls.is_empty(), "{text}");
            assert_eq!(acc.content, text);
            let sup = Options { mode: Mode::Suppress, ..opts("<｜Assistant｜>") };
            let acc = parse_with(Format::DeepSeekV3, &sup, text, FinishReason::Stop);
            assert!(acc.calls.is_empty() && acc.discarded.is_empty());
            assert_eq!(acc.content, "");
        }
    }

    #[test]
    fn v31_calls_with_and_without_block_markers() {
        let one = "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>";
        let acc = parse(Format::DeepSeekV31, &format!("Sure.{one}"));
        assert_eq!(acc.content, "Sure.");
        assert_eq!(names(&acc), ["get_weather"]);
        // No <｜tool▁calls▁end｜>, text after the calls.
        let acc = parse(Format::DeepSeekV31, &format!("<｜tool▁calls▁begin｜>{one}{one}\n\nDone."));
        assert_eq!(names(&acc), ["get_weather", "get_weather"]);
        assert_eq!(acc.content, "Done.");
        // Whitespace around names and JSON.
        let acc = parse(
            Format::DeepSeekV31,
            "<｜tool▁calls▁begin｜>\n<｜tool▁call▁begin｜> f <｜tool▁sep｜>\n{\"a\": [1, {\"b\": null}]}\n<｜tool▁call▁end｜>\n<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        );
        assert_eq!(names(&acc), ["f"]);
        assert_eq!(args(&acc, 0), json!({"a": [1, {"b": null}]}));
        assert_eq!(acc.content, "");
    }

    #[test]
    fn v31_marker_in_arguments_unicode_and_escapes() {
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>echo<｜tool▁sep｜>{\"t\": \"a<｜tool▁call▁end｜>b \\\"q\\\" \\u00e9 🌸\\n\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let acc = parse(Format::DeepSeekV31, text);
        assert_eq!(args(&acc, 0), json!({"t": "a<｜tool▁call▁end｜>b \"q\" é 🌸\n"}));
    }

    #[test]
    fn v31_truncated_in_second_call_keeps_the_first() {
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\": 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>b<｜tool▁sep｜>{\"y\": ";
        let o = opts("<｜Assistant｜></think>");
        let acc = parse_with(Format::DeepSeekV31, &o, text, FinishReason::Length);
        assert_eq!(names(&acc), ["a"]);
        assert_eq!(acc.content, "");
        // Cut right after a complete JSON body, before the close marker.
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\": 1}";
        let acc = parse_with(Format::DeepSeekV31, &o, text, FinishReason::Length);
        assert!(acc.calls.is_empty());
        assert_eq!(acc.content, "");
    }

    #[test]
    fn v31_empty_arguments_without_json() {
        let acc = parse(
            Format::DeepSeekV31,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜><｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        );
        assert_eq!(names(&acc), ["get_time"]);
        assert_eq!(args(&acc, 0), json!({}));
    }

    fn dsml(style_space: bool, block: &str, body: &str) -> String {
        let sp = if style_space { " " } else { "" };
        body.replace("<I", &format!("<｜DSML｜{sp}invoke"))
            .replace("</I>", &format!("</｜DSML｜{sp}invoke>"))
            .replace("<P", &format!("<｜DSML｜{sp}parameter"))
            .replace("</P>", &format!("</｜DSML｜{sp}parameter>"))
            .replace("<B>", &format!("<｜DSML｜{block}>"))
            .replace("</B>", &format!("</｜DSML｜{block}>"))
    }

    const ALL_DSML: [(Format, bool, &str); 3] = [
        (Format::DeepSeekV32, false, "function_calls"),
        (Format::DeepSeekV4, false, "tool_calls"),
        (Format::DeepSeekV41, true, " calls"),
    ];

    #[test]
    fn dsml_parallel_calls_with_typed_values() {
        let body = "Looking.\n\n<B>\n<I name=\"a\">\n<P name=\"s\" string=\"true\"> x < y & \"z\" \n</P>\n<P name=\"n\" string=\"false\">{\"k\": [1, 2.5, true, null]}</P>\n</I>\n<I name=\"b\">\n</I>\n</B>";
        for (f, sp, block) in ALL_DSML {
            let acc = parse(f, &dsml(sp, block, body));
            assert_eq!(acc.content, "Looking.");
            assert_eq!(names(&acc), ["a", "b"]);
            assert_eq!(
                args(&acc, 0),
                json!({"s": " x < y & \"z\" \n", "n": {"k": [1, 2.5, true, null]}})
            );
            assert_eq!(args(&acc, 1), json!({}));
        }
    }

    #[test]
    fn dsml_values_without_json_follow_the_schema() {
        let tools = Tools(vec![ToolSpec::new("f")
            .param("count", &[JsonType::Integer])
            .param("flag", &[JsonType::Boolean])
            .param("name", &[JsonType::String])]);
        let body = "<B>\n<I name=\"f\">\n<P name=\"count\">42</P>\n<P name=\"flag\" string=\"false\">True</P>\n<P name=\"name\" string=\"false\">007</P>\n<P name=\"other\" string=\"false\">not json</P>\n</I>\n</B>";
        for (f, sp, block) in ALL_DSML {
            let o = Options { tools: tools.clone(), ..opts("<｜Assistant｜></think>") };
            let acc = parse_with(f, &o, &dsml(sp, block, body), FinishReason::Stop);
            assert_eq!(
                args(&acc, 0),
                json!({"count": 42, "flag": true, "name": "007", "other": "not json"})
            );
        }
    }

    #[test]
    fn dsml_string_values_typed_only_when_the_schema_rules_out_strings() {
        let tools = Tools(vec![ToolSpec::new("add")
            .param("x", &[JsonType::Integer])
            .param("y", &[JsonType::String, JsonType::Integer])
            .param("z", &[JsonType::Integer])]);
        let body = "<B>\n<I name=\"add\">\n<P name=\"x\" string=\"true\">3</P>\n<P name=\"y\" string=\"true\">4</P>\n<P name=\"z\" string=\"true\">many</P>\n</I>\n</B>";
        for (f, sp, block) in ALL_DSML {
            let o = Options { tools: tools.clone(), ..opts("<｜Assistant｜></think>") };
            let acc = parse_with(f, &o, &dsml(sp, block, body), FinishReason::Stop);
            assert_eq!(args(&acc, 0), json!({"x": 3, "y": "4", "z": "many"}));
        }
    }

    #[test]
    fn dsml_marker_text_inside_a_value_is_kept() {
        for (f, sp, block) in ALL_DSML {
            let inner = dsml(sp, block, "Use <B> and <I name=\"x\"> and </I></B>");
            let text = dsml(
                sp,
                block,
                &format!(
                    "<B>\n<I name=\"echo\">\n<P name=\"t\" string=\"true\">{inner}</P>\n</I>\n</B>"
                ),
            );
            let acc = parse(f, &text);
            assert_eq!(args(&acc, 0), json!({"t": inner}));
            assert_eq!(acc.content, "");
        }
    }

    #[test]
    fn dsml_truncation_and_duplicates() {
        let o = opts("<｜Assistant｜></think>");
        for (f, sp, block) in ALL_DSML {
            let text = dsml(sp, block, "<B>\n<I name=\"a\">\n<P name=\"q\" string=\"true\">x</P>\n</I>\n<I name=\"b\">\n<P name=\"q\" string=\"true\">partial");
            let acc = parse_with(f, &o, &text, FinishReason::Length);
            assert_eq!(names(&acc), ["a"]);
            assert_eq!(acc.content, "");
            let dup = dsml(sp, block, "<B>\n<I name=\"a\">\n<P name=\"q\" string=\"true\">x</P>\n<P name=\"q\" string=\"true\">y</P>\n</I>\n</B>");
            let acc = parse(f, &dup);
            assert!(acc.calls.is_empty());
            assert_eq!(acc.content, dup.trim());
        }
    }

    #[test]
    fn dsml_json_body_and_missing_block_close() {
        for (f, sp, block) in ALL_DSML {
            let text = dsml(sp, block, "<B>\n<I name=\"a\">\n{\"x\": \"</I>\"}\n</I>\nAll done.");
            let acc = parse(f, &text);
            assert_eq!(names(&acc), ["a"]);
            assert_eq!(args(&acc, 0), json!({"x": dsml(sp, block, "</I>")}));
            assert_eq!(acc.content, "All done.");
        }
    }

    #[test]
    fn dsml_reasoning_start_states() {
        for (f, sp, block) in ALL_DSML {
            let body = dsml(sp, block, "Think.</think>Answer.\n\n<B>\n<I name=\"a\">\n</I>\n</B>");
            let acc = parse_with(f, &opts("<｜Assistant｜><think>"), &body, FinishReason::Stop);
            assert_eq!((acc.reasoning.as_str(), acc.content.as_str()), ("Think.", "Answer."));
            assert_eq!(names(&acc), ["a"]);
            // A block that starts inside reasoning ends it.
            let body = dsml(sp, block, "Think.\n\n<B>\n<I name=\"a\">\n</I>\n</B>");
            let acc = parse_with(f, &opts("<｜Assistant｜><think>"), &body, FinishReason::Stop);
            assert_eq!(acc.reasoning, "Think.");
            assert_eq!(names(&acc), ["a"]);
            // Truncated while thinking: reasoning only.
            let acc =
                parse_with(f, &opts("<｜Assistant｜><think>"), "Still thin", FinishReason::Length);
            assert_eq!((acc.reasoning.as_str(), acc.content.as_str()), ("Still thin", ""));
        }
    }

    #[test]
    fn dsml_formats_also_read_v31_calls() {
        let text = "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        for (f, _, _) in ALL_DSML {
            let acc = parse(f, text);
            assert_eq!(acc.content, "Sure.");
            assert_eq!(names(&acc), ["f"]);
        }
    }

    #[test]
    fn stray_turn_tokens_are_stripped() {
        let acc = parse(Format::DeepSeekV32, "Hi.<｜end▁of▁sentence｜>");
        assert_eq!(acc.content, "Hi.");
        let acc = parse(Format::DeepSeekV3, "</think>Hi.<｜tool▁calls▁end｜>");
        assert_eq!(acc.content, "Hi.");
    }

    #[test]
    fn buffer_cap_turns_a_huge_call_into_content() {
        let o = Options { buffer_cap: 64, ..opts("<｜Assistant｜></think>") };
        let long = "x".repeat(200);
        let text = format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{{\"a\": \"{long}\"}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let deltas: Vec<&str> = chars.iter().map(String::as_str).collect();
        let acc = feed(Format::DeepSeekV31, &o, &deltas, FinishReason::Stop);
        assert!(acc.calls.is_empty());
        assert!(acc.content.contains(&long));
    }

    #[test]
    fn long_arguments_char_by_char_stay_linear() {
        let long = "ab<c> é\n".repeat(20_000);
        let o = opts("<｜Assistant｜></think>");
        for (f, sp, block) in ALL_DSML {
            let text = dsml(
                sp,
                block,
                &format!(
                    "<B>\n<I name=\"w\">\n<P name=\"c\" string=\"true\">{long}</P>\n</I>\n</B>"
                ),
            );
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let deltas: Vec<&str> = chars.iter().map(String::as_str).collect();
            let t = std::time::Instant::now();
            let acc = feed(f, &o, &deltas, FinishReason::Stop);
            assert!(t.elapsed().as_secs() < 10);
            assert_eq!(args(&acc, 0), json!({"c": long}));
        }
        let json_long = serde_json::to_string(&long).unwrap_or_default();
        let text = format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>w\n```json\n{{\"c\": {json_long}}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let deltas: Vec<&str> = chars.iter().map(String::as_str).collect();
        let acc = feed(Format::DeepSeekV3, &o, &deltas, FinishReason::Stop);
        assert_eq!(args(&acc, 0), json!({"c": long}));
    }
    #[test]
    fn random_markup_never_panics_and_ignores_splits() {
        const PIECES: [&str; 30] = [
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>",
            "function",
            "f",
            "\n```json\n",
            "```",
            "{\"a\": ",
            "\"x}\"",
            "1}",
            "}",
            "{",
            " ",
            "\n",
            "<think>",
            "</think>",
            "<｜DSML｜function_calls>",
            "</｜DSML｜function_calls>",
            "<｜DSML｜ invoke name=\"g\">",
            "</｜DSML｜invoke>",
            "<｜DSML｜parameter name=\"p\" string=\"true\">",
            "</｜DSML｜parameter>",
            "<｜DSML｜invoke name=\"h\">",
            "<｜DSML｜ parameter name=\"q\">",
            "</｜DSML｜ parameter>",
            "é🌸",
            "<｜end▁of▁sentence｜>",
            "<｜DSML",
        ];
        let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |hi: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % hi as u64) as usize
        };
        let formats = [
            Format::DeepSeekV3,
            Format::DeepSeekV31,
            Format::DeepSeekV32,
            Format::DeepSeekV4,
            Format::DeepSeekV41,
        ];
        for round in 0..300 {
            let n = 1 + next(14);
            let text: String = (0..n).map(|_| PIECES[next(PIECES.len())]).collect();
            let f = formats[round % formats.len()];
            let reason = if round % 2 == 0 { FinishReason::Stop } else { FinishReason::Length };
            let gen = if round % 3 == 0 {
                "<｜Assistant｜><think>"
            } else {
                "<｜Assistant｜></think>"
            };
            let acc = parse_with(f, &opts(gen), &text, reason);
            for c in &acc.calls {
                assert!(crate::json::strict_object(&c.arguments).is_ok(), "{text:?}");
            }
            let sup = Options { mode: Mode::Suppress, ..opts(gen) };
            let s = parse_with(f, &sup, &text, reason);
            assert_eq!(s.discarded, acc.calls, "{text:?}");
        }
    }
}
