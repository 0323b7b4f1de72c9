//! The wire layer: each API's requests and replies as serde types (one
//! file per dialect: [`openai`] chat completions, [`responses`],
//! [`anthropic`] Messages, [`ollama`]), each mapped straight to the one
//! internal chat request ([`ChatRequest`]) and back from the engine's
//! events ([`Collected`], [`Running`]). A body is decoded with the path of
//! what is wrong in the message (`messages[2].content: invalid type …`);
//! the checks every dialect shares — tool choice, output format, sampling
//! ranges, the token limit — are made once, in [`ChatRequest::check`].
//!
//! The handlers in `server/{chat,responses,anthropic,ollama}.rs` own the
//! routes; this module owns no state and must not depend on them.

pub(super) mod anthropic;
mod fuzz;
pub(super) mod ollama;
pub(super) mod openai;
pub(super) mod responses;

use super::models::Lease;
use super::shared::{State, Tracked};
use super::worker::Job;
use crate::provider::chat::{with_knobs, ChatMsg, ChatOutput, ChatParams, Sampling};
use crate::provider::constrain::{Constraint, ToolChoice};
use crate::provider::engine::ChatJob;
use crate::provider::ProviderError;
use crate::state::policy::SamplingLimits;
use crate::state::registry::SamplingKnobs;
pub(crate) use fuzz::fuzz_request;
use prompts::{Message, ToolDef};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;
use toolparse::{Event, Mode, ToolCall};

/// A body as the request type `T`, or a message naming the field that is
/// wrong and why (`messages[0].role: unknown variant "wizard", expected
/// one of …`), worded for a JSON client rather than for Rust.
pub(crate) fn decode<T: DeserializeOwned>(body: Value) -> Result<T, String> {
    if !body.is_object() {
        return Err("the body must be a JSON object".into());
    }
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let why = plain(&e.into_inner().to_string());
        if path == "." {
            why
        } else {
            format!("`{path}`: {why}")
        }
    })
}

/// serde's words for types, in JSON's.
fn plain(msg: &str) -> String {
    let mut out = msg
        .replace("expected f64", "expected a number")
        .replace("expected f32", "expected a number")
        .replace("expected u64", "expected a non-negative integer")
        .replace("expected usize", "expected a non-negative integer")
        .replace("expected u32", "expected a non-negative integer")
        .replace("expected i64", "expected an integer")
        .replace("expected a sequence", "expected an array")
        .replace("expected a map", "expected an object")
        .replace("invalid type: map", "invalid type: object")
        .replace("invalid type: sequence", "invalid type: array")
        .replace("invalid type: unit value", "invalid type: null");
    // `expected struct Foo`: an object.
    while let Some(at) = out.find("expected struct ") {
        let rest = &out[at + "expected struct ".len()..];
        let end = rest.find(|c: char| !c.is_alphanumeric() && c != '_').unwrap_or(rest.len());
        let tail = rest[end..].to_owned();
        out.truncate(at);
        out.push_str("expected an object");
        out.push_str(&tail);
    }
    out
}

/// A content part: its type and, for text, the text.
#[derive(Debug, Deserialize)]
pub(crate) struct Part {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) text: Option<String>,
}

/// Text as the dialects send it: a string, or parts (OpenAI's content
/// parts, Anthropic's text blocks, the Responses API's `input_text`).
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be a string or an array of text parts")]
pub(crate) enum Text {
    Plain(String),
    Parts(Vec<Part>),
}

impl Text {
    /// The text, parts joined; a part of a type not in `readable` (or
    /// without text) is refused, naming it (`at`: where the text is).
    pub(crate) fn text(&self, at: &str, readable: &[&str]) -> Result<String, String> {
        match self {
            Text::Plain(s) => Ok(s.clone()),
            Text::Parts(parts) => {
                let mut out = String::new();
                for (i, p) in parts.iter().enumerate() {
                    match &p.text {
                        Some(t) if readable.contains(&p.kind.as_str()) => out.push_str(t),
                        _ => {
                            return Err(format!(
                                "{at}[{i}]: a {:?} part cannot be read here; only text is supported ({})",
                                p.kind,
                                readable.join(", ")
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// Which tools a reply may or must call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Choice {
    /// The model decides.
    #[default]
    Auto,
    /// No calls: tools are not offered and call markup is stripped.
    None,
    /// At least one call to any offered tool.
    Required,
    /// A call to this tool.
    Named(String),
}

/// Declares a request type with the sampling knobs as fields of its own
/// (so a wrong one is named by its path in the 400) and `knobs()`, the
/// knobs it sets.
macro_rules! knob_fields {
    ($(#[$m:meta])* pub(crate) struct $name:ident {
        $($(#[$fm:meta])* pub(crate) $f:ident: $t:ty,)*
    }) => {
        $(#[$m])*
        pub(crate) struct $name {
            $($(#[$fm])* pub(crate) $f: $t,)*
            pub(crate) temperature: Option<f64>,
            pub(crate) top_k: Option<f64>,
            pub(crate) top_p: Option<f64>,
            pub(crate) min_p: Option<f64>,
            pub(crate) repeat_penalty: Option<f64>,
            pub(crate) repeat_last_n: Option<f64>,
            pub(crate) frequency_penalty: Option<f64>,
            pub(crate) presence_penalty: Option<f64>,
            pub(crate) no_repeat_ngram: Option<f64>,
            pub(crate) seed: Option<f64>,
        }

        impl $name {
            /// The sampling knobs this sets (unused on [`Knobs`] itself).
            #[allow(dead_code)]
            pub(crate) fn knobs(&self) -> $crate::server::wire::Knobs {
                $crate::server::wire::Knobs {
                    temperature: self.temperature,
                    top_k: self.top_k,
                    top_p: self.top_p,
                    min_p: self.min_p,
                    repeat_penalty: self.repeat_penalty,
                    repeat_last_n: self.repeat_last_n,
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    no_repeat_ngram: self.no_repeat_ngram,
                    seed: self.seed,
                }
            }
        }
    };
}
pub(crate) use knob_fields;

knob_fields! {
    /// The sampling knobs a request sets, as numbers, before their ranges
    /// are checked (every dialect names a subset of them).
    #[derive(Debug, Clone, Copy, Default, Deserialize)]
    pub(crate) struct Knobs {}
}

/// A non-negative integer knob.
fn count(v: Option<f64>, key: &str) -> Result<Option<usize>, String> {
    match v {
        None => Ok(None),
        Some(n) if n >= 0.0 && n.fract() == 0.0 => Ok(Some(n as usize)),
        Some(_) => Err(format!("`{key}` must be a non-negative integer")),
    }
}

impl Knobs {
    /// The knobs within their ranges (the integer ones within the
    /// `sampling/…` policies in force); `repeat_last_n: -1` (llama.cpp's
    /// "the whole context") is as far back as the policy allows.
    fn checked(&self, limits: SamplingLimits) -> Result<SamplingKnobs, String> {
        let real = |v: Option<f64>| v.map(|x| x as f32);
        let repeat_last_n = match self.repeat_last_n {
            Some(-1.0) => Some(limits.repeat_last_n),
            Some(n) if n < 0.0 || n.fract() != 0.0 => {
                let (max, policy) = (limits.repeat_last_n, crate::state::policy::REPEAT_LAST_N);
                return Err(format!(
                    "`repeat_last_n` must be from 0 to {max}, the policy {policy}, or -1 (got {n})"
                ));
            }
            n => n.map(|n| n as usize),
        };
        let k = SamplingKnobs {
            temperature: real(self.temperature),
            top_k: count(self.top_k, "top_k")?,
            top_p: real(self.top_p),
            min_p: real(self.min_p),
            repeat_penalty: real(self.repeat_penalty),
            repeat_last_n,
            frequency_penalty: real(self.frequency_penalty),
            presence_penalty: real(self.presence_penalty),
            no_repeat_ngram: count(self.no_repeat_ngram, "no_repeat_ngram")?,
        };
        k.check(limits).map_err(|e| format!("`{}` {}", e.field, e.must))?;
        Ok(k)
    }

    /// A request's sampling: llama-server's defaults (greedy, no
    /// penalties), under the model's, under the request's own knobs.
    pub(crate) fn sampling(
        &self,
        model: &SamplingKnobs,
        limits: SamplingLimits,
    ) -> Result<Sampling, String> {
        let route = Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            no_repeat_ngram: 0,
            seed: self.seed.map(|s| s as u64).unwrap_or(0),
        };
        Ok(with_knobs(route, &self.checked(limits)?.over(model)))
    }
}

/// The most stop strings a request may give, and the longest one (bytes):
/// each is searched for in the text held back at every token.
pub(crate) const STOPS: (usize, usize) = (16, 256);

/// A request's stop strings within [`STOPS`].
fn check_stops(stop: &[String]) -> Result<(), String> {
    let (most, longest) = STOPS;
    if stop.len() > most {
        return Err(format!("at most {most} stop strings are taken, not {}", stop.len()));
    }
    match stop.iter().find(|s| s.len() > longest) {
        Some(s) => Err(format!(
            "a stop string is at most {longest} bytes; one has {} ({:?}…)",
            s.len(),
            s.chars().take(24).collect::<String>()
        )),
        None => Ok(()),
    }
}

/// Tokens a reply may write when the request does not say.
pub(crate) const DEFAULT_MAX_TOKENS: usize = 1024;

/// A chat request as every dialect maps to it, before the shared checks.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChatRequest {
    pub(crate) messages: Vec<Message>,
    pub(crate) tools: Vec<ToolDef>,
    pub(crate) choice: Choice,
    /// `response_format` / `text.format` / `format` / `output_config`.
    pub(crate) format: Option<Constraint>,
    /// The dialect's token limit; `None`: [`DEFAULT_MAX_TOKENS`].
    pub(crate) max_tokens: Option<usize>,
    pub(crate) knobs: Knobs,
    pub(crate) stop: Vec<String>,
    /// A prompt sent without the chat template (Ollama's `raw`, `suffix`).
    pub(crate) raw: Option<String>,
    /// Tokens the model may spend reasoning before it must answer
    /// (Anthropic's `thinking.budget_tokens`).
    pub(crate) reasoning_budget: Option<usize>,
}

/// A chat request checked and ready for its model's engine thread.
pub(crate) struct Parsed {
    pub(crate) messages: Vec<Message>,
    pub(crate) tools: Vec<ToolDef>,
    pub(crate) params: ChatParams,
}

/// What the shared checks read of the model a request goes to.
#[derive(Debug, Clone, Copy)]
struct Served<'a> {
    /// The model's own sampling defaults.
    sampling: &'a SamplingKnobs,
    /// What a request's sampling knobs may ask for.
    limits: SamplingLimits,
    /// In front of an upstream engine (no `no_repeat_ngram` there).
    upstream: bool,
}

impl ChatRequest {
    /// The checks every dialect shares: a conversation to answer, a tool
    /// choice that names an offered tool, a format and a forced call not
    /// both asked for, sampling knobs in range; what the request asks of
    /// tools becomes the enforcement (a system line and the decoder's
    /// constraint). The message of an `Err` is the 400's.
    pub(crate) fn check(self, st: &State) -> Result<Parsed, String> {
        self.check_for(&Served {
            sampling: &st.card.sampling,
            limits: st.limits,
            upstream: st.upstream.is_some(),
        })
    }

    /// [`ChatRequest::check`] for the model `served` describes.
    fn check_for(self, served: &Served<'_>) -> Result<Parsed, String> {
        let ChatRequest {
            mut messages,
            mut tools,
            choice,
            format,
            max_tokens,
            knobs,
            stop,
            raw,
            reasoning_budget,
        } = self;
        if messages.is_empty() && raw.is_none() {
            return Err("`messages` must be a non-empty array".into());
        }
        let (mode, forced) = match choice {
            Choice::Auto => (Mode::Tools, ToolChoice::Auto),
            Choice::None => {
                tools.clear();
                (Mode::Suppress, ToolChoice::Auto)
            }
            Choice::Required => {
                if tools.is_empty() {
                    return Err("`tool_choice: required` needs `tools`".into());
                }
                messages.push(Message::new(
                    "system",
                    "You must answer by calling one of the provided tools.",
                ));
                (Mode::Tools, ToolChoice::Required)
            }
            Choice::Named(name) => {
                tools.retain(|t| t.name == name);
                if tools.is_empty() {
                    return Err(format!("`tool_choice` names {name:?}, which is not in `tools`"));
                }
                messages.push(Message::new(
                    "system",
                    format!("You must answer by calling the tool {name}."),
                ));
                (Mode::Tools, ToolChoice::Named(name))
            }
        };
        let mode = if tools.is_empty() { Mode::Suppress } else { mode };
        let constraint = match (format, mode, forced) {
            (Some(_), Mode::Tools, ToolChoice::Required | ToolChoice::Named(_)) => {
                return Err("the output format and a `tool_choice` that forces a call cannot both be enforced; drop one".into())
            }
            (Some(f), _, _) => f,
            (None, Mode::Tools, c) => Constraint::ToolCalls(c),
            (None, _, _) => Constraint::None,
        };
        let max_tokens = match max_tokens {
            None => DEFAULT_MAX_TOKENS,
            Some(0) => {
                return Err("the token limit (`max_tokens`) must be a positive integer".into())
            }
            Some(n) => n,
        };
        // An empty stop string stops nothing.
        let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
        check_stops(&stop)?;
        let sampling = knobs.sampling(served.sampling, served.limits)?;
        if served.upstream && sampling.no_repeat_ngram > 0 {
            return Err("`no_repeat_ngram` is not supported in front of an upstream engine".into());
        }
        Ok(Parsed {
            messages,
            tools,
            params: ChatParams {
                max_tokens,
                sampling,
                stop,
                mode,
                constraint,
                lenient: false,
                raw,
                reasoning_budget,
            },
        })
    }
}

impl Parsed {
    /// The request as a job for its model's engine thread (its messages
    /// and tools move into it): stopped by `cancel`, streaming into `tx`,
    /// holding `lease` on the model until it ends.
    fn job(
        &mut self,
        cancel: Arc<AtomicBool>,
        tx: tokio::sync::mpsc::UnboundedSender<ChatMsg>,
        lease: Option<Lease>,
    ) -> Job {
        Job::Chat(ChatJob {
            messages: std::mem::take(&mut self.messages),
            tools: std::mem::take(&mut self.tools),
            params: self.params.clone(),
            cancel,
            run: None,
            tx,
            hold: lease.map(|l| Box::new(l) as Box<dyn std::any::Any + Send>),
        })
    }

    /// The prompt's size in tokens on the model of `st` (its template,
    /// tools included).
    pub(crate) async fn count(&self, st: &State) -> Result<usize, Started> {
        let (tx, rx) = std::sync::mpsc::channel();
        let job = Job::Count { messages: self.messages.clone(), tools: self.tools.clone(), tx };
        if st.worker.submit(job).is_err() {
            return Err(Started::Busy);
        }
        match tokio::task::spawn_blocking(move || rx.recv()).await {
            Ok(Ok(r)) => r.map_err(Started::Failed),
            _ => Err(Started::Failed(ProviderError::Failed("the engine stopped".into()))),
        }
    }

    /// Starts the reply on the model of `st`, tracked under `id` (a client
    /// that goes away cancels it). The first message is awaited, so a
    /// request the engine refuses at once (a prompt beyond the context) is
    /// an error before any byte of a reply is sent.
    pub(crate) async fn start(
        mut self,
        st: &State,
        id: &str,
        lease: Option<Lease>,
    ) -> Result<Running, Started> {
        let (cancel, guard) = st.track(id.to_owned());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        if st.worker.submit(self.job(cancel, tx, lease)).is_err() {
            guard.done();
            return Err(Started::Busy);
        }
        match rx.recv().await {
            Some(ChatMsg::Done(Err(e))) => {
                guard.done();
                Err(Started::Failed(e))
            }
            first => Ok(Running { first, rx, guard: Some(guard) }),
        }
    }
}

/// Why a reply did not start.
#[derive(Debug)]
pub(crate) enum Started {
    /// The model's queue is full.
    Busy,
    /// The engine refused or failed the request.
    Failed(ProviderError),
}

/// A reply in progress: the engine's messages in order.
pub(crate) struct Running {
    first: Option<ChatMsg>,
    rx: UnboundedReceiver<ChatMsg>,
    guard: Option<Tracked>,
}

impl Running {
    /// The next message; `None` once the engine has stopped sending.
    pub(crate) async fn next(&mut self) -> Option<ChatMsg> {
        match self.first.take() {
            Some(m) => Some(m),
            None => self.rx.recv().await,
        }
    }

    /// The whole reply, folded.
    pub(crate) async fn collect(mut self) -> (Collected, Result<ChatOutput, ProviderError>) {
        let mut c = Collected::default();
        let end = loop {
            match self.next().await {
                Some(ChatMsg::Event(e)) => c.push(e),
                Some(ChatMsg::Done(r)) => break r,
                None => break Err(ProviderError::Failed("the engine stopped".into())),
            }
        };
        if let Some(g) = self.guard.take() {
            g.done();
        }
        (c, end)
    }
}

/// A piece of a reply, in the order the model wrote it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Piece {
    Text(String),
    Reasoning(String),
    Call(ToolCall),
}

/// A whole reply: its pieces in order, adjacent text (and reasoning) joined.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Collected {
    pub(crate) pieces: Vec<Piece>,
}

impl Piece {
    /// The piece an engine event is, if it is one a reply shows (call
    /// starts and argument fragments are for progress; a call counts once
    /// complete).
    pub(crate) fn of(e: Event) -> Option<Piece> {
        match e {
            Event::Content(s) => Some(Piece::Text(s)),
            Event::Reasoning(s) => Some(Piece::Reasoning(s)),
            Event::CallEnd { call, .. } => Some(Piece::Call(call)),
            _ => None,
        }
    }
}

impl Collected {
    /// Adds an engine event (call starts and argument fragments are for
    /// streams; a call counts once complete).
    pub(crate) fn push(&mut self, e: Event) {
        match (e, self.pieces.last_mut()) {
            (Event::Content(s), Some(Piece::Text(t))) => t.push_str(&s),
            (Event::Reasoning(s), Some(Piece::Reasoning(t))) => t.push_str(&s),
            (Event::Content(s), _) => self.pieces.push(Piece::Text(s)),
            (Event::Reasoning(s), _) => self.pieces.push(Piece::Reasoning(s)),
            (Event::CallEnd { call, .. }, _) => self.pieces.push(Piece::Call(call)),
            _ => {}
        }
    }

    /// All visible text.
    pub(crate) fn text(&self) -> String {
        self.pieces
            .iter()
            .filter_map(|p| if let Piece::Text(t) = p { Some(t.as_str()) } else { None })
            .collect()
    }

    /// All reasoning.
    pub(crate) fn reasoning(&self) -> String {
        self.pieces
            .iter()
            .filter_map(|p| if let Piece::Reasoning(t) = p { Some(t.as_str()) } else { None })
            .collect()
    }

    /// The complete calls, in order.
    pub(crate) fn calls(&self) -> Vec<&ToolCall> {
        self.pieces
            .iter()
            .filter_map(|p| if let Piece::Call(c) = p { Some(c) } else { None })
            .collect()
    }
}

/// Seconds since the epoch (the `created` of OpenAI's objects).
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A call's id: the model's, or a fresh one with `prefix`.
pub(crate) fn call_id(c: &ToolCall, prefix: &str) -> String {
    c.id.clone()
        .filter(|i| i.starts_with(prefix))
        .unwrap_or_else(|| crate::state::store::new_id(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: SamplingLimits = SamplingLimits { repeat_last_n: 4096, no_repeat_ngram: 32 };

    fn of(body: Value, model: &SamplingKnobs) -> Result<Sampling, String> {
        let k: Knobs = decode(body)?;
        k.sampling(model, LIMITS)
    }

    #[test]
    fn a_request_without_knobs_gets_llama_server_defaults_then_the_models() {
        let none = SamplingKnobs::default();
        let s = of(json!({}), &none).unwrap();
        assert_eq!(
            (s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty),
            (0.0, 0, 1.0, 0.0, 1.0)
        );
        assert_eq!((s.frequency_penalty, s.presence_penalty, s.no_repeat_ngram), (0.0, 0.0, 0));
        let model = SamplingKnobs {
            repeat_penalty: Some(1.1),
            no_repeat_ngram: Some(4),
            ..SamplingKnobs::default()
        };
        let s = of(json!({"seed": 7}), &model).unwrap();
        assert_eq!((s.repeat_penalty, s.no_repeat_ngram, s.seed), (1.1, 4, 7));
    }

    #[test]
    fn a_clients_explicit_value_wins_over_the_models() {
        let model = SamplingKnobs {
            repeat_penalty: Some(1.1),
            no_repeat_ngram: Some(4),
            temperature: Some(0.7),
            ..SamplingKnobs::default()
        };
        let body = json!({"repeat_penalty": 1.0, "no_repeat_ngram": 0, "temperature": 0,
                          "frequency_penalty": 0.5, "presence_penalty": -0.25,
                          "repeat_last_n": 128, "min_p": 0.1, "top_k": 20});
        let s = of(body, &model).unwrap();
        assert_eq!((s.repeat_penalty, s.no_repeat_ngram, s.temperature), (1.0, 0, 0.0));
        assert_eq!((s.frequency_penalty, s.presence_penalty), (0.5, -0.25));
        assert_eq!((s.repeat_last_n, s.min_p, s.top_k), (128, 0.1, 20));
        // -1: as far back as the policy allows.
        let s = of(json!({"repeat_last_n": -1}), &model).unwrap();
        assert_eq!(s.repeat_last_n, 4096);
    }

    #[test]
    fn out_of_range_knobs_are_refused_naming_the_field_and_the_range() {
        let none = SamplingKnobs::default();
        let cases = [
            (json!({"frequency_penalty": 2.5}), "`frequency_penalty` must be between -2 and 2"),
            (json!({"frequency_penalty": -2.01}), "`frequency_penalty` must be between -2 and 2"),
            (json!({"presence_penalty": 3}), "`presence_penalty` must be between -2 and 2"),
            (json!({"repeat_penalty": 0}), "`repeat_penalty` must be in (0, 2]"),
            (json!({"repeat_penalty": 2.5}), "`repeat_penalty` must be in (0, 2]"),
            (
                json!({"repeat_last_n": 5000}),
                "`repeat_last_n` must be from 0 to 4096, the policy sampling/repeat-last-n",
            ),
            (json!({"repeat_last_n": -2}), "`repeat_last_n` must be from 0 to 4096"),
            (json!({"repeat_last_n": 1.5}), "`repeat_last_n` must be from 0 to 4096"),
            (
                json!({"no_repeat_ngram": 33}),
                "`no_repeat_ngram` must be from 0 to 32, the policy sampling/no-repeat-ngram",
            ),
            (json!({"no_repeat_ngram": -1}), "`no_repeat_ngram` must be a non-negative integer"),
            (json!({"min_p": 1.5}), "`min_p` must be between 0 and 1"),
            (json!({"temperature": 3}), "`temperature` must be between 0 and 2"),
            (json!({"top_p": 0}), "`top_p` must be in (0, 1]"),
            (json!({"top_k": -1}), "`top_k` must be a non-negative integer"),
            (
                json!({"presence_penalty": "lots"}),
                "`presence_penalty`: invalid type: string \"lots\", expected a number",
            ),
        ];
        for (body, want) in cases {
            let e = of(body.clone(), &none).unwrap_err();
            assert!(e.starts_with(want), "{body}: {e}");
        }
        // The ends of each range are in it.
        for body in [
            json!({"frequency_penalty": -2, "presence_penalty": 2}),
            json!({"repeat_penalty": 2, "repeat_last_n": 4096, "no_repeat_ngram": 32}),
        ] {
            of(body.clone(), &none).unwrap_or_else(|e| panic!("{body}: {e}"));
        }
    }

    #[test]
    fn stop_strings_are_bounded_in_number_and_length() {
        let ok: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
        check_stops(&ok).unwrap();
        check_stops(&["x".repeat(256)]).unwrap();
        let many: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
        assert!(check_stops(&many).unwrap_err().contains("at most 16"));
        assert!(check_stops(&["x".repeat(257)]).unwrap_err().contains("at most 256 bytes"));
    }

    #[test]
    fn a_reply_keeps_its_pieces_in_order_with_adjacent_text_joined() {
        let call = ToolCall { id: None, name: "f".into(), arguments: "{}".into() };
        let mut c = Collected::default();
        for e in [
            Event::Reasoning("a".into()),
            Event::Reasoning("b".into()),
            Event::Content("x".into()),
            Event::CallStart { index: 0, id: None, name: "f".into() },
            Event::CallEnd { index: 0, call: call.clone() },
            Event::Content("y".into()),
            Event::Content("z".into()),
        ] {
            c.push(e);
        }
        assert_eq!(
            c.pieces,
            vec![
                Piece::Reasoning("ab".into()),
                Piece::Text("x".into()),
                Piece::Call(call),
                Piece::Text("yz".into())
            ]
        );
        assert_eq!((c.text(), c.reasoning(), c.calls().len()), ("xyz".into(), "ab".into(), 1));
    }

    #[test]
    fn decoding_names_the_path_and_speaks_json() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Inner {
            n: u64,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Outer {
            items: Vec<Inner>,
        }
        let e = decode::<Outer>(json!({"items": [{"n": 1}, {"n": "two"}]})).unwrap_err();
        assert_eq!(
            e,
            "`items[1].n`: invalid type: string \"two\", expected a non-negative integer"
        );
        let e = decode::<Outer>(json!({"items": {}})).unwrap_err();
        assert_eq!(e, "`items`: invalid type: object, expected an array");
        let e = decode::<Outer>(json!([1])).unwrap_err();
        assert_eq!(e, "the body must be a JSON object");
    }

    /// A chat request as the cases of `daemon/tests/data/wire.jsonl`
    /// describe one: messages as `[role, content, calls or #id]`.
    fn summary(c: &ChatRequest) -> Value {
        let messages: Vec<Value> = c
            .messages
            .iter()
            .map(|m| {
                let mut v = vec![json!(m.role), json!(m.content)];
                let calls: Vec<String> = m
                    .tool_calls
                    .iter()
                    .map(|t| format!("{}({})#{}", t.function.name, t.function.arguments, t.id))
                    .collect();
                if !calls.is_empty() {
                    v.push(json!(calls.join(" ")));
                }
                if let Some(id) = &m.tool_call_id {
                    v.push(json!(format!("#{id}")));
                }
                Value::Array(v)
            })
            .collect();
        let choice = match &c.choice {
            Choice::Auto => "auto".to_owned(),
            Choice::None => "none".to_owned(),
            Choice::Required => "required".to_owned(),
            Choice::Named(n) => format!("name:{n}"),
        };
        let format = match &c.format {
            None => "none",
            Some(Constraint::JsonObject) => "json_object",
            Some(Constraint::JsonSchema(_)) => "json_schema",
            Some(_) => "other",
        };
        json!({"messages": messages, "tools": c.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
               "choice": choice, "max_tokens": c.max_tokens, "stop": c.stop, "format": format,
               "budget": c.reasoning_budget, "raw": c.raw})
    }

    /// Each dialect's request, decoded and mapped: what the chat request
    /// holds, or the message a client gets.
    #[test]
    fn every_dialect_maps_its_request_to_the_one_chat_request() {
        let cases = include_str!("../../../tests/data/wire.jsonl");
        let mut n = 0;
        for line in cases.lines().filter(|l| !l.trim().is_empty()) {
            let case: Value = serde_json::from_str(line).expect("a case is JSON");
            let (name, body, want) = (&case["name"], case["body"].clone(), &case["want"]);
            let got = match case["dialect"].as_str().unwrap() {
                "openai" => {
                    decode::<openai::Request>(body).and_then(|r| r.into_chat()).map(|c| c.0)
                }
                "anthropic" => {
                    decode::<anthropic::Request>(body).and_then(|r| r.into_chat(false)).map(|c| c.0)
                }
                "anthropic_count" => {
                    decode::<anthropic::Request>(body).and_then(|r| r.into_chat(true)).map(|c| c.0)
                }
                "ollama_chat" => {
                    decode::<ollama::Body>(body).and_then(|r| r.into_chat(8192)).map(|c| c.0)
                }
                "ollama_generate" => decode::<ollama::Body>(body)
                    .and_then(|r| r.into_generate(8192, None, "m:latest"))
                    .and_then(|g| match g {
                        ollama::Generate::Reply(c, _) => Ok(*c),
                        ollama::Generate::Load => Err("load".into()),
                    }),
                "responses" => decode::<responses::Create>(body)
                    .and_then(|r| r.conversation(Vec::new()).and_then(|c| r.chat(&c))),
                other => panic!("{name}: no dialect {other}"),
            };
            match (got, want.get("error").and_then(Value::as_str)) {
                (Ok(c), None) => {
                    let s = summary(&c);
                    for (k, v) in want.as_object().unwrap() {
                        assert_eq!(&s[k], v, "{name}: {k} in {s}");
                    }
                }
                (Err(e), Some(w)) => assert!(e.contains(w), "{name}: {e:?} lacks {w:?}"),
                (Ok(c), Some(w)) => panic!("{name}: accepted ({}), wanted {w:?}", summary(&c)),
                (Err(e), None) => panic!("{name}: refused: {e}"),
            }
            n += 1;
        }
        assert!(n >= 25, "only {n} cases");
    }

    /// Any JSON: the values a client can send.
    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            "[a-z_ <>|/\\{}\\[\\]\"]{0,12}".prop_map(Value::from),
            prop_oneof![
                Just("user"),
                Just("assistant"),
                Just("system"),
                Just("tool"),
                Just("text"),
                Just("tool_use"),
                Just("tool_result"),
                Just("function"),
                Just("json_schema"),
                Just("auto"),
                Just("required"),
                Just("none"),
                Just("any"),
                Just("message"),
                Just("function_call"),
                Just("enabled"),
            ]
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec(
                    (
                        prop_oneof![
                            Just("role"),
                            Just("content"),
                            Just("type"),
                            Just("text"),
                            Just("name"),
                            Just("messages"),
                            Just("tools"),
                            Just("tool_choice"),
                            Just("input"),
                            Just("function"),
                            Just("arguments"),
                            Just("parameters"),
                            Just("id"),
                            Just("max_tokens"),
                            Just("options"),
                            Just("format"),
                            Just("stop"),
                            Just("input_schema"),
                            Just("thinking"),
                            Just("budget_tokens"),
                            Just("tool_calls"),
                            Just("call_id"),
                            Just("output"),
                            Just("schema"),
                        ]
                        .prop_map(str::to_owned),
                        inner,
                    ),
                    0..6,
                )
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// A valid case's body with one subtree replaced by `v` (chosen by
    /// `pick`): a request that is nearly right.
    fn mutate(body: &mut Value, pick: usize, v: Value) {
        fn walk(x: &mut Value, pick: &mut usize, v: &mut Option<Value>) {
            if v.is_none() {
                return;
            }
            if *pick == 0 {
                *x = v.take().unwrap_or(Value::Null);
                return;
            }
            *pick -= 1;
            match x {
                Value::Array(a) => a.iter_mut().for_each(|y| walk(y, pick, v)),
                Value::Object(o) => o.values_mut().for_each(|y| walk(y, pick, v)),
                _ => {}
            }
        }
        walk(body, &mut pick.clone(), &mut Some(v));
    }

    /// Every dialect's mapping, on any body.
    fn map_all(body: &Value) -> Vec<Result<(), String>> {
        let f = |r: Result<ChatRequest, String>| r.map(|_| ());
        vec![
            f(decode::<openai::Request>(body.clone()).and_then(|r| r.into_chat()).map(|c| c.0)),
            f(decode::<anthropic::Request>(body.clone())
                .and_then(|r| r.into_chat(false))
                .map(|c| c.0)),
            f(decode::<anthropic::Request>(body.clone())
                .and_then(|r| r.into_chat(true))
                .map(|c| c.0)),
            f(decode::<ollama::Body>(body.clone()).and_then(|r| r.into_chat(8192)).map(|c| c.0)),
            decode::<ollama::Body>(body.clone())
                .and_then(|r| r.into_generate(8192, None, "m").map(|_| ())),
            f(decode::<responses::Create>(body.clone())
                .and_then(|r| r.conversation(Vec::new()).and_then(|c| r.chat(&c)))),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any body: every dialect answers a request or a message, never a
        /// panic, and a refusal always says something.
        #[test]
        fn any_body_is_mapped_or_refused_with_a_message(body in any_json()) {
            for r in map_all(&body) {
                if let Err(m) = r {
                    proptest::prop_assert!(!m.trim().is_empty());
                }
            }
        }

        /// The cases' bodies, each with one part replaced by anything.
        #[test]
        fn a_nearly_right_body_is_mapped_or_refused_with_a_message(
            case in 0usize..64, pick in 0usize..64, v in any_json()
        ) {
            let cases: Vec<&str> = include_str!("../../../tests/data/wire.jsonl")
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect();
            let c: Value = serde_json::from_str(cases[case % cases.len()]).unwrap();
            let mut body = c["body"].clone();
            mutate(&mut body, pick, v);
            for r in map_all(&body) {
                if let Err(m) = r {
                    proptest::prop_assert!(!m.trim().is_empty());
                }
            }
        }
    }
}
