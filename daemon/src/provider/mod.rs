//! Model providers behind one interface (`Provider`): `local` (a GGUF
//! through `inference`), `openai` (any OpenAI-compatible server) and
//! `scripted` (turns from a file, for tests); `upstream` is what `serve`
//! needs besides when generation runs on an `openai` upstream (forwarded
//! chat completions, probes, the in-flight bound); `build` makes the one an
//! ENGINE option set names. The research loop sees one stream of events
//! whatever runs the model, and every failure comes back as a
//! `ProviderError` that names its owner — a refusal by the run's own
//! allowance included.

pub(crate) mod build;
pub(crate) mod chat;
pub(crate) mod constrain;
pub(crate) mod engine;
pub(crate) mod local;
pub(crate) mod openai;
pub(crate) mod scripted;
pub(crate) mod upstream;

use crate::events::Phase;
use prompts::{Message, ToolDef};
use std::sync::atomic::AtomicBool;
use toolparse::{ToolSpec, Tools};

/// One model request.
#[derive(Debug, Clone)]
pub(crate) struct TurnRequest<'a> {
    pub(crate) messages: &'a [Message],
    /// Tools offered; empty means none may be called (suppress mode).
    pub(crate) tools: &'a [ToolDef],
    pub(crate) phase: Phase,
    pub(crate) max_tokens: usize,
    /// When not empty, the reply should be exactly one of these texts (a
    /// grounded answer composed of read sentences). A provider that can
    /// hold its decoder to them does (the local engine, by a grammar);
    /// one that cannot writes freely, under the same checks.
    pub(crate) choices: &'a [String],
}

/// A complete call the model proposed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) id: String,
    pub(crate) name: String,
    /// A JSON object, as text.
    pub(crate) arguments: String,
}

/// What a turn streams while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TurnEvent {
    Content(String),
    Reasoning(String),
    /// A call proposed where none may run.
    Discarded(Call),
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TurnFinish {
    Stop,
    Length,
    Cancelled,
}

/// What a turn produced.
#[derive(Debug, Clone)]
pub(crate) struct TurnReply {
    pub(crate) content: String,
    pub(crate) calls: Vec<Call>,
    pub(crate) discarded: Vec<Call>,
    pub(crate) finish: TurnFinish,
}

impl TurnReply {
    /// A reply with nothing in it yet, ending normally.
    pub(crate) fn empty() -> TurnReply {
        TurnReply {
            content: String::new(),
            calls: Vec::new(),
            discarded: Vec::new(),
            finish: TurnFinish::Stop,
        }
    }

    /// A turn cancelled before anything streamed.
    pub(crate) fn cancelled() -> TurnReply {
        TurnReply { finish: TurnFinish::Cancelled, ..TurnReply::empty() }
    }

    /// Keeps a complete call the upstream handed over whole: executable
    /// when tools were offered, else discarded and reported.
    pub(crate) fn push_call(
        &mut self,
        call: Call,
        tools_offered: bool,
        on: &mut dyn FnMut(TurnEvent),
    ) {
        if tools_offered {
            self.calls.push(call);
        } else {
            self.discarded.push(call.clone());
            on(TurnEvent::Discarded(call));
        }
    }
}

/// The parser's view of the tools offered (to type bare-text arguments).
pub(crate) fn tool_specs(tools: &[ToolDef]) -> Tools {
    Tools(tools.iter().map(|t| ToolSpec::from_json_schema(&t.name, &t.parameters)).collect())
}

/// The caller refused an attempt: the run's own allowance is spent, so it
/// was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused;

/// Why a turn failed, by owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProviderError {
    /// The request does not fit the model's context.
    Context { need: usize, limit: usize },
    /// The upstream's quota or budget is exhausted (not retried).
    Quota(String),
    /// A transient failure (429, 5xx, timeout) that outlived the retries.
    Transient(String),
    /// The upstream cannot be reached.
    Unavailable(String),
    /// Anything else (bad response, local engine failure).
    Failed(String),
    /// The request asks for what cannot be done (a schema or tool choice
    /// the grammar cannot enforce); nothing was generated.
    Invalid(String),
    /// The run's own allowance refused the attempt, so it was never sent
    /// (`local_budget_exhausted`, never "provider unavailable"). When the
    /// refused attempt was a retry, `retrying` is the transient failure of
    /// the attempt before it.
    Budget { retrying: Option<Box<ProviderError>> },
    /// The run's ledger (or its chat) could not be written, so the request
    /// was not sent: the ledger fails closed. Never a provider failure.
    Ledger(String),
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderError::Context { need, limit } => {
                write!(f, "the request needs {need} tokens but the context allows {limit}")
            }
            ProviderError::Quota(m) => write!(f, "upstream quota exhausted: {m}"),
            ProviderError::Transient(m) => write!(f, "upstream failed after retries: {m}"),
            ProviderError::Unavailable(m) => write!(f, "provider unavailable: {m}"),
            ProviderError::Failed(m) | ProviderError::Invalid(m) => write!(f, "{m}"),
            ProviderError::Budget { .. } => {
                write!(f, "this run's own request allowance is spent; the request was not sent")
            }
            ProviderError::Ledger(m) => write!(
                f,
                "{m}; no request was sent after it (check that the state folder is writable and has space, then `agentd runs resume`)"
            ),
        }
    }
}

impl ProviderError {
    /// `(code, classification)` for events and the ledger.
    pub(crate) fn code(&self) -> (&'static str, &'static str) {
        match self {
            ProviderError::Context { .. } => ("CONTEXT_LIMIT", "context_limit"),
            ProviderError::Quota(_) => ("UPSTREAM_QUOTA_EXHAUSTED", "upstream_quota_exhausted"),
            ProviderError::Transient(_) => ("PROVIDER_TRANSIENT", "transient"),
            ProviderError::Unavailable(_) => ("PROVIDER_UNAVAILABLE", "provider_unavailable"),
            ProviderError::Failed(_) => ("PROVIDER_ERROR", "provider_error"),
            ProviderError::Invalid(_) => ("INVALID_REQUEST", "invalid_request"),
            ProviderError::Budget { .. } => {
                ("PROVIDER_CALL_BUDGET_EXCEEDED", "local_budget_exhausted")
            }
            ProviderError::Ledger(_) => ("LEDGER_WRITE_FAILED", "ledger_write_failed"),
        }
    }
}

/// Routes one of a turn's parser events into its reply and the stream: text
/// and reasoning stream out, finished calls are kept, calls proposed where
/// none may run are kept as discarded and reported.
pub(crate) fn fold_event(
    reply: &mut TurnReply,
    e: toolparse::Event,
    on: &mut dyn FnMut(TurnEvent),
) {
    use toolparse::Event;
    let call = |c: toolparse::ToolCall| Call {
        id: c.id.unwrap_or_else(|| crate::state::store::new_id("call")),
        name: c.name,
        arguments: c.arguments,
    };
    match e {
        Event::Content(s) => {
            reply.content.push_str(&s);
            on(TurnEvent::Content(s));
        }
        Event::Reasoning(s) => on(TurnEvent::Reasoning(s)),
        Event::CallEnd { call: c, .. } => reply.calls.push(call(c)),
        Event::Discarded(c) => {
            let c = call(c);
            reply.discarded.push(c.clone());
            on(TurnEvent::Discarded(c));
        }
        Event::CallStart { .. } | Event::CallArgs { .. } | Event::CallDropped { .. } => {}
    }
}

/// Who drives a run's research (models.toml `research`): the model, by
/// calling tools round after round, or the host, which opens the run by
/// searching with the question and reading the best segments, after which
/// the model answers from them (models too small to drive tools).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Research {
    Model,
    Host,
}

impl Research {
    pub(crate) fn from_name(s: &str) -> Option<Research> {
        match s {
            "model" => Some(Research::Model),
            "host" => Some(Research::Host),
            _ => None,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Research::Model => "model",
            Research::Host => "host",
        }
    }
}

/// Something that runs model turns.
pub(crate) trait Provider {
    /// Who drives research with this provider's model (by default the
    /// model: upstream servers and scripts drive their own rounds).
    fn research(&self) -> Research {
        Research::Model
    }

    /// Runs one turn, streaming its text through `on`. `attempt` is called
    /// before every attempt (first try and each retry) so the caller can
    /// account for it; when it refuses, the attempt is not made and the turn
    /// fails with [`ProviderError::Budget`].
    fn turn(
        &mut self,
        req: &TurnRequest<'_>,
        cancel: &AtomicBool,
        attempt: &mut dyn FnMut(u32) -> Result<(), Refused>,
        on: &mut dyn FnMut(TurnEvent),
    ) -> Result<TurnReply, ProviderError>;

    /// Runs independent turns together (section workers): each reply comes
    /// back whole, nothing streams. `attempt(i, k)` is called before attempt
    /// `k` of request `i`, as in [`Provider::turn`]. By default they run one
    /// after another; the local engine steps them in one batch.
    fn turns(
        &mut self,
        reqs: &[TurnRequest<'_>],
        cancel: &AtomicBool,
        attempt: &mut dyn FnMut(usize, u32) -> Result<(), Refused>,
    ) -> Vec<Result<TurnReply, ProviderError>> {
        let mut out = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            out.push(self.turn(r, cancel, &mut |k| attempt(i, k), &mut |_| {}));
        }
        out
    }

    /// Tokens `messages` with `tools` take, when the provider can tell.
    fn count(&mut self, messages: &[Message], tools: &[ToolDef]) -> Option<usize>;

    /// The context the provider allows (tokens), when known, less the room
    /// a reply needs.
    fn context(&self) -> Option<usize>;

    /// A short name for logs (`local:smollm2…`, `openai:model`).
    fn describe(&self) -> String;
}
