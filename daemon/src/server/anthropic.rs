//! Anthropic's Messages API (`POST /v1/messages`,
//! `/v1/messages/count_tokens`) for Claude Code and the Anthropic SDKs.
//! A request is translated into the chat completions request
//! (`chat::parse`: the same checks, sampling and enforcement) and the
//! engine's events back into content blocks — `thinking` (where the model
//! reasons), `text`, `tool_use` — streamed as the SDK expects:
//!
//! ```text
//! message_start, ping,
//! (content_block_start, content_block_delta… (thinking_delta + signature_delta |
//!  text_delta | input_json_delta), content_block_stop)…,
//! message_delta {stop_reason, usage}, message_stop
//! ```
//!
//! The translation, field by field:
//!
//! | Anthropic | chat completions |
//! |---|---|
//! | `system` (string or text blocks) | a first `system` message |
//! | `system`-role messages in `messages` (Claude Code) | joined to that first message, in order |
//! | server tools (`tools[].type` not `custom`) and their history blocks | left out |
//! | `tool_use` block (assistant) | `tool_calls[]` with `arguments` = `input` |
//! | `tool_result` block (user) | a `tool` message with `tool_call_id` = `tool_use_id` |
//! | `tools[].input_schema` | `tools[].function.parameters` |
//! | `tool_choice` `auto` / `any` / `tool` / `none` | `"auto"` / `"required"` / `{"type": "function", "function": {"name"}}` / `"none"` |
//! | `output_config.format` `{"type": "json_schema", "schema"}` | `response_format: {"type": "json_schema", "json_schema": {"name": "output", "schema": …, "strict": true}}` |
//! | `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `top_k` | `max_tokens`, `stop`, the same names |
//!
//! Errors are `{"type": "error", "error": {"type", "message"}}` (reshaped
//! from the chat route's by `json::reshape`).

use super::chat::{parse, provider_error};
use super::json::{busy, error, json_body};
use super::shared::State;
use super::worker::Job;
use crate::provider::chat::{ChatMsg, ChatOutput};
use crate::provider::ProviderError;
use crate::provider::TurnFinish;
use axum::extract::{Request, State as AxState};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use toolparse::Event;

type Bad = Box<Response>;

fn bad(msg: impl Into<String>) -> Bad {
    Box::new(error(StatusCode::BAD_REQUEST, "invalid_request_error", msg))
}

/// The text of a `content` that must be text: a string or text blocks.
fn text_of(v: &Value, at: &str) -> Result<String, Bad> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (i, b) in blocks.iter().enumerate() {
                match (b["type"].as_str(), b["text"].as_str()) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(bad(format!("{at}[{i}]: only text blocks are supported here")))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(bad(format!("{at} must be a string or an array of text blocks"))),
    }
}

/// The chat completions body for a Messages request.
fn to_chat(body: &Value, count_only: bool) -> Result<Value, Bad> {
    let Some(b) = body.as_object() else { return Err(bad("the body must be a JSON object")) };
    let mut o = Map::new();
    match b.get("model") {
        Some(Value::String(m)) => o.insert("model".into(), json!(m)),
        _ => return Err(bad("model: a string is required")),
    };
    if !count_only {
        match b.get("max_tokens") {
            Some(n @ Value::Number(_)) => o.insert("max_tokens".into(), n.clone()),
            Some(_) => return Err(bad("max_tokens must be a positive integer")),
            None => return Err(bad("max_tokens: Field required")),
        };
    }
    let mut msgs = Vec::new();
    match b.get("system") {
        None | Some(Value::Null) => {}
        Some(s) => msgs.push(json!({"role": "system", "content": text_of(s, "system")?})),
    }
    let arr = b
        .get("messages")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| bad("messages must be a non-empty array"))?;
    // `system` messages among the turns (Claude Code sends them beside
    // the top-level `system`): their text joins the system prompt, in order.
    let mut system_more = Vec::new();
    for (i, m) in arr.iter().enumerate() {
        let at = format!("messages.{i}");
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            Some("system") => {
                let content = m.get("content").unwrap_or(&Value::Null);
                system_more.push(text_of(content, &format!("{at}.content"))?);
                continue;
            }
            _ => {
                return Err(bad(format!("{at}.role must be \"user\", \"assistant\" or \"system\"")))
            }
        };
        let blocks = match m.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(a)) => a.clone(),
            _ => return Err(bad(format!("{at}.content must be a string or an array of blocks"))),
        };
        let (mut text, mut calls) = (String::new(), Vec::new());
        for (j, blk) in blocks.iter().enumerate() {
            let at = format!("{at}.content.{j}");
            match blk.get("type").and_then(Value::as_str) {
                Some("text") => match blk.get("text") {
                    Some(Value::String(t)) => text.push_str(t),
                    _ => return Err(bad(format!("{at}.text must be a string"))),
                },
                Some("tool_use") if role == "assistant" => {
                    let (Some(id), Some(name)) = (blk["id"].as_str(), blk["name"].as_str()) else {
                        return Err(bad(format!("{at}: a tool_use block needs `id` and `name`")));
                    };
                    let input = match blk.get("input") {
                        Some(v @ Value::Object(_)) => v.clone(),
                        None | Some(Value::Null) => json!({}),
                        Some(_) => return Err(bad(format!("{at}.input must be an object"))),
                    };
                    calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
                }
                Some("tool_result") if role == "user" => {
                    let Some(id) = blk["tool_use_id"].as_str() else {
                        return Err(bad(format!("{at}.tool_use_id must be a string")));
                    };
                    let content = match blk.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(c) => text_of(c, &format!("{at}.content"))?,
                    };
                    let content =
                        if blk["is_error"] == true { format!("Error: {content}") } else { content };
                    msgs.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                }
                // Earlier reasoning is not replayed, nor server tools' use
                // and results (there are none here).
                Some("thinking" | "redacted_thinking") if role == "assistant" => {}
                Some(t) if t.starts_with("server_tool_use") || t.ends_with("_tool_result") => {}
                Some(t) => {
                    return Err(bad(format!(
                        "{at}: a {t:?} block is not supported in a {role} message"
                    )))
                }
                None => return Err(bad(format!("{at}.type must be a string"))),
            }
        }
        if role == "assistant" || !text.is_empty() {
            let mut msg = json!({"role": role, "content": text});
            if !calls.is_empty() {
                msg["tool_calls"] = json!(calls);
            }
            msgs.push(msg);
        }
    }
    if !msgs.iter().any(|m| m["role"] != "system") {
        return Err(bad("messages must hold at least one user or assistant message"));
    }
    let system_more = system_more.join("\n\n");
    if !system_more.is_empty() {
        match msgs.first_mut() {
            Some(first) if first["role"] == "system" => {
                let joined =
                    format!("{}\n\n{system_more}", first["content"].as_str().unwrap_or(""));
                first["content"] = json!(joined.trim_start());
            }
            _ => msgs.insert(0, json!({"role": "system", "content": system_more})),
        }
    }
    o.insert("messages".into(), json!(msgs));
    if let Some(tools) = b.get("tools").filter(|t| !t.is_null()) {
        let tools = tools.as_array().ok_or_else(|| bad("tools must be an array"))?;
        let mut out = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            // Server tools (`web_search_…`, `code_execution_…`, `bash_…`)
            // run on Anthropic's side; there is none here, so they are
            // left out, as a client that offers them expects of a server
            // without them.
            if t.get("type").and_then(Value::as_str).is_some_and(|ty| ty != "custom") {
                continue;
            }
            let name = t["name"]
                .as_str()
                .ok_or_else(|| bad(format!("tools.{i}.name must be a string")))?;
            let schema = match t.get("input_schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                _ => {
                    return Err(bad(format!("tools.{i}.input_schema must be a JSON Schema object")))
                }
            };
            let mut f = json!({"name": name, "parameters": schema});
            if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
                f["description"] = d.clone();
            }
            out.push(json!({"type": "function", "function": f}));
        }
        o.insert("tools".into(), json!(out));
    }
    match b.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(c) => {
            let choice = match (c["type"].as_str(), c["name"].as_str()) {
                (Some("auto"), _) => json!("auto"),
                (Some("any"), _) => json!("required"),
                (Some("none"), _) => json!("none"),
                (Some("tool"), Some(n)) => json!({"type": "function", "function": {"name": n}}),
                _ => return Err(bad("tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": …}")),
            };
            o.insert("tool_choice".into(), choice);
        }
    }
    // Structured output: `output_config.format` (`output_format` in the
    // beta) is the chat route's `response_format`.
    match b.get("output_config").and_then(|c| c.get("format")).or(b.get("output_format")) {
        None | Some(Value::Null) => {}
        Some(f) if f["type"] == "json_schema" && f["schema"].is_object() => {
            o.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "output", "schema": f["schema"], "strict": true}}),
            );
        }
        Some(_) => {
            return Err(bad(
                "output_config.format must be {\"type\": \"json_schema\", \"schema\": {…}}",
            ))
        }
    }
    if let Some(s) = b.get("stop_sequences").filter(|s| !s.is_null()) {
        o.insert("stop".into(), s.clone());
    }
    for k in ["temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = b.get(k) {
            o.insert(k.into(), v.clone());
        }
    }
    if let Some(t) = b.get("temperature").and_then(Value::as_f64) {
        if !(0.0..=1.0).contains(&t) {
            return Err(bad("temperature must be between 0 and 1"));
        }
    }
    Ok(Value::Object(o))
}

fn stop_reason(o: &ChatOutput, calls: usize) -> &'static str {
    if calls > 0 {
        "tool_use"
    } else if o.finish == TurnFinish::Length {
        "max_tokens"
    } else {
        "end_turn"
    }
}

fn usage(input: usize, output: usize, cached: usize) -> Value {
    json!({"input_tokens": input, "output_tokens": output,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached})
}

fn tool_id(c: &toolparse::ToolCall) -> String {
    c.id.clone()
        .filter(|i| i.starts_with("toolu_"))
        .unwrap_or_else(|| crate::state::store::new_id("toolu"))
}

/// The model a Messages request is served by: the one it names, or — for
/// a `claude-…` name that no served model has (Claude Code asks for its
/// own models by name) — the default model.
async fn for_messages(
    st: &State,
    body: &Value,
) -> Result<(State, Option<super::models::Lease>), Response> {
    match st.for_body(body).await {
        Err(r)
            if r.status() == StatusCode::NOT_FOUND
                && body["model"].as_str().is_some_and(|m| m.starts_with("claude-")) =>
        {
            let mut body = body.clone();
            body["model"] = Value::Null;
            st.for_body(&body).await
        }
        r => r,
    }
}

/// `POST /v1/messages`.
pub(super) async fn messages(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body_limit, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let chat = match to_chat(&body, false) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let show_thinking = body["thinking"]["type"] != "disabled";
    let (st, lease) = match for_messages(&st, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut p = match parse(&st, &chat) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    let id = crate::state::store::new_id("msg");
    let (cancel, guard) = st.track(id.clone());
    // The prompt's size first: message_start carries it.
    let input = if p.stream {
        let (tx, rx) = std::sync::mpsc::channel();
        let job = Job::Count { messages: p.messages.clone(), tools: p.tools.clone(), tx };
        if st.worker.submit(job).is_err() {
            guard.done();
            return busy();
        }
        match tokio::task::spawn_blocking(move || rx.recv()).await {
            Ok(Ok(Ok(n))) => n,
            // A backend that cannot count (an upstream) starts with 0; the
            // reply itself says whether the request can be served.
            _ => 0,
        }
    } else {
        0
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stream = p.stream;
    let job = p.job(cancel, tx, lease);
    if st.worker.submit(job).is_err() {
        guard.done();
        return busy();
    }
    let first = rx.recv().await;
    if let Some(ChatMsg::Done(Err(e))) = &first {
        guard.done();
        return provider_error(e);
    }
    if !stream {
        let mut blocks: Vec<Value> = Vec::new();
        let mut calls = 0;
        let mut pending = first;
        let out = loop {
            let msg = match pending.take() {
                Some(m) => Some(m),
                None => rx.recv().await,
            };
            match msg {
                Some(ChatMsg::Event(Event::Content(s))) => match blocks.last_mut() {
                    Some(b) if b["type"] == "text" => {
                        let t = format!("{}{s}", b["text"].as_str().unwrap_or(""));
                        b["text"] = json!(t);
                    }
                    _ => blocks.push(json!({"type": "text", "text": s})),
                },
                Some(ChatMsg::Event(Event::Reasoning(s))) if show_thinking => {
                    match blocks.last_mut() {
                        Some(b) if b["type"] == "thinking" => {
                            let t = format!("{}{s}", b["thinking"].as_str().unwrap_or(""));
                            b["thinking"] = json!(t);
                        }
                        _ => {
                            blocks.push(json!({"type": "thinking", "thinking": s, "signature": ""}))
                        }
                    }
                }
                Some(ChatMsg::Event(Event::CallEnd { call, .. })) => {
                    calls += 1;
                    let input: Value =
                        serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
                    blocks.push(json!({"type": "tool_use", "id": tool_id(&call), "name": call.name, "input": input}));
                }
                Some(ChatMsg::Event(_)) => {}
                Some(ChatMsg::Done(r)) => break r,
                None => break Err(ProviderError::Failed("the engine stopped".into())),
            }
        };
        guard.done();
        let out = match out {
            Ok(o) => o,
            Err(e) => return provider_error(&e),
        };
        // Whitespace-only text around calls is no block of its own.
        blocks.retain(|b| {
            b["type"] != "text"
                || b["text"].as_str().is_some_and(|t| !t.trim().is_empty())
                || calls == 0
        });
        return axum::Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": stop_reason(&out, calls), "stop_sequence": null,
            "usage": usage(out.prompt_tokens, out.completion_tokens, out.reused_tokens),
        }))
        .into_response();
    }
    let (otx, orx) = tokio::sync::mpsc::unbounded_channel::<(&'static str, Value)>();
    tokio::spawn(async move {
        let _guard = guard;
        let send = |name: &'static str, v: Value| otx.send((name, v)).is_ok();
        send(
            "message_start",
            json!({"type": "message_start", "message": {"id": id, "type": "message",
            "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage(input, 1, 0)}}),
        );
        send("ping", json!({"type": "ping"}));
        // The open block: its index and type.
        let mut open: Option<(usize, &'static str)> = None;
        let mut next = 0usize;
        let mut calls = 0usize;
        let close = |open: &mut Option<(usize, &'static str)>| {
            if let Some((i, kind)) = open.take() {
                if kind == "thinking" {
                    send(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "signature_delta", "signature": "agentd"}}),
                    );
                }
                send("content_block_stop", json!({"type": "content_block_stop", "index": i}));
            }
        };
        let mut pending = first;
        loop {
            let msg = match pending.take() {
                Some(m) => m,
                None => match rx.recv().await {
                    Some(m) => m,
                    None => return,
                },
            };
            match msg {
                ChatMsg::Event(Event::Content(s)) => {
                    if open.is_some_and(|(_, k)| k != "text") {
                        close(&mut open);
                    }
                    if open.is_none() {
                        // Whitespace between calls opens no block.
                        if s.trim().is_empty() && calls > 0 {
                            continue;
                        }
                        send(
                            "content_block_start",
                            json!({"type": "content_block_start", "index": next,
                            "content_block": {"type": "text", "text": ""}}),
                        );
                        open = Some((next, "text"));
                        next += 1;
                    }
                    let i = open.map_or(0, |o| o.0);
                    if !send(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "text_delta", "text": s}}),
                    ) {
                        return;
                    }
                }
                ChatMsg::Event(Event::Reasoning(s)) if show_thinking => {
                    if open.is_some_and(|(_, k)| k != "thinking") {
                        close(&mut open);
                    }
                    if open.is_none() {
                        send(
                            "content_block_start",
                            json!({"type": "content_block_start", "index": next,
                            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                        );
                        open = Some((next, "thinking"));
                        next += 1;
                    }
                    let i = open.map_or(0, |o| o.0);
                    if !send(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "thinking_delta", "thinking": s}}),
                    ) {
                        return;
                    }
                }
                ChatMsg::Event(Event::CallEnd { call, .. }) => {
                    close(&mut open);
                    let i = next;
                    next += 1;
                    calls += 1;
                    send(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": i,
                        "content_block": {"type": "tool_use", "id": tool_id(&call), "name": call.name, "input": {}}}),
                    );
                    send(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": call.arguments}}),
                    );
                    if !send(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ) {
                        return;
                    }
                }
                ChatMsg::Event(_) => {}
                ChatMsg::Done(Ok(o)) => {
                    close(&mut open);
                    send(
                        "message_delta",
                        json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason(&o, calls), "stop_sequence": null},
                        "usage": {"input_tokens": o.prompt_tokens, "output_tokens": o.completion_tokens,
                                  "cache_read_input_tokens": o.reused_tokens}}),
                    );
                    send("message_stop", json!({"type": "message_stop"}));
                    return;
                }
                ChatMsg::Done(Err(e)) => {
                    send(
                        "error",
                        json!({"type": "error", "error": {"type": "api_error", "message": e.to_string()}}),
                    );
                    return;
                }
            }
        }
    });
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(orx).map(|(name, v)| {
        Ok::<_, std::convert::Infallible>(SseEvent::default().event(name).data(v.to_string()))
    });
    Sse::new(s).into_response()
}

use futures_util::StreamExt;

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}` of the prompt the
/// request would send.
pub(super) async fn count_tokens(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body_limit, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let chat = match to_chat(&body, true) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let (st, _lease) = match for_messages(&st, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let p = match parse(&st, &chat) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    if st.worker.submit(Job::Count { messages: p.messages, tools: p.tools, tx }).is_err() {
        return busy();
    }
    match tokio::task::spawn_blocking(move || rx.recv()).await {
        Ok(Ok(Ok(n))) => axum::Json(json!({"input_tokens": n})).into_response(),
        Ok(Ok(Err(e))) => provider_error(&e),
        _ => error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", "the engine stopped"),
    }
}
