//! Placeholder: all text is content until this format's parser lands.

use super::{Machine, Passthrough};
use crate::cx::Cx;

use crate::{FinishReason, Options};

#[derive(Debug)]
pub(crate) struct Mistral(Passthrough);

impl Mistral {
    pub(crate) fn new(_opts: &Options) -> Mistral {
        Mistral(Passthrough)
    }
}

impl Machine for Mistral {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        self.0.step(input, end, cx)
    }
}
