//! Placeholder: all text is content until this format's parser lands.

use super::{Machine, Passthrough};
use crate::cx::Cx;

use crate::{FinishReason, Options};

#[derive(Debug)]
pub(crate) struct Qwen3Xml(Passthrough);

impl Qwen3Xml {
    pub(crate) fn new(_opts: &Options) -> Qwen3Xml {
        Qwen3Xml(Passthrough)
    }
}

impl Machine for Qwen3Xml {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        self.0.step(input, end, cx)
    }
}
