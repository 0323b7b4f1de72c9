//! The research routes: `POST /v1/research` (a run on its own thread, its
//! events as SSE or the `done` object), `GET /v1/runs/{id}` (the run
//! record), `POST /v1/runs/{id}/cancel` and `POST /v1/runs/{id}/resume`.

use super::json::{busy, error, json_body};
use super::shared::{blocking, State, Tracked};
use super::worker::{Job, ResearchRequest};
use crate::events::Ev;
use crate::state::store::RunStatus;
use axum::extract::{Path, Request, State as AxState};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio_stream::wrappers::UnboundedReceiverStream;

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

pub(super) async fn research(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body, req).await {
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
    // The run's model: the request's `model`, else the default.
    let (st, hold) = match st.for_body(&body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (cancel, guard) = st.track(crate::state::store::new_id("req"));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let request = ResearchRequest { question: question.to_owned(), chat_id, voice, max_tool_iters };
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
            if matches!(e, Ev::Done(_)) {
                if let Ok(mut m) = inflight.lock() {
                    m.retain(|_, f| !Arc::ptr_eq(f, &flag));
                }
            }
            if tx2.send(e).is_err() {
                flag.store(true, Ordering::Relaxed);
            }
        }
    });
    if st.worker.submit(Job::Research { request, cancel, tx, hold }).is_err() {
        guard.done();
        return busy();
    }
    events_response(rx2, stream, guard).await
}

pub(super) async fn get(Path(id): Path<String>) -> Response {
    match blocking(move |s| Ok(crate::research::runs::record(s, &id).ok())).await {
        Ok(Some(v)) => axum::Json(v).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "run_not_found", "no such run"),
        Err(r) => r,
    }
}

pub(super) async fn cancel(AxState(st): AxState<State>, Path(id): Path<String>) -> Response {
    if let Some(f) = st.inflight.lock().ok().and_then(|m| m.get(&id).cloned()) {
        f.store(true, Ordering::Relaxed);
        return axum::Json(json!({"run_id": id, "status": "cancel requested"})).into_response();
    }
    match blocking(move |s| Ok(crate::research::runs::cancel(s, &id, true).map(|r| (id, r)).ok()))
        .await
    {
        Ok(Some((id, r))) => axum::Json(json!({"run_id": id, "status": r})).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "run_not_found", "no such run"),
        Err(r) => r,
    }
}

pub(super) async fn resume(
    AxState(st): AxState<State>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    let stream = match json_body(st.body, req).await {
        Ok(b) => b.get("stream").and_then(Value::as_bool).unwrap_or(true),
        Err(_) => true,
    };
    let check = {
        let id = id.clone();
        blocking(move |s| {
            s.mark_interrupted(true)?;
            Ok(s.run(&id).ok().flatten().map(|r| (r.status, r.snapshot)))
        })
        .await
    };
    let snapshot = match check {
        Ok(None) => return error(StatusCode::NOT_FOUND, "run_not_found", "no such run"),
        Ok(Some((s, _))) if s != RunStatus::Interrupted => {
            return error(
                StatusCode::CONFLICT,
                "not_resumable",
                format!("run {id} is {}; only an interrupted run can be resumed", s.as_str()),
            )
        }
        Err(r) => return r,
        Ok(Some((_, snapshot))) => snapshot,
    };
    // A run resumes on the model it ran on (its snapshot's `provider`,
    // `local:NAME`), loaded again if it was unloaded.
    let model = serde_json::from_str::<Value>(&snapshot).ok().and_then(|v| {
        v["provider"].as_str().and_then(|p| p.strip_prefix("local:")).map(str::to_owned)
    });
    let (st, hold) = match st.for_model(model.as_deref()).await {
        Ok(x) => x,
        Err(e @ super::models::ModelError::Unknown { .. }) => {
            return error(
                StatusCode::CONFLICT,
                "model_not_found",
                format!("run {id} cannot resume: {e}"),
            )
        }
        Err(e) => {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "model_load_failed", e.to_string())
        }
    };
    let (cancel, guard) = st.track(id.clone());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (etx, _erx) = tokio::sync::mpsc::unbounded_channel();
    if st.worker.submit(Job::Resume { run_id: id, cancel, tx, err: etx, hold }).is_err() {
        guard.done();
        return busy();
    }
    events_response(rx, stream, guard).await
}
