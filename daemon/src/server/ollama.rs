//! Ollama's API (`/api/…`, CONTRACTS.md "HTTP") for the clients that speak
//! only it (Enchanted, Home Assistant, VS Code Copilot Chat's local path).
//! Each request is translated into the chat completions request
//! (`chat::parse`: the same checks, sampling and enforcement as
//! `/v1/chat/completions`) and the engine's events back into Ollama's
//! replies: NDJSON lines while streaming (Ollama streams unless told
//! `"stream": false`), one object otherwise. Errors are `{"error": "…"}`.
//!
//! The translation, field by field:
//!
//! | Ollama | chat completions |
//! |---|---|
//! | `messages[].tool_calls[].function.arguments` (object) | `tool_calls[].function.arguments` |
//! | `messages[].tool_name` (role `tool`) | `name` |
//! | `format: "json"` | `response_format: {"type": "json_object"}` |
//! | `format: {schema}` | `response_format: {"type": "json_schema", "json_schema": {"name": "format", "schema": …, "strict": true}}` |
//! | `options.num_predict` (> 0) | `max_tokens` |
//! | `options.temperature` / `top_p` / `top_k` / `min_p` / `seed` / `stop` | the same names |
//! | `options.repeat_penalty` / `repeat_last_n` / `frequency_penalty` / `presence_penalty` / `no_repeat_ngram` | the same names |
//! | `think: false` | reasoning dropped from the reply |
//!
//! `keep_alive` and `options.num_ctx` are accepted and have no effect (the
//! model stays loaded; its context is the daemon's). Options left out take
//! the model's defaults from models.toml, as a Modelfile's `PARAMETER`s do
//! in Ollama (`/api/show` lists them under `parameters`).

use super::chat::{parse, provider_error, Parsed};
use super::json::{busy, json_body};
use super::models::Lease;
use super::shared::State;
use crate::provider::chat::ChatMsg;
use crate::provider::ProviderError;
use crate::provider::TurnFinish;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State as AxState};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use std::time::{Instant, SystemTime};
use toolparse::Event;

/// The Ollama API version this emulates (clients check it).
const VERSION: &str = "0.12.6";

fn fail(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], json!({"error": msg.into()}).to_string())
        .into_response()
}

fn bad(msg: impl Into<String>) -> Response {
    fail(StatusCode::BAD_REQUEST, msg)
}

/// A refusal while translating a request (boxed: a `Response` is large).
type Bad = Box<Response>;

fn nope(msg: impl Into<String>) -> Bad {
    Box::new(bad(msg))
}

/// `GET /`: what Ollama answers there.
pub(super) async fn root() -> &'static str {
    "Ollama is running"
}

/// `GET /api/version`.
pub(super) async fn version() -> Response {
    axum::Json(json!({"version": VERSION})).into_response()
}

/// `POST /api/embed`, `/api/embeddings`: no embedding model is configured.
pub(super) async fn embed() -> Response {
    fail(
        StatusCode::NOT_IMPLEMENTED,
        "embeddings are not available: agentd serves a chat model and no embedding model is configured",
    )
}

/// The served model's Ollama name (`NAME:latest`; a model served from a
/// path is named by its file stem).
fn tag(st: &State) -> String {
    format!("{}:latest", short(st))
}

fn short(st: &State) -> &str {
    if st.model.ends_with(".gguf") || st.model.contains('/') {
        let p = std::path::Path::new(&st.model);
        p.file_stem().and_then(|s| s.to_str()).unwrap_or(&st.model)
    } else {
        &st.model
    }
}

/// A client's model name as the chat route knows it: `:latest` dropped.
fn local_name(m: &str) -> &str {
    m.strip_suffix(":latest").unwrap_or(m)
}

fn details(st: &State) -> Value {
    served_details(&st.card)
}

fn served_details(c: &super::shared::Card) -> Value {
    json!({"parent_model": "", "format": "gguf", "family": c.arch, "families": [c.arch],
           "parameter_size": size_label(c.parameters), "quantization_level": c.quantization})
}

fn size_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", (n as f64 / 1e6).round())
    }
}

/// `GET /api/tags`: every model served (loaded or not).
pub(super) async fn tags(AxState(st): AxState<State>) -> Response {
    let Some(m) = &st.models else {
        let c = &st.card;
        let modified = rfc3339(c.modified.unwrap_or(st_started(&st)));
        let models = vec![json!({"name": tag(&st), "model": tag(&st), "modified_at": modified,
            "size": c.file_bytes, "digest": c.digest.trim_start_matches("sha256:"), "details": details(&st)})];
        return axum::Json(json!({"models": models})).into_response();
    };
    // Each model's details from its card: the loaded model's, else its
    // file's header (read once per version of the file, off the async
    // threads); a file that cannot be read is listed without them.
    let m = std::sync::Arc::clone(m);
    let models = tokio::task::spawn_blocking(move || {
        m.available()
            .iter()
            .map(|a| {
                let meta = std::fs::metadata(&a.path).ok();
                let modified =
                    meta.as_ref().and_then(|m| m.modified().ok()).unwrap_or(SystemTime::UNIX_EPOCH);
                let name = format!("{}:latest", a.name);
                let details = match m.describe(Some(&a.name)) {
                    Ok((_, card, _)) => served_details(&card),
                    Err(_) => json!({"parent_model": "", "format": "gguf"}),
                };
                let digest = a.sha256.clone().unwrap_or_default();
                json!({"name": name, "model": name, "modified_at": rfc3339(modified),
                "size": meta.map_or(0, |m| m.len()), "digest": digest, "details": details})
            })
            .collect::<Vec<Value>>()
    })
    .await
    .unwrap_or_default();
    axum::Json(json!({"models": models})).into_response()
}

fn st_started(st: &State) -> SystemTime {
    SystemTime::now() - st.started.elapsed()
}

/// The `model` (or the older `name`) of a body, resolved before
/// (`State::for_body`): the served model's name.
fn model_of(st: &State, body: &Value, required: bool) -> Result<String, Bad> {
    match body.get("model").filter(|m| !m.is_null()).or(body.get("name")) {
        None | Some(Value::Null) if !required => Ok(st.model.clone()),
        None | Some(Value::Null) => Err(nope("`model` is required")),
        Some(Value::String(_)) => Ok(st.model.clone()),
        Some(_) => Err(nope("`model` must be a string")),
    }
}

/// Whether a chat template has a place for reasoning (Qwen3's
/// `enable_thinking`, DeepSeek's `<think>`, a `reasoning_content` field,
/// gpt-oss's analysis channel): the `thinking` capability.
fn thinks(template: &str) -> bool {
    ["<think>", "enable_thinking", "reasoning_content", "thinking", "<|channel|>analysis"]
        .iter()
        .any(|m| template.contains(m))
}

/// `POST /api/show`.
pub(super) async fn show(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body_limit, req).await {
        Ok(b) if b.is_object() => b,
        Ok(_) => return bad("the body must be a JSON object"),
        Err(r) => return r,
    };
    if let Err(r) = model_of(&st, &body, true) {
        return *r;
    }
    // What the model's file says (or the loaded model's card): a client
    // that shows every model's details loads none of them.
    let (_, card, context) = match st.describe(&body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let c = &*card;
    let a = &c.arch;
    let mut info = Map::new();
    info.insert("general.architecture".into(), json!(a));
    info.insert("general.parameter_count".into(), json!(c.parameters));
    info.insert(format!("{a}.context_length"), json!(context));
    info.insert(format!("{a}.embedding_length"), json!(c.embedding));
    info.insert(format!("{a}.block_count"), json!(c.layers));
    info.insert(format!("{a}.attention.head_count"), json!(c.heads.0));
    info.insert(format!("{a}.attention.head_count_kv"), json!(c.heads.1));
    let mut capabilities = vec!["completion", "tools"];
    if c.fim.is_some() {
        capabilities.push("insert");
    }
    if thinks(&c.template) {
        capabilities.push("thinking");
    }
    let mut parameters: Vec<String> = c.stop.iter().map(|s| format!("stop {s:?}")).collect();
    parameters.extend(c.sampling.lines());
    axum::Json(json!({
        "modelfile": format!("# Modelfile of the model agentd serves\nFROM {}\n", c.path.display()),
        "parameters": parameters.join("\n"),
        "template": c.template,
        "details": served_details(c),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": rfc3339(c.modified.unwrap_or(st_started(&st))),
    }))
    .into_response()
}

/// `GET /api/ps`: the loaded models, each with when it unloads if idle.
pub(super) async fn ps(AxState(st): AxState<State>) -> Response {
    let Some(m) = &st.models else {
        let c = &st.card;
        let forever = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(4_102_444_800); // 2100
        return axum::Json(
            json!({"models": [{"name": tag(&st), "model": tag(&st), "size": c.weight_bytes,
            "digest": c.digest.trim_start_matches("sha256:"), "details": details(&st),
            "expires_at": rfc3339(forever), "size_vram": 0, "context_length": st.context}]}),
        )
        .into_response();
    };
    let models: Vec<Value> = m
        .loaded()
        .iter()
        .map(|s| {
            let name = format!("{}:latest", s.name);
            json!({"name": name, "model": name, "size": s.card.weight_bytes,
                "digest": s.card.digest.trim_start_matches("sha256:"), "details": served_details(&s.card),
                "expires_at": rfc3339(s.expires_at()), "size_vram": 0, "context_length": s.context})
        })
        .collect();
    axum::Json(json!({"models": models})).into_response()
}

/// What the reply needs besides the parsed request.
struct Reply {
    stream: bool,
    think: bool,
    generate: bool,
}

fn flag(body: &Value, key: &str, default: bool) -> Result<bool, Bad> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(nope(format!("`{key}` must be a boolean"))),
    }
}

/// `options` that go to the chat completions request under the same name.
const OPTIONS: [&str; 11] = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "repeat_penalty",
    "repeat_last_n",
    "frequency_penalty",
    "presence_penalty",
    "no_repeat_ngram",
];

/// The chat completions body for an Ollama request's common fields:
/// `format`, `options`, `stream`, `model`.
fn common(st: &State, body: &Value) -> Result<Map<String, Value>, Bad> {
    if !body.is_object() {
        return Err(nope("the body must be a JSON object"));
    }
    let mut o = Map::new();
    o.insert("model".into(), json!(model_of(st, body, false)?));
    match body.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            o.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            o.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema, "strict": true}}),
            );
        }
        Some(_) => return Err(nope("`format` must be \"json\" or a JSON schema object")),
    }
    match body.get("options") {
        None | Some(Value::Null) => {}
        Some(Value::Object(opts)) => {
            for k in OPTIONS {
                if let Some(v) = opts.get(k) {
                    o.insert(k.into(), v.clone());
                }
            }
            match opts.get("num_predict") {
                None | Some(Value::Null) => {}
                Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n > 0) => {
                    o.insert("max_tokens".into(), json!(n));
                }
                // -1 (unbounded) and -2 (fill the context): up to the context.
                Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n < 0) => {
                    o.insert("max_tokens".into(), json!(st.context));
                }
                Some(_) => return Err(nope("`options.num_predict` must be a non-zero integer")),
            }
            if let Some(v) = opts.get("num_ctx").filter(|v| !v.is_null() && !v.is_u64()) {
                return Err(nope(format!("`options.num_ctx` must be a positive integer, not {v}")));
            }
        }
        Some(_) => return Err(nope("`options` must be an object")),
    }
    Ok(o)
}

fn think(body: &Value) -> Result<bool, Bad> {
    match body.get("think") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        // gpt-oss style levels: reasoning on.
        Some(Value::String(s)) if ["low", "medium", "high"].contains(&s.as_str()) => Ok(true),
        Some(_) => Err(nope("`think` must be a boolean or \"low\", \"medium\", \"high\"")),
    }
}

fn messages(v: Option<&Value>) -> Result<Vec<Value>, Bad> {
    let arr =
        v.and_then(Value::as_array).ok_or_else(|| bad("`messages` must be a non-empty array"))?;
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Some(m) = m.as_object() else { return Err(nope(format!("{at} must be an object"))) };
        if m.get("images").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            return Err(nope(format!("{at}.images: this model takes no images")));
        }
        let mut o = Map::new();
        o.insert("role".into(), m.get("role").cloned().unwrap_or(Value::Null));
        match m.get("content") {
            None | Some(Value::Null) => {
                o.insert("content".into(), json!(""));
            }
            Some(c @ Value::String(_)) => {
                o.insert("content".into(), c.clone());
            }
            Some(_) => return Err(nope(format!("{at}.content must be a string"))),
        }
        if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
            let calls =
                calls.as_array().ok_or_else(|| bad(format!("{at}.tool_calls must be an array")))?;
            let mut list = Vec::new();
            for (j, c) in calls.iter().enumerate() {
                let f = &c["function"];
                let args = match f.get("arguments") {
                    None | Some(Value::Null) => json!({}),
                    Some(a @ Value::Object(_)) => a.clone(),
                    Some(Value::String(s)) => json!(s),
                    Some(_) => {
                        return Err(nope(format!(
                            "{at}.tool_calls[{j}].function.arguments must be an object"
                        )))
                    }
                };
                let id =
                    c.get("id").and_then(Value::as_str).map_or(format!("call_{j}"), str::to_owned);
                list.push(json!({"id": id, "type": "function", "function": {"name": f.get("name").cloned().unwrap_or(Value::Null), "arguments": args}}));
            }
            o.insert("tool_calls".into(), json!(list));
        }
        if let Some(n) = m.get("tool_name").or(m.get("name")).filter(|n| n.is_string()) {
            o.insert("name".into(), n.clone());
        }
        if let Some(id) = m.get("tool_call_id").filter(|n| n.is_string()) {
            o.insert("tool_call_id".into(), id.clone());
        }
        out.push(Value::Object(o));
    }
    Ok(out)
}

/// Runs the parsed request and answers in Ollama's shape.
async fn answer(st: State, mut p: Parsed, reply: Reply, lease: Option<Lease>) -> Response {
    let id = crate::state::store::new_id("ollama");
    let (cancel, guard) = st.track(id);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = p.job(cancel, tx, lease);
    if st.worker.submit(job).is_err() {
        guard.done();
        return busy();
    }
    let started = Instant::now();
    // The status is decided by the first message (a prompt beyond the
    // context is a 400 before anything streams).
    let first = rx.recv().await;
    let first_at = Instant::now();
    if let Some(ChatMsg::Done(Err(e))) = &first {
        guard.done();
        return provider_error(e);
    }
    let model = tag(&st);
    let piece = {
        let model = model.clone();
        move |content: &str, thinking: Option<&str>, calls: Option<Value>| {
            let mut v = json!({"model": model, "created_at": rfc3339(SystemTime::now())});
            if reply.generate {
                v["response"] = json!(content);
                if let Some(t) = thinking {
                    v["thinking"] = json!(t);
                }
            } else {
                let mut m = json!({"role": "assistant", "content": content});
                if let Some(t) = thinking {
                    m["thinking"] = json!(t);
                }
                if let Some(c) = calls {
                    m["tool_calls"] = c;
                }
                v["message"] = m;
            }
            v["done"] = json!(false);
            v
        }
    };
    let last = move |v: &mut Value, o: &crate::provider::chat::ChatOutput, first_at: Instant| {
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        v["done"] = json!(true);
        v["done_reason"] = json!(if o.finish == TurnFinish::Length { "length" } else { "stop" });
        v["total_duration"] = json!(ns(started.elapsed()));
        v["load_duration"] = json!(0);
        v["prompt_eval_count"] = json!(o.prompt_tokens);
        v["prompt_eval_duration"] = json!(ns(first_at - started));
        v["eval_count"] = json!(o.completion_tokens);
        v["eval_duration"] = json!(ns(first_at.elapsed()));
    };
    let call = |i: usize, c: &toolparse::ToolCall| {
        let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
        let id = c.id.clone().unwrap_or_else(|| crate::state::store::new_id("call"));
        json!({"id": id, "function": {"index": i, "name": c.name, "arguments": args}})
    };
    if !reply.stream {
        let (mut content, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
        let mut pending = first;
        let out = loop {
            let msg = match pending.take() {
                Some(m) => Some(m),
                None => rx.recv().await,
            };
            match msg {
                Some(ChatMsg::Event(Event::Content(s))) => content.push_str(&s),
                Some(ChatMsg::Event(Event::Reasoning(s))) => thinking.push_str(&s),
                Some(ChatMsg::Event(Event::CallEnd { call: c, .. })) => {
                    calls.push(call(calls.len(), &c))
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
        let thinking = (reply.think && !thinking.is_empty()).then_some(thinking.as_str());
        let calls = (!calls.is_empty()).then(|| json!(calls));
        let mut v = piece(&content, thinking, calls);
        last(&mut v, &out, first_at);
        return axum::Json(v).into_response();
    }
    let (otx, orx) =
        tokio::sync::mpsc::unbounded_channel::<Result<Bytes, std::convert::Infallible>>();
    tokio::spawn(async move {
        let _guard = guard;
        let send = |v: Value| otx.send(Ok(Bytes::from(format!("{v}\n")))).is_ok();
        let mut pending = first;
        let mut n_calls = 0;
        loop {
            let msg = match pending.take() {
                Some(m) => m,
                None => match rx.recv().await {
                    Some(m) => m,
                    None => return,
                },
            };
            let ok = match msg {
                ChatMsg::Event(Event::Content(s)) => send(piece(&s, None, None)),
                ChatMsg::Event(Event::Reasoning(s)) if reply.think => {
                    send(piece("", Some(&s), None))
                }
                ChatMsg::Event(Event::CallEnd { call: c, .. }) if !reply.generate => {
                    let v = call(n_calls, &c);
                    n_calls += 1;
                    send(piece("", None, Some(json!([v]))))
                }
                ChatMsg::Event(_) => true,
                ChatMsg::Done(Ok(o)) => {
                    let mut v = piece("", None, None);
                    last(&mut v, &o, first_at);
                    send(v);
                    return;
                }
                ChatMsg::Done(Err(e)) => {
                    send(json!({"error": e.to_string()}));
                    return;
                }
            };
            if !ok {
                return;
            }
        }
    });
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(orx).boxed();
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(s)).into_response()
}

/// `POST /api/chat`.
pub(super) async fn chat(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body_limit, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (st, lease) = match st.for_body(&body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut o = match common(&st, &body) {
        Ok(o) => o,
        Err(r) => return *r,
    };
    let (stream, think) = match (flag(&body, "stream", true), think(&body)) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(r), _) | (_, Err(r)) => return *r,
    };
    match messages(body.get("messages")) {
        Ok(m) => o.insert("messages".into(), json!(m)),
        Err(r) => return *r,
    };
    if let Some(t) = body.get("tools") {
        o.insert("tools".into(), t.clone());
    }
    let p = match parse(&st, &Value::Object(o)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    answer(st, p, Reply { stream, think, generate: false }, lease).await
}

/// `POST /api/generate`: a prompt (with `system`) through the chat
/// template, or `raw` as it is; `suffix` as fill-in-the-middle where the
/// model's vocabulary has the tokens for it.
pub(super) async fn generate(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body_limit, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (st, lease) = match st.for_body(&body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut o = match common(&st, &body) {
        Ok(o) => o,
        Err(r) => return *r,
    };
    let (stream, think, raw) =
        match (flag(&body, "stream", true), think(&body), flag(&body, "raw", false)) {
            (Ok(s), Ok(t), Ok(r)) => (s, t, r),
            (Err(r), _, _) | (_, Err(r), _) | (_, _, Err(r)) => return *r,
        };
    let text = |k: &str| match body.get(k) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(nope(format!("`{k}` must be a string"))),
    };
    let (prompt, system, suffix) = match (text("prompt"), text("system"), text("suffix")) {
        (Ok(p), Ok(s), Ok(x)) => (p, s, x),
        (Err(r), _, _) | (_, Err(r), _) | (_, _, Err(r)) => return *r,
    };
    if body.get("images").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
        return bad("`images`: this model takes no images");
    }
    if prompt.is_empty() && suffix.is_empty() {
        // Ollama's way to load a model (it is loaded now), or with
        // `keep_alive: 0` to unload it.
        let unload = lease.as_ref().is_some_and(Lease::unloads);
        drop(lease);
        if unload {
            if let Some(m) = &st.models {
                m.unload_now(&st.model);
            }
        }
        return axum::Json(json!({"model": tag(&st), "created_at": rfc3339(SystemTime::now()),
            "response": "", "done": true, "done_reason": if unload { "unload" } else { "load" }}))
        .into_response();
    }
    let raw_text = if !suffix.is_empty() {
        let Some([pre, suf, mid]) = &st.card.fim else {
            return bad(format!(
                "{} does not support insert: `suffix` needs a model with fill-in-the-middle tokens",
                tag(&st)
            ));
        };
        Some(format!("{pre}{prompt}{suf}{suffix}{mid}"))
    } else if raw {
        Some(prompt.clone())
    } else {
        None
    };
    let mut msgs = Vec::new();
    if !system.is_empty() && raw_text.is_none() {
        msgs.push(json!({"role": "system", "content": system}));
    }
    msgs.push(json!({"role": "user", "content": prompt}));
    o.insert("messages".into(), json!(msgs));
    let mut p = match parse(&st, &Value::Object(o)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    p.params.raw = raw_text;
    answer(st, p, Reply { stream, think, generate: true }, lease).await
}

/// `POST /api/pull`: a model of models.toml, fetched (or found present and
/// verified), with Ollama's progress lines ending `{"status": "success"}`.
pub(super) async fn pull(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body_limit, req).await {
        Ok(b) if b.is_object() => b,
        Ok(_) => return bad("the body must be a JSON object"),
        Err(r) => return r,
    };
    let name = match body.get("model").filter(|m| !m.is_null()).or(body.get("name")) {
        Some(Value::String(s)) if !s.is_empty() => local_name(s).to_owned(),
        _ => return bad("`model` must be the name of a model in models.toml"),
    };
    let stream = match flag(&body, "stream", true) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let reg = match crate::state::registry::Registry::load() {
        Ok(r) => r,
        Err(e) => return fail(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    };
    let Some(entry) = reg.entries.get(&name).cloned() else {
        return fail(
            StatusCode::NOT_FOUND,
            format!(
                "pull model manifest: {name:?} is not in the model registry (models.toml); known models are {}",
                reg.entries.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        );
    };
    let (otx, orx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let total = entry.size.unwrap_or(0);
    let digest = format!("sha256:{}", entry.sha256);
    let _ = otx.send(json!({"status": "pulling manifest"}));
    let progress = otx.clone();
    let work = tokio::task::spawn_blocking(move || {
        let path = entry.local_path();
        let partial = crate::state::home::models_dir().join(format!("{}.partial", entry.file));
        let present = path.is_file();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Progress of a download: the size of its partial file.
        let watcher = (!present).then(|| {
            let (done, progress, digest, partial) =
                (std::sync::Arc::clone(&done), progress.clone(), digest.clone(), partial.clone());
            std::thread::spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let got = std::fs::metadata(&partial).map_or(0, |m| m.len());
                    let status = format!("pulling {}", &digest[7..19]);
                    let _ = progress.send(json!({"status": status, "digest": digest, "total": total, "completed": got}));
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
            })
        });
        let r = crate::state::pull::pull(&entry);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(w) = watcher {
            let _ = w.join();
        }
        r.map(|p| (p, digest))
    });
    let finish = async move {
        match work.await {
            Ok(Ok((path, digest))) => {
                let size = std::fs::metadata(&path).map_or(total, |m| m.len());
                let status = format!("pulling {}", &digest[7..19]);
                let _ = otx.send(
                    json!({"status": status, "digest": digest, "total": size, "completed": size}),
                );
                let _ = otx.send(json!({"status": "verifying sha256 digest"}));
                let _ = otx.send(json!({"status": "writing manifest"}));
                let _ = otx.send(json!({"status": "success"}));
                Ok(())
            }
            Ok(Err(e)) => {
                let msg = format!("pull {name}: {e:#}");
                let _ = otx.send(json!({"error": msg}));
                Err(msg)
            }
            Err(_) => {
                let _ = otx.send(json!({"error": "the pull failed"}));
                Err("the pull failed".to_owned())
            }
        }
    };
    if !stream {
        return match finish.await {
            Ok(()) => axum::Json(json!({"status": "success"})).into_response(),
            Err(m) => fail(StatusCode::INTERNAL_SERVER_ERROR, m),
        };
    }
    tokio::spawn(finish);
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(orx)
        .map(|v| Ok::<_, std::convert::Infallible>(Bytes::from(format!("{v}\n"))));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(s)).into_response()
}

/// `2024-05-01T12:00:00.000Z`.
pub(super) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_thinking_capability_follows_the_template() {
        use super::thinks;
        // Qwen3's template, the part that matters.
        assert!(thinks("{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"));
        assert!(thinks(
            "{% if message.reasoning_content %}{{ message.reasoning_content }}{% endif %}"
        ));
        // SmolLM2's ChatML template has none.
        assert!(!thinks("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"));
        assert!(!thinks(""));
    }

    #[test]
    fn dates_are_rfc3339() {
        let t =
            std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_714_564_800_250);
        assert_eq!(super::rfc3339(t), "2024-05-01T12:00:00.250Z");
        assert_eq!(super::rfc3339(std::time::SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }
}
