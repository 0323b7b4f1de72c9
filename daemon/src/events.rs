//! The research events (CONTRACTS.md "Research events"): one closed enum,
//! turned into JSON objects only here.

use serde_json::{json, Value};

/// Who asked for a tool call: the model, or the host's entry research
/// (seed 003's entry work, for models that do not drive their own rounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum By {
    Model,
    Host,
}

impl By {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            By::Model => "model",
            By::Host => "host",
        }
    }
}

/// What kind of request a turn is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Research,
    Final,
    Correction,
    /// A section worker (`analyze_source`, or condensing the final view).
    Section,
}

impl Phase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Research => "research",
            Phase::Final => "final",
            Phase::Correction => "correction",
            Phase::Section => "section",
        }
    }
}

/// Why research ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Answer,
    RoundLimit,
    RepeatedBatches,
    ContextLimit,
    Deadline,
    Budget,
    /// The section-request limit cut an analysis short (seed 000: section
    /// limits prevent more research after tools have run).
    SectionLimit,
    Cancelled,
    Error,
}

impl Stop {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Stop::Answer => "answer",
            Stop::RoundLimit => "round_limit",
            Stop::RepeatedBatches => "repeated_batches",
            Stop::ContextLimit => "context_limit",
            Stop::Deadline => "deadline",
            Stop::Budget => "budget",
            Stop::SectionLimit => "section_limit",
            Stop::Cancelled => "cancelled",
            Stop::Error => "error",
        }
    }
}

/// How the reply completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Answered,
    Excerpt,
    SpokenFallback,
    Cancelled,
    Error,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Excerpt => "excerpt",
            Outcome::SpokenFallback => "spoken_fallback",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

/// An error with its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunError {
    pub(crate) code: String,
    pub(crate) classification: String,
    pub(crate) message: String,
}

impl RunError {
    pub(crate) fn new(code: &str, classification: &str, message: impl Into<String>) -> RunError {
        RunError {
            code: code.into(),
            classification: classification.into(),
            message: message.into(),
        }
    }

    /// `{code, classification, message}`, as `done.error` and the run's row
    /// hold it.
    pub(crate) fn to_json(&self) -> Value {
        json!({"code": self.code, "classification": self.classification, "message": self.message})
    }
}

/// The last event of a run.
#[derive(Debug, Clone)]
pub(crate) struct Done {
    /// The run and its chat (so a client can fetch both).
    pub(crate) run_id: String,
    pub(crate) chat_id: String,
    pub(crate) outcome: Outcome,
    pub(crate) stop: Stop,
    pub(crate) rounds: usize,
    pub(crate) model_requests: usize,
    pub(crate) answer: String,
    pub(crate) error: Option<RunError>,
    /// Citations marked invalid after a failed correction.
    pub(crate) invalid_citations: Vec<String>,
    /// The answer cites sources it read (`research::grounding`).
    pub(crate) grounded: bool,
}

/// One research event.
#[derive(Debug, Clone)]
pub(crate) enum Ev {
    Run {
        run_id: String,
        chat_id: String,
        max_tool_iters: usize,
    },
    Request {
        n: usize,
        phase: Phase,
    },
    Reasoning(String),
    Content(String),
    ToolCall {
        round: usize,
        id: String,
        name: String,
        arguments: Value,
        by: By,
    },
    ToolResult {
        round: usize,
        id: String,
        name: String,
        ok: bool,
        content: String,
    },
    Notice {
        kind: &'static str,
        text: String,
    },
    Discarded {
        name: String,
        arguments: Value,
    },
    /// Voice requests only: a completed sentence of the spoken text, plain;
    /// `progress` for the short sentence said when a tool round begins.
    Sentence {
        text: String,
        progress: bool,
    },
    Done(Done),
}

impl Ev {
    pub(crate) fn to_json(&self) -> Value {
        match self {
            Ev::Run { run_id, chat_id, max_tool_iters } => {
                json!({"type": "run", "run_id": run_id, "chat_id": chat_id, "max_tool_iters": max_tool_iters})
            }
            Ev::Request { n, phase } => json!({"type": "request", "n": n, "phase": phase.as_str()}),
            Ev::Reasoning(d) => json!({"type": "reasoning", "delta": d}),
            Ev::Content(d) => json!({"type": "content", "delta": d}),
            Ev::ToolCall { round, id, name, arguments, by } => {
                json!({"type": "tool_call", "round": round, "id": id, "name": name, "arguments": arguments, "by": by.as_str()})
            }
            Ev::ToolResult { round, id, name, ok, content } => {
                json!({"type": "tool_result", "round": round, "id": id, "name": name, "ok": ok, "content": content})
            }
            Ev::Notice { kind, text } => json!({"type": "notice", "kind": kind, "text": text}),
            Ev::Discarded { name, arguments } => {
                json!({"type": "discarded_call", "name": name, "arguments": arguments})
            }
            Ev::Sentence { text, progress: false } => json!({"type": "sentence", "text": text}),
            Ev::Sentence { text, progress: true } => {
                json!({"type": "sentence", "text": text, "kind": "progress"})
            }
            Ev::Done(d) => json!({
                "type": "done", "run_id": d.run_id, "chat_id": d.chat_id, "outcome": d.outcome.as_str(), "stop": d.stop.as_str(), "rounds": d.rounds,
                "model_requests": d.model_requests, "answer": d.answer,
                "error": d.error.as_ref().map(RunError::to_json),
                "invalid_citations": d.invalid_citations, "grounded": d.grounded,
            }),
        }
    }
}

/// The display-relevant part of an event read back from JSON (a client of
/// the daemon prints it like a local run).
pub(crate) fn from_json(v: &Value) -> Option<Ev> {
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    Some(match v["type"].as_str()? {
        "content" => Ev::Content(s("delta")),
        "reasoning" => Ev::Reasoning(s("delta")),
        "notice" => Ev::Notice { kind: "notice", text: s("text") },
        "tool_call" => Ev::ToolCall {
            round: 0,
            id: s("id"),
            name: s("name"),
            arguments: v["arguments"].clone(),
            by: if v["by"] == "host" { By::Host } else { By::Model },
        },
        "discarded_call" => Ev::Discarded { name: s("name"), arguments: v["arguments"].clone() },
        _ => return None,
    })
}
