//! The engine worker: one thread owns the local model and serves jobs from
//! a bounded first-come-first-served queue. A full queue is refused at
//! once (the HTTP layer answers 503 with Retry-After).
//!
//! Chat completions run together: up to `server/decode-batch` of them
//! decode in one batched pass per token (each gets exactly the tokens it
//! would get alone), and a new one joins as soon as it is admitted. A
//! research run (or a resume) runs on a thread of its own, up to
//! `server/decode-batch` at once, in queue order; its model turns come back
//! to this queue as completions through [`EngineLink`] and join the batch
//! like any other, ahead of the capacity check (the run was admitted).
//!
//! In front of an upstream engine (`serve --provider openai`) there is no
//! engine thread: a dispatcher thread (`serve_upstream`) starts each chat
//! completion on a thread of its own as soon as the upstream gate
//! (`server/upstream-concurrency`) has a place, queue order kept, and each
//! research run on its own thread with the `openai` provider exactly as
//! `ask` builds it, its attempts holding places in the same gate.

use crate::events::Ev;
use crate::provider::local::{
    admit_turn, turn_finish, turn_params, ChatOutput, ChatParams, ChatRun, ChatStep, Local,
};
use crate::provider::openai::OpenAi;
use crate::provider::upstream::Gate;
use crate::provider::{
    fold_event, Provider, ProviderError, Refused, Research, TurnEvent, TurnReply, TurnRequest,
};
use crate::research::{RunConfig, RunOptions};
use crate::state::policy::{self, Policies};
use crate::state::store::Store;
use inference::Sampling;
use prompts::{Message, ToolDef};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// What a chat completion streams.
#[derive(Debug)]
pub(crate) enum ChatMsg {
    Event(toolparse::Event),
    Done(Result<ChatOutput, ProviderError>),
}

/// A `POST /v1/research` request.
#[derive(Debug)]
pub(crate) struct ResearchRequest {
    pub(crate) question: String,
    pub(crate) chat_id: Option<String>,
    pub(crate) voice: bool,
    /// Lowers the setting for this run (never raises it).
    pub(crate) max_tool_iters: Option<usize>,
}

/// A unit of work for the model.
pub(crate) enum Job {
    Chat {
        messages: Vec<Message>,
        tools: Vec<ToolDef>,
        params: ChatParams,
        cancel: Arc<AtomicBool>,
        tx: UnboundedSender<ChatMsg>,
    },
    Research {
        request: ResearchRequest,
        cancel: Arc<AtomicBool>,
        tx: UnboundedSender<Ev>,
    },
    Resume {
        run_id: String,
        cancel: Arc<AtomicBool>,
        tx: UnboundedSender<Ev>,
        err: UnboundedSender<String>,
    },
    /// Prompt tokens of a research turn (for fitting it to the context).
    Count {
        messages: Vec<Message>,
        tools: Vec<ToolDef>,
        tx: Sender<Result<usize, ProviderError>>,
    },
    /// A research thread ended: its slot is free.
    Finished,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Job::Chat { .. } => "Job::Chat",
            Job::Research { .. } => "Job::Research",
            Job::Resume { .. } => "Job::Resume",
            Job::Count { .. } => "Job::Count",
            Job::Finished => "Job::Finished",
        })
    }
}

/// The queue's front door. A job carries whether it came from a client
/// (counted against the capacity) or from a running research thread.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    tx: Sender<(Job, bool)>,
    pub(crate) depth: Arc<AtomicUsize>,
    pub(crate) capacity: usize,
}

/// The queue is full.
#[derive(Debug)]
pub(crate) struct Full;

/// What the worker needs besides the model.
pub(crate) struct Setup {
    pub(crate) local: Local,
    pub(crate) policies: Policies,
    pub(crate) metrics: Arc<super::metrics::Metrics>,
    /// What every research run uses: the daemon's engine, corpus, notes.
    pub(crate) config: RunConfig,
}

impl Worker {
    pub(crate) fn start(setup: Setup, capacity: usize) -> Worker {
        let (tx, rx) = channel::<(Job, bool)>();
        let worker = Worker { tx, depth: Arc::new(AtomicUsize::new(0)), capacity };
        let me = worker.clone();
        std::thread::Builder::new()
            .name("agentd-engine".into())
            .spawn(move || {
                let mut setup = setup;
                serve_jobs(&mut setup, &rx, &me);
            })
            .expect("spawning the engine thread");
        worker
    }

    /// A client's job: refused at once when the queue is full.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Full> {
        if self.depth.fetch_add(1, Ordering::Relaxed) >= self.capacity {
            self.depth.fetch_sub(1, Ordering::Relaxed);
            return Err(Full);
        }
        if self.tx.send((job, true)).is_err() {
            self.depth.fetch_sub(1, Ordering::Relaxed);
            return Err(Full);
        }
        Ok(())
    }

    /// The dispatcher in front of an upstream engine (no engine thread):
    /// chat completions go upstream through `gate`, research runs use
    /// `upstream` as their provider. Without one (`--provider scripted`,
    /// for tests) each run builds its provider from the daemon's ENGINE
    /// options and chat completions are refused.
    pub(crate) fn start_upstream(
        upstream: Option<OpenAi>,
        gate: Arc<Gate>,
        policies: Policies,
        metrics: Arc<super::metrics::Metrics>,
        config: RunConfig,
        capacity: usize,
    ) -> Worker {
        let (tx, rx) = channel::<(Job, bool)>();
        let worker = Worker { tx, depth: Arc::new(AtomicUsize::new(0)), capacity };
        let me = worker.clone();
        let setup = RunSetup {
            context: policies.get(policy::CONTEXT) as usize,
            name: upstream.as_ref().map_or_else(|| "scripted".into(), |u| u.describe()),
            sampling: Sampling::default(),
            research: Research::Model,
            built: upstream.is_none(),
            policies,
            metrics,
            config,
            upstream: upstream.map(|u| u.with_gate(Arc::clone(&gate))),
        };
        std::thread::Builder::new()
            .name("agentd-upstream".into())
            .spawn(move || serve_upstream(&setup, &gate, &rx, &me))
            .expect("spawning the upstream dispatcher");
        worker
    }

    /// A job of an admitted research run.
    fn internal(&self, job: Job) -> Result<(), ProviderError> {
        self.tx
            .send((job, false))
            .map_err(|_| ProviderError::Failed("the engine has stopped".into()))
    }
}

/// What a research thread needs besides the engine.
#[derive(Clone)]
struct RunSetup {
    policies: Policies,
    metrics: Arc<super::metrics::Metrics>,
    config: RunConfig,
    context: usize,
    name: String,
    sampling: Sampling,
    /// Who drives research with the daemon's model.
    research: Research,
    /// In front of an upstream: the provider every run uses.
    upstream: Option<OpenAi>,
    /// Each run builds its provider from `config.engine` (scripted).
    built: bool,
}

/// The research loop's provider inside `serve`: each turn goes to the
/// engine thread as a completion (joining the batch), its events come back.
struct EngineLink {
    worker: Worker,
    /// The run's cancel flag: what the engine watches for this run's turns.
    cancel: Arc<AtomicBool>,
    context: usize,
    name: String,
    sampling: Sampling,
    research: Research,
}

impl EngineLink {
    fn tokens(&self, messages: &[Message], tools: &[ToolDef]) -> Result<usize, ProviderError> {
        let (tx, rx) = channel();
        self.worker.internal(Job::Count {
            messages: messages.to_vec(),
            tools: tools.to_vec(),
            tx,
        })?;
        rx.recv().map_err(|_| ProviderError::Failed("the engine has stopped".into()))?
    }
}

impl Provider for EngineLink {
    fn turn(
        &mut self,
        req: &TurnRequest<'_>,
        cancel: &AtomicBool,
        attempt: &mut dyn FnMut(u32) -> Result<(), Refused>,
        on: &mut dyn FnMut(TurnEvent),
    ) -> Result<TurnReply, ProviderError> {
        admit_turn(self.tokens(req.messages, req.tools)?, self.context, attempt)?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // This turn's own flag: set when the run is cancelled or the loop
        // stops the turn (`cancel`, e.g. its text is junk) — the latter
        // ends the turn, not the run.
        let stop = Arc::new(AtomicBool::new(
            cancel.load(Ordering::Relaxed) || self.cancel.load(Ordering::Relaxed),
        ));
        self.worker.internal(Job::Chat {
            messages: req.messages.to_vec(),
            tools: req.tools.to_vec(),
            params: turn_params(&self.sampling, req),
            cancel: Arc::clone(&stop),
            tx,
        })?;
        let mut reply = TurnReply::empty();
        loop {
            let msg = match rx.try_recv() {
                Ok(m) => Some(m),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                    if cancel.load(Ordering::Relaxed) || self.cancel.load(Ordering::Relaxed) {
                        stop.store(true, Ordering::Relaxed);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    continue;
                }
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => None,
            };
            match msg {
                Some(ChatMsg::Event(e)) => fold_event(&mut reply, e, on),
                Some(ChatMsg::Done(r)) => {
                    reply.finish = turn_finish(r?.finish);
                    return Ok(reply);
                }
                None => return Err(ProviderError::Failed("the engine has stopped".into())),
            }
        }
    }

    /// Section workers: every request goes to the engine thread at once,
    /// so they decode together in its batch (with other clients' turns).
    fn turns(
        &mut self,
        reqs: &[TurnRequest<'_>],
        cancel: &AtomicBool,
        attempt: &mut dyn FnMut(usize, u32) -> Result<(), Refused>,
    ) -> Vec<Result<TurnReply, ProviderError>> {
        let mut out: Vec<Option<Result<TurnReply, ProviderError>>> = Vec::new();
        let mut pending = Vec::new();
        for (i, req) in reqs.iter().enumerate() {
            let sent = self.tokens(req.messages, req.tools).and_then(|n| {
                admit_turn(n, self.context, &mut |k| attempt(i, k))?;
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                self.worker.internal(Job::Chat {
                    messages: req.messages.to_vec(),
                    tools: req.tools.to_vec(),
                    params: turn_params(&self.sampling, req),
                    cancel: Arc::clone(&self.cancel),
                    tx,
                })?;
                Ok(rx)
            });
            match sent {
                Ok(rx) => {
                    pending.push((i, rx, TurnReply::empty()));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        while !pending.is_empty() {
            let mut progressed = false;
            pending.retain_mut(|(i, rx, reply)| loop {
                match rx.try_recv() {
                    Ok(ChatMsg::Event(e)) => {
                        progressed = true;
                        fold_event(reply, e, &mut |_| {});
                    }
                    Ok(ChatMsg::Done(r)) => {
                        progressed = true;
                        let mut reply = std::mem::replace(reply, TurnReply::empty());
                        out[*i] = Some(r.map(|o| {
                            reply.finish = turn_finish(o.finish);
                            reply
                        }));
                        return false;
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => return true,
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                        out[*i] = Some(Err(ProviderError::Failed("the engine has stopped".into())));
                        return false;
                    }
                }
            });
            if cancel.load(Ordering::Relaxed) {
                self.cancel.store(true, Ordering::Relaxed);
            }
            if !progressed {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ProviderError::Failed("no reply".into()))))
            .collect()
    }

    fn count(&mut self, messages: &[Message], tools: &[ToolDef]) -> Option<usize> {
        self.tokens(messages, tools).ok()
    }

    fn context(&self) -> Option<usize> {
        Some(self.context)
    }

    fn describe(&self) -> String {
        format!("local:{}", self.name)
    }

    fn research(&self) -> Research {
        self.research
    }
}

/// A chat completion decoding in the batch.
struct Active {
    run: ChatRun,
    cancel: Arc<AtomicBool>,
    tx: UnboundedSender<ChatMsg>,
    started: std::time::Instant,
}

/// The engine thread's loop: admits chat completions into the batch while
/// there is room, steps the batch, answers token counts, and starts
/// research threads while there are slots.
fn serve_jobs(setup: &mut Setup, rx: &Receiver<(Job, bool)>, worker: &Worker) {
    let batch = (setup.policies.get(policy::DECODE_BATCH) as usize).max(1);
    let run_setup = RunSetup {
        policies: setup.policies.clone(),
        metrics: Arc::clone(&setup.metrics),
        config: setup.config.clone(),
        context: setup.local.engine.info().context,
        name: setup.local.resolved.name.clone(),
        sampling: setup.local.sampling.clone(),
        research: setup.local.research(),
        upstream: None,
        built: false,
    };
    let mut active: Vec<Active> = Vec::new();
    // Completions waiting for room in the batch, and research jobs waiting
    // for a slot, in arrival order (with whether a client sent them: those
    // stay counted in the queue until they start).
    let mut pending: VecDeque<(Job, bool)> = VecDeque::new();
    let mut held: VecDeque<(Job, bool)> = VecDeque::new();
    let mut research = 0usize;
    // Set when the engine could not be reloaded after a panic: why every
    // request now fails.
    let mut broken: Option<String> = None;
    loop {
        // Take everything that has arrived (waiting only when idle): token
        // counts and slot releases are answered at once, between steps,
        // even while the batch is full.
        let idle = active.is_empty() && pending.is_empty();
        let mut wait = idle;
        loop {
            let next = if wait {
                rx.recv().map_err(|_| TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            // Something arrived (or nothing will): take the rest without
            // waiting, then go and act on it.
            wait = false;
            match next {
                Ok((Job::Count { tx, .. }, external)) if broken.is_some() => {
                    if external {
                        worker.depth.fetch_sub(1, Ordering::Relaxed);
                    }
                    let _ = tx.send(Err(ProviderError::Failed(broken.clone().unwrap_or_default())));
                }
                Ok((Job::Count { messages, tools, tx }, external)) => {
                    // A client's count (`/v1/messages/count_tokens`) leaves
                    // the queue as it is answered. Tokenizing reads the
                    // engine, never changes it.
                    if external {
                        worker.depth.fetch_sub(1, Ordering::Relaxed);
                    }
                    let n = catch_unwind(AssertUnwindSafe(|| {
                        setup.local.prompt_tokens(&messages, &tools)
                    }))
                    .unwrap_or_else(|_| Err(ProviderError::Failed("internal error".into())));
                    let _ = tx.send(n);
                }
                Ok((Job::Finished, _)) => research = research.saturating_sub(1),
                Ok(j @ (Job::Chat { .. }, _)) => pending.push_back(j),
                Ok(j) => held.push_back(j),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if idle && held.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        while research < batch {
            let Some((job, external)) = held.pop_front() else { break };
            if external {
                worker.depth.fetch_sub(1, Ordering::Relaxed);
            }
            research += 1;
            spawn_research(job, run_setup.clone(), worker.clone());
        }
        while active.len() < batch {
            let Some((job, external)) = pending.pop_front() else { break };
            if external {
                worker.depth.fetch_sub(1, Ordering::Relaxed);
            }
            let Job::Chat { messages, tools, params, cancel, tx } = job else { continue };
            if let Some(why) = &broken {
                let _ = tx.send(ChatMsg::Done(Err(ProviderError::Failed(why.clone()))));
                continue;
            }
            if cancel.load(Ordering::Relaxed) {
                let _ = tx.send(ChatMsg::Done(Ok(ChatOutput::cancelled())));
                continue;
            }
            let started = std::time::Instant::now();
            // One request's failure never takes the worker down.
            let begun = catch_unwind(AssertUnwindSafe(|| {
                setup.local.begin_chat(&messages, &tools, &params)
            }));
            match begun {
                Ok(Ok(run)) => active.push(Active { run, cancel, tx, started }),
                Ok(Err(e)) => {
                    let _ = tx.send(ChatMsg::Done(Err(e)));
                }
                Err(_) => {
                    tracing::error!("a request panicked; the model is loaded again");
                    let _ = tx.send(ChatMsg::Done(Err(ProviderError::Failed(
                        "internal error while starting the reply".into(),
                    ))));
                    // The engine is not trusted after an unwind through it.
                    fail_all(
                        &mut active,
                        "internal error in another reply; the model is loaded again",
                    );
                    broken = reload(setup);
                }
            }
        }
        setup.metrics.batch(active.len());
        if active.is_empty() {
            continue;
        }
        let stepped = catch_unwind(AssertUnwindSafe(|| {
            let mut parts: Vec<_> = active
                .iter_mut()
                .map(|a| {
                    let Active { run, cancel, tx, .. } = a;
                    let cancel: &AtomicBool = cancel;
                    let sink = move |e: toolparse::Event| {
                        if tx.send(ChatMsg::Event(e)).is_err() {
                            // The client went away: stop within one token.
                            cancel.store(true, Ordering::Relaxed);
                        }
                    };
                    (run, cancel, sink)
                })
                .collect();
            let mut runs: Vec<ChatStep<'_>> = parts
                .iter_mut()
                .map(|(run, cancel, sink)| {
                    (&mut **run, *cancel, sink as &mut dyn FnMut(toolparse::Event))
                })
                .collect();
            setup.local.step_chats(&mut runs)
        }));
        let failure = match stepped {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => {
                tracing::error!(
                    "a decode step panicked; its replies fail, the model is loaded again"
                );
                fail_all(&mut active, "internal error while generating");
                // The engine is not trusted after an unwind through it.
                broken = reload(setup);
                continue;
            }
        };
        if let Some(msg) = failure {
            fail_all(&mut active, &msg);
            continue;
        }
        let mut i = 0;
        while i < active.len() {
            if !active[i].run.is_done() {
                i += 1;
                continue;
            }
            let a = active.swap_remove(i);
            let Active { run, cancel, tx, started } = a;
            let out = setup.local.end_chat(run, &mut |e| {
                if tx.send(ChatMsg::Event(e)).is_err() {
                    cancel.store(true, Ordering::Relaxed);
                }
            });
            setup.metrics.tokens(out.completion_tokens, started.elapsed());
            let _ = tx.send(ChatMsg::Done(Ok(out)));
        }
    }
}

/// Ends every reply in the batch with `msg`.
fn fail_all(active: &mut Vec<Active>, msg: &str) {
    for a in active.drain(..) {
        let _ = a.tx.send(ChatMsg::Done(Err(ProviderError::Failed(msg.to_owned()))));
    }
}

/// Loads the model again after a panic unwound through the engine (its
/// sessions and buffers are not trusted after that); `Some(why)` when it
/// cannot be loaded: then every request fails, saying so.
fn reload(setup: &mut Setup) -> Option<String> {
    let args = &setup.config.engine;
    let context = Some(setup.policies.get(policy::CONTEXT) as usize);
    match Local::load(args, args.tool_format.as_deref(), context) {
        Ok(local) => {
            setup.local = local;
            None
        }
        Err(e) => {
            let why = format!(
                "the model failed and could not be loaded again ({e:#}); restart agentd serve"
            );
            tracing::error!("{why}");
            Some(why)
        }
    }
}

/// The dispatcher in front of an upstream: chat completions start in
/// queue order as the gate frees places, each on a thread of its own;
/// research runs start up to the gate's size at once.
fn serve_upstream(setup: &RunSetup, gate: &Arc<Gate>, rx: &Receiver<(Job, bool)>, worker: &Worker) {
    let slots = (setup.policies.get(policy::UPSTREAM_CONCURRENCY) as usize).max(1);
    let upstream = setup.upstream.clone();
    let mut pending: VecDeque<(Job, bool)> = VecDeque::new();
    let mut held: VecDeque<(Job, bool)> = VecDeque::new();
    let mut research = 0usize;
    loop {
        let idle = pending.is_empty() && held.is_empty();
        // Waiting for a place: look again soon (a place frees when a
        // reply or a research turn ends).
        let next = if idle {
            rx.recv().map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(std::time::Duration::from_millis(5))
        };
        match next {
            Ok((Job::Count { tx, .. }, _)) => {
                let _ = tx.send(Err(ProviderError::Failed("the upstream counts no tokens".into())));
            }
            Ok((Job::Finished, _)) => research = research.saturating_sub(1),
            Ok(j @ (Job::Chat { .. }, _)) => pending.push_back(j),
            Ok(j) => held.push_back(j),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                if idle {
                    return;
                }
            }
        }
        while research < slots {
            let Some((job, external)) = held.pop_front() else { break };
            if external {
                worker.depth.fetch_sub(1, Ordering::Relaxed);
            }
            research += 1;
            spawn_research(job, setup.clone(), worker.clone());
        }
        while !pending.is_empty() {
            let Some(place) = gate.try_acquire() else { break };
            let Some((job, external)) = pending.pop_front() else { break };
            if external {
                worker.depth.fetch_sub(1, Ordering::Relaxed);
            }
            let Job::Chat { messages, tools, params, cancel, tx } = job else { continue };
            let Some(up) = upstream.clone() else {
                let _ = tx.send(ChatMsg::Done(Err(ProviderError::Failed(
                    "--provider scripted serves /v1/research only; chat completions need --provider local or openai".into(),
                ))));
                continue;
            };
            let metrics = Arc::clone(&setup.metrics);
            let spawned =
                std::thread::Builder::new().name("agentd-forward".into()).spawn(move || {
                    let _place = place;
                    let started = std::time::Instant::now();
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        up.forward(&messages, &tools, &params, &cancel, &mut |e| {
                            if tx.send(ChatMsg::Event(e)).is_err() {
                                // The client went away: close the upstream stream.
                                cancel.store(true, Ordering::Relaxed);
                            }
                        })
                    }))
                    .unwrap_or_else(|_| {
                        Err(ProviderError::Failed("internal error while forwarding".into()))
                    });
                    match &r {
                        Ok(o) => metrics.tokens(o.completion_tokens, started.elapsed()),
                        Err(e) => metrics.error(e.code().1),
                    }
                    let _ = tx.send(ChatMsg::Done(r));
                });
            if let Err(e) = spawned {
                eprintln!("agentd serve: cannot start a forwarding thread: {e}");
            }
        }
    }
}

/// Frees the research slot when the thread ends, however it ends.
struct SlotGuard(Worker);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let _ = self.0.internal(Job::Finished);
    }
}

/// Runs a research job (or a resume) on a thread of its own.
fn spawn_research(job: Job, setup: RunSetup, worker: Worker) {
    let guard = SlotGuard(worker.clone());
    let spawned = std::thread::Builder::new().name("agentd-research".into()).spawn(move || {
        let _guard = guard;
        let r = catch_unwind(AssertUnwindSafe(|| research_job(job, &setup, worker)));
        if r.is_err() {
            tracing::error!("a research run panicked; the daemon goes on");
        }
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start a research thread: {e}");
    }
}

fn research_job(job: Job, setup: &RunSetup, worker: Worker) {
    let store = match Store::open() {
        Ok(s) => s,
        Err(e) => {
            let text = format!("the research run cannot open the store: {e:#}");
            match job {
                Job::Research { tx, .. } => {
                    let _ = tx.send(Ev::Notice { kind: "error", text });
                }
                Job::Resume { err, .. } => {
                    let _ = err.send(text);
                }
                _ => {}
            }
            return;
        }
    };
    let link = |cancel: &Arc<AtomicBool>| -> Result<Box<dyn Provider>, String> {
        if setup.built {
            return crate::provider::build::build(&setup.config.engine, &setup.policies)
                .map_err(|e| format!("{e:#}"));
        }
        Ok(match &setup.upstream {
            Some(u) => Box::new(u.clone()),
            None => Box::new(EngineLink {
                worker: worker.clone(),
                cancel: Arc::clone(cancel),
                context: setup.context,
                name: setup.name.clone(),
                sampling: setup.sampling.clone(),
                research: setup.research,
            }),
        })
    };
    match job {
        Job::Research { request, cancel, tx } => {
            let mut host = match setup.config.host(&setup.policies) {
                Ok(h) => h,
                Err(e) => {
                    let _ = tx.send(Ev::Notice { kind: "error", text: format!("{e:#}") });
                    return;
                }
            };
            let mut policies = setup.policies.clone();
            if let Some(n) = request.max_tool_iters {
                // A request may only lower the setting.
                let cur = policies.get(policy::ROUNDS);
                policies.values.insert(policy::ROUNDS.into(), cur.min(n as i64));
            }
            let mut link = match link(&cancel) {
                Ok(l) => l,
                Err(text) => {
                    let _ = tx.send(Ev::Notice { kind: "error", text });
                    return;
                }
            };
            let opts = RunOptions {
                question: request.question,
                chat_id: request.chat_id,
                voice: request.voice,
                provider: link.describe(),
                config: setup.config.clone(),
            };
            let done = crate::research::run(
                link.as_mut(),
                &mut host,
                &store,
                &policies,
                &opts,
                &cancel,
                &mut |e| {
                    if tx.send(e.clone()).is_err() {
                        cancel.store(true, Ordering::Relaxed);
                    }
                },
            );
            setup.metrics.research(&done);
        }
        Job::Resume { run_id, cancel, tx, err } => {
            let mut link = match link(&cancel) {
                Ok(l) => l,
                Err(text) => {
                    let _ = err.send(text);
                    return;
                }
            };
            match crate::research::resume_with(&store, &run_id, link.as_mut(), &cancel, &mut |e| {
                let _ = tx.send(e.clone());
            }) {
                Ok(done) => setup.metrics.research(&done),
                Err(e) => {
                    let _ = err.send(format!("{e:#}"));
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_refuses_beyond_its_capacity_and_research_turns_skip_it() {
        let (tx, rx) = channel();
        let w = Worker { tx, depth: Arc::new(AtomicUsize::new(0)), capacity: 2 };
        assert!(w.submit(Job::Finished).is_ok());
        assert!(w.submit(Job::Finished).is_ok());
        assert!(w.submit(Job::Finished).is_err(), "a third job is over capacity");
        assert_eq!(w.depth.load(Ordering::Relaxed), 2, "a refused job is not counted");
        // An admitted run's own requests are not clients' jobs.
        assert!(w.internal(Job::Finished).is_ok());
        assert_eq!(w.depth.load(Ordering::Relaxed), 2);
        let got: Vec<bool> = rx.try_iter().map(|(_, external)| external).collect();
        assert_eq!(got, [true, true, false]);
    }
}
