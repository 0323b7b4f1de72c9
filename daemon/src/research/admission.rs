//! Admission of a run (docs/budgets.md "Reserve finalization at admission"): a new run gets
//! an id, its chat, its question and its admission snapshot — the policies
//! in force and the run's own configuration (provider options, corpus,
//! notes) — stored before its first request; its budget is carved from
//! those policies. The snapshot is what a resumed run continues under,
//! never a newer default.

use super::budget::Budget;
use super::run::{drive, Admitted, Progress};
use super::view::chat_history;
use crate::events::{Done, Ev, Outcome, RunError, Stop};
use crate::provider::build::EngineArgs;
use crate::provider::{Provider, ProviderError};
use crate::state::policy::Policies;
use crate::state::store::{new_id, MessageStatus, NewRun, Store, StoredMessage};
use crate::tools::{mcp, Host};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What a run researches with besides its policies: the provider options,
/// the corpus folders, the notes folder and the MCP configuration files,
/// as the user gave them, and the MCP servers already running for them.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunConfig {
    pub(crate) engine: EngineArgs,
    pub(crate) corpus: Vec<PathBuf>,
    pub(crate) notes: Option<PathBuf>,
    /// The `mcp.json` files in force (`tools::mcp::files`).
    pub(crate) mcp: Vec<PathBuf>,
    /// Their servers, started by the command (not in the snapshot); a
    /// resumed run starts its own from `mcp`.
    pub(crate) servers: Option<Arc<mcp::Hub>>,
}

impl RunConfig {
    /// The snapshot's form: folders as absolute paths, so a run resumed
    /// from elsewhere finds them.
    fn to_json(&self) -> Value {
        let abs = |p: &PathBuf| {
            std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()).display().to_string()
        };
        json!({
            "engine": self.engine.to_json(),
            "corpus": self.corpus.iter().map(abs).collect::<Vec<_>>(),
            "notes": self.notes.as_ref().map(abs),
            "mcp": self.mcp.iter().map(abs).collect::<Vec<_>>(),
        })
    }

    fn from_json(v: &Value) -> RunConfig {
        RunConfig {
            engine: EngineArgs::from_json(&v["engine"]),
            corpus: v["corpus"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(PathBuf::from)
                .collect(),
            notes: v["notes"].as_str().map(PathBuf::from),
            mcp: v["mcp"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(PathBuf::from)
                .collect(),
            servers: None,
        }
    }

    /// Starts the MCP servers of `mcp` (when there are any) for the runs
    /// of this configuration.
    pub(crate) fn start_servers(&mut self, policies: &Policies) -> Result<()> {
        if self.servers.is_none() && !self.mcp.is_empty() {
            self.servers = Some(Arc::new(mcp::Hub::start(&self.mcp, policies)?));
        }
        Ok(())
    }

    /// The tools of a run under `policies`.
    pub(crate) fn host(&self, policies: &Policies) -> Result<Host> {
        let servers = match &self.servers {
            Some(h) => Some(Arc::clone(h)),
            None if !self.mcp.is_empty() => Some(Arc::new(mcp::Hub::start(&self.mcp, policies)?)),
            None => None,
        };
        Host::for_run(&self.corpus, self.notes.clone(), policies, servers)
    }
}

/// What one run is asked to do.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    pub(crate) question: String,
    pub(crate) chat_id: Option<String>,
    pub(crate) voice: bool,
    /// A description of the provider, stored with the run.
    pub(crate) provider: String,
    pub(crate) config: RunConfig,
}

/// A run's admission snapshot, as recovery reads it back.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub(super) policies: Policies,
    pub(super) config: RunConfig,
    pub(super) voice: bool,
}

impl Snapshot {
    /// The stored form (JSON text) of the snapshot of a run admitted under
    /// `policies` for `opts`.
    fn encode(policies: &Policies, opts: &RunOptions) -> String {
        json!({
            "policies": policies.snapshot(),
            "config": opts.config.to_json(),
            "question": opts.question,
            "voice": opts.voice,
            "provider": opts.provider,
        })
        .to_string()
    }

    /// The snapshot stored as `text`; values it lacks keep their declared
    /// defaults, never newer settings.
    pub(super) fn decode(text: &str) -> Result<Snapshot> {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        Ok(Snapshot {
            policies: Policies::from_snapshot(&v["policies"]).context("the run's snapshot")?,
            config: RunConfig::from_json(&v["config"]),
            voice: v["voice"].as_bool().unwrap_or(false),
        })
    }
}

/// Admits a new run: stores its snapshot (the policies in force and the
/// run's own configuration) and its question, then researches it.
pub(crate) fn run(
    provider: &mut dyn Provider,
    host: &mut Host,
    store: &Store,
    policies: &Policies,
    opts: &RunOptions,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Done {
    let run_id = new_id("run");
    let chat_id = opts.chat_id.clone().unwrap_or_else(|| new_id("chat"));
    let admitted = store
        .ensure_chat(&chat_id, &opts.question)
        .context("cannot write the chat")
        .and_then(|()| {
            store
                .insert_run(&NewRun {
                    id: &run_id,
                    chat_id: &chat_id,
                    question: &opts.question,
                    snapshot: &Snapshot::encode(policies, opts),
                })
                .context("cannot write the run")
        });
    let history = chat_history(store, &chat_id, None);
    let admitted = admitted.and_then(|()| {
        store
            .add_message(&StoredMessage {
                chat_id: chat_id.clone(),
                run_id: Some(run_id.clone()),
                role: "user".into(),
                content: opts.question.clone(),
                status: MessageStatus::Complete,
                ..Default::default()
            })
            .context("cannot write the question")
    });
    if let Err(e) = admitted {
        // The ledger fails closed: a run that cannot be recorded sends
        // nothing.
        return unrecorded(&run_id, &chat_id, format!("{e:#} (run {run_id})"), emit);
    }
    let admitted = Admitted {
        run_id,
        chat_id,
        history,
        budget: Budget::from_policies(policies),
        progress: Progress::default(),
    };
    drive(provider, host, store, admitted, opts, cancel, emit)
}

/// A run whose admission could not be written: it ends at once, before any
/// request, with the ledger's error.
fn unrecorded(run_id: &str, chat_id: &str, why: String, emit: &mut dyn FnMut(&Ev)) -> Done {
    let e = ProviderError::Ledger(why);
    let (code, class) = e.code();
    emit(&Ev::Run { run_id: run_id.to_owned(), chat_id: chat_id.to_owned(), max_tool_iters: 0 });
    let done = Done {
        outcome: Outcome::Error,
        stop: Stop::Error,
        rounds: 0,
        model_requests: 0,
        answer: String::new(),
        error: Some(RunError::new(code, class, e.to_string())),
        invalid_citations: Vec::new(),
        grounded: false,
        run_id: run_id.to_owned(),
        chat_id: chat_id.to_owned(),
    };
    emit(&Ev::Done(done.clone()));
    done
}
