//! One state machine per format. The driver ([`crate::Parser`]) keeps the
//! unconsumed text; a machine looks at it, reports what it decided through
//! [`Cx`], and says how much it consumed.
//!
//! INVARIANT: a machine decides only on text it has seen in full. When the
//! decision depends on text that has not arrived, it consumes nothing (or
//! only the part that is already certain) and waits. At the end (`end` is
//! `Some`), it consumes everything, and it is called once more with empty
//! input so it can close what is open.

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
}
