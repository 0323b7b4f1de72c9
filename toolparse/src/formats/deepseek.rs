//! DeepSeek: the text around the calls, shared by every sub-format (V3 /
//! R1, V3.1, and the DSML of V3.2, V4 and V4.1), and the state machine that
//! joins it to the two call grammars: [`super::deepseek_v3`] (JSON calls)
//! and [`super::deepseek_dsml`] (DSML markup).
//!
//! ```text
//! <think>
//! The user wants the weather.
//! </think>
//!
//! Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! Reasoning is `<think>` … `</think>`; a generation prompt that ends inside
//! `<think>` starts the parser in reasoning. A call block that starts inside
//! reasoning ends it. Text around call blocks is content, verbatim; the
//! whitespace inside a block is markup. Markup that is not a valid call is
//! shown verbatim as content (stripped in suppress mode); stray turn tokens
//! are stripped. Every sub-format reads V3 / V3.1 calls: DSML models keep
//! those tokens (DeepSeek-V3.2-Exp wrote V3.1 calls).

use super::deepseek_dsml::{self as dsml, Style, PLAIN, SPACED};
use super::deepseek_v3::{self as v3, CALLS_END, CALL_BEGIN, CALL_END};
use super::keyed::KeyedCall;
use super::{prompt_thinks, Machine, Step, THINK, UNTHINK};
use crate::cx::Cx;
use crate::json::{self, Scan, ValueEnd};
use crate::registry::Format;
use crate::scan::{find_first, lead_any, starts_with, ws_len, Find, Lead, Prefix};
use crate::{DropReason, FinishReason, Options};

pub(super) const EOS: &str = "<｜end▁of▁sentence｜>";

/// Turn tokens of the chat template: never shown.
const TURN_TOKENS: [&str; 5] =
    [EOS, "<｜begin▁of▁sentence｜>", "<｜Assistant｜>", "<｜User｜>", "<｜System｜>"];

/// The longest name or tag text accepted before its terminator (bytes).
pub(super) const TAG_CAP: usize = 1024;

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

/// Which call grammar a block is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Grammar {
    V3,
    /// DSML, with the tag spelling of the invoke in progress.
    Dsml(Style),
}

/// A call block in progress.
#[derive(Debug)]
pub(crate) struct Block {
    /// The markup text of the call (or block opening) in progress, shown as
    /// content if it turns out malformed.
    pub(super) raw: String,
    /// Calls completed in this block.
    pub(super) calls: usize,
    pub(super) grammar: Grammar,
}

impl Block {
    fn new(marker: &str, grammar: Grammar) -> Block {
        Block { raw: marker.to_owned(), calls: 0, grammar }
    }
}

#[derive(Debug)]
pub(crate) enum State {
    Content,
    Reasoning,
    /// Broken markup inside a block: shown verbatim up to the block end
    /// (`calls`: those the block completed before).
    Junk {
        dsml: bool,
        calls: usize,
    },
    /// V3: inside a call block, between calls.
    V3Block(Block),
    /// V3: after `<｜tool▁call▁begin｜>`, the header up to `<｜tool▁sep｜>`.
    V3Header {
        block: Block,
        header: String,
    },
    /// V3: after `<｜tool▁sep｜>`, the name (and fence) up to the JSON.
    V3Name {
        block: Block,
        header: String,
        between: String,
    },
    /// JSON arguments (V3, or a DSML invoke body written as JSON): the text
    /// so far and the scan for its end.
    Json {
        block: Block,
        json: String,
        scan: ValueEnd,
    },
    /// After the JSON arguments: up to the call's close marker.
    Tail {
        block: Block,
        json: String,
    },
    /// DSML: inside a block, between invokes.
    DsmlBlock(Block),
    /// DSML: the attributes of an invoke tag so far.
    InvokeTag {
        block: Block,
        tag: String,
    },
    /// DSML: inside an invoke, between parameters.
    Body {
        block: Block,
        call: KeyedCall,
    },
    /// DSML: the attributes of a parameter tag so far.
    ParamTag {
        block: Block,
        call: KeyedCall,
        tag: String,
    },
    /// DSML: the value of parameter `key` so far (`string`: its
    /// `string="…"` attribute).
    Value {
        block: Block,
        call: KeyedCall,
        key: String,
        string: Option<bool>,
        value: String,
    },
}

#[derive(Debug)]
pub(crate) struct DeepSeek {
    state: State,
    content_markers: Markers,
    reasoning_markers: Markers,
}

impl DeepSeek {
    pub(crate) fn new(format: Format, opts: &Options) -> DeepSeek {
        let dsml = matches!(format, Format::DeepSeekV32 | Format::DeepSeekV4 | Format::DeepSeekV41);
        let mut starts: Vec<(&'static str, Act)> = Vec::new();
        let mut stray: Vec<(&'static str, Act)> = Vec::new();
        if dsml {
            starts.extend(dsml::OPENS.iter().map(|m| (*m, Act::DsmlBlock)));
            stray.push((PLAIN.invoke, Act::DsmlInvoke(PLAIN)));
            stray.push((SPACED.invoke, Act::DsmlInvoke(SPACED)));
            stray.extend(dsml::STRAY.iter().map(|m| (*m, Act::Strip)));
        }
        starts.extend(v3::OPENS.iter().map(|m| (*m, Act::V3Block)));
        stray.push((CALL_BEGIN, Act::V3Call));
        stray.extend(v3::STRAY.iter().map(|m| (*m, Act::Strip)));
        let turn: Vec<(&'static str, Act)> = TURN_TOKENS.iter().map(|m| (*m, Act::Strip)).collect();

        let mut content = vec![(THINK, Act::Think), (UNTHINK, Act::Strip)];
        content.extend(starts.iter().copied());
        content.extend(stray.iter().copied());
        content.extend(turn.iter().copied());
        let mut reasoning = vec![(UNTHINK, Act::Unthink), (THINK, Act::Strip)];
        reasoning.extend(starts.iter().copied());
        reasoning.extend(stray.iter().copied());
        reasoning.extend(turn.iter().copied());

        let state = if prompt_thinks(opts) { State::Reasoning } else { State::Content };
        DeepSeek {
            state,
            content_markers: Markers::new(content),
            reasoning_markers: Markers::new(reasoning),
        }
    }

    /// Visible text (content or reasoning) up to the next marker.
    fn text(&self, reasoning: bool, input: &str, eof: bool, cx: &mut Cx) -> (Step, State) {
        let markers = if reasoning { &self.reasoning_markers } else { &self.content_markers };
        let here = || if reasoning { State::Reasoning } else { State::Content };
        let emit = |cx: &mut Cx, s: &str| if reasoning { cx.reasoning(s) } else { cx.content(s) };
        match find_first(input, &markers.text, eof) {
            Find::Found { at, idx } => {
                let (marker, act) = (markers.text[idx], markers.act[idx]);
                emit(cx, &input[..at]);
                let next = match act {
                    Act::Think => State::Reasoning,
                    Act::Unthink => State::Content,
                    Act::Strip => here(),
                    Act::V3Block => State::V3Block(Block::new(marker, Grammar::V3)),
                    Act::V3Call => State::V3Header {
                        block: Block::new(marker, Grammar::V3),
                        header: String::new(),
                    },
                    Act::DsmlBlock => State::DsmlBlock(Block::new(marker, Grammar::Dsml(PLAIN))),
                    Act::DsmlInvoke(style) => State::InvokeTag {
                        block: Block::new(marker, Grammar::Dsml(style)),
                        tag: String::new(),
                    },
                };
                (Step::took(at + marker.len()), next)
            }
            Find::Clear { safe } => {
                emit(cx, &input[..safe]);
                (Step::up_to(safe), here())
            }
        }
    }
}

/// The markup so far is not a valid call: it is shown, and so is what
/// follows up to the end of the block.
pub(super) fn fail(block: Block, cx: &mut Cx) -> State {
    cx.malformed(&block.raw);
    State::Junk { dsml: matches!(block.grammar, Grammar::Dsml(_)), calls: block.calls }
}

/// The text ended inside a call (all of it is in the block's markup now):
/// cut by the token limit, nothing is kept; ended by a stop, the markup is
/// shown.
pub(super) fn unfinished(block: Block, end: Option<FinishReason>, cx: &mut Cx) -> State {
    if end == Some(FinishReason::Length) {
        cx.drop_call(DropReason::Truncated);
    } else {
        cx.malformed(&block.raw);
    }
    State::Content
}

/// A call is complete: back to the block, between calls.
pub(super) fn call_done(mut block: Block) -> State {
    block.calls += 1;
    block.raw.clear();
    in_block(block)
}

/// Between the calls of a block.
fn in_block(block: Block) -> State {
    match block.grammar {
        Grammar::V3 => State::V3Block(block),
        Grammar::Dsml(_) => State::DsmlBlock(block),
    }
}

/// Between the calls of a block, in either grammar: whitespace is markup,
/// a marker of `opens` starts a call (`open` gets its index), one of
/// `closes` ends the block. Other text ends a block that has calls (the
/// block close is missing: it is content again); in a block without calls
/// it is malformed markup.
pub(super) fn between(
    mut block: Block,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
    (opens, closes): (&[&str], &[&str]),
    open: impl FnOnce(Block, usize) -> State,
) -> (Step, State) {
    let eof = end.is_some();
    let ws = ws_len(input);
    if ws > 0 {
        block.raw.push_str(&input[..ws]);
        return (Step::took(ws), in_block(block));
    }
    if input.is_empty() {
        // Only the opener and whitespace: nothing to show.
        return if eof {
            (Step::Transition, State::Content)
        } else {
            (Step::Wait, in_block(block))
        };
    }
    let mut lits = opens.to_vec();
    lits.extend(closes);
    match lead_any(input, &lits, eof) {
        Lead::More => (Step::Wait, in_block(block)),
        Lead::Is(i) if i < opens.len() => {
            block.raw.push_str(opens[i]);
            (Step::took(opens[i].len()), open(block, i))
        }
        Lead::Is(i) => (Step::took(lits[i].len()), State::Content),
        Lead::No if block.calls == 0 => (Step::Transition, fail(block, cx)),
        Lead::No => (Step::Transition, State::Content),
    }
}

/// The markers that end a run of broken markup.
fn junk_ends(dsml: bool) -> Vec<&'static str> {
    if dsml {
        let mut v = dsml::CLOSES.to_vec();
        v.extend([PLAIN.invoke, SPACED.invoke, EOS]);
        v
    } else {
        vec![CALLS_END, CALL_BEGIN, EOS]
    }
}

fn junk(dsml: bool, calls: usize, input: &str, eof: bool, cx: &mut Cx) -> (Step, State) {
    let ends = junk_ends(dsml);
    match find_first(input, &ends, eof) {
        Find::Found { at, idx } => {
            let m = ends[idx];
            if m == EOS {
                cx.malformed(&input[..at]);
                (Step::took(at + m.len()), State::Content)
            } else if m == CALL_BEGIN || m == PLAIN.invoke || m == SPACED.invoke {
                cx.malformed(&input[..at]);
                let grammar = if dsml { Grammar::Dsml(PLAIN) } else { Grammar::V3 };
                (Step::moved(at), in_block(Block { raw: String::new(), calls, grammar }))
            } else {
                let used = at + m.len();
                cx.malformed(&input[..used]);
                (Step::took(used), State::Content)
            }
        }
        Find::Clear { safe } => {
            cx.malformed(&input[..safe]);
            (Step::up_to(safe), State::Junk { dsml, calls })
        }
    }
}

/// JSON arguments: their end is found by scanning JSON, so marker text in a
/// string does not end them.
fn json_args(
    mut block: Block,
    mut json: String,
    mut scan: ValueEnd,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    let old = json.len();
    json.push_str(input);
    match scan.scan(&json) {
        Scan::Done(e) => {
            let take = e.saturating_sub(old).min(input.len());
            json.truncate(old + take);
            block.raw.push_str(&input[..take]);
            cx.call_args(&input[..take]);
            (Step::moved(take), State::Tail { block, json })
        }
        Scan::Partial => {
            block.raw.push_str(input);
            cx.call_args(input);
            if end.is_some() {
                return (Step::moved(input.len()), unfinished(block, end, cx));
            }
            (Step::up_to(input.len()), State::Json { block, json, scan })
        }
        Scan::Invalid => (Step::Transition, fail(block, cx)),
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

/// After the JSON arguments: the close marker.
fn tail(
    mut block: Block,
    json: String,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    let eof = end.is_some();
    let (close, fence) = match block.grammar {
        Grammar::V3 => (CALL_END, true),
        Grammar::Dsml(style) => (style.invoke_close, false),
    };
    match close_after_json(input, fence, close, eof) {
        Close::At(n) => {
            block.raw.push_str(&input[..n]);
            match json::object_text(&json) {
                Ok(args) => {
                    cx.end_call(args);
                    (Step::took(n), call_done(block))
                }
                // The call closed but its arguments are not an object.
                Err(_) => (Step::took(n), fail(block, cx)),
            }
        }
        Close::Need => (Step::Wait, State::Tail { block, json }),
        Close::Bad if eof && input.trim().trim_matches('`').trim().is_empty() => {
            block.raw.push_str(input);
            (Step::moved(input.len()), unfinished(block, end, cx))
        }
        Close::Bad => (Step::Transition, fail(block, cx)),
    }
}

impl Machine for DeepSeek {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        let state = std::mem::replace(&mut self.state, State::Content);
        let (step, next) = match state {
            State::Content => self.text(false, input, eof, cx),
            State::Reasoning => self.text(true, input, eof, cx),
            State::Junk { dsml, calls } => junk(dsml, calls, input, eof, cx),
            State::V3Block(block) => v3::between(block, input, end, cx),
            State::V3Header { block, header } => v3::header(block, header, input, end, cx),
            State::V3Name { block, header, between } => {
                v3::name(block, header, between, input, end, cx)
            }
            State::Json { block, json, scan } => json_args(block, json, scan, input, end, cx),
            State::Tail { block, json } => tail(block, json, input, end, cx),
            State::DsmlBlock(block) => dsml::between(block, input, end, cx),
            State::InvokeTag { block, tag } => dsml::invoke_tag(block, tag, input, end, cx),
            State::Body { block, call } => dsml::body(block, call, input, end, cx),
            State::ParamTag { block, call, tag } => {
                dsml::param_tag(block, call, tag, input, end, cx)
            }
            State::Value { block, call, key, string, value } => {
                dsml::value(block, call, key, string, value, input, end, cx)
            }
        };
        self.state = next;
        step
    }

    fn held(&self) -> usize {
        match &self.state {
            State::Content | State::Reasoning | State::Junk { .. } => 0,
            State::V3Block(block)
            | State::DsmlBlock(block)
            | State::V3Header { block, .. }
            | State::V3Name { block, .. }
            | State::Json { block, .. }
            | State::Tail { block, .. }
            | State::InvokeTag { block, .. }
            | State::Body { block, .. }
            | State::ParamTag { block, .. }
            | State::Value { block, .. } => block.raw.len(),
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        cx.malformed(text);
        self.state = State::Content;
    }
}
/// The grammar of calls in this format (see `grammar.rs`): a block of
/// calls as the chat template writes it, `<｜tool▁calls▁begin｜>` … `<｜tool▁calls▁end｜>`
/// (the lazy trigger is the block opener). V3 / R1: each call is the type
/// `function`, the name and the arguments in a ```` ```json ```` fence,
/// calls separated by a newline; V3.1: the name, then the bare arguments.
pub(crate) fn grammar(
    format: Format,
    tools: &[crate::grammar::GrammarTool<'_>],
    special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use crate::grammar::{alternatives, args_json, lit};
    let (begin, sep, end) = (special(CALL_BEGIN), special("<｜tool▁sep｜>"), special(CALL_END));
    let mut rules = if format == Format::DeepSeekV3 {
        let (open, close) = (lit("\n```json\n"), lit("\n```"));
        let function = lit("function");
        alternatives(tools, |_, t| {
            format!(
                "{begin} {function} {sep} {} {open} {} {close} {end}",
                lit(t.name),
                args_json(t)
            )
        })
    } else {
        alternatives(tools, |_, t| format!("{begin} {} {sep} {} {end}", lit(t.name), args_json(t)))
    };
    let (open, close) = (special(v3::CALLS_BEGIN), special(CALLS_END));
    rules.push_str("NL: /[ \\n]{1,2}/\n");
    rules.push_str(&format!("one: {open} fn {close}\n"));
    rules.push_str(&format!("calls: {open} body\n"));
    rules.push_str(&format!("body: fn (NL? fn)* {close}\n"));
    Some(crate::grammar::CallGrammar { rules, opener: v3::CALLS_BEGIN.to_owned() })
}

/// Calls as DeepSeek V3 / R1 and V3.1 write them (what [`grammar`]
/// generates): `<｜tool▁calls▁begin｜>`, each call, `<｜tool▁calls▁end｜>`.
/// V3: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`,
/// the calls separated by a newline; V3.1:
/// `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`, one after
/// the other.
pub(crate) fn write(format: Format, calls: &[(&str, &serde_json::Value)]) -> String {
    let v3 = format == Format::DeepSeekV3;
    let calls: Vec<String> = calls
        .iter()
        .map(|(name, args)| {
            if v3 {
                format!("{CALL_BEGIN}function<｜tool▁sep｜>{name}\n```json\n{args}\n```{CALL_END}")
            } else {
                format!("{CALL_BEGIN}{name}<｜tool▁sep｜>{args}{CALL_END}")
            }
        })
        .collect();
    format!("{}{}{CALLS_END}", v3::CALLS_BEGIN, calls.join(if v3 { "\n" } else { "" }))
}

#[cfg(test)]
mod tests {
    use crate::{Accumulator, FinishReason, Format, Options, Parser};
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

    fn args(acc: &Accumulator, i: usize) -> Value {
        serde_json::from_str(&acc.calls[i].arguments).expect("arguments are JSON")
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
            let (acc, work) =
                crate::scan::work::measure(|| feed(f, &o, &deltas, FinishReason::Stop));
            assert!(
                work <= 4 * text.len() as u64,
                "{f:?}: {work} bytes scanned for {}",
                text.len()
            );
            assert_eq!(args(&acc, 0), json!({"c": long}));
        }
        let json_long = serde_json::to_string(&long).unwrap_or_default();
        let text = format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>w\n```json\n{{\"c\": {json_long}}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let deltas: Vec<&str> = chars.iter().map(String::as_str).collect();
        let (acc, work) = crate::scan::work::measure(|| {
            feed(Format::DeepSeekV3, &o, &deltas, FinishReason::Stop)
        });
        assert!(work <= 4 * text.len() as u64, "{work} bytes scanned for {}", text.len());
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
        for f in [
            Format::DeepSeekV3,
            Format::DeepSeekV31,
            Format::DeepSeekV32,
            Format::DeepSeekV4,
            Format::DeepSeekV41,
        ] {
            let prompts = [Some("<｜Assistant｜><think>"), Some("<｜Assistant｜></think>")];
            let opts = |gen: Option<&str>| opts(gen.unwrap_or_default());
            crate::formats::testing::random_markup(f, &PIECES, &prompts, &opts, 60, 14);
        }
    }
}
