//! Placeholder: all text is content until this format's parser lands.

use super::{Machine, Passthrough};
use crate::cx::Cx;
use crate::{FinishReason, Options};

#[derive(Debug)]
pub(crate) struct Llama3Json(Passthrough);

impl Llama3Json {
    pub(crate) fn new(_opts: &Options) -> Llama3Json {
        Llama3Json(Passthrough)
    }
}

impl Machine for Llama3Json {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        self.0.step(input, end, cx)
    }
}

#[derive(Debug)]
pub(crate) struct Llama4Pythonic(Passthrough);

impl Llama4Pythonic {
    pub(crate) fn new(_opts: &Options) -> Llama4Pythonic {
        Llama4Pythonic(Passthrough)
    }
}

impl Machine for Llama4Pythonic {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        self.0.step(input, end, cx)
    }
}
