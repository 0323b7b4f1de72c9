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
use crate::events::Phase;
use crate::provider::chat::{turn_params, ChatMsg, ChatOutput, ChatParams, Sampling};
use crate::provider::engine::{Batch, ChatJob};
use crate::provider::openai::OpenAi;
use crate::provider::upstream::Gate;
use crate::provider::{Failure, Provider, ProviderError, Research, Tried, Try, TurnRequest};
use crate::research::{RunConfig, RunOptions};
use crate::state::policy::{self, Policies};
use crate::state::store::Store;
use prompts::{Message, ToolDef};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

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
    Chat(ChatJob),
    Research {
        request: ResearchRequest,
        cancel: Arc<AtomicBool>,
        tx: UnboundedSender<Ev>,
        /// The hold on the model, kept while the run runs.
        hold: Option<super::models::Lease>,
    },
    Resume {
        run_id: String,
        cancel: Arc<AtomicBool>,
        tx: UnboundedSender<Ev>,
        err: UnboundedSender<String>,
        hold: Option<super::models::Lease>,
    },
    /// Prompt tokens of a research turn (for fitting it to the context).
    Count {
        messages: Vec<Message>,
        tools: Vec<ToolDef>,
        tx: Sender<Result<usize, ProviderError>>,
    },
    /// Embeddings of inputs (`/v1/embeddings`, `/api/embed`), answered
    /// between the batch's steps.
    Embed {
        inputs: Vec<crate::provider::engine::EmbedInput>,
        /// Cut an input longer than the context instead of refusing it.
        truncate: bool,
        tx: Sender<Result<Vec<inference::Embedding>, ProviderError>>,
    },
    /// A research thread ended: its slot is free.
    Finished,
    /// A place in the upstream gate freed.
    Wake,
    /// The model is unloaded: the engine thread ends once idle.
    Stop,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Job::Chat(_) => "Job::Chat",
            Job::Research { .. } => "Job::Research",
            Job::Resume { .. } => "Job::Resume",
            Job::Count { .. } => "Job::Count",
            Job::Embed { .. } => "Job::Embed",
            Job::Finished => "Job::Finished",
            Job::Wake => "Job::Wake",
            Job::Stop => "Job::Stop",
        })
    }
}

/// The queue's front door. A job carries whether it came from a client
/// (counted against the capacity) or from a running research thread.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    tx: UnboundedSender<(Job, bool)>,
    pub(crate) depth: Arc<AtomicUsize>,
    pub(crate) capacity: usize,
}

/// The queue is full.
#[derive(Debug)]
pub(crate) struct Full;

/// What the engine thread serves with: the model and the rest.
struct Setup {
    batch: Batch,
    policies: Policies,
    metrics: Arc<super::metrics::Metrics>,
    /// What every research run uses: the daemon's engine, corpus, notes.
    config: RunConfig,
}

impl Worker {
    /// Starts an engine thread that first loads its model with `load`
    /// (so the model's memory and its decoding live in the thread's own
    /// allocator arena, which the next engine thread reuses once this one
    /// ends: unloading and loading again does not grow the daemon), then
    /// serves. Returns once the model is loaded, with `describe`'s view of
    /// it, or the load's error.
    pub(crate) fn start_loading<T: Send + 'static>(
        load: impl FnOnce() -> anyhow::Result<Batch> + Send + 'static,
        describe: impl FnOnce(&Batch) -> T + Send + 'static,
        policies: Policies,
        metrics: Arc<super::metrics::Metrics>,
        config: RunConfig,
        capacity: usize,
    ) -> anyhow::Result<(Worker, T)> {
        let (tx, mut rx) = unbounded_channel::<(Job, bool)>();
        let worker = Worker { tx, depth: Arc::new(AtomicUsize::new(0)), capacity };
        let me = worker.clone();
        let (ready_tx, ready_rx) = channel();
        std::thread::Builder::new().name("agentd-engine".into()).spawn(move || {
            let batch = match load() {
                Ok(b) => b,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(describe(&batch)));
            let mut setup = Setup { batch, policies, metrics, config };
            serve_jobs(&mut setup, &mut rx, &me);
        })?;
        let seen = ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the engine thread ended while loading the model"))??;
        Ok((worker, seen))
    }

    /// Whether the thread behind the queue still takes jobs (it ends when
    /// its model is unloaded, or if it died).
    pub(crate) fn alive(&self) -> bool {
        !self.tx.is_closed()
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
    /// options, and chat completions run on one such provider, shared.
    pub(crate) fn start_upstream(
        upstream: Option<OpenAi>,
        gate: Arc<Gate>,
        policies: Policies,
        metrics: Arc<super::metrics::Metrics>,
        config: RunConfig,
        capacity: usize,
    ) -> Worker {
        let (tx, mut rx) = unbounded_channel::<(Job, bool)>();
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
            .spawn(move || serve_upstream(&setup, &gate, &mut rx, &me))
            .expect("spawning the upstream dispatcher");
        worker
    }

    /// Ends the engine thread once it has nothing left to do (the model
    /// is unloaded).
    pub(super) fn stop(&self) {
        let _ = self.internal(Job::Stop);
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
    /// Sends one request to the engine thread (joining its batch); its
    /// events come back on the returned channel. The request stops when
    /// `stop` or the run's own flag is set.
    fn send(
        &self,
        req: &TurnRequest<'_>,
        stop: Arc<AtomicBool>,
    ) -> Result<UnboundedReceiver<ChatMsg>, ProviderError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.worker.internal(Job::Chat(ChatJob {
            messages: req.messages.to_vec(),
            tools: req.tools.to_vec(),
            params: turn_params(&self.sampling, req),
            cancel: stop,
            run: Some(Arc::clone(&self.cancel)),
            tx,
            hold: None,
        }))?;
        Ok(rx)
    }
}

/// Hands what a request streams to `sink` until it ends, waiting on the
/// channel (no polling); `after` runs after each event.
fn collect(
    rx: &mut UnboundedReceiver<ChatMsg>,
    sink: &mut dyn FnMut(toolparse::Event),
    decode: &mut crate::events::Decode,
    after: &mut dyn FnMut(),
) -> Tried {
    loop {
        match rx.blocking_recv() {
            Some(ChatMsg::Event(e)) => {
                sink(e);
                after();
            }
            Some(ChatMsg::Done(r)) => {
                return r
                    .map(|o| {
                        *decode = o.decode;
                        o.finish
                    })
                    .map_err(Failure::Final)
            }
            None => {
                return Err(Failure::Final(ProviderError::Failed("the engine has stopped".into())))
            }
        }
    }
}

impl Provider for EngineLink {
    /// Every try goes to the engine thread at once, so they decode
    /// together in its batch (with other clients' turns); their events
    /// are then read one request after another. The tries' own flag,
    /// which the engine watches beside the run's, is set as soon as the
    /// caller's `cancel` is (the caller stops a turn, e.g. its text is
    /// junk, as it hears an event: that ends the turn, not the run).
    fn attempt(&mut self, tries: &mut [Try<'_, '_>], cancel: &AtomicBool) -> Vec<Tried> {
        let stop = Arc::new(AtomicBool::new(cancel.load(Ordering::Relaxed)));
        let sent: Vec<_> = tries.iter().map(|t| self.send(t.req, Arc::clone(&stop))).collect();
        sent.into_iter()
            .zip(tries.iter_mut())
            .map(|(rx, t)| {
                let mut rx = rx.map_err(Failure::Final)?;
                collect(&mut rx, &mut *t.sink, &mut t.decode, &mut || {
                    if cancel.load(Ordering::Relaxed) {
                        stop.store(true, Ordering::Relaxed);
                    }
                })
            })
            .collect()
    }

    fn tokens(
        &mut self,
        messages: &[Message],
        tools: &[ToolDef],
    ) -> Result<Option<usize>, ProviderError> {
        let (tx, rx) = channel();
        self.worker.internal(Job::Count {
            messages: messages.to_vec(),
            tools: tools.to_vec(),
            tx,
        })?;
        rx.recv().map_err(|_| ProviderError::Failed("the engine has stopped".into()))?.map(Some)
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

/// The engine thread's loop: admits chat requests into the batch while
/// there is room, steps the batch, answers token counts, and starts
/// research threads while there are slots.
fn serve_jobs(setup: &mut Setup, rx: &mut UnboundedReceiver<(Job, bool)>, worker: &Worker) {
    let slots = (setup.policies.get(policy::DECODE_BATCH) as usize).max(1);
    let batch = &mut setup.batch;
    let run_setup = RunSetup {
        policies: setup.policies.clone(),
        metrics: Arc::clone(&setup.metrics),
        config: setup.config.clone(),
        context: batch.context(),
        name: batch.name(),
        sampling: batch.sampling(),
        research: batch.research(),
        upstream: None,
        built: false,
    };
    // Completions waiting for room in the batch, and research jobs waiting
    // for a slot, in arrival order (with whether a client sent them: those
    // stay counted in the queue until they start).
    let mut pending: VecDeque<(Job, bool)> = VecDeque::new();
    let mut held: VecDeque<(Job, bool)> = VecDeque::new();
    let mut research = 0usize;
    // The model was unloaded: end once nothing is left to do.
    let mut stopping = false;
    loop {
        if stopping && batch.len() == 0 && pending.is_empty() && held.is_empty() && research == 0 {
            return;
        }
        // Take everything that has arrived (waiting only when idle): token
        // counts and slot releases are answered at once, between steps,
        // even while the batch is full.
        let idle = batch.len() == 0 && pending.is_empty();
        let mut wait = idle;
        loop {
            let next = if wait {
                rx.blocking_recv().ok_or(TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            // Something arrived (or nothing will): take the rest without
            // waiting, then go and act on it.
            wait = false;
            match next {
                Ok((Job::Count { messages, tools, tx }, external)) => {
                    // A client's count (`/v1/messages/count_tokens`) leaves
                    // the queue as it is answered.
                    if external {
                        worker.depth.fetch_sub(1, Ordering::Relaxed);
                    }
                    let _ = tx.send(batch.count(&messages, &tools));
                }
                Ok((Job::Embed { inputs, truncate, tx }, external)) => {
                    if external {
                        worker.depth.fetch_sub(1, Ordering::Relaxed);
                    }
                    let _ = tx.send(batch.embed(&inputs, truncate));
                }
                Ok((Job::Finished, _)) => research = research.saturating_sub(1),
                Ok((Job::Wake, _)) => {}
                Ok((Job::Stop, _)) => stopping = true,
                Ok(j @ (Job::Chat(_), _)) => pending.push_back(j),
                Ok(j) => held.push_back(j),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if idle && held.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        while research < slots {
            let Some((job, external)) = held.pop_front() else { break };
            if external {
                worker.depth.fetch_sub(1, Ordering::Relaxed);
            }
            research += 1;
            spawn_research(job, run_setup.clone(), worker.clone());
        }
        while batch.has_room() {
            let Some((job, external)) = pending.pop_front() else { break };
            if external {
                worker.depth.fetch_sub(1, Ordering::Relaxed);
            }
            if let Job::Chat(chat) = job {
                batch.start(chat);
            }
        }
        setup.metrics.batch(batch.len());
        let metrics = &setup.metrics;
        batch.step(&mut |o, took| {
            metrics.tokens(o.completion_tokens, took);
            metrics.drafts(o.decode.drafted, o.decode.accepted);
        });
    }
}

/// The dispatcher in front of an upstream: chat completions start in
/// queue order as the gate frees places, each on a thread of its own;
/// research runs start up to the gate's size at once.
fn serve_upstream(
    setup: &RunSetup,
    gate: &Arc<Gate>,
    rx: &mut UnboundedReceiver<(Job, bool)>,
    worker: &Worker,
) {
    let slots = (setup.policies.get(policy::UPSTREAM_CONCURRENCY) as usize).max(1);
    let upstream = setup.upstream.clone();
    // Without an upstream, the provider chat completions run on (built at
    // the first one, shared: a script plays its lines in request order).
    let mut built: Option<Result<Shared, String>> = None;
    let mut pending: VecDeque<(Job, bool)> = VecDeque::new();
    let mut held: VecDeque<(Job, bool)> = VecDeque::new();
    let mut research = 0usize;
    // A place that frees (a reply or a research turn ended) rings here, so
    // waiting requests start at once, without polling (the gate holds a
    // weak sender: no cycle through it).
    let bell = worker.tx.downgrade();
    gate.on_free(Box::new(move || {
        if let Some(tx) = bell.upgrade() {
            let _ = tx.send((Job::Wake, false));
        }
    }));
    loop {
        let idle = pending.is_empty() && held.is_empty();
        let next = rx.blocking_recv();
        match next {
            Some((Job::Count { messages, tools, tx }, _)) if upstream.is_none() => {
                match own(&mut built, setup) {
                    // Counted beside the chat that may hold the provider.
                    Ok(p) => {
                        std::thread::spawn(move || {
                            let n = lock(&p).count(&messages, &tools).unwrap_or(0);
                            let _ = tx.send(Ok(n));
                        });
                    }
                    Err(e) => {
                        let _ = tx.send(Err(ProviderError::Failed(e)));
                    }
                }
            }
            Some((Job::Count { tx, .. }, _)) => {
                let _ = tx.send(Err(ProviderError::Failed("the upstream counts no tokens".into())));
            }
            Some((Job::Embed { tx, .. }, external)) => {
                if external {
                    worker.depth.fetch_sub(1, Ordering::Relaxed);
                }
                let _ = tx.send(Err(ProviderError::Invalid(
                    "embeddings need the local engine: this daemon serves the model through another provider".into(),
                )));
            }
            Some((Job::Finished, _)) => research = research.saturating_sub(1),
            Some((Job::Wake | Job::Stop, _)) => {}
            Some(j @ (Job::Chat(_), _)) => pending.push_back(j),
            Some(j) => held.push_back(j),
            None if idle => return,
            // Closed while requests wait: they start as places free.
            None => gate.wait_free(),
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
            let Job::Chat(ChatJob { messages, tools, params, cancel, tx, .. }) = job else {
                continue;
            };
            let Some(up) = upstream.clone() else {
                // No upstream (`--provider scripted`): the daemon's own
                // provider, through the one backend interface.
                match own(&mut built, setup) {
                    Ok(p) => spawn_chat(p, place, messages, tools, params, cancel, tx),
                    Err(e) => {
                        let _ = tx.send(ChatMsg::Done(Err(ProviderError::Failed(e))));
                    }
                }
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

/// A provider chat completions share, one at a time.
type Shared = Arc<std::sync::Mutex<Box<dyn Provider + Send>>>;

/// The daemon's own provider (no upstream), built at its first use.
fn own(built: &mut Option<Result<Shared, String>>, setup: &RunSetup) -> Result<Shared, String> {
    built
        .get_or_insert_with(|| {
            crate::provider::build::build(&setup.config.engine, &setup.policies)
                .map(|p| Arc::new(std::sync::Mutex::new(p)))
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
}

/// The provider, even after a chat panicked holding it (each request
/// starts from the provider's state between requests).
fn lock(p: &Shared) -> std::sync::MutexGuard<'_, Box<dyn Provider + Send>> {
    p.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs one chat completion on `provider` on a thread of its own, holding
/// its place in the gate: the parser's events stream back as they come.
/// The request's messages, tools and token limit reach the provider; what
/// only a decoder can hold to (stop strings, grammars) is the engine's.
fn spawn_chat(
    provider: Shared,
    place: crate::provider::upstream::Place,
    messages: Vec<Message>,
    tools: Vec<ToolDef>,
    params: ChatParams,
    cancel: Arc<AtomicBool>,
    tx: UnboundedSender<ChatMsg>,
) {
    let spawned = std::thread::Builder::new().name("agentd-chat".into()).spawn(move || {
        let _place = place;
        let req = TurnRequest {
            messages: &messages,
            tools: &tools,
            phase: if tools.is_empty() { Phase::Final } else { Phase::Research },
            max_tokens: params.max_tokens,
            choices: &[],
        };
        let mut p = lock(&provider);
        let prompt_tokens = p.count(&messages, &tools).unwrap_or(0);
        let mut completion_tokens = 0;
        let r = catch_unwind(AssertUnwindSafe(|| {
            p.stream(&req, &cancel, &mut |e| {
                completion_tokens += 1;
                if tx.send(ChatMsg::Event(e)).is_err() {
                    cancel.store(true, Ordering::Relaxed);
                }
            })
        }))
        .unwrap_or_else(|_| Err(ProviderError::Failed("internal error in the provider".into())));
        let _ = tx.send(ChatMsg::Done(r.map(|finish| ChatOutput {
            finish,
            prompt_tokens,
            completion_tokens,
            reused_tokens: 0,
            stop: None,
            decode: Default::default(),
        })));
    });
    if let Err(e) = spawned {
        eprintln!("agentd serve: cannot start a chat thread: {e}");
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
                .map(|p| -> Box<dyn Provider> { p })
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
        Job::Research { request, cancel, tx, hold: _hold } => {
            // A new run is admitted under the settings stored now (a
            // setting changed since start-up applies from this run on);
            // its snapshot then holds for it and for its resume.
            let mut policies = match setup.policies.with_settings(&store) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(
                        "the stored settings cannot be applied ({e:#}); this run keeps the policies read at start-up — fix or reset the setting (`agentd settings reset KEY`)"
                    );
                    setup.policies.clone()
                }
            };
            let mut host = match setup.config.host(&policies) {
                Ok(h) => h,
                Err(e) => {
                    let _ = tx.send(Ev::Notice { kind: "error", text: format!("{e:#}") });
                    return;
                }
            };
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
        Job::Resume { run_id, cancel, tx, err, hold: _hold } => {
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
        let (tx, mut rx) = unbounded_channel();
        let w = Worker { tx, depth: Arc::new(AtomicUsize::new(0)), capacity: 2 };
        assert!(w.submit(Job::Finished).is_ok());
        assert!(w.submit(Job::Finished).is_ok());
        assert!(w.submit(Job::Finished).is_err(), "a third job is over capacity");
        assert_eq!(w.depth.load(Ordering::Relaxed), 2, "a refused job is not counted");
        // An admitted run's own requests are not clients' jobs.
        assert!(w.internal(Job::Finished).is_ok());
        assert_eq!(w.depth.load(Ordering::Relaxed), 2);
        let got: Vec<bool> =
            std::iter::from_fn(|| rx.try_recv().ok()).map(|(_, external)| external).collect();
        assert_eq!(got, [true, true, false]);
        assert!(w.alive());
        drop(rx);
        assert!(!w.alive(), "a queue whose thread ended is not alive");
    }
}
