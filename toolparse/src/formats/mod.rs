//! One state machine per format. The driver ([`crate::Parser`]) keeps the
//! unconsumed text; a machine looks at it, reports what it decided through
//! [`Cx`], and says how much it consumed.
//!
//! INVARIANT: a machine decides only on text it has seen in full. When the
//! decision depends on text that has not arrived, it consumes nothing (or
//! only the part that is already certain) and waits. At the end (`end` is
//! `Some`), it consumes everything, and it is called once more with empty
//! input so it can close what is open.
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
//! - When a machine cannot go on with a window cut by the cap (it returns 0
//!   and its state stays put), the driver calls [`Machine::overflow`] with
//!   the region's first `cap` bytes (held bytes, then the window); the
//!   machine reports them (normally [`Cx::malformed`]) and goes back to its
//!   content state holding nothing. The driver then goes on after them.
//!
//! Machines therefore never check the cap themselves, and their buffers are
//! bounded by what they have been shown: O(cap).
//!
//! Returning 0 without `end` asks for more text and must leave the machine
//! as it was; a machine that changes state without consuming goes on in the
//! new state within the same step. Where waiting is not possible (at the end,
//! or with a window cut by the cap), the driver steps a machine again as long
//! as its state keeps changing (with a bound), so a step that only changed
//! state loses no text.

mod deepseek;
mod gemma4;
mod glm;
mod gpt_oss;
mod hermes;
mod kimi;
mod llama;
mod mistral;
mod qwen3_xml;

use crate::cx::Cx;
use crate::registry::Format;
use crate::{FinishReason, Options};

/// A format's state machine.
pub(crate) trait Machine: Send + std::fmt::Debug {
    /// Looks at `input` (all text not consumed yet), reports events and
    /// returns how many bytes it consumed (a char boundary). Returning 0
    /// without `end` asks for more text.
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize;

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

pub(crate) fn machine_for(format: Format, opts: &Options) -> Box<dyn Machine> {
    match format {
        Format::Hermes => Box::new(hermes::Hermes::new(opts)),
        Format::Qwen3Xml => Box::new(qwen3_xml::Qwen3Xml::new(opts)),
        Format::Llama3Json => Box::new(llama::Llama3Json::new(opts)),
        Format::Llama4Pythonic => Box::new(llama::Llama4Pythonic::new(opts)),
        Format::Mistral => Box::new(mistral::Mistral::new(opts)),
        Format::DeepSeekV3
        | Format::DeepSeekV31
        | Format::DeepSeekV32
        | Format::DeepSeekV4
        | Format::DeepSeekV41 => Box::new(deepseek::DeepSeek::new(format, opts)),
        Format::GptOss => Box::new(gpt_oss::GptOss::new(opts)),
        Format::Glm45 | Format::Glm47 => Box::new(glm::Glm::new(format, opts)),
        Format::KimiK2 | Format::KimiK3 => Box::new(kimi::Kimi::new(format, opts)),
        Format::Gemma4 => Box::new(gemma4::Gemma4::new(opts)),
    }
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

/// A machine that treats all text as content; a placeholder for formats
/// whose parser is not written yet.
#[derive(Debug, Default)]
#[allow(dead_code)]
pub(crate) struct Passthrough;

impl Machine for Passthrough {
    fn step(&mut self, input: &str, _end: Option<FinishReason>, cx: &mut Cx) -> usize {
        cx.content(input);
        input.len()
    }

    fn held(&self) -> usize {
        0
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        cx.content(text);
    }
}
