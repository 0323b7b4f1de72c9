//! Routes, errors and listeners of `agentd serve`. Every failure becomes a
//! JSON `{"error": {"code", "message"}}` response with a fitting status;
//! nothing a request sends can bring the daemon down.

use super::metrics::Metrics;
use super::worker::{Job, Worker};
use crate::events::Ev;
use axum::extract::{Path, Request, State as AxState};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Shared by every request.
#[derive(Debug, Clone)]
pub(crate) struct State {
    pub(crate) worker: Worker,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) model: String,
    pub(crate) context: usize,
    pub(crate) body_limit: usize,
    /// Cancel flags of replies in flight (by run id, or a request id).
    pub(crate) inflight: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
    pub(crate) started: Instant,
}

impl State {
    pub(crate) fn new(
        worker: Worker,
        metrics: Arc<Metrics>,
        model: String,
        context: usize,
        body_limit: usize,
    ) -> State {
        State {
            worker,
            metrics,
            model,
            context,
            body_limit,
            inflight: Arc::default(),
            started: Instant::now(),
        }
    }

    /// A cancel flag registered until the guard drops.
    pub(crate) fn track(&self, key: String) -> (Arc<AtomicBool>, Tracked) {
        let flag = Arc::new(AtomicBool::new(false));
        if let Ok(mut m) = self.inflight.lock() {
            m.insert(key.clone(), Arc::clone(&flag));
        }
        (Arc::clone(&flag), Tracked { key, inflight: Arc::clone(&self.inflight), flag })
    }
}

/// Unregisters a reply in flight and cancels it when dropped (a client that
/// goes away cancels its generation).
#[derive(Debug)]
pub(crate) struct Tracked {
    key: String,
    inflight: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
    flag: Arc<AtomicBool>,
}

impl Tracked {
    /// Keeps the reply running after the guard drops (it finished).
    pub(crate) fn done(self) {
        if let Ok(mut m) = self.inflight.lock() {
            m.remove(&self.key);
        }
        std::mem::forget(self);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::Relaxed);
        if let Ok(mut m) = self.inflight.lock() {
            m.remove(&self.key);
        }
    }
}

/// A JSON error response.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"code": code, "message": message.into(), "type": code}});
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

pub(crate) fn busy() -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "queue_full",
        "the model is busy: the request queue is full; retry shortly",
    );
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
    r
}

/// The request body as JSON: 413 beyond the limit, 400 for invalid UTF-8
/// or JSON.
pub(crate) async fn json_body(st: &State, req: Request) -> Result<Value, Response> {
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > st.body_limit {
            return Err(too_large(st.body_limit));
        }
    }
    let bytes = match axum::body::to_bytes(req.into_body(), st.body_limit).await {
        Ok(b) => b,
        Err(_) => return Err(too_large(st.body_limit)),
    };
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        error(StatusCode::BAD_REQUEST, "invalid_request", format!("the body is not UTF-8: {e}"))
    })?;
    serde_json::from_str::<Value>(text).map_err(|e| {
        error(StatusCode::BAD_REQUEST, "invalid_json", format!("the body is not valid JSON: {e}"))
    })
}

fn too_large(limit: usize) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is larger than the limit of {limit} bytes"),
    )
}

async fn counted(st: AxState<State>, req: Request, next: axum::middleware::Next) -> Response {
    let route = req.uri().path().to_owned();
    let route = if route.starts_with("/v1/runs/") {
        "/v1/runs/{id}".to_owned()
    } else if route.starts_with("/v1/chats/") {
        "/v1/chats/{id}".to_owned()
    } else if route.starts_with("/v1/settings/") {
        "/v1/settings/{key}".to_owned()
    } else {
        route
    };
    let r = next.run(req).await;
    st.metrics.request(&route, r.status().as_u16());
    r
}

async fn auth(
    st: AxState<Option<Arc<String>>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(token) = st.0 {
        let ok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| constant_eq(t.trim().as_bytes(), token.as_bytes()));
        if !ok {
            return error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid bearer token is required (Authorization: Bearer …)",
            );
        }
    }
    next.run(req).await
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn router(st: State, token: Option<Arc<String>>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(super::chat::completions))
        .route("/v1/research", post(research))
        .route("/v1/runs/{id}", get(run_get))
        .route("/v1/runs/{id}/cancel", post(run_cancel))
        .route("/v1/runs/{id}/resume", post(run_resume))
        .route("/v1/chats", get(chats))
        .route("/v1/chats/{id}", get(chat_get))
        .route("/v1/settings", get(settings_list))
        .route("/v1/settings/{key}", axum::routing::put(settings_put).delete(settings_delete))
        .fallback(|| async {
            error(StatusCode::NOT_FOUND, "not_found", "no such route; see CONTRACTS.md \"HTTP\"")
        })
        .layer(axum::middleware::from_fn_with_state(st.clone(), counted))
        .layer(axum::middleware::from_fn_with_state(token, auth))
        .with_state(st)
}

/// Serves on the Unix socket (and TCP when asked) until SIGTERM or SIGINT.
pub(crate) async fn serve(
    st: State,
    socket: PathBuf,
    listen: Option<String>,
    token: Option<String>,
) -> anyhow::Result<()> {
    use anyhow::Context;
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
    let mut tasks = Vec::new();
    {
        let app = router(st.clone(), None);
        let sd = Arc::clone(&shutdown);
        tasks.push(tokio::spawn(async move {
            axum::serve(unix, app).with_graceful_shutdown(async move { sd.notified().await }).await
        }));
    }
    if let Some(addr) = listen {
        let addr = if addr.contains(':') { addr } else { format!("127.0.0.1:{addr}") };
        let tcp = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        eprintln!("agentd serve: also on http://{} (bearer token required)", tcp.local_addr()?);
        let app = router(st.clone(), token.map(Arc::new));
        let sd = Arc::clone(&shutdown);
        tasks.push(tokio::spawn(async move {
            axum::serve(tcp, app).with_graceful_shutdown(async move { sd.notified().await }).await
        }));
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
    while st.worker.depth.load(Ordering::Relaxed) > 0
        || st.inflight.lock().map(|m| !m.is_empty()).unwrap_or(false)
    {
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

async fn health(AxState(st): AxState<State>) -> Response {
    axum::Json(json!({"status": "ok", "model": st.model, "context": st.context,
        "queue_depth": st.worker.depth.load(Ordering::Relaxed), "queue_capacity": st.worker.capacity,
        "uptime_s": st.started.elapsed().as_secs(), "version": env!("CARGO_PKG_VERSION")}))
    .into_response()
}

async fn metrics(AxState(st): AxState<State>) -> Response {
    let text = st.metrics.render(st.worker.depth.load(Ordering::Relaxed), st.worker.capacity);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn models(AxState(st): AxState<State>) -> Response {
    let mut data =
        vec![json!({"id": st.model, "object": "model", "created": 0, "owned_by": "agentd"})];
    if let Ok(reg) = crate::state::registry::Registry::load() {
        for (name, e) in &reg.entries {
            if *name != st.model && e.local_path().is_file() {
                data.push(json!({"id": name, "object": "model", "created": 0, "owned_by": "agentd", "loaded": false}));
            }
        }
    }
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// SSE of research events, or the `done` object.
async fn events_response(
    rx: tokio::sync::mpsc::UnboundedReceiver<Ev>,
    stream: bool,
    guard: Tracked,
) -> Response {
    if stream {
        let s = UnboundedReceiverStream::new(rx).map(move |e| {
            let _keep = &guard;
            Ok::<_, std::convert::Infallible>(SseEvent::default().data(e.to_json().to_string()))
        });
        return Sse::new(s).keep_alive(KeepAlive::default()).into_response();
    }
    let mut rx = rx;
    let mut last = None;
    while let Some(e) = rx.recv().await {
        if let Ev::Done(_) = &e {
            last = Some(e.to_json());
        }
    }
    guard.done();
    match last {
        Some(d) => axum::Json(d).into_response(),
        None => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "no_result", "the run ended without a result")
        }
    }
}

async fn research(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(&st, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(question) =
        body.get("question").and_then(Value::as_str).filter(|q| !q.trim().is_empty())
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "`question` must be a non-empty string",
        );
    };
    let chat_id = match body.get("chat_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 128 => Some(s.clone()),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "`chat_id` must be a string of 1 to 128 characters",
            )
        }
    };
    let voice = match body.get("voice") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return error(StatusCode::BAD_REQUEST, "invalid_request", "`voice` must be a boolean"),
    };
    let max_tool_iters = match body.get("max_tool_iters") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=64).contains(&n) => Some(n as usize),
            _ => return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "`max_tool_iters` must be an integer from 1 to 64 (it may only lower the setting)",
            ),
        },
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        _ => {
            return error(StatusCode::BAD_REQUEST, "invalid_request", "`stream` must be a boolean")
        }
    };
    let (cancel, guard) = st.track(crate::state::store::new_id("req"));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = crate::research::RunOptions {
        question: question.to_owned(),
        chat_id,
        voice,
        provider: format!("local:{}", st.model),
        config: Value::Null,
    };
    // Cancel by run id while it runs: register under the run id as soon as
    // the run event names it.
    let inflight = Arc::clone(&st.inflight);
    let flag = Arc::clone(&cancel);
    let (tx2, rx2) = tokio::sync::mpsc::unbounded_channel::<Ev>();
    tokio::spawn(async move {
        let mut rx = rx;
        while let Some(e) = rx.recv().await {
            if let Ev::Run { run_id, .. } = &e {
                if let Ok(mut m) = inflight.lock() {
                    m.insert(run_id.clone(), Arc::clone(&flag));
                }
            }
            let end = matches!(e, Ev::Done(_));
            if let (true, Ev::Done(_)) = (end, &e) {
                if let Ok(mut m) = inflight.lock() {
                    m.retain(|_, f| !Arc::ptr_eq(f, &flag));
                }
            }
            if tx2.send(e).is_err() {
                flag.store(true, Ordering::Relaxed);
            }
        }
    });
    if st.worker.submit(Job::Research { opts, max_tool_iters, cancel, tx }).is_err() {
        guard.done();
        return busy();
    }
    events_response(rx2, stream, guard).await
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce(&crate::state::store::Store) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, Response> {
    let r = tokio::task::spawn_blocking(move || {
        let store = crate::state::store::Store::open()?;
        f(&store)
    })
    .await;
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            Err(error(StatusCode::INTERNAL_SERVER_ERROR, "store_error", format!("{e:#}")))
        }
        Err(_) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the request failed")),
    }
}

async fn run_get(Path(id): Path<String>) -> Response {
    match blocking(move |s| Ok(crate::commands::runs::record(s, &id).ok())).await {
        Ok(Some(v)) => axum::Json(v).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "run_not_found", "no such run"),
        Err(r) => r,
    }
}

async fn run_cancel(AxState(st): AxState<State>, Path(id): Path<String>) -> Response {
    if let Some(f) = st.inflight.lock().ok().and_then(|m| m.get(&id).cloned()) {
        f.store(true, Ordering::Relaxed);
        return axum::Json(json!({"run_id": id, "status": "cancel requested"})).into_response();
    }
    match blocking(move |s| Ok(crate::commands::runs::cancel(s, &id, true).map(|r| (id, r)).ok()))
        .await
    {
        Ok(Some((id, r))) => axum::Json(json!({"run_id": id, "status": r})).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "run_not_found", "no such run"),
        Err(r) => r,
    }
}

async fn run_resume(AxState(st): AxState<State>, Path(id): Path<String>, req: Request) -> Response {
    let stream = match json_body(&st, req).await {
        Ok(b) => b.get("stream").and_then(Value::as_bool).unwrap_or(true),
        Err(_) => true,
    };
    let check = {
        let id = id.clone();
        blocking(move |s| {
            s.mark_interrupted(true)?;
            Ok(crate::commands::runs::record(s, &id)
                .ok()
                .map(|r| r["status"].as_str().unwrap_or_default().to_owned()))
        })
        .await
    };
    match check {
        Ok(None) => return error(StatusCode::NOT_FOUND, "run_not_found", "no such run"),
        Ok(Some(s)) if s != "interrupted" => {
            return error(
                StatusCode::CONFLICT,
                "not_resumable",
                format!("run {id} is {s}; only an interrupted run can be resumed"),
            )
        }
        Err(r) => return r,
        _ => {}
    }
    let (cancel, guard) = st.track(id.clone());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (etx, _erx) = tokio::sync::mpsc::unbounded_channel();
    if st.worker.submit(Job::Resume { run_id: id, cancel, tx, err: etx }).is_err() {
        guard.done();
        return busy();
    }
    events_response(rx, stream, guard).await
}

async fn chats() -> Response {
    match blocking(|s| {
        let mut st = s.conn.prepare("SELECT id, title, created, updated FROM chats ORDER BY updated DESC")?;
        let rows: Vec<Value> = st
            .query_map([], |r| {
                Ok(json!({"id": r.get::<_, String>(0)?, "title": r.get::<_, String>(1)?, "created": r.get::<_, String>(2)?, "updated": r.get::<_, String>(3)?}))
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    })
    .await
    {
        Ok(rows) => axum::Json(json!({"object": "list", "data": rows})).into_response(),
        Err(r) => r,
    }
}

async fn chat_get(Path(id): Path<String>) -> Response {
    let id2 = id.clone();
    match blocking(move |s| {
        s.mark_interrupted(true)?;
        let exists: bool = s.conn.prepare("SELECT 1 FROM chats WHERE id = ?1")?.exists([&id2])?;
        if !exists {
            return Ok(None);
        }
        let msgs: Vec<Value> = s
            .messages(&id2)?
            .into_iter()
            .map(|m| {
                json!({"id": m.id, "run_id": m.run_id, "role": m.role, "content": m.content, "status": m.status,
                       "tool_calls": m.tool_calls.and_then(|t| serde_json::from_str::<Value>(&t).ok()),
                       "tool_call_id": m.tool_call_id, "name": m.name, "created": m.created})
            })
            .collect();
        Ok(Some(msgs))
    })
    .await
    {
        Ok(Some(msgs)) => axum::Json(json!({"id": id, "messages": msgs})).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "chat_not_found", format!("no chat {id:?}")),
        Err(r) => r,
    }
}

async fn settings_list() -> Response {
    match blocking(|s| {
        Ok(crate::state::settings::list(s)?.into_iter().map(|e| e.to_json()).collect::<Vec<_>>())
    })
    .await
    {
        Ok(v) => axum::Json(json!({"object": "list", "data": v})).into_response(),
        Err(r) => r,
    }
}

async fn settings_put(
    AxState(st): AxState<State>,
    Path(key): Path<String>,
    req: Request,
) -> Response {
    let body = match json_body(&st, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if crate::state::settings::def(&key).is_err() {
        return error(
            StatusCode::NOT_FOUND,
            "setting_not_found",
            format!("unknown setting {key:?}"),
        );
    }
    let raw = match body.get("value") {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_value",
                "body must be {\"value\": N}",
            )
        }
    };
    match blocking(move |s| {
        Ok(crate::state::settings::set(s, &key, &raw)
            .map(|e| e.to_json())
            .map_err(|e| e.to_string()))
    })
    .await
    {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(msg)) => error(StatusCode::UNPROCESSABLE_ENTITY, "out_of_bounds", msg),
        Err(r) => r,
    }
}

async fn settings_delete(Path(key): Path<String>) -> Response {
    if crate::state::settings::def(&key).is_err() {
        return error(
            StatusCode::NOT_FOUND,
            "setting_not_found",
            format!("unknown setting {key:?}"),
        );
    }
    match blocking(move |s| Ok(crate::state::settings::reset(s, &key)?.to_json())).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => r,
    }
}
