//! The engine worker: one thread owns the local model and serves jobs from
//! a bounded first-come-first-served queue. A full queue is refused at
//! once (the HTTP layer answers 503 with Retry-After).
//!
//! Chat completions run together: up to `server/decode-batch` of them
//! decode in one batched pass per token (each gets exactly the tokens it
//! would get alone), and a new one joins as soon as it is admitted. A
//! research run or a resume takes the model alone: it waits, in queue
//! order, until the running completions finish, and nothing behind it
//! starts before it.

use crate::events::Ev;
use crate::policy::Policies;
use crate::provider::local::{ChatOutput, ChatParams, ChatRun, ChatStep, Local};
use crate::provider::ProviderError;
use crate::research::RunOptions;
use crate::store::Store;
use crate::tools::Host;
use prompts::{Message, ToolDef};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// What a chat completion streams.
#[derive(Debug)]
pub(crate) enum ChatMsg {
    Event(toolparse::Event),
    Done(Result<ChatOutput, ProviderError>),
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
        opts: RunOptions,
        max_tool_iters: Option<usize>,
        cancel: Arc<AtomicBool>,
        tx: UnboundedSender<Ev>,
    },
    Resume {
        run_id: String,
        cancel: Arc<AtomicBool>,
        tx: UnboundedSender<Ev>,
        err: UnboundedSender<String>,
    },
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Job::Chat { .. } => "Job::Chat",
            Job::Research { .. } => "Job::Research",
            Job::Resume { .. } => "Job::Resume",
        })
    }
}

/// The queue's front door.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    tx: SyncSender<Job>,
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
    pub(crate) corpus: Vec<std::path::PathBuf>,
    pub(crate) notes: Option<std::path::PathBuf>,
    pub(crate) metrics: Arc<super::metrics::Metrics>,
    pub(crate) config: serde_json::Value,
}

impl Worker {
    pub(crate) fn start(setup: Setup, capacity: usize) -> Worker {
        let (tx, rx) = sync_channel::<Job>(capacity);
        let depth = Arc::new(AtomicUsize::new(0));
        let d2 = Arc::clone(&depth);
        std::thread::Builder::new()
            .name("agentd-engine".into())
            .spawn(move || {
                let mut setup = setup;
                let store = match Store::open() {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("agentd serve: the engine cannot open the store: {e:#}");
                        return;
                    }
                };
                serve_jobs(&mut setup, &store, &rx, &d2);
            })
            .expect("spawning the engine thread");
        Worker { tx, depth, capacity }
    }

    pub(crate) fn submit(&self, job: Job) -> Result<(), Full> {
        self.depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.depth.fetch_sub(1, Ordering::Relaxed);
                Err(Full)
            }
        }
    }
}

fn host(setup: &Setup) -> Result<Host, String> {
    let limits = crate::runs::tool_limits(&setup.policies);
    let corpus = if setup.corpus.is_empty() {
        None
    } else {
        Some(
            crate::tools::corpus::Corpus::open(
                &setup.corpus,
                setup.policies.get(crate::policy::SEGMENT) as usize,
            )
            .map_err(|e| format!("{e:#}"))?,
        )
    };
    Ok(Host::new(corpus, setup.notes.clone(), limits))
}

/// A chat completion decoding in the batch.
struct Active {
    run: ChatRun,
    cancel: Arc<AtomicBool>,
    tx: UnboundedSender<ChatMsg>,
    started: std::time::Instant,
}

/// The engine thread's loop: admits chat completions into the batch while
/// there is room, steps the batch, and runs other jobs alone in turn.
fn serve_jobs(setup: &mut Setup, store: &Store, rx: &Receiver<Job>, depth: &AtomicUsize) {
    let batch = (setup.policies.get(crate::policy::DECODE_BATCH) as usize).max(1);
    let mut active: Vec<Active> = Vec::new();
    // A job taken from the queue that must wait for the batch to drain.
    let mut waiting: Option<Job> = None;
    loop {
        while active.len() < batch {
            let job = match waiting.take() {
                Some(j) => j,
                None => {
                    let next = if active.is_empty() {
                        rx.recv().map_err(|_| TryRecvError::Disconnected)
                    } else {
                        rx.try_recv()
                    };
                    match next {
                        Ok(j) => {
                            depth.fetch_sub(1, Ordering::Relaxed);
                            j
                        }
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) if active.is_empty() => return,
                        Err(TryRecvError::Disconnected) => break,
                    }
                }
            };
            match job {
                Job::Chat { messages, tools, params, cancel, tx } => {
                    if cancel.load(Ordering::Relaxed) {
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
                            eprintln!("agentd serve: a request panicked; the worker goes on");
                            let _ = tx.send(ChatMsg::Done(Err(ProviderError::Failed(
                                "internal error while starting the reply".into(),
                            ))));
                        }
                    }
                }
                other if active.is_empty() => {
                    let r = catch_unwind(AssertUnwindSafe(|| run(setup, store, other)));
                    if r.is_err() {
                        eprintln!("agentd serve: a request panicked; the worker goes on");
                    }
                }
                other => {
                    waiting = Some(other);
                    break;
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
                eprintln!(
                    "agentd serve: a decode step panicked; its replies fail, the worker goes on"
                );
                Some("internal error while generating".into())
            }
        };
        if let Some(msg) = failure {
            for a in active.drain(..) {
                let _ = a.tx.send(ChatMsg::Done(Err(ProviderError::Failed(msg.clone()))));
            }
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

fn run(setup: &mut Setup, store: &Store, job: Job) {
    match job {
        Job::Chat { messages, tools, params, cancel, tx } => {
            if cancel.load(Ordering::Relaxed) {
                return;
            }
            let t = std::time::Instant::now();
            let r = setup.local.chat(&messages, &tools, &params, &cancel, &mut |e| {
                if tx.send(ChatMsg::Event(e)).is_err() {
                    cancel.store(true, Ordering::Relaxed);
                }
            });
            if let Ok(o) = &r {
                setup.metrics.tokens(o.completion_tokens, t.elapsed());
            }
            let _ = tx.send(ChatMsg::Done(r));
        }
        Job::Research { mut opts, max_tool_iters, cancel, tx } => {
            let mut host = match host(setup) {
                Ok(h) => h,
                Err(e) => {
                    let _ = tx.send(Ev::Notice { kind: "error", text: e });
                    return;
                }
            };
            let mut policies = setup.policies.clone();
            if let Some(n) = max_tool_iters {
                // A request may only lower the setting.
                let cur = policies.get(crate::policy::ROUNDS);
                policies.values.insert(crate::policy::ROUNDS.into(), cur.min(n as i64));
            }
            opts.config = setup.config.clone();
            let metrics = Arc::clone(&setup.metrics);
            let done = crate::research::run(
                &mut setup.local,
                &mut host,
                store,
                &policies,
                &opts,
                &cancel,
                &mut |e| {
                    if tx.send(e.clone()).is_err() {
                        cancel.store(true, Ordering::Relaxed);
                    }
                },
            );
            metrics.research(&done);
        }
        Job::Resume { run_id, cancel, tx, err } => {
            let metrics = Arc::clone(&setup.metrics);
            match crate::runs::resume_with(store, &run_id, &mut setup.local, &cancel, &mut |e| {
                let _ = tx.send(e.clone());
            }) {
                Ok(done) => metrics.research(&done),
                Err(e) => {
                    let _ = err.send(format!("{e:#}"));
                }
            }
        }
    }
}
