//! `agentd serve`: one local model for many clients over a Unix socket
//! (default, mode 0600) and, with `--listen`, loopback TCP guarded by a
//! bearer token. Routes and status codes: docs/http.md.
//!
//! The model runs on one engine thread fed by a bounded queue (503 with
//! `Retry-After` beyond it; `worker`); HTTP runs on tokio (`http`: the
//! router and listeners). A client that disconnects cancels its generation
//! within one token; SIGTERM cancels the replies in flight, which persist
//! their text, and exits. The routes: `chat` (chat completions), `runs`
//! (research and runs), `records` (chats and settings), `page` (the chat
//! page at `/` and its sign-in cookie); what they share:
//! `shared` (state, replies in flight, store access) and `json` (bodies and
//! errors); `metrics` for `/metrics`. The clients that speak other APIs:
//! `ollama` (Ollama's `/api/…`, also on a tokenless loopback listener with
//! `--ollama`) and `anthropic` (`/v1/messages`); both translate into the
//! chat completions request and back.
//!
//! With `--provider openai` generation moves to an upstream engine
//! (llama-server, vLLM): no engine thread and no model loaded; the worker
//! is a dispatcher (`worker::Worker::start_upstream`) and the forwarding,
//! probes and in-flight bound live in `provider::upstream`. Everything
//! else (state, tools, budgets, chats, the page) stays here.

mod anthropic;
mod chat;
mod embed;
mod http;
mod json;
pub(crate) mod metrics;
mod models;
mod ollama;
mod page;
mod records;
mod responses;
mod runs;
mod shared;
mod wire;
mod worker;

pub(crate) use wire::fuzz_request;

use crate::provider::build::EngineArgs;
use crate::research::RunConfig;
use crate::state::policy::{self, Policies};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// Options of `agentd serve`.
#[derive(Debug)]
pub(crate) struct ServeArgs {
    pub(crate) engine: EngineArgs,
    pub(crate) corpus: Vec<PathBuf>,
    pub(crate) notes: Option<PathBuf>,
    /// `--mcp` files (none: `$AGENTD_HOME/mcp.json` when it exists).
    pub(crate) mcp: Vec<PathBuf>,
    pub(crate) socket: Option<PathBuf>,
    pub(crate) listen: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    /// The tokenless Ollama listener (loopback only).
    pub(crate) ollama: Option<String>,
    /// Origins granted CORS on the Ollama listener.
    pub(crate) allow_origin: Vec<String>,
    /// Seconds to wait for the upstream at start-up (`--provider openai`).
    pub(crate) wait_upstream: Option<u64>,
    /// Folders of GGUF files served besides the models folder.
    pub(crate) models: Vec<PathBuf>,
}

/// The address of the tokenless `--ollama` listener: loopback only (a bare
/// port means 127.0.0.1). Anything else is refused, saying why.
fn ollama_addr(spec: &str) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let full = if spec.contains(':') { spec.to_owned() } else { format!("127.0.0.1:{spec}") };
    let addrs: Vec<std::net::SocketAddr> = full
        .to_socket_addrs()
        .with_context(|| {
            format!("--ollama {spec}: not a HOST:PORT address (e.g. 127.0.0.1:11434)")
        })?
        .collect();
    match addrs.iter().find(|a| !a.ip().is_loopback()).or(addrs.first()) {
        // `localhost` binds 127.0.0.1, where clients look first.
        Some(a) if a.ip().is_loopback() => Ok(*addrs.iter().find(|a| a.is_ipv4()).unwrap_or(a)),
        Some(a) => bail!(
            "--ollama {spec}: {} is not a loopback address. The Ollama listener serves without a token, \
             so it listens on loopback only (127.0.0.1, ::1, localhost); to serve other machines use \
             --listen {spec} --token-file PATH, which requires a bearer token there",
            a.ip()
        ),
        None => bail!("--ollama {spec}: the address resolves to nothing"),
    }
}

pub(crate) fn run(a: ServeArgs) -> Result<()> {
    match a.engine.provider.as_str() {
        "local" | "openai" | "scripted" => {}
        other => bail!(
            "unknown provider {other:?}: agentd serve runs local, openai (an upstream) or scripted (tests)"
        ),
    }
    let socket = a.socket.clone().unwrap_or_else(crate::state::home::default_socket);
    // A live daemon on the socket: refuse. A stale socket: replace it.
    // Anything else at that path (a file, a folder) is not ours to delete.
    if let Ok(meta) = std::fs::symlink_metadata(&socket) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            bail!(
                "{} exists and is not a socket; agentd serve will not replace it: remove it yourself or pass --socket PATH",
                socket.display()
            );
        }
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
    let ollama = a.ollama.as_deref().map(ollama_addr).transpose()?;
    let store = crate::state::store::Store::open()?;
    let interrupted = store.mark_interrupted(false)?;
    if interrupted > 0 {
        tracing::warn!("{interrupted} run(s) from a previous process are marked interrupted (see `agentd runs list`)");
    }
    let policies = Policies::load(&store)?;
    drop(store);
    let metrics = Arc::new(metrics::Metrics::default());
    let capacity = policies.get(policy::QUEUE) as usize;
    let body = json::BodyRules {
        limit: policies.get(policy::BODY_LIMIT) as usize,
        timeout: std::time::Duration::from_secs(policies.get(policy::BODY_TIMEOUT).max(1) as u64),
    };
    let header_timeout =
        std::time::Duration::from_secs(policies.get(policy::HEADER_TIMEOUT).max(1) as u64);
    let limits = policy::SamplingLimits::in_force(&policies);
    let state = if a.engine.provider == "scripted" {
        // Tests: research runs replay the script (each run from its start);
        // a script that does not load stops start-up here.
        crate::provider::build::build(&a.engine, &policies)?;
        let gate = crate::provider::upstream::Gate::new(1);
        let mut config = RunConfig {
            engine: a.engine,
            corpus: a.corpus,
            notes: a.notes,
            mcp: crate::tools::mcp::files(&a.mcp),
            servers: None,
        };
        // The daemon's MCP servers, started once for all its runs (and
        // again when the daemon restarts).
        config.start_servers(&policies)?;
        let context = policies.get(policy::CONTEXT) as usize;
        let worker = worker::Worker::start_upstream(
            None,
            gate,
            policies,
            Arc::clone(&metrics),
            config,
            capacity,
        );
        shared::State::new(
            worker,
            metrics,
            "scripted".into(),
            shared::Card::default(),
            context,
            body,
            limits,
        )
    } else if a.engine.provider == "openai" {
        let upstream = crate::provider::build::openai(&a.engine, &policies)?;
        let probe = wait_for(&upstream, a.wait_upstream)?;
        let gate = crate::provider::upstream::Gate::new(
            policies.get(policy::UPSTREAM_CONCURRENCY) as usize
        );
        metrics.upstream(
            Arc::clone(&gate.in_flight),
            policies.get(policy::UPSTREAM_CONCURRENCY) as usize,
        );
        let model = a.engine.model.clone().unwrap_or_else(|| "default".into());
        let context = policies.get(policy::CONTEXT) as usize;
        let mut config = RunConfig {
            engine: a.engine,
            corpus: a.corpus,
            notes: a.notes,
            mcp: crate::tools::mcp::files(&a.mcp),
            servers: None,
        };
        // The daemon's MCP servers, started once for all its runs (and
        // again when the daemon restarts).
        config.start_servers(&policies)?;
        let worker = worker::Worker::start_upstream(
            Some(upstream.clone()),
            gate,
            policies,
            Arc::clone(&metrics),
            config,
            capacity,
        );
        let mut st = shared::State::new(
            worker,
            metrics,
            model,
            shared::Card::default(),
            context,
            body,
            limits,
        );
        st.upstream = Some(shared::Upstream { provider: upstream, models: probe.models });
        st
    } else {
        let mut config = RunConfig {
            engine: a.engine.clone(),
            corpus: a.corpus,
            notes: a.notes,
            mcp: crate::tools::mcp::files(&a.mcp),
            servers: None,
        };
        // The daemon's MCP servers, started once for all its runs (and
        // again when the daemon restarts).
        config.start_servers(&policies)?;
        for d in &a.models {
            if !d.is_dir() {
                bail!("--models {}: not a folder of .gguf files", d.display());
            }
        }
        let template = models::Template {
            engine: a.engine,
            policies,
            metrics: Arc::clone(&metrics),
            config,
            capacity,
            dirs: a.models,
        };
        let models = models::Models::start(template)?;
        let default = models.loaded().into_iter().next().context("the default model is loaded")?;
        let mut st = shared::State::new(
            default.worker.clone(),
            metrics,
            default.name.clone(),
            (*default.card).clone(),
            default.context,
            body,
            limits,
        );
        st.models = Some(models);
        st
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let listeners = http::Listeners {
        socket,
        listen: a.listen,
        token,
        ollama,
        allow_origin: a.allow_origin,
        header_timeout,
    };
    rt.block_on(http::serve(state, listeners))
}

/// Probes the upstream until it answers (`--wait-upstream SECONDS`), or
/// once; unreachable is a start-up error that says what to do.
fn wait_for(
    upstream: &crate::provider::openai::OpenAi,
    wait: Option<u64>,
) -> Result<crate::provider::upstream::Probe> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait.unwrap_or(0));
    loop {
        match upstream.probe(std::time::Duration::from_secs(5)) {
            Ok(p) => return Ok(p),
            Err(e) if std::time::Instant::now() < deadline => {
                if std::env::var_os("AGENTD_VERBOSE").is_some() {
                    eprintln!("agentd serve: waiting for the upstream: {e}");
                }
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            Err(e) => bail!(
                "cannot reach the upstream at {} ({e}); start it first, check --base-url, or pass --wait-upstream SECONDS to wait for it",
                upstream.base_url()
            ),
        }
    }
}
