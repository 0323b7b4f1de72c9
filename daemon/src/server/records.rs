//! The daemon's records over HTTP: the persisted chats with their messages
//! (partial, cancelled and interrupted ones included), and the settings
//! with their metadata, changed within their bounds or reset.

use super::json::{error, json_body};
use super::shared::{blocking, State};
use crate::state::settings;
use crate::state::store::StoredCall;
use axum::extract::{Path, Request, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

pub(super) async fn chats() -> Response {
    match blocking(|s| {
        Ok(s.chats()?
            .into_iter()
            .map(|c| json!({"id": c.id, "title": c.title, "created": c.created, "updated": c.updated}))
            .collect::<Vec<_>>())
    })
    .await
    {
        Ok(rows) => axum::Json(json!({"object": "list", "data": rows})).into_response(),
        Err(r) => r,
    }
}

pub(super) async fn chat(Path(id): Path<String>) -> Response {
    let id2 = id.clone();
    match blocking(move |s| {
        s.mark_interrupted(true)?;
        if !s.chat_exists(&id2)? {
            return Ok(None);
        }
        let msgs: Vec<Value> = s
            .messages(&id2)?
            .into_iter()
            .map(|m| {
                let calls = m.tool_calls.map(|cs| cs.iter().map(StoredCall::to_json).collect::<Vec<_>>());
                json!({"id": m.id, "run_id": m.run_id, "role": m.role, "content": m.content, "status": m.status.as_str(),
                       "tool_calls": calls, "tool_call_id": m.tool_call_id, "name": m.name, "created": m.created})
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

pub(super) async fn settings_list() -> Response {
    match blocking(|s| Ok(settings::list(s)?.into_iter().map(|e| e.to_json()).collect::<Vec<_>>()))
        .await
    {
        Ok(v) => axum::Json(json!({"object": "list", "data": v})).into_response(),
        Err(r) => r,
    }
}

pub(super) async fn setting_put(
    AxState(st): AxState<State>,
    Path(key): Path<String>,
    req: Request,
) -> Response {
    let body = match json_body(st.body, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if settings::def(&key).is_err() {
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
        Ok(settings::set(s, &key, &raw).map(|e| e.to_json()).map_err(|e| e.to_string()))
    })
    .await
    {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(msg)) => error(StatusCode::UNPROCESSABLE_ENTITY, "out_of_bounds", msg),
        Err(r) => r,
    }
}

pub(super) async fn setting_delete(Path(key): Path<String>) -> Response {
    if settings::def(&key).is_err() {
        return error(
            StatusCode::NOT_FOUND,
            "setting_not_found",
            format!("unknown setting {key:?}"),
        );
    }
    match blocking(move |s| Ok(settings::reset(s, &key)?.to_json())).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => r,
    }
}
