//! `POST /v1/chat/completions` for clients that bring their own tools:
//! OpenAI-compatible requests and responses, streamed (SSE ending with
//! `data: [DONE]`) or not. The model's native calls are parsed by toolparse
//! into `tool_calls`; with `tool_choice: none` or no tools, call markup
//! never reaches `content`.
//!
//! Sampling: llama-server's defaults (greedy, no penalties), under the
//! model's `[sampling]` table in models.toml, under what the request sets —
//! a client's value always wins. Besides OpenAI's `temperature`, `top_p`,
//! `seed`, `frequency_penalty` and `presence_penalty` (-2..2, counted over
//! the last `repeat_last_n` tokens, prompt included, as llama.cpp does), the
//! route takes llama-server's `top_k`, `min_p`, `repeat_penalty` and
//! `repeat_last_n`, and `no_repeat_ngram` (ban a token that would repeat an
//! n-gram of the reply; 0 turns a model's default off). A value out of its
//! range is a 400 naming the field and the range.

use super::json::{busy, error, json_body};
use super::models::Lease;
use super::shared::State;
use super::worker::Job;
use crate::provider::chat::{with_knobs, ChatMsg, ChatOutput, ChatParams, Sampling};
use crate::provider::constrain::{Constraint, ToolChoice};
use crate::provider::engine::ChatJob;
use crate::provider::ProviderError;
use crate::provider::TurnFinish;
use crate::state::policy::SamplingLimits;
use crate::state::registry::SamplingKnobs;
use axum::extract::{Request, State as AxState};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use prompts::{Message, ToolCallMsg, ToolDef};
use serde_json::{json, Value};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use toolparse::{Event, Mode};

type Bad = Box<Response>;

fn bad(msg: impl Into<String>) -> Bad {
    Box::new(error(StatusCode::BAD_REQUEST, "invalid_request", msg))
}

fn text_of(content: &Value, at: &str) -> Result<String, Bad> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err(bad(format!("{at}.content[{i}]: only text parts are supported ({{\"type\": \"text\", \"text\": …}})"))),
                }
            }
            Ok(out)
        }
        _ => Err(bad(format!("{at}.content must be a string, null or an array of text parts"))),
    }
}

fn messages(v: Option<&Value>) -> Result<Vec<Message>, Bad> {
    let arr =
        v.and_then(Value::as_array).ok_or_else(|| bad("`messages` must be a non-empty array"))?;
    if arr.is_empty() {
        return Err(bad("`messages` must be a non-empty array"));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let at = format!("messages[{i}]");
        if !m.is_object() {
            return Err(bad(format!("{at} must be an object")));
        }
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.role must be a string")))?;
        let role = match role {
            "system" | "developer" => "system",
            "user" | "assistant" | "tool" => role,
            other => {
                return Err(bad(format!(
                    "{at}.role {other:?} is not one of system, developer, user, assistant, tool"
                )))
            }
        };
        let mut msg = Message::new(role, text_of(m.get("content").unwrap_or(&Value::Null), &at)?);
        if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
            let calls =
                calls.as_array().ok_or_else(|| bad(format!("{at}.tool_calls must be an array")))?;
            for (j, c) in calls.iter().enumerate() {
                let f = &c["function"];
                let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                    bad(format!("{at}.tool_calls[{j}].function.name must be a string"))
                })?;
                let args = match f.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Object(_)) => v.to_string(),
                    None | Some(Value::Null) => "{}".into(),
                    _ => {
                        return Err(bad(format!(
                            "{at}.tool_calls[{j}].function.arguments must be a JSON string"
                        )))
                    }
                };
                let id = c.get("id").and_then(Value::as_str).unwrap_or("call_0");
                msg.tool_calls.push(ToolCallMsg::new(id, name, &args));
            }
        }
        if role == "tool" {
            msg.tool_call_id = m.get("tool_call_id").and_then(Value::as_str).map(str::to_owned);
            msg.name = m.get("name").and_then(Value::as_str).map(str::to_owned);
        }
        out.push(msg);
    }
    Ok(out)
}

fn tools(v: Option<&Value>) -> Result<Vec<ToolDef>, Bad> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
    let arr = v.as_array().ok_or_else(|| bad("`tools` must be an array"))?;
    let mut out = Vec::new();
    for (i, t) in arr.iter().enumerate() {
        let f = t.get("function").ok_or_else(|| {
            bad(format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{…}}}}"))
        })?;
        if let Some(ty) = t.get("type") {
            if ty != "function" {
                return Err(bad(format!("tools[{i}].type must be \"function\"")));
            }
        }
        let name =
            f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| {
                bad(format!("tools[{i}].function.name must be a non-empty string"))
            })?;
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(bad(format!(
                    "tools[{i}].function.parameters must be a JSON Schema object"
                )))
            }
        };
        let description = match f.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(bad(format!("tools[{i}].function.description must be a string")))
            }
        };
        out.push(ToolDef { name: name.to_owned(), description, parameters });
    }
    Ok(out)
}

/// `response_format`: `text`, `json_object`, or `json_schema` with its
/// `schema` (checked when the turn's grammar is built).
fn response_format(v: Option<&Value>) -> Result<Option<Constraint>, Bad> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let js = v.get("json_schema").filter(|j| j.is_object()).ok_or_else(|| {
                bad("`response_format.json_schema` must be an object with a `schema`")
            })?;
            match js.get("strict") {
                None | Some(Value::Null) | Some(Value::Bool(_)) => {}
                Some(_) => {
                    return Err(bad("`response_format.json_schema.strict` must be a boolean"))
                }
            }
            match js.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(Constraint::JsonSchema(s.clone())))
                }
                None | Some(Value::Null) => Ok(Some(Constraint::JsonObject)),
                Some(_) => {
                    Err(bad("`response_format.json_schema.schema` must be a JSON Schema object"))
                }
            }
        }
        _ => {
            Err(bad("`response_format.type` must be \"text\", \"json_object\" or \"json_schema\""))
        }
    }
}

fn num(body: &Value, key: &str) -> Result<Option<f64>, Bad> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(bad(format!("`{key}` must be a number"))),
    }
}

/// A number field, as `num` (the message for a 400).
fn number(body: &Value, key: &str) -> Result<Option<f64>, String> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(format!("`{key}` must be a number")),
    }
}

/// A non-negative integer field.
fn count(body: &Value, key: &str) -> Result<Option<usize>, String> {
    match number(body, key)? {
        None => Ok(None),
        Some(n) if n >= 0.0 && n.fract() == 0.0 => Ok(Some(n as usize)),
        Some(_) => Err(format!("`{key}` must be a non-negative integer")),
    }
}

/// The sampling knobs a request sets, each within its range (the integer
/// ones within the `sampling/…` policies in force); `repeat_last_n: -1`
/// (llama.cpp's "the whole context") is as far back as the policy allows.
fn knobs(body: &Value, limits: SamplingLimits) -> Result<SamplingKnobs, String> {
    let real = |key| number(body, key).map(|v| v.map(|x| x as f32));
    let repeat_last_n = match number(body, "repeat_last_n")? {
        Some(-1.0) => Some(limits.repeat_last_n),
        Some(n) if n < 0.0 || n.fract() != 0.0 => {
            let (max, policy) = (limits.repeat_last_n, crate::state::policy::REPEAT_LAST_N);
            return Err(format!(
                "`repeat_last_n` must be from 0 to {max}, the policy {policy}, or -1 (got {n})"
            ));
        }
        n => n.map(|n| n as usize),
    };
    let k = SamplingKnobs {
        temperature: real("temperature")?,
        top_k: count(body, "top_k")?,
        top_p: real("top_p")?,
        min_p: real("min_p")?,
        repeat_penalty: real("repeat_penalty")?,
        repeat_last_n,
        frequency_penalty: real("frequency_penalty")?,
        presence_penalty: real("presence_penalty")?,
        no_repeat_ngram: count(body, "no_repeat_ngram")?,
    };
    k.check(limits).map_err(|e| format!("`{}` {}", e.field, e.must))?;
    Ok(k)
}

/// A request's sampling: llama-server's defaults (greedy, no penalties),
/// under the model's, under the request's own knobs.
fn sampling(
    body: &Value,
    model: &SamplingKnobs,
    limits: SamplingLimits,
) -> Result<Sampling, String> {
    let seed = number(body, "seed")?.map(|s| s as u64).unwrap_or(0);
    let route = Sampling {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        no_repeat_ngram: 0,
        seed,
    };
    Ok(with_knobs(route, &knobs(body, limits)?.over(model)))
}

/// A chat request as the engine takes it. The Ollama and Anthropic routes
/// translate their bodies into this route's JSON and parse them here, so
/// every front gets the same checks and the same enforcement.
pub(super) struct Parsed {
    pub(super) messages: Vec<Message>,
    pub(super) tools: Vec<ToolDef>,
    pub(super) params: ChatParams,
    pub(super) stream: bool,
    usage_in_stream: bool,
}

impl Parsed {
    /// The request as a job for its model's engine thread (its messages
    /// and tools move into it): stopped by
    /// `cancel`, streaming into `tx`, holding `lease` on the model until it
    /// ends.
    pub(super) fn job(
        &mut self,
        cancel: Arc<AtomicBool>,
        tx: UnboundedSender<ChatMsg>,
        lease: Option<Lease>,
    ) -> Job {
        Job::Chat(ChatJob {
            messages: std::mem::take(&mut self.messages),
            tools: std::mem::take(&mut self.tools),
            params: self.params.clone(),
            cancel,
            run: None,
            tx,
            hold: lease.map(|l| Box::new(l) as Box<dyn std::any::Any + Send>),
        })
    }
}

pub(super) fn parse(st: &State, body: &Value) -> Result<Parsed, Bad> {
    if !body.is_object() {
        return Err(bad("the body must be a JSON object"));
    }
    // The model was resolved before (`State::for_body`); here only its type.
    if body.get("model").is_some_and(|m| !m.is_null() && !m.is_string()) {
        return Err(bad("`model` must be a string"));
    }
    let mut messages = messages(body.get("messages"))?;
    let mut tools = tools(body.get("tools"))?;
    let mut choice = ToolChoice::Auto;
    let mode = match body.get("tool_choice") {
        None | Some(Value::Null) => Mode::Tools,
        Some(Value::String(s)) if s == "auto" => Mode::Tools,
        Some(Value::String(s)) if s == "none" => {
            tools.clear();
            Mode::Suppress
        }
        Some(Value::String(s)) if s == "required" => {
            if tools.is_empty() {
                return Err(bad("`tool_choice: required` needs `tools`"));
            }
            messages.push(Message::new("system", "You must answer by calling one of the provided tools."));
            choice = ToolChoice::Required;
            Mode::Tools
        }
        Some(v @ Value::Object(_)) => {
            let name = v["function"]["name"].as_str().ok_or_else(|| bad("`tool_choice.function.name` must be a string"))?;
            tools.retain(|t| t.name == name);
            if tools.is_empty() {
                return Err(bad(format!("`tool_choice` names {name:?}, which is not in `tools`")));
            }
            messages.push(Message::new("system", format!("You must answer by calling the tool {name}.")));
            choice = ToolChoice::Named(name.to_owned());
            Mode::Tools
        }
        Some(_) => return Err(bad("`tool_choice` must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}")),
    };
    let mode = if tools.is_empty() { Mode::Suppress } else { mode };
    let format = response_format(body.get("response_format"))?;
    let constraint = match (format, mode, choice) {
        (Some(_), Mode::Tools, ToolChoice::Required | ToolChoice::Named(_)) => {
            return Err(bad("`response_format` and a `tool_choice` that forces a call cannot both be enforced; drop one"))
        }
        (Some(f), _, _) => f,
        (None, Mode::Tools, c) => Constraint::ToolCalls(c),
        (None, _, _) => Constraint::None,
    };
    let max_tokens = match num(body, "max_completion_tokens")?.or(num(body, "max_tokens")?) {
        None => 1024,
        Some(n) if n >= 1.0 && n.fract() == 0.0 => n as usize,
        Some(_) => return Err(bad("`max_tokens` must be a positive integer")),
    };
    let sampling = sampling(body, &st.card.sampling, st.limits).map_err(bad)?;
    if st.upstream.is_some() && sampling.no_repeat_ngram > 0 {
        return Err(bad("`no_repeat_ngram` is not supported in front of an upstream engine"));
    }
    if let Some(n) = num(body, "n")? {
        if n != 1.0 {
            return Err(bad("only `n: 1` is supported"));
        }
    }
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.iter().all(Value::is_string) && a.len() <= 4 => {
            a.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        Some(_) => return Err(bad("`stop` must be a string or an array of up to 4 strings")),
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`stream` must be a boolean")),
    };
    let usage_in_stream = body["stream_options"]["include_usage"].as_bool().unwrap_or(false);
    Ok(Parsed {
        messages,
        tools,
        params: ChatParams {
            max_tokens,
            sampling,
            stop,
            mode,
            constraint,
            lenient: false,
            raw: None,
        },
        stream,
        usage_in_stream,
    })
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(super) fn call_json(i: usize, c: &toolparse::ToolCall, id: &str) -> Value {
    json!({"index": i, "id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

fn finish_reason(out: &ChatOutput, calls: usize) -> &'static str {
    if calls > 0 {
        "tool_calls"
    } else if out.finish == TurnFinish::Length {
        "length"
    } else {
        "stop"
    }
}

fn usage(o: &ChatOutput) -> Value {
    json!({"prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
           "total_tokens": o.prompt_tokens + o.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": o.reused_tokens}})
}

pub(super) fn provider_error(e: &ProviderError) -> Response {
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

pub(super) async fn completions(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body_limit, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (st, lease) = match st.for_body(&body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut p = match parse(&st, &body) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let id = crate::state::store::new_id("chatcmpl");
    let (cancel, guard) = st.track(id.clone());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = p.job(cancel, tx, lease);
    if st.worker.submit(job).is_err() {
        guard.done();
        return busy();
    }
    let model = st.model.clone();
    let created = now();
    if !p.stream {
        let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        let out = loop {
            match rx.recv().await {
                Some(ChatMsg::Event(Event::Content(s))) => content.push_str(&s),
                Some(ChatMsg::Event(Event::Reasoning(s))) => reasoning.push_str(&s),
                Some(ChatMsg::Event(Event::CallEnd { call, .. })) => calls.push(call),
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
        let tool_calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = call_json(
                    i,
                    c,
                    &c.id.clone().unwrap_or_else(|| crate::state::store::new_id("call")),
                );
                v.as_object_mut().map(|m| m.remove("index"));
                v
            })
            .collect();
        let mut message = json!({"role": "assistant", "content": if content.is_empty() && !tool_calls.is_empty() { Value::Null } else { Value::from(content) }});
        if !reasoning.is_empty() {
            message["reasoning_content"] = json!(reasoning);
        }
        if !tool_calls.is_empty() {
            message["tool_calls"] = json!(tool_calls);
        }
        return axum::Json(json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(&out, calls.len()), "logprobs": null}],
            "usage": usage(&out),
        }))
        .into_response();
    }
    // Streaming: the status is decided by the first message (a prompt too
    // long for the context is a 400 before any byte is streamed).
    let first = rx.recv().await;
    if let Some(ChatMsg::Done(Err(e))) = &first {
        guard.done();
        return provider_error(e);
    }
    let chunk = move |delta: Value, finish: Option<&str>| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
    };
    let (otx, orx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let usage_in_stream = p.usage_in_stream;
    tokio::spawn(async move {
        let _guard = guard;
        let send = |v: Value| otx.send(v.to_string()).is_ok();
        if !send(chunk(json!({"role": "assistant", "content": ""}), None)) {
            return;
        }
        let mut calls = 0usize;
        let mut pending = first;
        loop {
            let msg = match pending.take() {
                Some(m) => m,
                None => match rx.recv().await {
                    Some(m) => m,
                    None => return,
                },
            };
            let ok = match msg {
                ChatMsg::Event(Event::Content(s)) => send(chunk(json!({"content": s}), None)),
                ChatMsg::Event(Event::Reasoning(s)) => {
                    send(chunk(json!({"reasoning_content": s}), None))
                }
                ChatMsg::Event(Event::CallEnd { call, .. }) => {
                    let cid =
                        call.id.clone().unwrap_or_else(|| crate::state::store::new_id("call"));
                    let v = call_json(calls, &call, &cid);
                    calls += 1;
                    send(chunk(json!({"tool_calls": [v]}), None))
                }
                ChatMsg::Event(_) => true,
                ChatMsg::Done(Ok(o)) => {
                    send(chunk(json!({}), Some(finish_reason(&o, calls))));
                    if usage_in_stream {
                        let mut u = chunk(json!({}), None);
                        u["choices"] = json!([]);
                        u["usage"] = usage(&o);
                        send(u);
                    }
                    let _ = otx.send("[DONE]".into());
                    return;
                }
                ChatMsg::Done(Err(e)) => {
                    let _ = otx.send(
                        json!({"error": {"code": e.code().1, "message": e.to_string()}})
                            .to_string(),
                    );
                    let _ = otx.send("[DONE]".into());
                    return;
                }
            };
            if !ok {
                return;
            }
        }
    });
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(orx)
        .map(|d| Ok::<_, std::convert::Infallible>(SseEvent::default().data(d)));
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: SamplingLimits = SamplingLimits { repeat_last_n: 4096, no_repeat_ngram: 32 };

    fn of(body: Value, model: &SamplingKnobs) -> Result<Sampling, String> {
        sampling(&body, model, LIMITS)
    }

    #[test]
    fn a_request_without_knobs_gets_llama_server_defaults_then_the_models() {
        let none = SamplingKnobs::default();
        let s = of(json!({}), &none).unwrap();
        assert_eq!(
            (s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty),
            (0.0, 0, 1.0, 0.0, 1.0)
        );
        assert_eq!((s.frequency_penalty, s.presence_penalty, s.no_repeat_ngram), (0.0, 0.0, 0));
        let model = SamplingKnobs {
            repeat_penalty: Some(1.1),
            no_repeat_ngram: Some(4),
            ..SamplingKnobs::default()
        };
        let s = of(json!({"seed": 7}), &model).unwrap();
        assert_eq!((s.repeat_penalty, s.no_repeat_ngram, s.seed), (1.1, 4, 7));
    }

    #[test]
    fn a_clients_explicit_value_wins_over_the_models() {
        let model = SamplingKnobs {
            repeat_penalty: Some(1.1),
            no_repeat_ngram: Some(4),
            temperature: Some(0.7),
            ..SamplingKnobs::default()
        };
        let body = json!({"repeat_penalty": 1.0, "no_repeat_ngram": 0, "temperature": 0,
                          "frequency_penalty": 0.5, "presence_penalty": -0.25,
                          "repeat_last_n": 128, "min_p": 0.1, "top_k": 20});
        let s = of(body, &model).unwrap();
        assert_eq!((s.repeat_penalty, s.no_repeat_ngram, s.temperature), (1.0, 0, 0.0));
        assert_eq!((s.frequency_penalty, s.presence_penalty), (0.5, -0.25));
        assert_eq!((s.repeat_last_n, s.min_p, s.top_k), (128, 0.1, 20));
        // -1: as far back as the policy allows.
        let s = of(json!({"repeat_last_n": -1}), &model).unwrap();
        assert_eq!(s.repeat_last_n, 4096);
    }

    #[test]
    fn out_of_range_knobs_are_refused_naming_the_field_and_the_range() {
        let none = SamplingKnobs::default();
        let cases = [
            (json!({"frequency_penalty": 2.5}), "`frequency_penalty` must be between -2 and 2"),
            (json!({"frequency_penalty": -2.01}), "`frequency_penalty` must be between -2 and 2"),
            (json!({"presence_penalty": 3}), "`presence_penalty` must be between -2 and 2"),
            (json!({"repeat_penalty": 0}), "`repeat_penalty` must be in (0, 2]"),
            (json!({"repeat_penalty": 2.5}), "`repeat_penalty` must be in (0, 2]"),
            (
                json!({"repeat_last_n": 5000}),
                "`repeat_last_n` must be from 0 to 4096, the policy sampling/repeat-last-n",
            ),
            (json!({"repeat_last_n": -2}), "`repeat_last_n` must be from 0 to 4096"),
            (json!({"repeat_last_n": 1.5}), "`repeat_last_n` must be from 0 to 4096"),
            (
                json!({"no_repeat_ngram": 33}),
                "`no_repeat_ngram` must be from 0 to 32, the policy sampling/no-repeat-ngram",
            ),
            (json!({"no_repeat_ngram": -1}), "`no_repeat_ngram` must be a non-negative integer"),
            (json!({"min_p": 1.5}), "`min_p` must be between 0 and 1"),
            (json!({"temperature": 3}), "`temperature` must be between 0 and 2"),
            (json!({"top_p": 0}), "`top_p` must be in (0, 1]"),
            (json!({"top_k": -1}), "`top_k` must be a non-negative integer"),
            (json!({"presence_penalty": "lots"}), "`presence_penalty` must be a number"),
        ];
        for (body, want) in cases {
            let e = of(body.clone(), &none).unwrap_err();
            assert!(e.starts_with(want), "{body}: {e}");
        }
        // The ends of each range are in it.
        for body in [
            json!({"frequency_penalty": -2, "presence_penalty": 2}),
            json!({"repeat_penalty": 2, "repeat_last_n": 4096, "no_repeat_ngram": 32}),
        ] {
            of(body.clone(), &none).unwrap_or_else(|e| panic!("{body}: {e}"));
        }
    }
}
