//! Placeholder: all text is content until this format's parser lands.

use super::{Machine, Passthrough};
use crate::cx::Cx;

use crate::{FinishReason, Options};

#[derive(Debug)]
pub(crate) struct Gemma4(Passthrough);

impl Gemma4 {
    pub(crate) fn new(_opts: &Options) -> Gemma4 {
        Gemma4(Passthrough)
    }
}

impl Machine for Gemma4 {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        self.0.step(input, end, cx)
    }
}
