//! DeepSeek V3 / R1 and V3.1 JSON calls (the text around them is
//! [`super::deepseek`]).
//!
//! V3 and R1 (the type, then the name, then fenced JSON):
//!
//! ````text
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
//! One grammar reads both: after `<｜tool▁sep｜>` the text up to the first
//! `{` is the name (V3: the header is the type `function` and a
//! ```` ```json ```` fence follows the name; V3.1: the header is the name and
//! nothing follows the separator). The end of the JSON is found by scanning
//! it, so marker text inside an argument string does not end a call; then an
//! optional closing fence and `<｜tool▁call▁end｜>` must follow. A call without
//! `<｜tool▁calls▁begin｜>` is accepted, and so is a block without
//! `<｜tool▁calls▁end｜>` (text after the last call is content again). R1
//! distill spellings of the block opener (`<｜tool_calls_begin｜>`, …) are
//! accepted too.

use super::deepseek::{self, call_done, fail, unfinished, Block, State, EOS, TAG_CAP};
use super::Step;
use crate::cx::Cx;
use crate::json::ValueEnd;
use crate::scan::{find_first, push_capped, Find};
use crate::FinishReason;

pub(super) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub(super) const CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub(super) const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub(super) const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

/// The block opener and the spellings of it seen from R1 distills.
pub(super) const OPENS: [&str; 5] = [
    CALLS_BEGIN,
    "<｜tool_calls_begin｜>",
    "<｜tool calls begin｜>",
    "<｜tool\\_calls\\_begin｜>",
    "<｜tool▁calls｜>",
];

/// Markers stripped where they show outside a block.
pub(super) const STRAY: [&str; 7] = [
    CALLS_END,
    CALL_END,
    SEP,
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
];

/// Between calls of a block.
pub(super) fn between(
    block: Block,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    let markers: (&[&str], &[&str]) = (&[CALL_BEGIN], &[CALLS_END, EOS]);
    deepseek::between(block, input, end, cx, markers, |block, _| State::V3Header {
        block,
        header: String::new(),
    })
}

/// Appends `text` to a bounded part of a call's markup (and to the markup
/// shown if it fails); `Err(k)`: the part outgrew [`TAG_CAP`] after
/// `text[..k]`.
fn take(block: &mut Block, part: &mut String, text: &str) -> Result<(), usize> {
    let r = push_capped(part, text, TAG_CAP);
    block.raw.push_str(&text[..r.err().unwrap_or(text.len())]);
    r
}

/// The header after `<｜tool▁call▁begin｜>`, up to `<｜tool▁sep｜>`.
pub(super) fn header(
    mut block: Block,
    mut header: String,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    let eof = end.is_some();
    match find_first(input, &[SEP, CALL_END, CALLS_END, CALL_BEGIN, EOS], eof) {
        Find::Found { at, idx } => {
            if let Err(k) = take(&mut block, &mut header, &input[..at]) {
                // As when waiting for it: too long, whatever the deltas.
                return (Step::moved(k), fail(block, cx));
            }
            if idx != 0 {
                return (Step::moved(at), fail(block, cx));
            }
            block.raw.push_str(SEP);
            let next = State::V3Name { block, header, between: String::new() };
            (Step::took(at + SEP.len()), next)
        }
        Find::Clear { safe } if eof => {
            block.raw.push_str(&input[..safe]);
            (Step::moved(safe), unfinished(block, end, cx))
        }
        Find::Clear { safe } => match take(&mut block, &mut header, &input[..safe]) {
            Err(k) => (Step::moved(k), fail(block, cx)),
            Ok(()) => (Step::up_to(safe), State::V3Header { block, header }),
        },
    }
}

/// The name (and fence) after `<｜tool▁sep｜>`, up to the JSON.
pub(super) fn name(
    mut block: Block,
    header: String,
    mut between: String,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    let eof = end.is_some();
    match find_first(input, &["{", CALL_END, CALLS_END, CALL_BEGIN, EOS], eof) {
        Find::Found { at, idx } => {
            if let Err(k) = take(&mut block, &mut between, &input[..at]) {
                return (Step::moved(k), fail(block, cx));
            }
            match (idx, call_name(&header, &between)) {
                (0, Some(name)) => {
                    cx.start_call(None, &name);
                    let json =
                        State::Json { block, json: String::new(), scan: ValueEnd::default() };
                    (Step::moved(at), json)
                }
                (1, Some(name)) => {
                    // No JSON at all: a call without arguments.
                    cx.call(None, &name, "{}".to_owned());
                    (Step::took(at + CALL_END.len()), call_done(block))
                }
                _ => (Step::moved(at), fail(block, cx)),
            }
        }
        Find::Clear { safe } if eof => {
            block.raw.push_str(&input[..safe]);
            (Step::moved(safe), unfinished(block, end, cx))
        }
        Find::Clear { safe } => match take(&mut block, &mut between, &input[..safe]) {
            Err(k) => (Step::moved(k), fail(block, cx)),
            Ok(()) => (Step::up_to(safe), State::V3Name { block, header, between }),
        },
    }
}

/// The function name of a call from the text before and after
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
