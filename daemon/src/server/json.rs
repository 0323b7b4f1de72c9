//! JSON in, JSON errors out: the request body read within its limit (413
//! beyond it, 400 for invalid UTF-8 or JSON) and the `{"error": {"code",
//! "message"}}` response every failure becomes, the busy one included —
//! and the same errors reshaped for the routes of other APIs (`reshape`).

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

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
pub(crate) async fn json_body(limit: usize, req: Request) -> Result<Value, Response> {
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
    let bytes = match axum::body::to_bytes(req.into_body(), limit).await {
        Ok(b) => b,
        Err(_) => return Err(too_large(limit)),
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
        Shape::Ollama => json!({"error": message}),
        Shape::Anthropic => {
            let kind = match parts.status.as_u16() {
                400 | 405 | 422 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                503 | 529 => "overloaded_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
    };
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body.to_string()))
}
