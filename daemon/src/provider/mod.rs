//! Model providers behind one backend interface (`Provider`): `local` (a
//! GGUF through `inference`), `openai` (any OpenAI-compatible server) and
//! `scripted` (turns from a file, for tests) — and `serve`'s link to its
//! engine thread — each implement only its attempts; a turn (context,
//! allowance, retries, streaming, the reply) is written once here over
//! them (`drive`). `upstream` is what `serve`
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
pub(crate) mod sse;
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
    /// Its decoding, over all its attempts.
    pub(crate) decode: crate::events::Decode,
}

impl TurnReply {
    /// A reply with nothing in it yet, ending normally.
    pub(crate) fn empty() -> TurnReply {
        TurnReply {
            content: String::new(),
            calls: Vec::new(),
            discarded: Vec::new(),
            finish: TurnFinish::Stop,
            decode: Default::default(),
        }
    }

    /// A turn cancelled before anything streamed.
    pub(crate) fn cancelled() -> TurnReply {
        TurnReply { finish: TurnFinish::Cancelled, ..TurnReply::empty() }
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

/// One attempt at one request, as a backend runs it.
pub(crate) struct Try<'r, 'a> {
    /// The request's position among those of its `turns` call (the same
    /// for each of its attempts).
    pub(crate) id: usize,
    /// 1 for the first try, 2 for the first retry, …
    pub(crate) k: u32,
    pub(crate) req: &'r TurnRequest<'a>,
    /// Hears what the attempt streams, as it comes: text, reasoning and
    /// calls as the parser reports them (a backend handed a whole call
    /// reports it with [`whole_call`]).
    pub(crate) sink: &'r mut dyn FnMut(toolparse::Event),
    /// What the attempt's decoding took, set by a backend that knows.
    pub(crate) decode: crate::events::Decode,
}

/// How an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A transient failure before anything streamed, which the backend
    /// would try again (its retry policy allows another attempt): why.
    Retry(String),
    /// The request failed for good.
    Final(ProviderError),
}

/// How one attempt ended.
pub(crate) type Tried = Result<TurnFinish, Failure>;

/// What a whole call a backend was handed (an upstream's structured
/// `tool_calls`, a script's) is to the parser's stream: a finished call
/// when tools were offered, else one discarded.
pub(crate) fn whole_call(call: Call, index: usize, tools_offered: bool) -> toolparse::Event {
    let call =
        toolparse::ToolCall { id: Some(call.id), name: call.name, arguments: call.arguments };
    if tools_offered {
        toolparse::Event::CallEnd { index, call }
    } else {
        toolparse::Event::Discarded(call)
    }
}

/// The one backend interface: what runs model requests — the local
/// engine (batched), the engine thread of `serve` (through its queue), an
/// OpenAI-compatible upstream, a script. A backend makes attempts
/// ([`Provider::attempt`]) and says what it knows of its model; a turn —
/// fitting the context, each attempt admitted by the caller's allowance,
/// retries, what streams, the reply — is written once, over it
/// ([`Provider::turn`], [`Provider::turns`]).
pub(crate) trait Provider {
    /// Who drives research with this provider's model (by default the
    /// model: upstream servers and scripts drive their own rounds).
    fn research(&self) -> Research {
        Research::Model
    }

    /// Tokens `messages` with `tools` take, `None` when the backend cannot
    /// tell; an error when they cannot be rendered or the backend is gone.
    fn tokens(
        &mut self,
        _messages: &[Message],
        _tools: &[ToolDef],
    ) -> Result<Option<usize>, ProviderError> {
        Ok(None)
    }

    /// The context the provider allows (tokens), when known: a request
    /// whose prompt and one reply token do not fit is refused before any
    /// attempt.
    fn context(&self) -> Option<usize> {
        None
    }

    /// A short name for logs (`local:smollm2…`, `openai:model`).
    fn describe(&self) -> String;

    /// How long to wait before attempt `k` (k ≥ 2) of a request whose
    /// attempt failed transiently.
    fn backoff(&self, _k: u32) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Makes one attempt at each of `tries`, together where the backend
    /// can (the local engine steps them in one batched pass per token;
    /// others run them one after another), each streaming into its sink;
    /// one result per try, in order. `cancel` stops them all (they end
    /// [`TurnFinish::Cancelled`]).
    fn attempt(&mut self, tries: &mut [Try<'_, '_>], cancel: &AtomicBool) -> Vec<Tried>;

    /// Tokens `messages` with `tools` take, when the provider can tell.
    fn count(&mut self, messages: &[Message], tools: &[ToolDef]) -> Option<usize> {
        self.tokens(messages, tools).ok().flatten()
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
    ) -> Result<TurnReply, ProviderError> {
        let on = Some(Listen::Turn(on));
        let mut out = drive(self, std::slice::from_ref(req), cancel, &mut |_, k| attempt(k), on);
        out.pop().unwrap_or_else(|| Err(ProviderError::Failed("no reply".into())))
    }

    /// Runs one request the way a chat route streams it: the parser's
    /// events as they come (calls as they form), fitted, retried and
    /// ended like a turn (no allowance of a run's to ask); how it ended.
    fn stream(
        &mut self,
        req: &TurnRequest<'_>,
        cancel: &AtomicBool,
        on: &mut dyn FnMut(toolparse::Event),
    ) -> Result<TurnFinish, ProviderError> {
        let on = Some(Listen::Events(on));
        let mut out = drive(self, std::slice::from_ref(req), cancel, &mut |_, _| Ok(()), on);
        out.pop().unwrap_or_else(|| Err(ProviderError::Failed("no reply".into()))).map(|r| r.finish)
    }

    /// Runs independent turns together (section workers): each reply comes
    /// back whole, nothing streams. `attempt(i, k)` is called before attempt
    /// `k` of request `i`, as in [`Provider::turn`].
    fn turns(
        &mut self,
        reqs: &[TurnRequest<'_>],
        cancel: &AtomicBool,
        attempt: &mut dyn FnMut(usize, u32) -> Result<(), Refused>,
    ) -> Vec<Result<TurnReply, ProviderError>> {
        drive(self, reqs, cancel, attempt, None)
    }
}

/// Where a lone request's stream goes.
enum Listen<'a, 'o> {
    /// Text, reasoning and discarded calls, as the research loop hears
    /// them (finished calls come with the reply).
    Turn(&'a mut (dyn FnMut(TurnEvent) + 'o)),
    /// The parser's events as they are (a chat route).
    Events(&'a mut (dyn FnMut(toolparse::Event) + 'o)),
}

impl<'o> Listen<'_, 'o> {
    /// The same listener, borrowed for one round of attempts.
    fn again(&mut self) -> Listen<'_, 'o> {
        match self {
            Listen::Turn(f) => Listen::Turn(&mut **f),
            Listen::Events(f) => Listen::Events(&mut **f),
        }
    }
}

/// A turn's reply as its attempt streams into it (and out through `on`,
/// when the turn streams).
struct Sink<'a, 'o> {
    reply: &'a mut TurnReply,
    on: Option<Listen<'a, 'o>>,
}

impl Sink<'_, '_> {
    fn hear(&mut self, e: toolparse::Event) {
        match self.on.as_mut() {
            Some(Listen::Turn(on)) => fold_event(self.reply, e, *on),
            Some(Listen::Events(on)) => on(e),
            None => fold_event(self.reply, e, &mut |_| {}),
        }
    }
}

/// Waits `d`, or less when `cancel` is set (checked every 10 ms).
fn pause(d: std::time::Duration, cancel: &AtomicBool) {
    let until = std::time::Instant::now() + d;
    while !cancel.load(std::sync::atomic::Ordering::Relaxed) {
        let now = std::time::Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(std::time::Duration::from_millis(10)));
    }
}

/// The turns of [`Provider::turn`] and [`Provider::turns`]: each request
/// is fitted to the context, then attempted in rounds — every attempt
/// admitted by `attempt` first (a refusal ends that request with
/// [`ProviderError::Budget`], naming the transient failure it would have
/// retried), the admitted ones run together, a [`Failure::Retry`] tried
/// again after the backend's backoff. Only a lone request streams (`on`).
fn drive<P: Provider + ?Sized>(
    p: &mut P,
    reqs: &[TurnRequest<'_>],
    cancel: &AtomicBool,
    attempt: &mut dyn FnMut(usize, u32) -> Result<(), Refused>,
    mut on: Option<Listen<'_, '_>>,
) -> Vec<Result<TurnReply, ProviderError>> {
    use std::sync::atomic::Ordering;
    let mut out: Vec<Option<Result<TurnReply, ProviderError>>> =
        reqs.iter().map(|_| None).collect();
    let limit = p.context();
    for (i, r) in reqs.iter().enumerate() {
        match (p.tokens(r.messages, r.tools), limit) {
            (Err(e), _) => out[i] = Some(Err(e)),
            (Ok(Some(tokens)), Some(limit)) if tokens + 1 >= limit => {
                out[i] = Some(Err(ProviderError::Context { need: tokens + 1, limit }))
            }
            _ => {}
        }
    }
    let mut replies: Vec<TurnReply> = reqs.iter().map(|_| TurnReply::empty()).collect();
    // Why each request's last attempt failed, while it is retried.
    let mut last: Vec<Option<String>> = reqs.iter().map(|_| None).collect();
    let mut k = 1u32;
    loop {
        if k > 1 {
            pause(p.backoff(k), cancel);
        }
        let mut going = Vec::new();
        for i in 0..reqs.len() {
            if out[i].is_some() || (k > 1 && last[i].is_none()) {
                continue;
            }
            if cancel.load(Ordering::Relaxed) {
                out[i] = Some(Ok(TurnReply::cancelled()));
            } else if attempt(i, k).is_err() {
                // The run's own allowance refused it: never retried as a
                // provider failure, never reported as one.
                let retrying = last[i].take().map(|m| {
                    Box::new(ProviderError::Transient(format!(
                        "{m} (no allowance left for a retry)"
                    )))
                });
                out[i] = Some(Err(ProviderError::Budget { retrying }));
            } else {
                going.push(i);
            }
        }
        if going.is_empty() {
            break;
        }
        let mut stream = if reqs.len() == 1 { on.as_mut().map(Listen::again) } else { None };
        let mut sinks: Vec<Sink<'_, '_>> = replies
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| going.contains(i))
            .map(|(_, reply)| Sink { reply, on: stream.take() })
            .collect();
        let mut hears: Vec<_> =
            sinks.iter_mut().map(|s| move |e: toolparse::Event| s.hear(e)).collect();
        let mut tries: Vec<Try<'_, '_>> = hears
            .iter_mut()
            .zip(&going)
            .map(|(h, &i)| Try { id: i, k, req: &reqs[i], sink: h, decode: Default::default() })
            .collect();
        let results = p.attempt(&mut tries, cancel);
        let decodes: Vec<_> = tries.iter().map(|t| t.decode).collect();
        drop(tries);
        drop(hears);
        drop(sinks);
        for (n, &i) in going.iter().enumerate() {
            replies[i].decode += decodes[n];
            match results.get(n).cloned().unwrap_or_else(|| {
                Err(Failure::Final(ProviderError::Failed("the backend gave no reply".into())))
            }) {
                Ok(finish) => {
                    let mut reply = std::mem::replace(&mut replies[i], TurnReply::empty());
                    reply.finish = finish;
                    out[i] = Some(Ok(reply));
                }
                Err(Failure::Final(e)) => out[i] = Some(Err(e)),
                Err(Failure::Retry(m)) => last[i] = Some(m),
            }
        }
        k += 1;
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(ProviderError::Failed("no reply".into()))))
        .collect()
}

#[cfg(test)]
mod tests {
    //! The one turn, over a backend whose attempts the test writes: what
    //! the caller's allowance, the context, retries, cancellation and
    //! batching do to each request, whatever backend runs it.

    use super::*;
    use std::sync::atomic::Ordering;

    /// A backend whose attempt `k` at request `id` plays `plan(id, k)`,
    /// and which records the batches it was handed.
    struct Plan {
        plan: fn(usize, u32) -> Tried,
        tokens: Option<usize>,
        context: Option<usize>,
        batches: Vec<Vec<(usize, u32)>>,
    }

    impl Provider for Plan {
        fn attempt(&mut self, tries: &mut [Try<'_, '_>], _cancel: &AtomicBool) -> Vec<Tried> {
            self.batches.push(tries.iter().map(|t| (t.id, t.k)).collect());
            tries
                .iter_mut()
                .map(|t| {
                    let r = (self.plan)(t.id, t.k);
                    if r.is_ok() {
                        (t.sink)(toolparse::Event::Content(format!("reply {}", t.id)));
                    }
                    r
                })
                .collect()
        }

        fn tokens(
            &mut self,
            _messages: &[Message],
            _tools: &[ToolDef],
        ) -> Result<Option<usize>, ProviderError> {
            Ok(self.tokens)
        }

        fn context(&self) -> Option<usize> {
            self.context
        }

        fn describe(&self) -> String {
            "plan".into()
        }
    }

    fn plan(f: fn(usize, u32) -> Tried) -> Plan {
        Plan { plan: f, tokens: Some(10), context: Some(100), batches: Vec::new() }
    }

    fn request(messages: &[Message]) -> TurnRequest<'_> {
        TurnRequest { messages, tools: &[], phase: Phase::Research, max_tokens: 16, choices: &[] }
    }

    #[test]
    fn a_transient_failure_is_tried_again_and_each_attempt_is_admitted_first() {
        let mut p =
            plan(
                |_, k| if k < 3 { Err(Failure::Retry("503".into())) } else { Ok(TurnFinish::Stop) },
            );
        let msgs = [Message::new("user", "q")];
        let mut admitted = Vec::new();
        let mut streamed = String::new();
        let r = p.turn(
            &request(&msgs),
            &AtomicBool::new(false),
            &mut |k| {
                admitted.push(k);
                Ok(())
            },
            &mut |e| {
                if let TurnEvent::Content(s) = e {
                    streamed.push_str(&s)
                }
            },
        );
        assert_eq!(r.unwrap().content, "reply 0");
        assert_eq!(streamed, "reply 0");
        assert_eq!(admitted, [1, 2, 3]);
        assert_eq!(p.batches, [vec![(0, 1)], vec![(0, 2)], vec![(0, 3)]]);
    }

    #[test]
    fn a_refused_retry_is_the_runs_budget_naming_the_failure_it_would_have_retried() {
        let mut p = plan(|_, _| Err(Failure::Retry("HTTP 503".into())));
        let msgs = [Message::new("user", "q")];
        let r = p.turn(
            &request(&msgs),
            &AtomicBool::new(false),
            &mut |k| if k == 1 { Ok(()) } else { Err(Refused) },
            &mut |_| {},
        );
        match r {
            Err(ProviderError::Budget { retrying: Some(e) }) => {
                assert!(e.to_string().contains("HTTP 503"), "{e}");
                assert_eq!(e.code().1, "transient");
            }
            other => panic!("{other:?}"),
        }
        // A first attempt refused names no failure.
        let r =
            p.turn(&request(&msgs), &AtomicBool::new(false), &mut |_| Err(Refused), &mut |_| {});
        assert!(matches!(r, Err(ProviderError::Budget { retrying: None })), "{r:?}");
    }

    #[test]
    fn a_prompt_that_leaves_no_room_for_a_reply_is_refused_before_any_attempt() {
        let mut p = plan(|_, _| Ok(TurnFinish::Stop));
        p.tokens = Some(99);
        let msgs = [Message::new("user", "q")];
        let mut admitted = 0;
        let r = p.turn(
            &request(&msgs),
            &AtomicBool::new(false),
            &mut |_| {
                admitted += 1;
                Ok(())
            },
            &mut |_| {},
        );
        assert!(matches!(r, Err(ProviderError::Context { need: 100, limit: 100 })), "{r:?}");
        assert_eq!(admitted, 0);
        assert!(p.batches.is_empty());
    }

    #[test]
    fn turns_run_together_each_on_its_own_retries_and_nothing_streams() {
        // Request 1 fails once, transiently; request 2 fails for good.
        let mut p = plan(|id, k| match (id, k) {
            (1, 1) => Err(Failure::Retry("429".into())),
            (2, _) => Err(Failure::Final(ProviderError::Quota("spent".into()))),
            _ => Ok(TurnFinish::Stop),
        });
        let msgs = [Message::new("user", "q")];
        let reqs = [request(&msgs), request(&msgs), request(&msgs)];
        let out = p.turns(&reqs, &AtomicBool::new(false), &mut |_, _| Ok(()));
        assert_eq!(p.batches, [vec![(0, 1), (1, 1), (2, 1)], vec![(1, 2)]]);
        assert_eq!(out[0].as_ref().unwrap().content, "reply 0");
        assert_eq!(out[1].as_ref().unwrap().content, "reply 1");
        assert!(matches!(out[2], Err(ProviderError::Quota(_))));
    }

    #[test]
    fn a_cancelled_turn_makes_no_attempt() {
        let mut p = plan(|_, _| Ok(TurnFinish::Stop));
        let msgs = [Message::new("user", "q")];
        let cancel = AtomicBool::new(false);
        cancel.store(true, Ordering::Relaxed);
        let r = p.turn(&request(&msgs), &cancel, &mut |_| Ok(()), &mut |_| {}).unwrap();
        assert_eq!(r.finish, TurnFinish::Cancelled);
        assert!(p.batches.is_empty());
    }

    #[test]
    fn a_whole_call_is_kept_when_tools_were_offered_and_discarded_otherwise() {
        let call = Call { id: "c1".into(), name: "search_sources".into(), arguments: "{}".into() };
        let mut reply = TurnReply::empty();
        let mut heard = Vec::new();
        fold_event(&mut reply, whole_call(call.clone(), 0, true), &mut |e| heard.push(e));
        fold_event(&mut reply, whole_call(call.clone(), 1, false), &mut |e| heard.push(e));
        assert_eq!(reply.calls, std::slice::from_ref(&call));
        assert_eq!(reply.discarded, std::slice::from_ref(&call));
        assert_eq!(heard, [TurnEvent::Discarded(call)]);
    }
}
