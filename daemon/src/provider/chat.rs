//! The one model-request interface every front and the research loop
//! use, whatever runs the model: a chat request's settings
//! ([`ChatParams`]), what streams back while it runs and how it ended
//! ([`ChatMsg`], [`ChatOutput`] with the provider's own [`TurnFinish`]),
//! and the rules a research turn adds (its settings). The
//! local engine, the OpenAI-compatible upstream and the research link all
//! speak it; the HTTP fronts import nothing of the engine.

use super::constrain::{Constraint, ToolChoice};
use super::{ProviderError, TurnFinish, TurnRequest};
use crate::events::Decode;
use crate::state::registry::SamplingKnobs;
use toolparse::Mode;

/// How tokens are drawn (temperature, top-k/p, penalties, seed): the
/// engine's settings type, named here so that fronts need not know the
/// engine.
pub(crate) use inference::Sampling;

/// What a chat request streams, then how it ended.
#[derive(Debug)]
pub(crate) enum ChatMsg {
    Event(toolparse::Event),
    Done(Result<ChatOutput, ProviderError>),
}

/// `base` with every knob `k` sets.
pub(crate) fn with_knobs(base: Sampling, k: &SamplingKnobs) -> Sampling {
    Sampling {
        temperature: k.temperature.unwrap_or(base.temperature),
        top_k: k.top_k.unwrap_or(base.top_k),
        top_p: k.top_p.unwrap_or(base.top_p),
        min_p: k.min_p.unwrap_or(base.min_p),
        repeat_penalty: k.repeat_penalty.unwrap_or(base.repeat_penalty),
        repeat_last_n: k.repeat_last_n.unwrap_or(base.repeat_last_n),
        frequency_penalty: k.frequency_penalty.unwrap_or(base.frequency_penalty),
        presence_penalty: k.presence_penalty.unwrap_or(base.presence_penalty),
        no_repeat_ngram: k.no_repeat_ngram.unwrap_or(base.no_repeat_ngram),
        seed: base.seed,
    }
}

/// Generation settings of one chat turn.
#[derive(Debug, Clone)]
pub(crate) struct ChatParams {
    pub(crate) max_tokens: usize,
    pub(crate) sampling: Sampling,
    pub(crate) stop: Vec<String>,
    /// Parse calls, or strip and discard them (no tools may run).
    pub(crate) mode: Mode,
    /// What the output must follow (JSON, enforced calls, no calls).
    pub(crate) constraint: Constraint,
    /// A tool whose schema the grammar cannot enforce is held only to being
    /// a JSON object instead of refusing the turn (the research loop, whose
    /// host checks every call; a client's request is refused instead).
    pub(crate) lenient: bool,
    /// A raw prompt sent as it is, without the chat template (control
    /// tokens written in it are parsed); the messages are then unused.
    pub(crate) raw: Option<String>,
    /// Tokens the model may reason for before the end of its reasoning is
    /// written for it (Anthropic's `thinking.budget_tokens`); `None`: as
    /// long as the token limit allows.
    pub(crate) reasoning_budget: Option<usize>,
}

/// What a chat turn produced, beside its events.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChatOutput {
    pub(crate) finish: TurnFinish,
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
    pub(crate) reused_tokens: usize,
    /// Which of the request's own stop strings (`ChatParams::stop`, by
    /// index) ended the reply, where one did and the backend knows.
    pub(crate) stop: Option<usize>,
    /// Its decoding, where the backend tells (the local engine).
    pub(crate) decode: Decode,
}

impl ChatOutput {
    /// A turn cancelled before it started.
    pub(crate) fn cancelled() -> ChatOutput {
        ChatOutput {
            finish: TurnFinish::Cancelled,
            prompt_tokens: 0,
            completion_tokens: 0,
            reused_tokens: 0,
            stop: None,
            decode: Decode::default(),
        }
    }
}

/// The chat settings of a research turn: tools parsed when offered, else
/// suppressed (the final turn may not call).
pub(crate) fn turn_params(sampling: &Sampling, req: &TurnRequest<'_>) -> ChatParams {
    ChatParams {
        max_tokens: req.max_tokens,
        sampling: sampling.clone(),
        stop: Vec::new(),
        mode: if req.tools.is_empty() { Mode::Suppress } else { Mode::Tools },
        // Research: a call the model starts is held to its tool's schema;
        // the final turn (no tools) cannot start one.
        constraint: if !req.choices.is_empty() {
            Constraint::OneOf(req.choices.to_vec())
        } else if req.tools.is_empty() {
            Constraint::NoCalls
        } else {
            Constraint::ToolCalls(ToolChoice::Auto)
        },
        lenient: true,
        raw: None,
        reasoning_budget: None,
    }
}
