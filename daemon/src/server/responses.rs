//! OpenAI's Responses API (`POST /v1/responses`, `GET` / `DELETE
//! /v1/responses/{id}`, `POST /v1/responses/input_tokens`), which the Codex
//! CLI and the OpenAI Agents SDK speak. The request and every object and
//! event it answers with are the serde types of `wire/responses.rs`; a
//! request becomes the one chat request (the same checks, sampling and
//! enforcement as the other routes) and the engine's events become output
//! items.
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
//! Errors before a stream starts are OpenAI's `{"error": {…}}`.

use super::json::{bad, error, not_started, provider_error};
use super::shared::{blocking, State};
use super::wire::openai::ChatMessage;
use super::wire::responses::{
    CachedTokens, Create, Deleted, ErrorBody, Format, FormatOut, Incomplete, InputTokens,
    OutputItem, Payload, ReasoningPart, ReasoningTokens, ResponseObject, StreamEvent, TextOut,
    TextPart, Tool, ToolChoice, ToolOut, Usage,
};
use super::wire::{decode, now, Parsed, Piece, Running, Started};
use crate::provider::chat::{ChatMsg, ChatOutput};
use crate::provider::{ProviderError, TurnFinish};
use axum::extract::{Path, Request, State as AxState};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use prompts::{Message, ToolCallMsg};
use tokio::sync::mpsc::UnboundedSender;

/// The conversation a `previous_response_id` continues.
async fn earlier(id: Option<&str>) -> Result<Vec<Message>, Response> {
    let Some(id) = id.map(str::to_owned) else { return Ok(Vec::new()) };
    let kept = blocking({
        let id = id.clone();
        move |s| s.response(&id)
    })
    .await?;
    let Some((_, conversation)) = kept else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "previous_response_not_found",
            format!("Previous response with id '{id}' not found."),
        ));
    };
    // Kept as chat messages (the template's shape), read back as such.
    let kept: Vec<ChatMessage> = serde_json::from_str(&conversation).unwrap_or_default();
    super::wire::openai::messages(kept).map_err(|m| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("the kept response {id} cannot be read: {m}"),
        )
    })
}

// The reply, item by item.

/// Streams events with rising sequence numbers (or only counts them when
/// there is no stream).
struct Emitter {
    seq: u64,
    tx: Option<UnboundedSender<SseEvent>>,
}

impl Emitter {
    /// Streams one event; `false` once the client has gone.
    fn emit(&mut self, payload: Payload<'_>) -> bool {
        let n = self.seq;
        self.seq += 1;
        let Some(tx) = &self.tx else { return true };
        let name = payload.name();
        let data =
            serde_json::to_string(&StreamEvent { payload, sequence_number: n }).unwrap_or_default();
        tx.send(SseEvent::default().event(name).data(data)).is_ok()
    }
}

/// The output items as the engine's events build them, each change
/// streamed as its event when there is a stream.
struct Builder {
    out: Emitter,
    items: Vec<OutputItem>,
    /// The text or reasoning item text streams into.
    open: Option<usize>,
}

fn id_of(item: &OutputItem) -> &str {
    match item {
        OutputItem::Message { id, .. }
        | OutputItem::Reasoning { id, .. }
        | OutputItem::FunctionCall { id, .. } => id,
    }
}

impl Builder {
    fn new(tx: Option<UnboundedSender<SseEvent>>) -> Builder {
        Builder { out: Emitter { seq: 0, tx }, items: Vec::new(), open: None }
    }

    /// Adds an item and announces it.
    fn add(&mut self, item: OutputItem) -> usize {
        self.items.push(item);
        let i = self.items.len() - 1;
        self.out.emit(Payload::ItemAdded { output_index: i, item: &self.items[i] });
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
                    content: vec![TextPart::new(String::new())],
                });
                if let OutputItem::Message { id, content, .. } = &self.items[i] {
                    let (item_id, part) = (id.as_str(), &content[0]);
                    self.out.emit(Payload::PartAdded {
                        item_id,
                        output_index: i,
                        content_index: 0,
                        part,
                    });
                }
                self.open = Some(i);
                i
            }
        };
        let OutputItem::Message { id, content, .. } = &mut self.items[i] else { return true };
        if let Some(p) = content.first_mut() {
            p.text.push_str(&s);
        }
        let (item_id, delta) = (id.as_str(), s.as_str());
        self.out.emit(Payload::TextDelta {
            item_id,
            output_index: i,
            content_index: 0,
            delta,
            logprobs: &[],
        })
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
        let OutputItem::Reasoning { id, content, .. } = &mut self.items[i] else { return true };
        if let Some(p) = content.first_mut() {
            p.text.push_str(&s);
        }
        let (item_id, delta) = (id.as_str(), s.as_str());
        self.out.emit(Payload::ReasoningDelta { item_id, output_index: i, content_index: 0, delta })
    }

    /// Ends the item text or reasoning streams into.
    fn close(&mut self) -> bool {
        let Some(i) = self.open.take() else { return true };
        if let OutputItem::Message { status, .. } = &mut self.items[i] {
            *status = "completed";
        }
        let ok = match &self.items[i] {
            OutputItem::Message { id, content, .. } => {
                let (item_id, part) = (id.as_str(), &content[0]);
                let text = &part.text;
                self.out.emit(Payload::TextDone {
                    item_id,
                    output_index: i,
                    content_index: 0,
                    text,
                    logprobs: &[],
                });
                self.out.emit(Payload::PartDone {
                    item_id,
                    output_index: i,
                    content_index: 0,
                    part,
                })
            }
            OutputItem::Reasoning { id, content, .. } => {
                let text = content.first().map_or("", |p| p.text.as_str());
                self.out.emit(Payload::ReasoningDone {
                    item_id: id,
                    output_index: i,
                    content_index: 0,
                    text,
                })
            }
            OutputItem::FunctionCall { .. } => true,
        };
        ok && self.out.emit(Payload::ItemDone { output_index: i, item: &self.items[i] })
    }

    /// A complete call: added, its arguments in one delta, done.
    fn call(&mut self, c: toolparse::ToolCall) -> bool {
        self.close();
        let i = self.add(OutputItem::FunctionCall {
            id: crate::state::store::new_id("fc"),
            call_id: super::wire::call_id(&c, "call"),
            name: c.name.clone(),
            arguments: String::new(),
            status: "in_progress",
        });
        if let OutputItem::FunctionCall { arguments, status, .. } = &mut self.items[i] {
            arguments.clone_from(&c.arguments);
            *status = "completed";
        }
        let item_id = id_of(&self.items[i]);
        self.out.emit(Payload::ArgumentsDelta { item_id, output_index: i, delta: &c.arguments });
        self.out.emit(Payload::ArgumentsDone {
            item_id,
            output_index: i,
            name: &c.name,
            arguments: &c.arguments,
        });
        self.out.emit(Payload::ItemDone { output_index: i, item: &self.items[i] })
    }

    /// What the reply adds to the conversation: one assistant message
    /// (text and calls).
    fn as_messages(&self) -> Vec<Message> {
        let mut m = Message::new("assistant", "");
        for item in &self.items {
            match item {
                OutputItem::Message { content, .. } => {
                    content.iter().for_each(|p| m.content.push_str(&p.text))
                }
                OutputItem::FunctionCall { call_id, name, arguments, .. } => {
                    m.tool_calls.push(ToolCallMsg::new(call_id, name, arguments))
                }
                OutputItem::Reasoning { .. } => {}
            }
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
        let format = match r.text.as_ref().and_then(|t| t.format.as_ref()) {
            Some(Format::JsonSchema { .. }) => "json_schema",
            Some(Format::JsonObject) => "json_object",
            _ => "text",
        };
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
            tool_choice: r.tool_choice.clone().unwrap_or_else(|| ToolChoice::Mode("auto".into())),
            tools: r
                .tools
                .iter()
                .filter_map(|t| match t {
                    Tool::Function { name, description, parameters } => Some(ToolOut {
                        kind: "function",
                        name: name.clone(),
                        description: description.clone(),
                        parameters: parameters.clone(),
                        strict: false,
                    }),
                    Tool::Other => None,
                })
                .collect(),
            text: TextOut { format: FormatOut { kind: format } },
            store: self.store,
            metadata: r.metadata.clone().unwrap_or_default(),
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
async fn drain(run: &mut Running, b: &mut Builder) -> Result<ChatOutput, ProviderError> {
    loop {
        let alive = match run.next().await {
            Some(ChatMsg::Event(e)) => match Piece::of(e) {
                Some(Piece::Text(s)) => b.text(s),
                Some(Piece::Reasoning(s)) => b.reasoning(s),
                Some(Piece::Call(c)) => b.call(c),
                None => true,
            },
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
async fn keep(frame: &Frame, response: &ResponseObject, conversation: Vec<Message>) {
    if !frame.store || response.status == "failed" {
        return;
    }
    let id = frame.id.clone();
    let body = serde_json::to_string(response).unwrap_or_default();
    let conv = serde_json::to_string(&conversation).unwrap_or_default();
    if let Err(r) = blocking(move |s| s.save_response(&id, &body, &conv)).await {
        tracing::warn!(status = %r.status(), "a response could not be kept");
    }
}

/// A Responses request: its type, its conversation (a kept one it
/// continues, then its input) and the checked chat request, on the state
/// of the model it names.
async fn read(
    st: &State,
    req: Request,
) -> Result<(State, Option<super::models::Lease>, Create, Vec<Message>, Parsed), Response> {
    let (body, st, lease) = st.read(req).await?;
    let create: Create =
        decode(body).map_err(|m| bad(format!("the request is not a Responses request: {m}")))?;
    let earlier = earlier(create.previous_response_id.as_deref()).await?;
    let conversation = create.conversation(earlier).map_err(bad)?;
    let parsed = create.chat(&conversation).and_then(|c| c.check(&st)).map_err(bad)?;
    Ok((st, lease, create, conversation, parsed))
}

/// `POST /v1/responses`.
pub(super) async fn create(AxState(st): AxState<State>, req: Request) -> Response {
    let (st, lease, create, msgs, p) = match read(&st, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let frame = Frame {
        id: crate::state::store::new_id("resp"),
        created_at: now(),
        model: st.model.clone(),
        store: create.store.unwrap_or(true),
        req: create,
    };
    let mut run = match p.start(&st, &frame.id, lease).await {
        Ok(r) => r,
        // A stream reports a refusal as clients of this API expect it:
        // `response.failed` with its code, after `created`.
        Err(Started::Failed(e)) if frame.req.stream => {
            let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
            let mut b = Builder::new(Some(etx));
            let start = frame.object("in_progress", Vec::new());
            b.out.emit(Payload::Created { response: &start });
            b.out.emit(Payload::InProgress { response: &start });
            let failed = frame.finished(&b, &Err(e));
            b.out.emit(Payload::Failed { response: &failed });
            drop(b);
            return sse(erx);
        }
        Err(s) => return not_started(s),
    };
    if !frame.req.stream {
        let mut b = Builder::new(None);
        let end = drain(&mut run, &mut b).await;
        drop(run);
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
        let mut b = Builder::new(Some(etx));
        let start = frame.object("in_progress", Vec::new());
        b.out.emit(Payload::Created { response: &start });
        b.out.emit(Payload::InProgress { response: &start });
        let end = drain(&mut run, &mut b).await;
        drop(run);
        let response = frame.finished(&b, &end);
        keep(&frame, &response, [msgs, b.as_messages()].concat()).await;
        b.out.emit(match response.status {
            "completed" => Payload::Completed { response: &response },
            "failed" => Payload::Failed { response: &response },
            _ => Payload::Incomplete { response: &response },
        });
    });
    sse(erx)
}

/// The events sent into `rx`, as the stream.
fn sse(rx: tokio::sync::mpsc::UnboundedReceiver<SseEvent>) -> Response {
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
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
        Ok(true) => {
            axum::Json(Deleted { id, object: "response.deleted", deleted: true }).into_response()
        }
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
    let (st, _lease, _, _, p) = match read(&st, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match p.count(&st).await {
        Ok(n) => axum::Json(InputTokens { object: "response.input_tokens", input_tokens: n })
            .into_response(),
        Err(s @ (Started::Busy | Started::Failed(_))) => not_started(s),
    }
}
