//! One state machine per format. The driver ([`crate::Parser`]) keeps the
//! unconsumed text; a machine looks at it, reports what it decided through
//! [`Cx`], and answers with a [`Step`]: how much it consumed, that it moved
//! to another state without consuming, or that it must wait for more text.
//!
//! INVARIANT: a machine decides only on text it has seen in full. When the
//! decision depends on text that has not arrived, it consumes nothing (or
//! only the part that is already certain) and waits. At the end (`end` is
//! `Some`) it consumes everything; then it is stepped once more with empty
//! input, so it can close what is open, and answers [`Step::Wait`] when it
//! has nothing left to do.
//!
//! Progress is in the type: [`Step::Consumed`] holds a non-zero count, and a
//! [`Step::Transition`] must enter a state kind (a variant of
//! [`Machine::State`]) not visited since the last consumption. So between
//! two consumptions a machine passes through each kind at most once, and
//! the driver needs no other bound. A step that breaks this is a bug: the
//! driver hands the text to [`Machine::overflow`] (a debug build panics).
//!
//! The buffer cap ([`crate::Options::buffer_cap`]) is enforced by the driver,
//! the same way for every machine:
//!
//! - The *held region* is the text the machine has not decided yet: from a
//!   call's opening marker (or, outside a call, from the first byte it
//!   holds) to the end of what it has seen. [`Machine::held`] says how many
//!   of the bytes it consumed already belong to it (its most recent ones,
//!   verbatim; 0 when it holds nothing consumed).
//! - A step's `input` is a window: the unconsumed text up to `cap` bytes
//!   past the start of the held region (cut back to a char boundary). When
//!   the window stops short of the text, `end` is `None` even at the end of
//!   the text, so a machine can never look past the cap, nor accept a call
//!   whose end lies beyond it. The window always ends at or before the cap
//!   boundary of any region that starts inside it, so a machine may open a
//!   call and go on inside it in the same step.
//! - When a machine waits on a window cut by the cap, the driver calls
//!   [`Machine::overflow`] with the region's first `cap` bytes (held bytes,
//!   then the window); the machine reports them (normally
//!   [`Cx::malformed`]) and goes back to its content state holding nothing.
//!   The driver then goes on after them.
//!
//! Machines therefore never check the cap themselves, and their buffers are
//! bounded by what they have been shown: O(cap).

mod cursor;
mod deepseek;
mod deepseek_dsml;
mod deepseek_v3;
mod gemma4;
mod glm;
mod gpt_oss;
mod hermes;
mod keyed;
mod kimi_k2;
mod kimi_k3;
mod llama3_json;
mod llama4_pythonic;
mod mistral;
mod python;
mod qwen3_xml;
#[cfg(test)]
mod testing;

use crate::cx::Cx;
use crate::grammar::{CallGrammar, GrammarTool, Special};
use crate::registry::Format;
use crate::scan::{find_first, Find, Prefix};
use crate::{FinishReason, Options};
use std::num::NonZeroUsize;

/// What one step of a machine decided, in the manner of httparse's
/// `Status`: each answer has one meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Step {
    /// The first `n` bytes of the input (a char boundary) are decided.
    Consumed(NonZeroUsize),
    /// The machine moved to another kind of state without consuming; the
    /// driver steps it again on the same input.
    Transition,
    /// Nothing more can be decided on this input: without `end`, the
    /// machine needs more text; with `end`, it is done (its input is empty).
    Wait,
}

impl Step {
    /// The input before `safe` is decided (`safe` > 0), or nothing is yet
    /// (`safe` = 0: wait). For scans that report how far the text is safe.
    pub(crate) fn up_to(safe: usize) -> Step {
        NonZeroUsize::new(safe).map_or(Step::Wait, Step::Consumed)
    }

    /// The machine moved to another state after consuming `n` bytes (which
    /// may be none: then it is a transition).
    pub(crate) fn moved(n: usize) -> Step {
        NonZeroUsize::new(n).map_or(Step::Transition, Step::Consumed)
    }

    /// Consumed `n` bytes, where `n` > 0 is known from the grammar (a marker
    /// or a value was read). `n` = 0 would be a bug: it is a transition
    /// then, which the driver checks.
    pub(crate) fn took(n: usize) -> Step {
        debug_assert!(n > 0, "a step that read markup consumed nothing");
        NonZeroUsize::new(n).map_or(Step::Transition, Step::Consumed)
    }
}

/// A format's state machine.
pub(crate) trait Machine: Send + std::fmt::Debug {
    /// The machine's state: one variant per kind, each holding the data
    /// that only it needs.
    type State;

    /// The current state (the driver checks that transitions change its kind).
    fn state(&self) -> &Self::State;

    /// Looks at `input` (the text not consumed yet, a window of it), reports
    /// events and says what it decided.
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step;

    /// How many of the bytes consumed so far (the most recent ones) belong
    /// to the held region: the open call's markup from its opening marker,
    /// verbatim. 0 when nothing consumed is held (text waited on without
    /// consuming it counts from the start of the input).
    fn held(&self) -> usize;

    /// The held region outgrew the cap: `text` is its first `cap` bytes (the
    /// held bytes, then unconsumed text). Report it (normally as malformed
    /// markup, which drops an open call) and go back to the content state,
    /// holding nothing; the text after it is stepped next.
    fn overflow(&mut self, text: &str, cx: &mut Cx);
}

/// The machine for `format`, in the driver that feeds it.
pub(crate) fn machine_for(format: Format, opts: &Options) -> Box<dyn crate::Drive> {
    use crate::Driver;
    match format {
        Format::Hermes => Driver::boxed(hermes::Hermes::new(opts), opts),
        Format::Qwen3Xml => Driver::boxed(qwen3_xml::Qwen3Xml::new(opts), opts),
        Format::Llama3Json => Driver::boxed(llama3_json::Llama3Json::new(opts), opts),
        Format::Llama4Pythonic => Driver::boxed(llama4_pythonic::Llama4Pythonic::new(opts), opts),
        Format::Mistral => Driver::boxed(mistral::Mistral::new(opts), opts),
        Format::DeepSeekV3
        | Format::DeepSeekV31
        | Format::DeepSeekV32
        | Format::DeepSeekV4
        | Format::DeepSeekV41 => Driver::boxed(deepseek::DeepSeek::new(format, opts), opts),
        Format::GptOss => Driver::boxed(gpt_oss::GptOss::new(opts), opts),
        Format::Glm45 | Format::Glm47 => Driver::boxed(glm::Glm::new(format, opts), opts),
        Format::KimiK2 => Driver::boxed(kimi_k2::KimiK2::new(opts), opts),
        Format::KimiK3 => Driver::boxed(kimi_k3::KimiK3::new(opts), opts),
        Format::Gemma4 => Driver::boxed(gemma4::Gemma4::new(opts), opts),
    }
}

/// The grammar of calls to `tools` in `format` ([`Format::call_grammar`]);
/// each format's file writes its own.
pub(crate) fn call_grammar(
    format: Format,
    tools: &[GrammarTool<'_>],
    special: Special<'_>,
) -> Option<CallGrammar> {
    if tools.is_empty() {
        return None;
    }
    match format {
        Format::Hermes => hermes::grammar(tools, special),
        Format::Qwen3Xml => qwen3_xml::grammar(tools, special),
        Format::Llama3Json => llama3_json::grammar(tools, special),
        Format::Llama4Pythonic => llama4_pythonic::grammar(tools, special),
        Format::Mistral => mistral::grammar(tools, special),
        Format::DeepSeekV3 | Format::DeepSeekV31 => deepseek::grammar(format, tools, special),
        Format::DeepSeekV32 | Format::DeepSeekV4 | Format::DeepSeekV41 => {
            deepseek_dsml::grammar(format, tools, special)
        }
        Format::GptOss => gpt_oss::grammar(tools, special),
        Format::Glm45 | Format::Glm47 => glm::grammar(format, tools, special),
        Format::KimiK2 => kimi_k2::grammar(tools, special),
        Format::KimiK3 => kimi_k3::grammar(tools, special),
        Format::Gemma4 => gemma4::grammar(tools, special),
    }
}

/// The text a model of `format` writes for `calls`
/// ([`Format::write_calls`]); each format's file writes its own markup.
pub(crate) fn write_calls(format: Format, calls: &[(&str, &serde_json::Value)]) -> String {
    match format {
        Format::Hermes => hermes::write(calls),
        Format::Qwen3Xml => qwen3_xml::write(calls),
        Format::Llama3Json => llama3_json::write(calls),
        Format::Llama4Pythonic => llama4_pythonic::write(calls),
        Format::Mistral => mistral::write(calls),
        Format::DeepSeekV3 | Format::DeepSeekV31 => deepseek::write(format, calls),
        Format::DeepSeekV32 | Format::DeepSeekV4 | Format::DeepSeekV41 => {
            deepseek_dsml::write(format, calls)
        }
        Format::GptOss => gpt_oss::write(calls),
        Format::Glm45 | Format::Glm47 => glm::write(format, calls),
        Format::KimiK2 => kimi_k2::write(calls),
        Format::KimiK3 => kimi_k3::write(calls),
        Format::Gemma4 => gemma4::write(calls),
    }
}

/// What a marker met in running text (content or reasoning) turns out to
/// be; [`text_step`] consumes by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtMarker {
    /// Markup: the step consumes through it, and none of it shows.
    Markup,
    /// Text after all: it is emitted like the text before it, and the step
    /// consumes through it.
    Text,
    /// Undecided until more text arrives: the step consumes only the text
    /// before it.
    Wait,
    /// The state the machine moved to reads it: the step consumes only the
    /// text before it.
    Reread,
}

/// What running text between markup is shown as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shown {
    Content,
    Reasoning,
    /// Nothing: text between markers that is itself markup (inside a Kimi
    /// K2 tool section).
    Dropped,
}

impl Shown {
    /// Reports `text` as what it is shown as.
    pub(crate) fn emit(self, cx: &mut Cx, text: &str) {
        match self {
            Shown::Content => cx.content(text),
            Shown::Reasoning => cx.reasoning(text),
            Shown::Dropped => {}
        }
    }
}

impl AtMarker {
    /// A call opener met inside reasoning, which opens a call only when the
    /// call's markup follows it (`ahead` says whether it does): then `open`
    /// enters the call and the opener is markup; with no call it is
    /// reasoning text; undecided, it waits.
    pub(crate) fn opener_in_reasoning(ahead: Prefix, open: impl FnOnce()) -> AtMarker {
        match ahead {
            Prefix::Yes => {
                open();
                AtMarker::Markup
            }
            Prefix::No => AtMarker::Text,
            Prefix::NeedMore => AtMarker::Wait,
        }
    }
}

/// One step through running text that stops at the first of `markers`, the
/// loop every machine runs outside its calls: the text before the marker is
/// emitted as `shown`, and `at_marker`, given the marker and the text after
/// it, says what the marker is (moving the machine where it leads). With no
/// marker in sight the step emits and consumes the text that is safe,
/// holding back what may be the start of a marker.
pub(crate) fn text_step<'m>(
    input: &str,
    markers: &[&'m str],
    eof: bool,
    cx: &mut Cx,
    shown: Shown,
    at_marker: impl FnOnce(&'m str, &str) -> AtMarker,
) -> Step {
    match find_first(input, markers, eof) {
        Find::Found { at, idx } => {
            let marker = markers[idx];
            shown.emit(cx, &input[..at]);
            let past = at + marker.len();
            match at_marker(marker, &input[past..]) {
                AtMarker::Markup => Step::took(past),
                AtMarker::Text => {
                    shown.emit(cx, marker);
                    Step::took(past)
                }
                AtMarker::Wait => Step::up_to(at),
                AtMarker::Reread => Step::moved(at),
            }
        }
        Find::Clear { safe } => {
            shown.emit(cx, &input[..safe]);
            Step::up_to(safe)
        }
    }
}

/// Opens the plain-text reasoning block of Hermes, Qwen3, GLM, Kimi K2,
/// DeepSeek and Magistral: `<think>` … `</think>`.
pub(crate) const THINK: &str = "<think>";
/// Closes the plain-text reasoning block.
pub(crate) const UNTHINK: &str = "</think>";

/// Whether the text starts inside a `<think>` block: the generation prompt
/// ends inside one.
pub(crate) fn prompt_thinks(opts: &Options) -> bool {
    prompt_opens(opts.generation_prompt.as_deref(), THINK, UNTHINK)
}

/// Whether a generation prompt leaves the model inside a reasoning block:
/// its last `open` tag comes after its last `close` tag.
pub(crate) fn prompt_opens(gen: Option<&str>, open: &str, close: &str) -> bool {
    let Some(gen) = gen else { return false };
    match (gen.rfind(open), gen.rfind(close)) {
        (Some(o), Some(c)) => o > c,
        (Some(_), None) => true,
        _ => false,
    }
}
