//! `agentd serve`: one local model for many clients over a Unix socket
//! (default, mode 0600) and, with `--listen`, loopback TCP guarded by a
//! bearer token. Routes and status codes: CONTRACTS.md "HTTP".
//!
//! The model runs on one engine thread fed by a bounded queue (503 with
//! `Retry-After` beyond it); HTTP runs on tokio. A client that disconnects
//! cancels its generation within one token; SIGTERM cancels the replies in
//! flight, which persist their text, and exits.

mod chat;
mod http;
pub(crate) mod metrics;
mod worker;

use crate::commands::engine::EngineArgs;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// Options of `agentd serve`.
#[derive(Debug)]
pub(crate) struct ServeArgs {
    pub(crate) engine: EngineArgs,
    pub(crate) corpus: Vec<PathBuf>,
    pub(crate) notes: Option<PathBuf>,
    pub(crate) socket: Option<PathBuf>,
    pub(crate) listen: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
}

/// The default socket: `$XDG_RUNTIME_DIR/agentd.sock`, else under the state
/// folder.
pub(crate) fn default_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) if std::env::var_os("AGENTD_HOME").is_none() => {
            PathBuf::from(d).join("agentd.sock")
        }
        _ => crate::state::home::home().join("agentd.sock"),
    }
}

pub(crate) fn run(a: ServeArgs) -> Result<()> {
    if a.engine.provider != "local" {
        bail!("agentd serve runs the local engine; --provider {} is for `ask`", a.engine.provider);
    }
    let socket = a.socket.clone().unwrap_or_else(default_socket);
    // A live daemon on the socket: refuse. A stale file: replace it.
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            bail!("another agentd serve is already listening on {}; stop it first or pass --socket PATH", socket.display());
        }
        std::fs::remove_file(&socket)
            .with_context(|| format!("cannot remove the stale socket {}", socket.display()))?;
    }
    let token = match (&a.listen, &a.token_file) {
        (Some(_), Some(f)) => {
            let t = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the token file {}", f.display()))?;
            let t = t.trim().to_owned();
            if t.len() < 16 {
                bail!(
                    "the token in {} is too short ({} characters); use at least 16",
                    f.display(),
                    t.len()
                );
            }
            Some(t)
        }
        (Some(addr), None) => {
            bail!("--listen {addr} needs --token-file: TCP clients must present a bearer token")
        }
        (None, _) => None,
    };
    let store = crate::state::store::Store::open()?;
    let interrupted = store.mark_interrupted(false)?;
    if interrupted > 0 {
        eprintln!("agentd serve: {interrupted} run(s) from a previous process are marked interrupted (see `agentd runs list`)");
    }
    let policies = crate::state::policy::Policies::load(&store)?;
    drop(store);
    let local = crate::provider::local::Local::load(
        &a.engine,
        a.engine.tool_format.as_deref(),
        Some(policies.get(crate::state::policy::CONTEXT) as usize),
    )?;
    let model = local.resolved.name.clone();
    let context = local.engine.info().context;
    let metrics = Arc::new(metrics::Metrics::default());
    let abs =
        |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()).display().to_string();
    let config = serde_json::json!({
        "engine": crate::commands::runs::engine_json(&a.engine),
        "corpus": a.corpus.iter().map(abs).collect::<Vec<_>>(),
        "notes": a.notes.as_ref().map(abs),
    });
    let capacity = policies.get(crate::state::policy::QUEUE) as usize;
    let body_limit = policies.get(crate::state::policy::BODY_LIMIT) as usize;
    let worker = worker::Worker::start(
        worker::Setup {
            local,
            policies,
            corpus: a.corpus.clone(),
            notes: a.notes.clone(),
            metrics: Arc::clone(&metrics),
            config,
        },
        capacity,
    );
    let state = http::State::new(worker, metrics, model, context, body_limit);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(http::serve(state, socket, a.listen, token))
}
