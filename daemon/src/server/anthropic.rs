//! Anthropic's Messages API (`POST /v1/messages`,
//! `/v1/messages/count_tokens`) for Claude Code and the Anthropic SDKs.
//! A request (the types of `wire/anthropic.rs`, where the mapping is
//! tabled) becomes the one chat request — the same checks, sampling and
//! enforcement as every route — and the engine's events come back as
//! content blocks: `thinking` (where the model reasons), `text`,
//! `tool_use`, streamed as the SDK expects:
//!
//! ```text
//! message_start, ping,
//! (content_block_start, content_block_delta… (thinking_delta + signature_delta |
//!  text_delta | input_json_delta), content_block_stop)…,
//! message_delta {stop_reason, stop_sequence, usage}, message_stop
//! ```
//!
//! `message_start` carries the prompt's real `input_tokens`. A reply that
//! ends at one of the request's `stop_sequences` says `stop_reason:
//! "stop_sequence"` and which. Errors are `{"type": "error", "error":
//! {"type", "message"}}` (reshaped from OpenAI's by `json::reshape`); one
//! after the stream began is an `error` event.

use super::json::{bad, json_body, not_started};
use super::shared::State;
use super::wire::anthropic::{
    error_kind, BlockOut, DeltaOut, Ending, ErrorDetail, MessageOut, Request as MessagesBody,
    Shape, StreamEvent, Usage,
};
use super::wire::{decode, Collected, Parsed, Piece, Started};
use crate::provider::chat::{ChatMsg, ChatOutput};
use crate::provider::TurnFinish;
use axum::extract::{Request, State as AxState};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;

/// The stop reason and the stop sequence that ended the reply, if any.
fn ending(o: &ChatOutput, calls: usize, shape: &Shape) -> Ending {
    let stop_sequence = o.stop.and_then(|i| shape.stop_sequences.get(i).cloned());
    let stop_reason = if calls > 0 {
        "tool_use"
    } else if o.finish == TurnFinish::Length {
        "max_tokens"
    } else if stop_sequence.is_some() {
        "stop_sequence"
    } else {
        "end_turn"
    };
    Ending { stop_reason, stop_sequence }
}

fn usage(input: usize, output: usize, cached: usize) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: cached,
    }
}

fn tool_use(c: &toolparse::ToolCall) -> BlockOut {
    let input: Value = serde_json::from_str(&c.arguments)
        .unwrap_or_else(|_| Value::Object(serde_json::Map::new()));
    BlockOut::ToolUse { id: super::wire::call_id(c, "toolu_"), name: c.name.clone(), input }
}

/// The content blocks of a whole reply. Whitespace-only text around calls
/// is no block of its own.
fn blocks(c: Collected, show_thinking: bool) -> Vec<BlockOut> {
    let calls = c.calls().len();
    c.pieces
        .into_iter()
        .filter_map(|p| match p {
            Piece::Text(t) if calls > 0 && t.trim().is_empty() => None,
            Piece::Text(text) => Some(BlockOut::Text { text }),
            Piece::Reasoning(thinking) if show_thinking => {
                Some(BlockOut::Thinking { thinking, signature: String::new() })
            }
            Piece::Reasoning(_) => None,
            Piece::Call(call) => Some(tool_use(&call)),
        })
        .collect()
}

/// A Messages request as its model's state, lease, checked chat request
/// and reply shape (`count`: for `count_tokens`).
async fn read(
    st: &State,
    req: Request,
    count: bool,
) -> Result<(State, Option<super::models::Lease>, Parsed, Shape), Response> {
    let body = json_body(st.body, req).await?;
    let (chat, shape) =
        decode::<MessagesBody>(body.clone()).and_then(|r| r.into_chat(count)).map_err(bad)?;
    let (st, lease) = for_messages(st, &body).await?;
    Ok((st.clone(), lease, chat.check(&st).map_err(bad)?, shape))
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
    let (st, lease, p, shape) = match read(&st, req, false).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let id = crate::state::store::new_id("msg");
    // The prompt's size first: message_start carries it. A backend that
    // cannot count (an upstream) starts with 0; the reply itself says
    // whether the request can be served.
    let input = if shape.stream { p.count(&st).await.unwrap_or(0) } else { 0 };
    let mut run = match p.start(&st, &id, lease).await {
        Ok(r) => r,
        Err(s) => return not_started(s),
    };
    if !shape.stream {
        let (c, out) = run.collect().await;
        let out = match out {
            Ok(o) => o,
            Err(e) => return super::json::provider_error(&e),
        };
        let end = ending(&out, c.calls().len(), &shape);
        return axum::Json(MessageOut {
            id,
            kind: "message",
            role: "assistant",
            model: shape.model.clone(),
            content: blocks(c, shape.show_thinking),
            stop_reason: Some(end.stop_reason),
            stop_sequence: end.stop_sequence,
            usage: usage(out.prompt_tokens, out.completion_tokens, out.reused_tokens),
        })
        .into_response();
    }
    let (otx, orx) = tokio::sync::mpsc::unbounded_channel::<StreamEvent>();
    tokio::spawn(async move {
        let send = |e: StreamEvent| otx.send(e).is_ok();
        send(StreamEvent::MessageStart {
            message: MessageOut {
                id,
                kind: "message",
                role: "assistant",
                model: shape.model.clone(),
                content: Vec::new(),
                stop_reason: None,
                stop_sequence: None,
                usage: usage(input, 1, 0),
            },
        });
        send(StreamEvent::Ping);
        // The open block: its index and whether it is reasoning.
        let mut open: Option<(usize, bool)> = None;
        let mut next = 0usize;
        let mut calls = 0usize;
        let close = |open: &mut Option<(usize, bool)>| {
            if let Some((index, thinking)) = open.take() {
                if thinking {
                    let delta = DeltaOut::Signature { signature: "agentd".into() };
                    send(StreamEvent::ContentBlockDelta { index, delta });
                }
                send(StreamEvent::ContentBlockStop { index });
            }
        };
        loop {
            let msg = match run.next().await {
                Some(m) => m,
                None => return,
            };
            let piece = match msg {
                ChatMsg::Event(e) => Piece::of(e),
                ChatMsg::Done(Ok(o)) => {
                    close(&mut open);
                    let delta = ending(&o, calls, &shape);
                    let usage = usage(o.prompt_tokens, o.completion_tokens, o.reused_tokens);
                    send(StreamEvent::MessageDelta { delta, usage });
                    send(StreamEvent::MessageStop);
                    return;
                }
                ChatMsg::Done(Err(e)) => {
                    // After the headers: Anthropic's `error` event, typed
                    // as its status would have been.
                    let status = super::json::provider_error(&e).status().as_u16();
                    let error = ErrorDetail { kind: error_kind(status), message: e.to_string() };
                    send(StreamEvent::Error { error });
                    return;
                }
            };
            let alive = match piece {
                None => true,
                Some(Piece::Reasoning(_)) if !shape.show_thinking => true,
                Some(Piece::Text(s)) if open.is_none() && calls > 0 && s.trim().is_empty() => true,
                Some(Piece::Text(s)) => {
                    if open.is_some_and(|(_, thinking)| thinking) {
                        close(&mut open);
                    }
                    let index = match open {
                        Some((i, _)) => i,
                        None => {
                            let block = BlockOut::Text { text: String::new() };
                            send(StreamEvent::ContentBlockStart {
                                index: next,
                                content_block: block,
                            });
                            open = Some((next, false));
                            next += 1;
                            next - 1
                        }
                    };
                    send(StreamEvent::ContentBlockDelta {
                        index,
                        delta: DeltaOut::Text { text: s },
                    })
                }
                Some(Piece::Reasoning(s)) => {
                    if open.is_some_and(|(_, thinking)| !thinking) {
                        close(&mut open);
                    }
                    let index = match open {
                        Some((i, _)) => i,
                        None => {
                            let block = BlockOut::Thinking {
                                thinking: String::new(),
                                signature: String::new(),
                            };
                            send(StreamEvent::ContentBlockStart {
                                index: next,
                                content_block: block,
                            });
                            open = Some((next, true));
                            next += 1;
                            next - 1
                        }
                    };
                    let delta = DeltaOut::Thinking { thinking: s };
                    send(StreamEvent::ContentBlockDelta { index, delta })
                }
                Some(Piece::Call(call)) => {
                    close(&mut open);
                    let index = next;
                    next += 1;
                    calls += 1;
                    let block = match tool_use(&call) {
                        BlockOut::ToolUse { id, name, .. } => BlockOut::ToolUse {
                            id,
                            name,
                            input: Value::Object(serde_json::Map::new()),
                        },
                        other => other,
                    };
                    send(StreamEvent::ContentBlockStart { index, content_block: block });
                    let delta = DeltaOut::InputJson { partial_json: call.arguments };
                    send(StreamEvent::ContentBlockDelta { index, delta });
                    send(StreamEvent::ContentBlockStop { index })
                }
            };
            if !alive {
                return;
            }
        }
    });
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(orx).map(|e| {
        let data = serde_json::to_string(&e).unwrap_or_default();
        Ok::<_, std::convert::Infallible>(SseEvent::default().event(e.name()).data(data))
    });
    Sse::new(s).into_response()
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}` of the prompt the
/// request would send.
pub(super) async fn count_tokens(AxState(st): AxState<State>, req: Request) -> Response {
    let (st, _lease, p, _) = match read(&st, req, true).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match p.count(&st).await {
        Ok(n) => {
            axum::Json(super::wire::anthropic::InputTokens { input_tokens: n }).into_response()
        }
        Err(s @ (Started::Busy | Started::Failed(_))) => not_started(s),
    }
}
