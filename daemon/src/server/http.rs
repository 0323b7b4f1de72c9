//! The router and listeners of `agentd serve`: every route, the bearer
//! token check on TCP (`Authorization: Bearer`, `x-api-key`, or the chat
//! page's sign-in cookie, `page`), per-route request counting, the Unix
//! socket (mode 0600), the optional TCP listener and the tokenless
//! `--ollama` loopback listener with its guard (a `Host` that is not
//! loopback is refused: DNS rebinding; no CORS grant but to
//! `--allow-origin`), graceful shutdown that cancels the replies in flight;
//! and the small routes (`/health`, `/metrics`, `/v1/models`). Every
//! failure becomes a JSON error in the shape of the API the route belongs
//! to (`{"error": {"code", "message"}}`, Ollama's `{"error": "…"}`,
//! Anthropic's `{"type": "error", …}`) with a fitting status; nothing a
//! request sends can bring the daemon down.

use super::json::{error, reshape, Shape};
use super::shared::{constant_eq, State};
use super::wire::openai::{ModelCard, ModelList};
use super::{anthropic, chat, embed, ollama, page, records, responses, runs};
use axum::extract::{Request, State as AxState};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The routes `/metrics` counts by name; a path of none of them is
/// counted as `other` (a label per unknown path would let any client grow
/// the series without bound).
const ROUTES: [&str; 27] = [
    "/",
    "/health",
    "/metrics",
    "/favicon.ico",
    "/favicon.svg",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/reranking",
    "/rerank",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/v1/research",
    "/v1/chats",
    "/v1/settings",
    "/api/version",
    "/api/tags",
    "/api/show",
    "/api/ps",
    "/api/chat",
    "/api/generate",
    "/api/pull",
    "/api/embed",
    "/api/embeddings",
];

/// A request path as `/metrics` labels it: a route's own path, a route
/// with an id by its template, else `other`.
fn route_label(path: &str) -> &'static str {
    let path = path.strip_suffix('/').filter(|p| !p.is_empty()).unwrap_or(path);
    if let Some(r) = ROUTES.iter().find(|r| **r == path) {
        return r;
    }
    let templated = [
        ("/v1/runs/", "/v1/runs/{id}"),
        ("/v1/chats/", "/v1/chats/{id}"),
        ("/v1/settings/", "/v1/settings/{key}"),
        ("/v1/responses/", "/v1/responses/{id}"),
    ];
    for (prefix, label) in templated {
        if path.starts_with(prefix) {
            return match path.rsplit('/').next() {
                Some("cancel") if prefix == "/v1/runs/" => "/v1/runs/{id}/cancel",
                Some("resume") if prefix == "/v1/runs/" => "/v1/runs/{id}/resume",
                _ => label,
            };
        }
    }
    "other"
}

async fn counted(st: AxState<State>, req: Request, next: axum::middleware::Next) -> Response {
    let route = route_label(req.uri().path());
    let r = next.run(req).await;
    st.metrics.request(route, r.status().as_u16());
    r
}

async fn auth(
    st: AxState<Option<Arc<String>>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(token) = st.0 {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // Anthropic's clients send the key as `x-api-key`.
        let key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok());
        let ok = [bearer, key]
            .into_iter()
            .flatten()
            .any(|t| constant_eq(t.trim().as_bytes(), token.as_bytes()));
        if !ok && !page::public(req.uri().path()) {
            match page::cookie(req.headers(), &token) {
                page::Cookie::Valid => {}
                page::Cookie::CrossOrigin => {
                    return error(
                        StatusCode::FORBIDDEN,
                        "cross_origin",
                        "the sign-in cookie was sent from another origin; use the page this daemon serves",
                    )
                }
                page::Cookie::Missing => {
                    return error(
                        StatusCode::UNAUTHORIZED,
                        "unauthorized",
                        "a valid token is required (Authorization: Bearer …, or x-api-key), or open the link `agentd serve` printed to sign a browser in",
                    )
                }
            }
        }
    }
    next.run(req).await
}

/// Errors in the shape of the API the route belongs to.
async fn shaped(req: Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path();
    let shape = if path.starts_with("/api/") || path == "/api" {
        Some(Shape::Ollama)
    } else if path.starts_with("/v1/messages") {
        Some(Shape::Anthropic)
    } else {
        None
    };
    let r = next.run(req).await;
    match shape {
        Some(s) if r.status().is_client_error() || r.status().is_server_error() => {
            reshape(r, s).await
        }
        _ => r,
    }
}

/// The Ollama listener's origins: the ones `--allow-origin` names.
#[derive(Debug, Clone)]
struct Origins(Arc<Vec<String>>);

/// The guard of the tokenless listener. A page on another site can reach a
/// loopback port through the user's browser: by a name that resolves to
/// 127.0.0.1 (DNS rebinding: its `Host` is that name, so anything but a
/// loopback name or address is refused), or by a cross-origin request (no
/// CORS grant but to the origins named; a cross-origin request that could
/// act without a preflight is refused outright).
async fn guard(st: AxState<Origins>, req: Request, next: axum::middleware::Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !req.headers().contains_key(header::HOST) && req.uri().host().is_none() {
        // HTTP/1.0 without Host: no browser sends that.
    } else if !loopback_host(req.uri().host().unwrap_or(host)) {
        return error(
            StatusCode::FORBIDDEN,
            "forbidden_host",
            format!("Host {host:?} is not a loopback name or address; this listener answers only requests addressed to localhost, 127.0.0.1 or [::1]"),
        );
    }
    let origin = req.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let granted = origin.as_ref().filter(|o| st.0 .0.iter().any(|a| a == *o || a == "*")).cloned();
    if let (Some(o), None) = (&origin, &granted) {
        if req.method() != axum::http::Method::GET && req.method() != axum::http::Method::HEAD {
            return error(
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                format!("requests from the origin {o:?} are not allowed; start agentd serve with --allow-origin {o} to allow it"),
            );
        }
    }
    let preflight = req.method() == axum::http::Method::OPTIONS;
    let mut r = if preflight && granted.is_some() {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    if let Some(o) = granted {
        let h = r.headers_mut();
        if let Ok(v) = o.parse() {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
        h.insert(header::VARY, axum::http::HeaderValue::from_static("Origin"));
        if preflight {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                axum::http::HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                axum::http::HeaderValue::from_static(
                    "Authorization, Content-Type, x-api-key, anthropic-version",
                ),
            );
        }
    }
    r
}

/// `localhost`, `*.localhost`, `127.x.x.x` or `[::1]`, with or without a
/// port.
fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The Ollama routes, on every listener.
fn ollama_routes(r: Router<State>) -> Router<State> {
    r.route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/pull", post(ollama::pull))
        .route("/api/embed", post(embed::ollama))
        .route("/api/embeddings", post(embed::ollama))
        // Rerank under llama-server's three names (no Ollama route exists).
        .route("/v1/rerank", post(embed::rerank))
        .route("/v1/reranking", post(embed::rerank))
        .route("/rerank", post(embed::rerank))
}

/// What the tokenless `--ollama` listener serves: the Ollama routes and the
/// model-serving ones (OpenAI, Anthropic), nothing that reads or changes
/// the daemon's records.
fn ollama_router(st: State, origins: Vec<String>) -> Router {
    ollama_routes(Router::new())
        .route("/", get(ollama::root))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/embeddings", post(embed::openai))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route on the Ollama listener, which serves only the model routes: /api/…, /v1/models, /v1/chat/completions, /v1/embeddings, /v1/rerank, /v1/messages, /v1/responses and /health (runs, chats and settings are on the socket and the --listen port)",
            )
        })
        .layer(axum::middleware::from_fn_with_state(st.clone(), counted))
        .layer(axum::middleware::from_fn_with_state(Origins(Arc::new(origins)), guard))
        .layer(axum::middleware::from_fn(shaped))
        .with_state(st)
}

fn router(st: State, token: Option<Arc<String>>) -> Router {
    ollama_routes(Router::new())
        .merge(page::routes(token.clone()))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/embeddings", post(embed::openai))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/research", post(runs::research))
        .route("/v1/runs/{id}", get(runs::get))
        .route("/v1/runs/{id}/cancel", post(runs::cancel))
        .route("/v1/runs/{id}/resume", post(runs::resume))
        .route("/v1/chats", get(records::chats))
        .route("/v1/chats/{id}", get(records::chat))
        .route("/v1/settings", get(records::settings_list))
        .route(
            "/v1/settings/{key}",
            axum::routing::put(records::setting_put).delete(records::setting_delete),
        )
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route; agentd serves /v1/chat/completions, /v1/responses, /v1/messages, /v1/models, /v1/research, /v1/runs/{id}, /v1/chats, /v1/settings, Ollama's /api/…, /health, /metrics and the chat page at / (docs/http.md in the agentd repository lists them)",
            )
        })
        .layer(axum::middleware::from_fn_with_state(st.clone(), counted))
        .layer(axum::middleware::from_fn_with_state(token, auth))
        .layer(axum::middleware::from_fn(shaped))
        .with_state(st)
}

/// Where `agentd serve` listens.
#[derive(Debug)]
pub(crate) struct Listeners {
    pub(crate) socket: PathBuf,
    pub(crate) listen: Option<String>,
    pub(crate) token: Option<String>,
    /// The tokenless loopback listener (checked to be loopback).
    pub(crate) ollama: Option<std::net::SocketAddr>,
    pub(crate) allow_origin: Vec<String>,
    /// How long a client may take to send a request's headers
    /// (`server/header-timeout`).
    pub(crate) header_timeout: std::time::Duration,
}

/// Serves on the Unix socket (and TCP when asked) until SIGTERM or SIGINT.
pub(crate) async fn serve(st: State, l: Listeners) -> anyhow::Result<()> {
    use anyhow::Context;
    let Listeners { socket, listen, token, ollama, allow_origin, header_timeout } = l;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    let unix = tokio::net::UnixListener::bind(&socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    }
    eprintln!("agentd serve: {} ready on unix:{}", st.model, socket.display());
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let listeners = 1 + usize::from(listen.is_some()) + usize::from(ollama.is_some());
    let cap = connection_cap(listeners);
    tracing::info!(cap, header_timeout_s = header_timeout.as_secs(), "connections per listener");
    let conn = Conn { cap, header_timeout, shutdown: Arc::clone(&shutdown) };
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(accept_loop(unix, router(st.clone(), None), conn.clone())));
    if let Some(addr) = listen {
        let addr = if addr.contains(':') { addr } else { format!("127.0.0.1:{addr}") };
        let tcp = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        eprintln!("agentd serve: also on http://{} (bearer token required)", tcp.local_addr()?);
        if let Some(t) = &token {
            say_link(&page::link(tcp.local_addr()?, t));
        }
        let app = router(st.clone(), token.map(Arc::new));
        tasks.push(tokio::spawn(accept_loop(tcp, app, conn.clone())));
    }
    if let Some(addr) = ollama {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (--ollama)"))?;
        eprintln!(
            "agentd serve: Ollama API on http://{} (no token; loopback only)",
            tcp.local_addr()?
        );
        let app = ollama_router(st.clone(), allow_origin);
        tasks.push(tokio::spawn(accept_loop(tcp, app, conn.clone())));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("agentd serve: shutting down; cancelling the replies in flight");
    if let Ok(m) = st.inflight.lock() {
        for f in m.values() {
            f.store(true, Ordering::Relaxed);
        }
    }
    shutdown.notify_waiters();
    // Give the engine a moment to persist what it streamed.
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while st.queue_depth() > 0 || st.inflight.lock().map(|m| !m.is_empty()).unwrap_or(false) {
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    std::fs::remove_file(&socket).ok();
    for t in tasks {
        t.abort();
    }
    Ok(())
}

/// Tells the user the chat page's sign-in link, which carries the token:
/// printed when stderr is a terminal; otherwise (a log file, a journal,
/// which would keep the secret) written to `page-link` in agentd's home,
/// readable only by the user, and the log names the file.
fn say_link(link: &str) {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!("agentd serve: chat page: {link}");
        return;
    }
    let file = crate::state::home::home().join("page-link");
    match write_private(&file, link) {
        Ok(()) => eprintln!(
            "agentd serve: chat page: the sign-in link (it holds the token) is in {}",
            file.display()
        ),
        Err(e) => eprintln!(
            "agentd serve: chat page: cannot write the sign-in link to {} ({e}); open http://…/?token=<the token of --token-file>",
            file.display()
        ),
    }
}

/// Replaces `file` with `text`, mode 0600 from its creation.
fn write_private(file: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = file.parent() {
        crate::state::home::create_private(dir)?;
    }
    let _ = std::fs::remove_file(file);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(file)?;
    writeln!(f, "{text}")
}

/// Descriptors kept free of connections for the daemon's own files: the
/// model, the store, corpus indexes, MCP servers' pipes.
const RESERVED_FDS: u64 = 48;

/// The most connections one listener holds open at once, from the
/// process's descriptor limit (raised to its hard limit first): what is
/// left after the reserve, shared between the `listeners`, so that clients
/// that hold connections on one listener (the TCP ones) never take the
/// descriptors another (the Unix socket) needs. More clients wait in the
/// kernel's backlog until a connection ends.
fn connection_cap(listeners: usize) -> usize {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
        // Some systems refuse the hard limit itself (macOS: above
        // OPEN_MAX); the soft one then stays.
        if setrlimit(Resource::Nofile, raised).is_ok() {
            limit = getrlimit(Resource::Nofile);
        }
    }
    let soft = limit.current.unwrap_or(u64::MAX);
    let free = soft.saturating_sub(RESERVED_FDS.max(soft / 4));
    usize::try_from(free / listeners.max(1) as u64).unwrap_or(usize::MAX).clamp(4, 1024)
}

/// How each listener holds its connections.
#[derive(Debug, Clone)]
struct Conn {
    /// The most connections open at once.
    cap: usize,
    /// How long a request's headers may take to arrive (and a kept-alive
    /// connection may idle).
    header_timeout: std::time::Duration,
    shutdown: Arc<tokio::sync::Notify>,
}

/// Serves `app` on `listener` until shutdown: at most `conn.cap`
/// connections at once, each an HTTP/1.1 connection with a timer, so that
/// a client that sends half a header (or idles) is dropped after
/// `conn.header_timeout`. `axum::serve` runs hyper without a timer, so its
/// header timeout never fires, and it has no cap.
async fn accept_loop<L>(mut listener: L, app: Router, conn: Conn)
where
    L: axum::serve::Listener,
{
    let Conn { cap, header_timeout, shutdown } = conn;
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        // `Listener::accept` waits out errors (a full descriptor table
        // among them) itself.
        let io = tokio::select! {
            (io, _) = listener.accept() => io,
            () = shutdown.notified() => return,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let sd = Arc::clone(&shutdown);
        tokio::spawn(async move {
            let _slot = slot;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = http.serve_connection(hyper_util::rt::TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = sd.notified() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}

/// `GET /health`: the daemon's state; `degraded` when a loaded model's
/// engine failed for good or the upstream cannot be reached.
#[derive(Debug, Serialize)]
struct Health {
    status: &'static str,
    model: String,
    context: usize,
    queue_depth: usize,
    queue_capacity: usize,
    uptime_s: u64,
    version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    loaded: Option<Vec<LoadedHealth>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<UpstreamHealth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
}

/// Why `/health` is degraded when a queue's thread ended while its model
/// was still listed as loaded.
const STOPPED: &str = "the engine thread has stopped; restart agentd serve";

#[derive(Debug, Serialize)]
struct LoadedHealth {
    model: String,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct UpstreamHealth {
    base_url: String,
    reachable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    models: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

async fn health(AxState(st): AxState<State>) -> Response {
    let mut h = Health {
        status: "ok",
        model: st.model.clone(),
        context: st.context,
        queue_depth: st.queue_depth(),
        queue_capacity: st.worker.capacity,
        uptime_s: st.started.elapsed().as_secs(),
        version: env!("CARGO_PKG_VERSION"),
        loaded: None,
        upstream: None,
        error: None,
    };
    if let Some(m) = &st.models {
        // Each loaded model, and why one's engine failed for good.
        let loaded: Vec<LoadedHealth> = m
            .loaded()
            .iter()
            .map(|s| {
                let error = s
                    .failed
                    .lock()
                    .ok()
                    .and_then(|f| f.clone())
                    .or_else(|| (!s.worker.alive()).then(|| STOPPED.to_owned()));
                LoadedHealth { model: s.name.clone(), ok: error.is_none(), error }
            })
            .collect();
        if loaded.iter().any(|l| !l.ok) {
            h.status = "degraded";
        }
        h.loaded = Some(loaded);
    } else if !st.worker.alive() {
        // The dispatcher in front of an upstream (or the scripted one).
        h.status = "degraded";
        h.error = Some(STOPPED);
    }
    if let Some(up) = st.upstream.clone() {
        let base_url = up.provider.base_url().to_owned();
        let probe = tokio::task::spawn_blocking(move || {
            up.provider.probe(std::time::Duration::from_secs(2))
        })
        .await
        .unwrap_or_else(|_| Err("the probe failed".into()));
        h.upstream = Some(match probe {
            Ok(p) => {
                UpstreamHealth { base_url, reachable: true, models: Some(p.models), error: None }
            }
            Err(e) => {
                h.status = "degraded";
                UpstreamHealth {
                    base_url,
                    reachable: false,
                    models: None,
                    error: Some(e.to_string()),
                }
            }
        });
    }
    axum::Json(h).into_response()
}

async fn metrics(AxState(st): AxState<State>) -> Response {
    let mut text = st.metrics.render(st.queue_depth(), st.worker.capacity);
    if let Some(m) = &st.models {
        let loaded = m.loaded();
        text.push_str("# HELP agentd_model_loads_total Times each model was loaded.\n# TYPE agentd_model_loads_total counter\n");
        for (name, n) in m.loads() {
            let name = super::metrics::label(&name);
            text.push_str(&format!("agentd_model_loads_total{{model=\"{name}\"}} {n}\n"));
        }
        text.push_str(
            "# HELP agentd_models_loaded Models loaded now.\n# TYPE agentd_models_loaded gauge\n",
        );
        text.push_str(&format!("agentd_models_loaded {}\n", loaded.len()));
        text.push_str("# HELP agentd_model_bytes Bytes of each loaded model's weights in memory.\n# TYPE agentd_model_bytes gauge\n");
        for s in &loaded {
            text.push_str(&format!(
                "agentd_model_bytes{{model=\"{}\"}} {}\n",
                super::metrics::label(&s.name),
                s.card.weight_bytes
            ));
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn models(AxState(st): AxState<State>) -> Response {
    if let Some(up) = &st.upstream {
        // The upstream's model, under the name agentd serves it by.
        let mut card = ModelCard::new(st.model.clone());
        card.upstream = Some(up.provider.base_url().to_owned());
        card.upstream_models = Some(up.models.clone());
        return axum::Json(ModelList::of(vec![card])).into_response();
    }
    let Some(m) = &st.models else {
        return axum::Json(ModelList::of(vec![ModelCard::new(st.model.clone())])).into_response();
    };
    let loaded: Vec<String> = m.loaded().iter().map(|s| s.name.clone()).collect();
    let data = m
        .available()
        .iter()
        .map(|a| ModelCard {
            loaded: Some(loaded.contains(&a.name)),
            ..ModelCard::new(a.name.clone())
        })
        .collect();
    axum::Json(ModelList::of(data)).into_response()
}

#[cfg(test)]
mod tests {

    #[test]
    fn metrics_label_routes_by_name_and_everything_else_other() {
        assert_eq!(super::route_label("/v1/chat/completions"), "/v1/chat/completions");
        assert_eq!(super::route_label("/v1/runs/run_abc"), "/v1/runs/{id}");
        assert_eq!(super::route_label("/v1/runs/run_abc/cancel"), "/v1/runs/{id}/cancel");
        assert_eq!(super::route_label("/v1/settings/chat.max_tool_iters"), "/v1/settings/{key}");
        assert_eq!(super::route_label("/api/tags/"), "/api/tags");
        for unknown in ["/x", "/a\"b", "/v1/nothing", "/api/../etc", "/v2/chat/completions"] {
            assert_eq!(super::route_label(unknown), "other", "{unknown}");
        }
    }
    #[test]
    fn only_loopback_names_and_addresses_pass_the_host_check() {
        for h in [
            "localhost",
            "localhost:11434",
            "127.0.0.1:11434",
            "127.1.2.3",
            "[::1]:11434",
            "[::1]",
            "app.localhost",
            "LOCALHOST.",
        ] {
            assert!(super::loopback_host(h), "{h}");
        }
        for h in [
            "attacker.example",
            "attacker.example:11434",
            "10.0.0.2:11434",
            "localhost.attacker.example",
            "[::2]:1",
            "",
            "127.0.0.1.nip.io",
        ] {
            assert!(!super::loopback_host(h), "{h}");
        }
    }
}
