//! Placeholder: all text is content until this format's parser lands.

use super::{Machine, Passthrough};
use crate::cx::Cx;
use crate::registry::Format;
use crate::{FinishReason, Options};

#[derive(Debug)]
pub(crate) struct DeepSeek(Passthrough);

impl DeepSeek {
    pub(crate) fn new(_format: Format, _opts: &Options) -> DeepSeek {
        DeepSeek(Passthrough)
    }
}

impl Machine for DeepSeek {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        self.0.step(input, end, cx)
    }
}
