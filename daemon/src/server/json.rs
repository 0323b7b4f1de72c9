//! JSON in, JSON errors out: the request body read within its limit (413
//! beyond it, 400 for invalid UTF-8 or JSON) and the `{"error": {"code",
//! "message"}}` response every failure becomes, the busy one included.

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
