//! OpenAI's Responses API (`POST /v1/responses`, `GET` / `DELETE
//! /v1/responses/{id}`, `POST /v1/responses/input_tokens`), which the Codex
//! CLI and the OpenAI Agents SDK speak. The request and every object and
//! event it answers with are serde types here; a request becomes the chat
//! route's request (`chat::parse`: the same checks, sampling and
//! enforcement) and the engine's events become output items:
//!
//! | Responses | chat completions |
//! |---|---|
//! | `instructions`; `system` / `developer` messages | `system` messages |
//! | `input` (a string, or `message` items with `input_text` / `output_text` parts) | `user` / `assistant` messages |
//! | `function_call` items | an assistant message's `tool_calls` |
//! | `function_call_output` items | `tool` messages |
//! | `reasoning` items, other item types | left out |
//! | `tools[]` of `type: function` | `tools[].function` (other tool types are left out) |
//! | `tool_choice` `auto` / `none` / `required` / `{"type": "function", "name"}` | the same |
//! | `text.format` `json_schema` / `json_object` | `response_format` |
//! | `max_output_tokens`, `temperature`, `top_p` | `max_tokens`, the same names |
//! | `previous_response_id` (a kept response) | its conversation, then this input |
//!
//! Streamed, every event is an SSE `event:` with its `type` and a rising
//! `sequence_number`: `response.created`, `response.in_progress`, then per
//! output item `response.output_item.added`, its deltas
//! (`response.content_part.added` + `response.output_text.delta` … `.done` +
//! `response.content_part.done` for text, `response.reasoning_text.delta`
//! for reasoning, `response.function_call_arguments.delta` / `.done` for a
//! call, which is sent once complete), `response.output_item.done`; last
//! `response.completed`, `response.incomplete` (the token limit) or
//! `response.failed` (with `error.code`, e.g. `context_length_exceeded`).
//! Errors before a stream starts are the chat route's `{"error": {…}}`.

use super::chat::{parse, provider_error};
use super::json::{busy, error, json_body};
use super::shared::{blocking, State};
use super::worker::Job;
use crate::provider::chat::{ChatMsg, ChatOutput};
use crate::provider::{ProviderError, TurnFinish};
use axum::extract::{Path, Request, State as AxState};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use toolparse::Event;

// The request.

/// `POST /v1/responses`. Fields this server does not use (`metadata`,
/// `reasoning`, `include`, `truncation`, `user`, …) are accepted and
/// ignored.
#[derive(Debug, Deserialize)]
struct Create {
    model: Option<String>,
    #[serde(default)]
    input: Input,
    instructions: Option<String>,
    #[serde(default)]
    tools: Vec<Tool>,
    tool_choice: Option<ToolChoice>,
    parallel_tool_calls: Option<bool>,
    text: Option<TextParam>,
    max_output_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    #[serde(default)]
    stream: bool,
    previous_response_id: Option<String>,
    store: Option<bool>,
    metadata: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<Item>),
}

impl Default for Input {
    fn default() -> Input {
        Input::Items(Vec::new())
    }
}

/// An input item: typed, or a bare `{role, content}` message.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Item {
    Typed(Typed),
    Message(MessageItem),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Typed {
    Message(MessageItem),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    /// Reasoning, web search calls, item references, …: left out.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct MessageItem {
    role: String,
    content: Content,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct FunctionCallItem {
    call_id: String,
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Debug, Deserialize)]
struct FunctionCallOutputItem {
    call_id: String,
    output: Content,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Tool {
    Function {
        name: String,
        description: Option<String>,
        parameters: Option<Value>,
    },
    /// `custom`, `local_shell`, `web_search`, `file_search`, MCP …: there
    /// is nothing here to run them, so they are left out.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(untagged)]
enum ToolChoice {
    Mode(String),
    Object {
        #[serde(rename = "type")]
        kind: String,
        name: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
struct TextParam {
    format: Option<Format>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Format {
    Text,
    JsonObject,
    JsonSchema { name: Option<String>, schema: Value, strict: Option<bool> },
}

// What comes back.

/// A response object.
#[derive(Debug, Serialize, Clone)]
struct ResponseObject {
    id: String,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    model: String,
    output: Vec<OutputItem>,
    usage: Option<Usage>,
    error: Option<ErrorBody>,
    incomplete_details: Option<Incomplete>,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    parallel_tool_calls: bool,
    previous_response_id: Option<String>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    tool_choice: Value,
    tools: Vec<Value>,
    text: Value,
    store: bool,
    metadata: Value,
}

#[derive(Debug, Serialize, Clone)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutputItem {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<TextPart>,
    },
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
}

#[derive(Debug, Serialize, Clone)]
struct TextPart {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
    annotations: Vec<Value>,
    logprobs: Vec<Value>,
}

impl TextPart {
    fn new(text: String) -> TextPart {
        TextPart { kind: "output_text", text, annotations: Vec::new(), logprobs: Vec::new() }
    }
}

#[derive(Debug, Serialize, Clone)]
struct ReasoningPart {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

#[derive(Debug, Serialize, Clone, Copy)]
struct Usage {
    input_tokens: usize,
    input_tokens_details: CachedTokens,
    output_tokens: usize,
    output_tokens_details: ReasoningTokens,
    total_tokens: usize,
}

#[derive(Debug, Serialize, Clone, Copy)]
struct CachedTokens {
    cached_tokens: usize,
}

#[derive(Debug, Serialize, Clone, Copy)]
struct ReasoningTokens {
    reasoning_tokens: usize,
}

#[derive(Debug, Serialize, Clone)]
struct ErrorBody {
    code: String,
    message: String,
}

#[derive(Debug, Serialize, Clone)]
struct Incomplete {
    reason: &'static str,
}

/// One streamed event: its `type`, its number, and its fields.
#[derive(Debug, Serialize)]
struct StreamEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    #[serde(flatten)]
    fields: Value,
}

// From a request to the chat route's.

type Bad = Box<Response>;

fn bad(msg: impl Into<String>) -> Bad {
    Box::new(error(StatusCode::BAD_REQUEST, "invalid_request_error", msg))
}

/// The text of a content: a string, or its text parts (`input_text`,
/// `output_text`); a part this server cannot read is refused.
fn text_of(c: &Content, at: &str) -> Result<String, Bad> {
    match c {
        Content::Text(s) => Ok(s.clone()),
        Content::Parts(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("input_text" | "output_text" | "text" | "refusal", Some(t)) => {
                        out.push_str(t)
                    }
                    (kind, _) => {
                        return Err(bad(format!(
                            "{at}.content[{i}]: a {kind:?} part cannot be read here; send text (input_text)"
                        )))
                    }
                }
            }
            Ok(out)
        }
    }
}

/// A message item as a chat message (`developer` is `system`).
fn message(m: &MessageItem, at: &str) -> Result<Value, Bad> {
    let role = match m.role.as_str() {
        "user" | "assistant" | "system" => m.role.as_str(),
        "developer" => "system",
        other => {
            return Err(bad(format!(
                "{at}.role {other:?}: use user, assistant, system or developer"
            )))
        }
    };
    Ok(json!({"role": role, "content": text_of(&m.content, at)?}))
}

/// The chat messages of `input`, after `earlier` (a kept conversation).
fn messages(input: &Input, earlier: Vec<Value>) -> Result<Vec<Value>, Bad> {
    let mut msgs = earlier;
    let items = match input {
        Input::Text(s) => return Ok([msgs, vec![json!({"role": "user", "content": s})]].concat()),
        Input::Items(items) => items,
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let typed = match item {
            Item::Typed(t) => t,
            Item::Message(m) => {
                msgs.push(message(m, &at)?);
                continue;
            }
        };
        match typed {
            Typed::Message(m) => msgs.push(message(m, &at)?),
            Typed::FunctionCall(c) => {
                let call = json!({"id": c.call_id, "type": "function",
                    "function": {"name": c.name, "arguments": if c.arguments.trim().is_empty() { "{}" } else { &c.arguments }}});
                match msgs.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last["tool_calls"].as_array_mut() {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => {
                        msgs.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                    }
                }
            }
            Typed::FunctionCallOutput(o) => {
                let content = text_of(&o.output, &at)?;
                msgs.push(json!({"role": "tool", "tool_call_id": o.call_id, "content": content}));
            }
            Typed::Other => {}
        }
    }
    Ok(msgs)
}

/// The chat route's body for `req` with `msgs` (instructions first).
fn chat_body(req: &Create, msgs: &[Value]) -> Value {
    let mut all = Vec::with_capacity(msgs.len() + 1);
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        all.push(json!({"role": "system", "content": i}));
    }
    all.extend(msgs.iter().cloned());
    let mut b = json!({"model": req.model, "messages": all,
        "max_tokens": req.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT)});
    let tools: Vec<Value> = req
        .tools
        .iter()
        .filter_map(|t| match t {
            Tool::Function { name, description, parameters } => Some(json!({"type": "function",
                "function": {"name": name, "description": description.clone().unwrap_or_default(),
                    "parameters": parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}}))}})),
            Tool::Other => None,
        })
        .collect();
    if !tools.is_empty() {
        b["tools"] = json!(tools);
        match &req.tool_choice {
            Some(ToolChoice::Mode(m)) => b["tool_choice"] = json!(m),
            Some(ToolChoice::Object { kind, name: Some(n) }) if kind == "function" => {
                b["tool_choice"] = json!({"type": "function", "function": {"name": n}})
            }
            _ => {}
        }
    }
    match req.text.as_ref().and_then(|t| t.format.as_ref()) {
        Some(Format::JsonSchema { name, schema, strict }) => {
            b["response_format"] = json!({"type": "json_schema", "json_schema": {
                "name": name.clone().unwrap_or_else(|| "output".into()), "schema": schema,
                "strict": strict.unwrap_or(true)}});
        }
        Some(Format::JsonObject) => b["response_format"] = json!({"type": "json_object"}),
        Some(Format::Text) | None => {}
    }
    if let Some(t) = req.temperature {
        b["temperature"] = json!(t);
    }
    if let Some(p) = req.top_p {
        b["top_p"] = json!(p);
    }
    b
}

/// Tokens a response may write when the request does not say.
const DEFAULT_MAX_OUTPUT: u64 = 4096;

/// A request's body as its type, or a 400 naming what is wrong.
fn create_of(body: &Value) -> Result<Create, Bad> {
    Create::deserialize(body)
        .map_err(|e| bad(format!("the request is not a Responses request: {e}")))
}

/// The conversation a `previous_response_id` continues.
async fn earlier(id: Option<&str>) -> Result<Vec<Value>, Response> {
    let Some(id) = id.map(str::to_owned) else { return Ok(Vec::new()) };
    let kept = blocking({
        let id = id.clone();
        move |s| s.response(&id)
    })
    .await?;
    match kept {
        Some((_, conversation)) => Ok(serde_json::from_str(&conversation).unwrap_or_default()),
        None => Err(error(
            StatusCode::BAD_REQUEST,
            "previous_response_not_found",
            format!("Previous response with id '{id}' not found."),
        )),
    }
}

// The reply, item by item.

/// The output items as the engine's events build them, each change
/// streamed as its event when there is a stream.
struct Builder {
    seq: u64,
    items: Vec<OutputItem>,
    /// The text or reasoning item text streams into.
    open: Option<usize>,
    tx: Option<UnboundedSender<SseEvent>>,
}

impl Builder {
    fn new(tx: Option<UnboundedSender<SseEvent>>) -> Builder {
        Builder { seq: 0, items: Vec::new(), open: None, tx }
    }

    /// Streams one event; `false` once the client has gone.
    fn emit(&mut self, kind: &str, fields: Value) -> bool {
        let n = self.seq;
        self.seq += 1;
        let Some(tx) = &self.tx else { return true };
        let data = serde_json::to_string(&StreamEvent { kind, sequence_number: n, fields })
            .unwrap_or_default();
        tx.send(SseEvent::default().event(kind).data(data)).is_ok()
    }

    fn item(&self, i: usize) -> Value {
        serde_json::to_value(&self.items[i]).unwrap_or_default()
    }

    fn id(&self, i: usize) -> String {
        match &self.items[i] {
            OutputItem::Message { id, .. }
            | OutputItem::Reasoning { id, .. }
            | OutputItem::FunctionCall { id, .. } => id.clone(),
        }
    }

    /// Adds an item and announces it.
    fn add(&mut self, item: OutputItem) -> usize {
        self.items.push(item);
        let i = self.items.len() - 1;
        let added = json!({"output_index": i, "item": self.item(i)});
        self.emit("response.output_item.added", added);
        i
    }

    fn text(&mut self, s: String) -> bool {
        let i = match self.open {
            Some(i) if matches!(self.items[i], OutputItem::Message { .. }) => i,
            _ => {
                self.close();
                let i = self.add(OutputItem::Message {
                    id: crate::state::store::new_id("msg"),
                    status: "in_progress",
                    role: "assistant",
                    content: Vec::new(),
                });
                let part = TextPart::new(String::new());
                let fields = json!({"item_id": self.id(i), "output_index": i, "content_index": 0, "part": part});
                if let OutputItem::Message { content, .. } = &mut self.items[i] {
                    content.push(part);
                }
                self.emit("response.content_part.added", fields);
                self.open = Some(i);
                i
            }
        };
        if let OutputItem::Message { content, .. } = &mut self.items[i] {
            if let Some(p) = content.first_mut() {
                p.text.push_str(&s);
            }
        }
        let fields = json!({"item_id": self.id(i), "output_index": i, "content_index": 0, "delta": s, "logprobs": []});
        self.emit("response.output_text.delta", fields)
    }

    fn reasoning(&mut self, s: String) -> bool {
        let i = match self.open {
            Some(i) if matches!(self.items[i], OutputItem::Reasoning { .. }) => i,
            _ => {
                self.close();
                let i = self.add(OutputItem::Reasoning {
                    id: crate::state::store::new_id("rs"),
                    summary: Vec::new(),
                    content: vec![ReasoningPart { kind: "reasoning_text", text: String::new() }],
                });
                self.open = Some(i);
                i
            }
        };
        if let OutputItem::Reasoning { content, .. } = &mut self.items[i] {
            if let Some(p) = content.first_mut() {
                p.text.push_str(&s);
            }
        }
        let fields =
            json!({"item_id": self.id(i), "output_index": i, "content_index": 0, "delta": s});
        self.emit("response.reasoning_text.delta", fields)
    }

    /// Ends the item text or reasoning streams into.
    fn close(&mut self) -> bool {
        let Some(i) = self.open.take() else { return true };
        let id = self.id(i);
        let ok = match &mut self.items[i] {
            OutputItem::Message { status, content, .. } => {
                *status = "completed";
                let part = content.first().cloned().unwrap_or_else(|| TextPart::new(String::new()));
                self.emit(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": part.text, "logprobs": []}),
                );
                self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
                )
            }
            OutputItem::Reasoning { content, .. } => {
                let text = content.first().map(|p| p.text.clone()).unwrap_or_default();
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text}),
                )
            }
            OutputItem::FunctionCall { .. } => true,
        };
        let done = json!({"output_index": i, "item": self.item(i)});
        ok && self.emit("response.output_item.done", done)
    }

    /// A complete call: added, its arguments in one delta, done.
    fn call(&mut self, c: toolparse::ToolCall) -> bool {
        self.close();
        let i = self.add(OutputItem::FunctionCall {
            id: crate::state::store::new_id("fc"),
            call_id: c.id.unwrap_or_else(|| crate::state::store::new_id("call")),
            name: c.name.clone(),
            arguments: String::new(),
            status: "in_progress",
        });
        let id = self.id(i);
        self.emit(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": i, "delta": c.arguments}),
        );
        if let OutputItem::FunctionCall { arguments, status, .. } = &mut self.items[i] {
            arguments.clone_from(&c.arguments);
            *status = "completed";
        }
        self.emit(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": i, "name": c.name, "arguments": c.arguments}),
        );
        let done = json!({"output_index": i, "item": self.item(i)});
        self.emit("response.output_item.done", done)
    }

    /// What the reply adds to the conversation: one assistant message
    /// (text and calls), as chat messages.
    fn as_messages(&self) -> Vec<Value> {
        let mut text = String::new();
        let mut calls = Vec::new();
        for item in &self.items {
            match item {
                OutputItem::Message { content, .. } => {
                    content.iter().for_each(|p| text.push_str(&p.text))
                }
                OutputItem::FunctionCall { call_id, name, arguments, .. } => calls.push(
                    json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}),
                ),
                OutputItem::Reasoning { .. } => {}
            }
        }
        let mut m = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            m["tool_calls"] = json!(calls);
        }
        vec![m]
    }
}

/// The `error.code` a failure has on this API.
fn code_of(e: &ProviderError) -> &'static str {
    match e {
        ProviderError::Context { .. } => "context_length_exceeded",
        ProviderError::Quota(_) => "insufficient_quota",
        ProviderError::Transient(m) if m.contains("429") => "rate_limit_exceeded",
        ProviderError::Invalid(_) => "invalid_prompt",
        _ => "server_error",
    }
}

/// Everything a response object says besides its output and outcome.
struct Frame {
    id: String,
    created_at: u64,
    model: String,
    req: Create,
    store: bool,
}

impl Frame {
    fn object(&self, status: &'static str, output: Vec<OutputItem>) -> ResponseObject {
        let r = &self.req;
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            status,
            model: self.model.clone(),
            output,
            usage: None,
            error: None,
            incomplete_details: None,
            instructions: r.instructions.clone(),
            max_output_tokens: r.max_output_tokens,
            parallel_tool_calls: r.parallel_tool_calls.unwrap_or(true),
            previous_response_id: r.previous_response_id.clone(),
            temperature: r.temperature,
            top_p: r.top_p,
            tool_choice: r.tool_choice.as_ref().map_or(json!("auto"), |c| json!(c)),
            tools: r
                .tools
                .iter()
                .filter_map(|t| match t {
                    Tool::Function { name, description, parameters } => Some(json!({"type": "function",
                        "name": name, "description": description, "parameters": parameters, "strict": false})),
                    Tool::Other => None,
                })
                .collect(),
            text: json!({"format": {"type": match r.text.as_ref().and_then(|t| t.format.as_ref()) {
                Some(Format::JsonSchema { .. }) => "json_schema",
                Some(Format::JsonObject) => "json_object",
                _ => "text",
            }}}),
            store: self.store,
            metadata: r.metadata.clone().unwrap_or_else(|| json!({})),
        }
    }

    /// The finished response: its status from how the reply ended.
    fn finished(&self, b: &Builder, end: &Result<ChatOutput, ProviderError>) -> ResponseObject {
        match end {
            Ok(o) => {
                let incomplete = o.finish != TurnFinish::Stop;
                let mut r = self
                    .object(if incomplete { "incomplete" } else { "completed" }, b.items.clone());
                if incomplete {
                    r.incomplete_details = Some(Incomplete {
                        reason: if o.finish == TurnFinish::Length {
                            "max_output_tokens"
                        } else {
                            "cancelled"
                        },
                    });
                }
                r.usage = Some(Usage {
                    input_tokens: o.prompt_tokens,
                    input_tokens_details: CachedTokens { cached_tokens: o.reused_tokens },
                    output_tokens: o.completion_tokens,
                    output_tokens_details: ReasoningTokens { reasoning_tokens: 0 },
                    total_tokens: o.prompt_tokens + o.completion_tokens,
                });
                r
            }
            Err(e) => {
                let mut r = self.object("failed", b.items.clone());
                r.error = Some(ErrorBody { code: code_of(e).into(), message: e.to_string() });
                r
            }
        }
    }
}

/// Folds the engine's messages into `b` until the reply ends.
async fn drain(
    rx: &mut UnboundedReceiver<ChatMsg>,
    b: &mut Builder,
) -> Result<ChatOutput, ProviderError> {
    loop {
        let alive = match rx.recv().await {
            Some(ChatMsg::Event(Event::Content(s))) => b.text(s),
            Some(ChatMsg::Event(Event::Reasoning(s))) => b.reasoning(s),
            Some(ChatMsg::Event(Event::CallEnd { call, .. })) => b.call(call),
            Some(ChatMsg::Event(_)) => true,
            Some(ChatMsg::Done(r)) => {
                b.close();
                return r;
            }
            None => return Err(ProviderError::Failed("the engine stopped".into())),
        };
        if !alive {
            // The client went away; the reply stops when the guard drops.
            return Ok(ChatOutput::cancelled());
        }
    }
}

/// Keeps a finished response and its conversation (`store`).
async fn keep(frame: &Frame, response: &ResponseObject, conversation: Vec<Value>) {
    if !frame.store || response.status == "failed" {
        return;
    }
    let id = frame.id.clone();
    let body = serde_json::to_string(response).unwrap_or_default();
    let conv = Value::Array(conversation).to_string();
    if let Err(r) = blocking(move |s| s.save_response(&id, &body, &conv)).await {
        tracing::warn!(status = %r.status(), "a response could not be kept");
    }
}

/// A Responses request: its body, its type, and its conversation (a kept
/// one it continues, then its input) as chat messages.
async fn read(st: &State, req: Request) -> Result<(Value, Create, Vec<Value>), Response> {
    let body = json_body(st.body_limit, req).await?;
    let create = create_of(&body).map_err(|r| *r)?;
    let earlier = earlier(create.previous_response_id.as_deref()).await?;
    let msgs = messages(&create.input, earlier).map_err(|r| *r)?;
    Ok((body, create, msgs))
}

/// `POST /v1/responses`.
pub(super) async fn create(AxState(st): AxState<State>, req: Request) -> Response {
    let (body, create, msgs) = match read(&st, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if msgs.is_empty() {
        return *bad("input: give a string or at least one item");
    }
    let chat = chat_body(&create, &msgs);
    let (st, lease) = match st.for_body(&body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut p = match parse(&st, &chat) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let frame = Frame {
        id: crate::state::store::new_id("resp"),
        created_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: st.model.clone(),
        store: create.store.unwrap_or(true),
        req: create,
    };
    let (cancel, guard) = st.track(frame.id.clone());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    if st.worker.submit(p.job(cancel, tx, lease)).is_err() {
        guard.done();
        return busy();
    }
    if !frame.req.stream {
        let mut b = Builder::new(None);
        let end = drain(&mut rx, &mut b).await;
        guard.done();
        if let Err(e) = &end {
            if b.items.is_empty() {
                return provider_error(e);
            }
        }
        let response = frame.finished(&b, &end);
        keep(&frame, &response, [msgs, b.as_messages()].concat()).await;
        return axum::Json(response).into_response();
    }
    let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let _guard = guard;
        let mut b = Builder::new(Some(etx));
        let start = json!({"response": frame.object("in_progress", Vec::new())});
        b.emit("response.created", start.clone());
        b.emit("response.in_progress", start);
        let end = drain(&mut rx, &mut b).await;
        let response = frame.finished(&b, &end);
        keep(&frame, &response, [msgs, b.as_messages()].concat()).await;
        let kind = match response.status {
            "completed" => "response.completed",
            "failed" => "response.failed",
            _ => "response.incomplete",
        };
        b.emit(kind, json!({"response": response}));
    });
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(erx)
        .map(Ok::<_, std::convert::Infallible>);
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}

/// `GET /v1/responses/{id}`: a kept response.
pub(super) async fn get(Path(id): Path<String>) -> Response {
    let key = id.clone();
    match blocking(move |s| s.response(&key)).await {
        Ok(Some((response, _))) => {
            ([(axum::http::header::CONTENT_TYPE, "application/json")], response).into_response()
        }
        Ok(None) => not_found(&id),
        Err(r) => r,
    }
}

/// `DELETE /v1/responses/{id}`.
pub(super) async fn delete(Path(id): Path<String>) -> Response {
    let key = id.clone();
    match blocking(move |s| s.delete_response(&key)).await {
        Ok(true) => axum::Json(json!({"id": id, "object": "response.deleted", "deleted": true}))
            .into_response(),
        Ok(false) => not_found(&id),
        Err(r) => r,
    }
}

fn not_found(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, "not_found", format!("Response with id '{id}' not found."))
}

/// `POST /v1/responses/input_tokens`: the tokens the request's input
/// would take on its model.
pub(super) async fn input_tokens(AxState(st): AxState<State>, req: Request) -> Response {
    let (body, create, msgs) = match read(&st, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (st, _lease) = match st.for_body(&body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut p = match parse(&st, &chat_body(&create, &msgs)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let job = Job::Count {
        messages: std::mem::take(&mut p.messages),
        tools: std::mem::take(&mut p.tools),
        tx,
    };
    if st.worker.submit(job).is_err() {
        return busy();
    }
    match tokio::task::spawn_blocking(move || rx.recv()).await {
        Ok(Ok(Ok(n))) => axum::Json(json!({"object": "response.input_tokens", "input_tokens": n}))
            .into_response(),
        Ok(Ok(Err(e))) => provider_error(&e),
        _ => error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the engine stopped"),
    }
}
