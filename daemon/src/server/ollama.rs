//! Ollama's API (`/api/…`, docs/http.md) for the clients that speak
//! only it (Enchanted, Home Assistant, VS Code Copilot Chat's local path).
//! Chat and generate requests are the types of `wire/ollama.rs`, mapped
//! to the one chat request (the same checks, sampling and enforcement as
//! `/v1/chat/completions`); the engine's events come back as Ollama's
//! replies: NDJSON lines while streaming (Ollama streams unless told
//! `"stream": false`), one object otherwise. Errors are `{"error": "…"}`.
//!
//! Options left out take the model's defaults from models.toml, as a
//! Modelfile's `PARAMETER`s do in Ollama (`/api/show` lists them under
//! `parameters`).

use super::json::{json_body, not_started, provider_error};
use super::models::Lease;
use super::shared::State;
use super::wire::ollama::{
    Body as OllamaBody, Details, End, ErrorBody, Generate, Line, ModelEntry, Models, Named,
    OutCall, OutMessage, Progress, Shape, Show, Version,
};
use super::wire::{self, Parsed, Piece};
use crate::provider::chat::{ChatMsg, ChatOutput};
use crate::provider::TurnFinish;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State as AxState};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Map, Value};
use std::time::{Instant, SystemTime};

/// The Ollama API version this emulates (clients check it).
const VERSION: &str = "0.12.6";

fn fail(status: StatusCode, msg: impl Into<String>) -> Response {
    let body = serde_json::to_string(&ErrorBody { error: msg.into() }).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn bad(msg: impl Into<String>) -> Response {
    fail(StatusCode::BAD_REQUEST, msg)
}

/// `GET /`: what Ollama answers there.
pub(super) async fn root() -> &'static str {
    "Ollama is running"
}

/// `GET /api/version`.
pub(super) async fn version() -> Response {
    axum::Json(Version { version: VERSION }).into_response()
}

/// The served model's Ollama name (`NAME:latest`; a model served from a
/// path is named by its file stem).
pub(super) fn tag(st: &State) -> String {
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

fn details(st: &State) -> Details {
    served_details(&st.card)
}

fn served_details(c: &super::shared::Card) -> Details {
    Details {
        parent_model: "",
        format: "gguf",
        family: Some(c.arch.clone()),
        families: Some(vec![c.arch.clone()]),
        parameter_size: Some(size_label(c.parameters)),
        quantization_level: Some(c.quantization.clone()),
    }
}

/// A listed model: its name, size, digest and details; the other fields
/// are set by the listing.
fn entry(name: String, size: u64, digest: &str, details: Details) -> ModelEntry {
    ModelEntry {
        model: name.clone(),
        name,
        modified_at: None,
        size,
        digest: digest.trim_start_matches("sha256:").to_owned(),
        details,
        expires_at: None,
        size_vram: None,
        context_length: None,
    }
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
        let mut e = entry(tag(&st), c.file_bytes, &c.digest, details(&st));
        e.modified_at = Some(rfc3339(c.modified.unwrap_or(st_started(&st))));
        return axum::Json(Models { models: vec![e] }).into_response();
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
                    Err(_) => Details::unknown(),
                };
                let digest = a.sha256.clone().unwrap_or_default();
                let mut e = entry(name, meta.map_or(0, |m| m.len()), &digest, details);
                e.modified_at = Some(rfc3339(modified));
                e
            })
            .collect::<Vec<ModelEntry>>()
    })
    .await
    .unwrap_or_default();
    axum::Json(Models { models }).into_response()
}

fn st_started(st: &State) -> SystemTime {
    SystemTime::now() - st.started.elapsed()
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
    let body = match json_body(st.body, req).await {
        Ok(b) if b.is_object() => b,
        Ok(_) => return bad("the body must be a JSON object"),
        Err(r) => return r,
    };
    match wire::decode::<Named>(body.clone()) {
        Ok(n) if n.model().is_some() => {}
        Ok(_) => return bad("`model` is required"),
        Err(m) => return bad(m),
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
    info.insert("general.architecture".into(), Value::from(a.as_str()));
    info.insert("general.parameter_count".into(), Value::from(c.parameters));
    info.insert(format!("{a}.context_length"), Value::from(context));
    info.insert(format!("{a}.embedding_length"), Value::from(c.embedding));
    info.insert(format!("{a}.block_count"), Value::from(c.layers));
    info.insert(format!("{a}.attention.head_count"), Value::from(c.heads.0));
    info.insert(format!("{a}.attention.head_count_kv"), Value::from(c.heads.1));
    // Every model the engine runs also embeds (`/api/embed`: its pooling,
    // else the mean of its token states); an encoder only embeds.
    let mut capabilities =
        if c.encoder { vec!["embedding"] } else { vec!["completion", "tools", "embedding"] };
    if c.fim.is_some() {
        capabilities.push("insert");
    }
    if thinks(&c.template) {
        capabilities.push("thinking");
    }
    let mut parameters: Vec<String> = c.stop.iter().map(|s| format!("stop {s:?}")).collect();
    parameters.extend(c.sampling.lines());
    axum::Json(Show {
        modelfile: format!("# Modelfile of the model agentd serves\nFROM {}\n", c.path.display()),
        parameters: parameters.join("\n"),
        template: c.template.clone(),
        details: served_details(c),
        model_info: info,
        capabilities,
        modified_at: rfc3339(c.modified.unwrap_or(st_started(&st))),
    })
    .into_response()
}

/// `GET /api/ps`: the loaded models, each with when it unloads if idle.
pub(super) async fn ps(AxState(st): AxState<State>) -> Response {
    let Some(m) = &st.models else {
        let c = &st.card;
        let forever = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(4_102_444_800); // 2100
        let mut e = entry(tag(&st), c.weight_bytes, &c.digest, details(&st));
        (e.expires_at, e.size_vram, e.context_length) =
            (Some(rfc3339(forever)), Some(0), Some(st.context));
        return axum::Json(Models { models: vec![e] }).into_response();
    };
    let models: Vec<ModelEntry> = m
        .loaded()
        .iter()
        .map(|s| {
            let name = format!("{}:latest", s.name);
            let mut e = entry(name, s.card.weight_bytes, &s.card.digest, served_details(&s.card));
            (e.expires_at, e.size_vram, e.context_length) =
                (Some(rfc3339(s.expires_at())), Some(0), Some(s.context));
            e
        })
        .collect();
    axum::Json(Models { models }).into_response()
}

/// Runs the checked request and answers in Ollama's shape (`generate`:
/// `/api/generate`'s `response` lines, else `/api/chat`'s messages).
async fn answer(
    st: State,
    p: Parsed,
    shape: Shape,
    generate: bool,
    lease: Option<Lease>,
) -> Response {
    let started = Instant::now();
    let id = crate::state::store::new_id("ollama");
    let mut run = match p.start(&st, &id, lease).await {
        Ok(r) => r,
        Err(s) => return not_started(s),
    };
    let first_at = Instant::now();
    let model = tag(&st);
    let line = move |content: String, thinking: Option<String>, calls: Vec<OutCall>| {
        let (message, response, thinking) = if generate {
            (None, Some(content), thinking)
        } else {
            (
                Some(OutMessage { role: "assistant", content, thinking, tool_calls: calls }),
                None,
                None,
            )
        };
        Line {
            model: model.clone(),
            created_at: rfc3339(SystemTime::now()),
            message,
            response,
            thinking,
            done: false,
            end: None,
        }
    };
    let end = move |o: &ChatOutput| {
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        End {
            done_reason: if o.finish == TurnFinish::Length { "length" } else { "stop" },
            total_duration: Some(ns(started.elapsed())),
            load_duration: Some(0),
            prompt_eval_count: Some(o.prompt_tokens),
            prompt_eval_duration: Some(ns(first_at - started)),
            eval_count: Some(o.completion_tokens),
            eval_duration: Some(ns(first_at.elapsed())),
        }
    };
    if !shape.stream {
        let (c, out) = run.collect().await;
        let out = match out {
            Ok(o) => o,
            Err(e) => return provider_error(&e),
        };
        let thinking = Some(c.reasoning()).filter(|t| shape.think && !t.is_empty());
        let calls = c.calls().into_iter().enumerate().map(|(i, c)| OutCall::of(i, c)).collect();
        let mut l = line(c.text(), thinking, calls);
        l.done = true;
        l.end = Some(end(&out));
        return axum::Json(l).into_response();
    }
    let (otx, orx) =
        tokio::sync::mpsc::unbounded_channel::<Result<Bytes, std::convert::Infallible>>();
    tokio::spawn(async move {
        let send = |v: &dyn erased::Line| otx.send(Ok(Bytes::from(v.ndjson()))).is_ok();
        let mut n_calls = 0;
        loop {
            let ok = match run.next().await {
                None => return,
                Some(ChatMsg::Event(e)) => match Piece::of(e) {
                    Some(Piece::Text(s)) => send(&line(s, None, Vec::new())),
                    Some(Piece::Reasoning(s)) if shape.think => {
                        send(&line(String::new(), Some(s), Vec::new()))
                    }
                    Some(Piece::Call(c)) if !generate => {
                        n_calls += 1;
                        send(&line(String::new(), None, vec![OutCall::of(n_calls - 1, &c)]))
                    }
                    _ => true,
                },
                Some(ChatMsg::Done(Ok(o))) => {
                    let mut l = line(String::new(), None, Vec::new());
                    l.done = true;
                    l.end = Some(end(&o));
                    send(&l);
                    return;
                }
                Some(ChatMsg::Done(Err(e))) => {
                    send(&ErrorBody { error: e.to_string() });
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

/// A reply line of any type as one NDJSON line.
mod erased {
    pub(super) trait Line {
        fn ndjson(&self) -> String;
    }

    impl<T: serde::Serialize> Line for T {
        fn ndjson(&self) -> String {
            let mut s = serde_json::to_string(self).unwrap_or_default();
            s.push('\n');
            s
        }
    }
}

/// `POST /api/chat`.
pub(super) async fn chat(AxState(st): AxState<State>, req: Request) -> Response {
    let (body, st, lease) = match st.read(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let parsed = wire::decode::<OllamaBody>(body).and_then(|b| {
        let (chat, shape) = b.into_chat(st.context)?;
        Ok((chat.check(&st)?, shape))
    });
    match parsed {
        Ok((p, shape)) => answer(st, p, shape, false, lease).await,
        Err(m) => bad(m),
    }
}

/// `POST /api/generate`: a prompt (with `system`) through the chat
/// template, or `raw` as it is; `suffix` as fill-in-the-middle where the
/// model's vocabulary has the tokens for it.
pub(super) async fn generate(AxState(st): AxState<State>, req: Request) -> Response {
    let (body, st, lease) = match st.read(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let asked = wire::decode::<OllamaBody>(body)
        .and_then(|b| b.into_generate(st.context, st.card.fim.as_ref(), &tag(&st)));
    match asked {
        Err(m) => bad(m),
        Ok(Generate::Reply(chat, shape)) => match (*chat).check(&st) {
            Ok(p) => answer(st, p, shape, true, lease).await,
            Err(m) => bad(m),
        },
        Ok(Generate::Load) => {
            // Ollama's way to load a model (it is loaded now), or with
            // `keep_alive: 0` to unload it.
            let unload = lease.as_ref().is_some_and(Lease::unloads);
            drop(lease);
            if unload {
                if let Some(m) = &st.models {
                    m.unload_now(&st.model);
                }
            }
            let reason = if unload { "unload" } else { "load" };
            let end = End {
                done_reason: reason,
                total_duration: None,
                load_duration: None,
                prompt_eval_count: None,
                prompt_eval_duration: None,
                eval_count: None,
                eval_duration: None,
            };
            let l = Line {
                model: tag(&st),
                created_at: rfc3339(SystemTime::now()),
                message: None,
                response: Some(String::new()),
                thinking: None,
                done: true,
                end: Some(end),
            };
            axum::Json(l).into_response()
        }
    }
}

/// `POST /api/pull`: a model of models.toml, fetched (or found present and
/// verified), with Ollama's progress lines ending `{"status": "success"}`.
pub(super) async fn pull(AxState(st): AxState<State>, req: Request) -> Response {
    let body = match json_body(st.body, req).await {
        Ok(b) if b.is_object() => b,
        Ok(_) => return bad("the body must be a JSON object"),
        Err(r) => return r,
    };
    let named = match wire::decode::<Named>(body) {
        Ok(n) => n,
        Err(m) => return bad(m),
    };
    let Some(name) = named.model().map(|m| local_name(m).to_owned()) else {
        return bad("`model` must be the name of a model in models.toml");
    };
    let stream = named.stream.unwrap_or(true);
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
    let (otx, orx) = tokio::sync::mpsc::unbounded_channel::<Progress>();
    let total = entry.size.unwrap_or(0);
    let digest = format!("sha256:{}", entry.sha256);
    let _ = otx.send(Progress::status("pulling manifest"));
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
                    let _ = progress.send(Progress::layer(&digest, total, got));
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
                let _ = otx.send(Progress::layer(&digest, size, size));
                let _ = otx.send(Progress::status("verifying sha256 digest"));
                let _ = otx.send(Progress::status("writing manifest"));
                let _ = otx.send(Progress::status("success"));
                Ok(())
            }
            Ok(Err(e)) => {
                let msg = format!("pull {name}: {e:#}");
                let _ = otx.send(Progress::failed(msg.clone()));
                Err(msg)
            }
            Err(_) => {
                let _ = otx.send(Progress::failed("the pull failed"));
                Err("the pull failed".to_owned())
            }
        }
    };
    if !stream {
        return match finish.await {
            Ok(()) => axum::Json(Progress::status("success")).into_response(),
            Err(m) => fail(StatusCode::INTERNAL_SERVER_ERROR, m),
        };
    }
    tokio::spawn(finish);
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(orx)
        .map(|v| Ok::<_, std::convert::Infallible>(Bytes::from(erased::Line::ndjson(&v))));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(s)).into_response()
}

/// `2024-05-01T12:00:00.000Z`: Ollama's dates, with milliseconds.
pub(super) fn rfc3339(t: SystemTime) -> String {
    crate::clock::rfc3339_millis(t)
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
