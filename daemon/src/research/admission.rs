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
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What a run researches with besides its policies: the provider options,
/// the corpus folders, the notes folder and the MCP configuration files,
/// as the user gave them, and the MCP servers already running for them.
/// The snapshot keeps the serde form: folders and files as absolute paths,
/// so a run resumed from elsewhere finds them; what it lacks reads as the
/// default.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RunConfig {
    pub(crate) engine: EngineArgs,
    #[serde(serialize_with = "absolute_all")]
    pub(crate) corpus: Vec<PathBuf>,
    #[serde(serialize_with = "absolute_some")]
    pub(crate) notes: Option<PathBuf>,
    /// The `mcp.json` files in force (`tools::mcp::files`).
    #[serde(serialize_with = "absolute_all")]
    pub(crate) mcp: Vec<PathBuf>,
    /// Their servers, started by the command (not in the snapshot); a
    /// resumed run starts its own from `mcp`.
    #[serde(skip)]
    pub(crate) servers: Option<Arc<mcp::Hub>>,
}

/// `p` made absolute where it exists, as text (lossy for a path that is not
/// UTF-8, which serde's own form of a path would refuse).
fn absolute(p: &Path) -> String {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned()).display().to_string()
}

fn absolute_all<S: Serializer>(paths: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(paths.iter().map(|p| absolute(p)))
}

fn absolute_some<S: Serializer>(path: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    path.as_deref().map(absolute).serialize(s)
}

impl RunConfig {
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

/// The stored form of a snapshot (JSON text in the run's row); what it
/// lacks reads as the default.
#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Stored<'a> {
    /// The policies in force (`Policies::snapshot`).
    policies: Value,
    config: Cow<'a, RunConfig>,
    question: Cow<'a, str>,
    voice: bool,
    /// The provider's description (`Provider::describe`); a resumed run
    /// finds its model by it.
    provider: Cow<'a, str>,
}

impl Snapshot {
    /// The stored form (JSON text) of the snapshot of a run admitted under
    /// `policies` for `opts`.
    fn encode(policies: &Policies, opts: &RunOptions) -> Result<String> {
        let stored = Stored {
            policies: policies.snapshot(),
            config: Cow::Borrowed(&opts.config),
            question: Cow::Borrowed(&opts.question),
            voice: opts.voice,
            provider: Cow::Borrowed(&opts.provider),
        };
        serde_json::to_string(&stored).context("cannot write the run's snapshot")
    }

    /// The snapshot stored as `text`; values it lacks keep their declared
    /// defaults, never newer settings.
    pub(super) fn decode(text: &str) -> Result<Snapshot> {
        let stored: Stored<'_> =
            serde_json::from_str(text).context("the run's snapshot is not readable")?;
        Ok(Snapshot {
            policies: Policies::from_snapshot(&stored.policies).context("the run's snapshot")?,
            config: stored.config.into_owned(),
            voice: stored.voice,
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
        .and_then(|()| Snapshot::encode(policies, opts))
        .and_then(|snapshot| {
            store
                .insert_run(&NewRun {
                    id: &run_id,
                    chat_id: &chat_id,
                    question: &opts.question,
                    snapshot: &snapshot,
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
        decode: Default::default(),
        run_id: run_id.to_owned(),
        chat_id: chat_id.to_owned(),
    };
    emit(&Ev::Done(done.clone()));
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RunConfig {
        RunConfig {
            engine: EngineArgs {
                model: Some("m".into()),
                device: "cpu".into(),
                ..Default::default()
            },
            corpus: vec!["/no/such/corpus".into(), "/tmp".into()],
            notes: Some("/no/such/notes".into()),
            mcp: vec![],
            servers: None,
        }
    }

    /// The snapshot's JSON (what `GET /v1/runs/{id}` and a resumed run read)
    /// keeps its fields and their order.
    #[test]
    fn the_snapshot_keeps_its_json_and_reads_back() {
        let config = config();
        assert_eq!(
            serde_json::to_string(&config).unwrap(),
            r#"{"engine":{"model":"m","device":"cpu","threads":null,"provider":"local","base_url":null,"api_key_env":null,"tool_format":null,"script":null,"research":null,"draft":8,"draft_model":null,"kv_type":null},"corpus":["/no/such/corpus","/tmp"],"notes":"/no/such/notes","mcp":[]}"#
        );
        let policies = Policies::from_snapshot(&Value::Null).unwrap();
        let opts = RunOptions {
            question: "why?".into(),
            chat_id: None,
            voice: true,
            provider: "local:m".into(),
            config,
        };
        let text = Snapshot::encode(&policies, &opts).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["policies", "config", "question", "voice", "provider"]);
        assert_eq!(
            (&v["question"], &v["provider"]),
            (&Value::from("why?"), &Value::from("local:m"))
        );
        assert_eq!(v["policies"], policies.snapshot());
        let back = Snapshot::decode(&text).unwrap();
        assert!(back.voice);
        assert_eq!(serde_json::to_value(&back.config).unwrap(), v["config"]);
    }

    /// What a snapshot lacks reads as the default: the command line's
    /// engine options, no folders.
    #[test]
    fn a_sparse_snapshot_reads_as_the_defaults() {
        let back = Snapshot::decode(r#"{"config": {"engine": {"model": "m"}}}"#).unwrap();
        assert_eq!(back.config.engine.model.as_deref(), Some("m"));
        assert_eq!(
            (back.config.engine.device.as_str(), back.config.engine.provider.as_str()),
            ("auto", "local")
        );
        assert!(back.config.corpus.is_empty() && back.config.notes.is_none() && !back.voice);
        let back = Snapshot::decode("{}").unwrap();
        assert_eq!(back.config.engine.provider, "local");
        assert!(Snapshot::decode("not json").is_err());
    }
}
