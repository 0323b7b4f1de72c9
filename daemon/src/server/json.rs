//! JSON in, JSON errors out: the request body read within its limit (413
//! beyond it, 400 for invalid UTF-8 or JSON) and the `{"error": {"code",
//! "message"}}` response every failure becomes, the busy one included —
//! and the same errors reshaped for the routes of other APIs (`reshape`).

use super::wire::{anthropic, ollama, openai, Started};
use crate::provider::ProviderError;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

/// A JSON response of `status` with `body`.
fn with(status: StatusCode, body: &impl Serialize) -> Response {
    let text = serde_json::to_string(body).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// A JSON error response (OpenAI's shape, `{"error": {"code", "message",
/// "type"}}`; the other APIs' routes reshape it).
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    with(status, &openai::ErrorBody::new(code, message))
}

/// A 400 for a request this route cannot take.
pub(crate) fn bad(msg: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_request", msg)
}

pub(crate) fn provider_error(e: &ProviderError) -> Response {
    match e {
        ProviderError::Invalid(m) => error(StatusCode::BAD_REQUEST, "invalid_request_error", m.clone()),
        ProviderError::Context { need, limit } => error(
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
            format!("the prompt needs {need} tokens but the model's context holds {limit}; shorten the messages"),
        ),
        // An upstream's failures keep their classification; the status
        // says whose they are.
        ProviderError::Quota(_) => error(StatusCode::TOO_MANY_REQUESTS, e.code().1, e.to_string()),
        ProviderError::Transient(_) | ProviderError::Unavailable(_) => {
            error(StatusCode::BAD_GATEWAY, e.code().1, e.to_string())
        }
        other => error(StatusCode::INTERNAL_SERVER_ERROR, other.code().1, other.to_string()),
    }
}

/// The response to a reply that did not start.
pub(crate) fn not_started(s: Started) -> Response {
    match s {
        Started::Busy => busy(),
        Started::Failed(e) => provider_error(&e),
    }
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

/// How big a request's body may be (`server/request-body-limit`) and how
/// long a client may take to send all of it (`server/body-timeout`: a
/// client that trickles a body holds a connection for nothing).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyRules {
    pub(crate) limit: usize,
    pub(crate) timeout: std::time::Duration,
}

/// The request body as JSON: 413 beyond the limit, 408 when it does not
/// arrive in time, 400 for invalid UTF-8 or JSON.
pub(crate) async fn json_body(rules: BodyRules, req: Request) -> Result<Value, Response> {
    let limit = rules.limit;
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(too_large(limit));
        }
    }
    let read = tokio::time::timeout(rules.timeout, axum::body::to_bytes(req.into_body(), limit));
    let bytes = match read.await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return Err(too_large(limit)),
        Err(_) => {
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {} s (server/body-timeout); send it whole, at once",
                    rules.timeout.as_secs()
                ),
            ))
        }
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

/// The error shape of an API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `{"error": "…"}`
    Ollama,
    /// `{"type": "error", "error": {"type": "invalid_request_error", "message"}}`
    Anthropic,
}

/// An error response of ours in the shape of another API, status and
/// headers kept. A body already in that shape is left as it is.
pub(crate) async fn reshape(r: Response, shape: Shape) -> Response {
    let (mut parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let message = match &v["error"] {
        Value::String(_) if shape == Shape::Ollama => None,
        _ if v["type"] == "error" && shape == Shape::Anthropic => None,
        Value::Object(e) => e.get("message").and_then(Value::as_str).map(str::to_owned),
        _ => Some(String::from_utf8_lossy(&bytes).trim().to_owned()),
    };
    let Some(message) = message else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    let message = if message.is_empty() {
        parts.status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        message
    };
    let body = match shape {
        Shape::Ollama => serde_json::to_string(&ollama::ErrorBody { error: message }),
        Shape::Anthropic => serde_json::to_string(&anthropic::ErrorBody {
            kind: "error",
            error: anthropic::ErrorDetail {
                kind: anthropic::error_kind(parts.status.as_u16()),
                message,
            },
        }),
    }
    .unwrap_or_default();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}
