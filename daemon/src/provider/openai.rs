//! The `openai` provider: any OpenAI-compatible `/chat/completions` server
//! (llama-server, Ollama, vLLM, another agentd), the OpenAI way. Research
//! turns stream with `tools` and use the upstream's structured `tool_calls`
//! (and toolparse on content, should the upstream leave markup in it); the
//! final turn carries no `tools` and no `tool_choice`, and its text goes
//! through toolparse's suppress mode. Transient failures (429, 5xx,
//! timeouts) are retried here, with bounded backoff, and only here; a 429
//! that says the quota or budget is exhausted is not.

use super::sse;
use super::{
    tool_specs, whole_call, Call, Failure, Provider, ProviderError, Tried, Try, TurnFinish,
    TurnRequest,
};
use crate::state::policy::{self, Policies};
use prompts::{Message, ToolDef};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::BufReader;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use toolparse::{Event, FinishReason, Format, Mode, Options, Parser};

/// Retry settings of the provider layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    /// Retries after the first attempt.
    pub(crate) retries: u32,
    /// First backoff; doubled each retry.
    pub(crate) backoff: Duration,
    /// Per-request timeout (connect and each read).
    pub(crate) timeout: Duration,
}

impl Retry {
    /// Waits before retry `k + 1` (doubling backoff, at most 8 s); no wait
    /// after the last attempt.
    pub(super) fn pause(&self, k: u32) {
        if k < self.retries {
            std::thread::sleep(self.wait(k + 2));
        }
    }

    /// The wait before attempt `k` (2 for the first retry): the backoff,
    /// doubled each retry, at most 8 s.
    pub(super) fn wait(&self, k: u32) -> Duration {
        let wait = self.backoff.saturating_mul(1 << k.saturating_sub(2).min(6));
        wait.min(Duration::from_secs(8))
    }
}

impl Retry {
    /// The retry settings of the provider layer's policies.
    pub(crate) fn from_policies(p: &Policies) -> Retry {
        Retry {
            retries: p.get(policy::RETRIES) as u32,
            backoff: Duration::from_millis(p.get(policy::BACKOFF) as u64),
            timeout: Duration::from_secs(p.get(policy::TIMEOUT) as u64),
        }
    }
}

/// An OpenAI-compatible upstream.
#[derive(Debug, Clone)]
pub(crate) struct OpenAi {
    pub(super) base: String,
    pub(super) api_key: Option<String>,
    pub(super) model: String,
    pub(super) format: Format,
    pub(super) agent: ureq::Agent,
    pub(super) retry: Retry,
    /// Inside `serve`: the server's bound on requests in flight to the
    /// upstream, which every attempt holds a place in.
    pub(super) gate: Option<std::sync::Arc<super::upstream::Gate>>,
}

impl OpenAi {
    pub(crate) fn new(
        base_url: &str,
        api_key: Option<String>,
        model: &str,
        format: Format,
        retry: Retry,
    ) -> OpenAi {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10).min(retry.timeout))
            .timeout_read(retry.timeout)
            .build();
        OpenAi {
            base: base_url.trim_end_matches('/').to_owned(),
            api_key,
            model: model.to_owned(),
            format,
            agent,
            retry,
            gate: None,
        }
    }

    /// The same upstream, every attempt holding a place in `gate`.
    pub(crate) fn with_gate(mut self, gate: std::sync::Arc<super::upstream::Gate>) -> OpenAi {
        self.gate = Some(gate);
        self
    }

    /// The upstream's base URL (up to `/v1`).
    pub(crate) fn base_url(&self) -> &str {
        &self.base
    }

    fn body(&self, req: &TurnRequest<'_>) -> Value {
        let messages: Vec<Value> = req.messages.iter().map(wire_message).collect();
        let mut b = json!({"model": self.model, "messages": messages, "stream": true, "max_tokens": req.max_tokens});
        if !req.tools.is_empty() {
            b["tools"] = Value::Array(req.tools.iter().map(wire_tool).collect());
        }
        b
    }

    pub(super) fn post(&self, body: &str) -> Result<ureq::Response, Attempt> {
        let mut r = self
            .agent
            .post(&format!("{}/chat/completions", self.base))
            .set("Content-Type", "application/json");
        if let Some(k) = &self.api_key {
            r = r.set("Authorization", &format!("Bearer {k}"));
        }
        match r.send_string(body) {
            Ok(resp) => Ok(resp),
            Err(ureq::Error::Status(code, resp)) => {
                let text = resp.into_string().unwrap_or_default();
                Err(classify_status(code, &text))
            }
            Err(ureq::Error::Transport(t)) => Err(classify_transport(&t)),
        }
    }

    /// One request: what it streams goes to `on`; how it ended.
    fn once(
        &self,
        body: &str,
        req: &TurnRequest<'_>,
        cancel: &AtomicBool,
        on: &mut dyn FnMut(Event),
    ) -> Result<TurnFinish, Attempt> {
        let resp = self.post(body)?;
        let tools_mode = if req.tools.is_empty() { Mode::Suppress } else { Mode::Tools };
        let mut parser = Parser::new(
            self.format,
            Options { tools: tool_specs(req.tools), mode: tools_mode, ..Options::default() },
        );
        let mut finish = TurnFinish::Stop;
        let mut structured = CallSlots::new();
        let mut finish_reason = String::new();
        let streamed = resp.content_type().contains("event-stream");
        // The stream said it is over ([DONE] or a finish reason); a stream
        // that just stops was cut (the upstream went away).
        let mut ended = !streamed;
        if streamed {
            for message in sse::Reader::new(BufReader::new(resp.into_reader())) {
                if cancel.load(Ordering::Relaxed) {
                    finish = TurnFinish::Cancelled;
                    break;
                }
                let message =
                    message.map_err(|e| Attempt::Transient(format!("the stream broke: {e}")))?;
                if message.is_done() {
                    ended = true;
                    break;
                }
                let Ok(v) = serde_json::from_str::<Value>(&message.data) else { continue };
                if let Some(err) = v.get("error") {
                    return Err(Attempt::Failed(format!(
                        "the upstream reported an error mid-stream: {err}"
                    )));
                }
                let Some(choice) = v["choices"].get(0) else { continue };
                let delta = &choice["delta"];
                if let Some(r) = delta
                    .get("reasoning_content")
                    .or_else(|| delta.get("reasoning"))
                    .and_then(Value::as_str)
                {
                    if !r.is_empty() {
                        on(Event::Reasoning(r.to_owned()));
                    }
                }
                if let Some(c) = delta["content"].as_str() {
                    parser.push(c).into_iter().for_each(&mut *on);
                }
                merge_tool_call_deltas(delta, &mut structured);
                if let Some(f) = choice["finish_reason"].as_str() {
                    finish_reason = f.to_owned();
                    ended = true;
                }
            }
            if !ended && finish != TurnFinish::Cancelled {
                return Err(Attempt::Transient(
                    "the upstream closed the stream before the reply finished".into(),
                ));
            }
        } else {
            let text = resp
                .into_string()
                .map_err(|e| Attempt::Transient(format!("cannot read the response: {e}")))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| Attempt::Failed(format!("the response is not JSON: {e}")))?;
            let msg = &v["choices"][0]["message"];
            if let Some(r) = msg.get("reasoning_content").and_then(Value::as_str) {
                on(Event::Reasoning(r.to_owned()));
            }
            if let Some(c) = msg["content"].as_str() {
                parser.push(c).into_iter().for_each(&mut *on);
            }
            for (i, tc) in msg["tool_calls"].as_array().into_iter().flatten().enumerate() {
                structured.insert(
                    i as u64,
                    (
                        tc["id"].as_str().unwrap_or_default().to_owned(),
                        tc["function"]["name"].as_str().unwrap_or_default().to_owned(),
                        match &tc["function"]["arguments"] {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        },
                    ),
                );
            }
            finish_reason = v["choices"][0]["finish_reason"].as_str().unwrap_or("stop").to_owned();
        }
        let reason =
            if finish_reason == "length" { FinishReason::Length } else { FinishReason::Stop };
        parser.finish(reason).into_iter().for_each(&mut *on);
        if finish != TurnFinish::Cancelled && finish_reason == "length" {
            finish = TurnFinish::Length;
        }
        for (index, (id, name, args)) in structured {
            if name.is_empty() {
                continue;
            }
            let args = if args.trim().is_empty() { "{}".to_owned() } else { args };
            let arguments = match serde_json::from_str::<Value>(&args) {
                Ok(v @ Value::Object(_)) => v.to_string(),
                _ => json!({"_raw": args}).to_string(),
            };
            let call = Call {
                id: if id.is_empty() { crate::state::store::new_id("call") } else { id },
                name,
                arguments,
            };
            on(whole_call(call, index as usize, !req.tools.is_empty()));
        }
        Ok(finish)
    }
}

/// The outcome of one HTTP attempt.
#[derive(Debug)]
pub(super) enum Attempt {
    Transient(String),
    Quota(String),
    Unavailable(String),
    Context,
    Failed(String),
}

impl Attempt {
    /// What a failed attempt means to the retry loop (the one retry policy
    /// of research turns and forwarded chat completions): the message of a
    /// transient failure, to retry; else the error to return. A failure
    /// after part of the reply streamed is never retried (the text would
    /// repeat); `context` is the error for a prompt the upstream cannot fit.
    pub(super) fn settle(
        self,
        streamed: bool,
        context: impl FnOnce() -> ProviderError,
    ) -> Result<String, ProviderError> {
        match self {
            Attempt::Transient(m) if streamed => Err(ProviderError::Transient(format!(
                "{m} (after part of the reply had streamed; not retried)"
            ))),
            Attempt::Transient(m) => Ok(m),
            Attempt::Quota(m) => Err(ProviderError::Quota(m)),
            Attempt::Unavailable(m) => Err(ProviderError::Unavailable(m)),
            Attempt::Context => Err(context()),
            Attempt::Failed(m) => Err(ProviderError::Failed(m)),
        }
    }
}

pub(super) fn classify_status(code: u16, body: &str) -> Attempt {
    let snippet: String = body.chars().take(300).collect();
    let lower = body.to_ascii_lowercase();
    if code == 429 && (lower.contains("insufficient_quota") || lower.contains("budget_exceeded")) {
        return Attempt::Quota(format!("HTTP 429: {snippet}"));
    }
    if code == 429 || code >= 500 || code == 408 {
        return Attempt::Transient(format!("HTTP {code}: {snippet}"));
    }
    if code == 400
        && (lower.contains("context") && (lower.contains("length") || lower.contains("exceed")))
    {
        return Attempt::Context;
    }
    Attempt::Failed(format!("HTTP {code}: {snippet}"))
}

pub(super) fn classify_transport(t: &ureq::Transport) -> Attempt {
    let msg = t.to_string();
    let lower = msg.to_ascii_lowercase();
    match t.kind() {
        ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns
            if !lower.contains("timed out") =>
        {
            Attempt::Unavailable(msg)
        }
        _ => Attempt::Transient(msg),
    }
}

pub(super) fn wire_message(m: &Message) -> Value {
    let mut v = json!({"role": m.role, "content": m.content});
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = Value::Array(
            m.tool_calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments.to_string()}}))
                .collect(),
        );
        if m.content.is_empty() {
            v["content"] = Value::Null;
        }
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    if m.role == "tool" {
        if let Some(n) = &m.name {
            v["name"] = json!(n);
        }
    }
    v
}

pub(super) fn wire_tool(t: &ToolDef) -> Value {
    json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}})
}

impl Provider for OpenAi {
    /// The tries one after another, each holding a place in the server's
    /// gate while it is sent. A transient failure is tried again while
    /// retries are left, unless part of the reply had streamed (the text
    /// would repeat).
    fn attempt(&mut self, tries: &mut [Try<'_, '_>], cancel: &AtomicBool) -> Vec<Tried> {
        let mut out = Vec::with_capacity(tries.len());
        for t in tries.iter_mut() {
            let body = self.body(t.req).to_string();
            let _place = self.gate.as_ref().map(|g| g.acquire());
            let mut streamed = false;
            let outcome = self.once(&body, t.req, cancel, &mut |e| {
                streamed = true;
                (t.sink)(e)
            });
            drop(_place);
            out.push(outcome.map_err(|a| {
                match a.settle(streamed, || ProviderError::Context { need: 0, limit: 0 }) {
                    Ok(m) if t.k <= self.retry.retries => Failure::Retry(m),
                    Ok(m) => Failure::Final(ProviderError::Transient(m)),
                    Err(e) => Failure::Final(e),
                }
            }));
        }
        out
    }

    fn backoff(&self, k: u32) -> Duration {
        self.retry.wait(k)
    }

    fn describe(&self) -> String {
        format!("openai:{}@{}", self.model, self.base)
    }
}

/// Streamed tool calls, by their `index`: `(id, name, arguments)`, each
/// delta's name and argument pieces appended in order.
pub(crate) type CallSlots = BTreeMap<u64, (String, String, String)>;

/// Merges one streamed `delta`'s `tool_calls` pieces into `slots` (a piece
/// without an `index` starts a new call).
pub(crate) fn merge_tool_call_deltas(delta: &Value, slots: &mut CallSlots) {
    for tc in delta["tool_calls"].as_array().into_iter().flatten() {
        let idx = tc["index"].as_u64().unwrap_or(slots.len() as u64);
        let slot = slots.entry(idx).or_default();
        if let Some(id) = tc["id"].as_str() {
            slot.0 = id.to_owned();
        }
        if let Some(n) = tc["function"]["name"].as_str() {
            slot.1.push_str(n);
        }
        if let Some(a) = tc["function"]["arguments"].as_str() {
            slot.2.push_str(a);
        }
    }
}
