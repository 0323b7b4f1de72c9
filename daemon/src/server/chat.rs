//! `POST /v1/chat/completions` for clients that bring their own tools:
//! OpenAI-compatible requests and responses (the types of
//! `wire/openai.rs`), streamed (SSE ending with `data: [DONE]`) or not.
//! The model's native calls are parsed by toolparse into `tool_calls`;
//! with `tool_choice: none` or no tools, call markup never reaches
//! `content`.
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

use super::json::{bad, not_started, provider_error};
use super::shared::State;
use super::wire::openai::{
    Chunk, ChunkChoice, Completion, Delta, ErrorBody, Request as ChatBody, Usage,
};
use super::wire::{decode, now, Piece};
use crate::provider::chat::ChatMsg;
use axum::extract::{Request, State as AxState};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Serialize;

fn sse_data(v: &impl Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

pub(super) async fn completions(AxState(st): AxState<State>, req: Request) -> Response {
    let (body, st, lease) = match st.read(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let parsed = decode::<ChatBody>(body)
        .and_then(ChatBody::into_chat)
        .and_then(|(chat, shape)| Ok((chat.check(&st)?, shape)));
    let (p, shape) = match parsed {
        Ok(x) => x,
        Err(m) => return bad(m),
    };
    let id = crate::state::store::new_id("chatcmpl");
    let mut run = match p.start(&st, &id, lease).await {
        Ok(r) => r,
        Err(s) => return not_started(s),
    };
    let (model, created) = (st.model.clone(), now());
    if !shape.stream {
        return match run.collect().await {
            (c, Ok(out)) => {
                axum::Json(Completion::of(id, created, model, &c, &out)).into_response()
            }
            (_, Err(e)) => provider_error(&e),
        };
    }
    let (otx, orx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let frame = |choices: Vec<ChunkChoice>, usage: Option<Usage>| {
            let object = "chat.completion.chunk";
            sse_data(&Chunk { id: &id, object, created, model: &model, choices, usage })
        };
        let chunk = |delta: Delta, finish: Option<&'static str>| {
            frame(
                vec![ChunkChoice { index: 0, delta, finish_reason: finish, logprobs: None }],
                None,
            )
        };
        let send = |s: String| otx.send(s).is_ok();
        let first =
            Delta { role: Some("assistant"), content: Some(String::new()), ..Delta::default() };
        if !send(chunk(first, None)) {
            return;
        }
        let mut calls = 0usize;
        loop {
            let ok = match run.next().await {
                None => return,
                Some(ChatMsg::Event(e)) => match Piece::of(e) {
                    Some(p) => send(chunk(Delta::of(p, &mut calls), None)),
                    None => true,
                },
                Some(ChatMsg::Done(Ok(o))) => {
                    let reason = super::wire::openai::finish_reason(&o, calls);
                    send(chunk(Delta::default(), Some(reason)));
                    if shape.usage_in_stream {
                        send(frame(Vec::new(), Some(Usage::of(&o))));
                    }
                    let _ = otx.send("[DONE]".into());
                    return;
                }
                Some(ChatMsg::Done(Err(e))) => {
                    let _ = otx.send(sse_data(&ErrorBody::new(e.code().1, e.to_string())));
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
