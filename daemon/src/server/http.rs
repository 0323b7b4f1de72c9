//! The router and listeners of `agentd serve`: every route, the bearer
//! token (or the chat page's sign-in cookie, `page`) check on TCP, per-route request counting, the Unix socket (mode
//! 0600) and the optional TCP listener, graceful shutdown that cancels the
//! replies in flight; and the small routes (`/health`, `/metrics`,
//! `/v1/models`). Every failure becomes a JSON `{"error": {"code",
//! "message"}}` response with a fitting status; nothing a request sends can
//! bring the daemon down.

use super::json::error;
use super::shared::{constant_eq, State};
use super::{chat, page, records, runs};
use axum::extract::{Request, State as AxState};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

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
                        "a valid bearer token is required (Authorization: Bearer …), or open the link `agentd serve` printed to sign a browser in",
                    )
                }
            }
        }
    }
    next.run(req).await
}

fn router(st: State, token: Option<Arc<String>>) -> Router {
    Router::new()
        .merge(page::routes(token.clone()))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::completions))
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
        if let Some(t) = &token {
            eprintln!("agentd serve: chat page: {}", page::link(tcp.local_addr()?, t));
        }
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
    let mut v = json!({"status": "ok", "model": st.model, "context": st.context,
        "queue_depth": st.worker.depth.load(Ordering::Relaxed), "queue_capacity": st.worker.capacity,
        "uptime_s": st.started.elapsed().as_secs(), "version": env!("CARGO_PKG_VERSION")});
    if let Some(up) = st.upstream.clone() {
        let base = up.provider.base_url().to_owned();
        let probe = tokio::task::spawn_blocking(move || {
            up.provider.probe(std::time::Duration::from_secs(2))
        })
        .await
        .unwrap_or_else(|_| Err("the probe failed".into()));
        v["upstream"] = match probe {
            Ok(p) => json!({"base_url": base, "reachable": true, "models": p.models}),
            Err(e) => {
                v["status"] = json!("degraded");
                json!({"base_url": base, "reachable": false, "error": e})
            }
        };
    }
    axum::Json(v).into_response()
}

async fn metrics(AxState(st): AxState<State>) -> Response {
    let text = st.metrics.render(st.worker.depth.load(Ordering::Relaxed), st.worker.capacity);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn models(AxState(st): AxState<State>) -> Response {
    if let Some(up) = &st.upstream {
        // The upstream's model, under the name agentd serves it by.
        let data = json!([{"id": st.model, "object": "model", "created": 0, "owned_by": "agentd",
            "upstream": up.provider.base_url(), "upstream_models": up.models}]);
        return axum::Json(json!({"object": "list", "data": data})).into_response();
    }
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
