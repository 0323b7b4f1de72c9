//! Placeholder: all text is content until this format's parser lands.

use super::{Machine, Passthrough};
use crate::cx::Cx;
use crate::registry::Format;
use crate::{FinishReason, Options};

#[derive(Debug)]
pub(crate) struct Glm(Passthrough);

impl Glm {
    pub(crate) fn new(_format: Format, _opts: &Options) -> Glm {
        Glm(Passthrough)
    }
}

impl Machine for Glm {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        self.0.step(input, end, cx)
    }
}
