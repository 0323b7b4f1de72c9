//! The research loop (DESIGN.md "The research loop", seed 000): model turns
//! that call tools, bounded in rounds, always followed by an answer. At the
//! round bound, after three identical read-only batches, or when the
//! context cannot hold another research request, one reserved final turn
//! runs with no tools offered; if it cannot produce answer text, the reply
//! completes with a labelled excerpt of the evidence (or, for voice, a brief
//! spoken fallback).

use crate::events::{Done, Ev, Outcome, RunError, Stop};
use crate::provider::{Call, Phase, Provider, ProviderError, TurnEvent, TurnFinish, TurnRequest};
use crate::store::{new_id, Store, StoredMessage};
use crate::tools::{Host, Kind};
use prompts::fallback::{self, Evidence};
use prompts::{texts, Message, ToolCallMsg};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What one run is asked to do.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    pub(crate) question: String,
    pub(crate) chat_id: Option<String>,
    pub(crate) voice: bool,
    pub(crate) max_tool_iters: usize,
    /// Tokens a single turn may generate.
    pub(crate) max_tokens: usize,
    /// A short description of the provider, stored with the run.
    pub(crate) provider: String,
}

/// Consecutive identical read-only batches that end research.
const REPEATS: usize = 3;

/// How often streamed text is saved while it arrives.
const SAVE_EVERY: Duration = Duration::from_millis(250);

struct Ctx<'a> {
    host: &'a mut Host,
    store: &'a Store,
    cancel: &'a AtomicBool,
    emit: &'a mut dyn FnMut(&Ev),
    run_id: String,
    chat_id: String,
    requests: usize,
    answer: String,
    /// The assistant message that holds the streamed text.
    row: Option<i64>,
    saved_at: Instant,
    evidence: Vec<Evidence>,
    turn_has_content: bool,
}

impl Ctx<'_> {
    fn emit(&mut self, e: Ev) {
        (self.emit)(&e);
    }

    /// Streams visible text: emitted, kept in the answer, saved.
    fn content(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        if !self.turn_has_content && !self.answer.is_empty() {
            // A new turn's text starts a new paragraph.
            self.answer.push_str("\n\n");
            self.emit(Ev::Content("\n\n".into()));
        }
        self.turn_has_content = true;
        self.answer.push_str(s);
        self.emit(Ev::Content(s.to_owned()));
        self.save("streaming", false);
    }

    fn save(&mut self, status: &str, force: bool) {
        if self.answer.is_empty() && self.row.is_none() {
            return;
        }
        match self.row {
            None => {
                let m = StoredMessage {
                    chat_id: self.chat_id.clone(),
                    run_id: Some(self.run_id.clone()),
                    role: "assistant".into(),
                    content: self.answer.clone(),
                    status: status.into(),
                    ..Default::default()
                };
                self.row = self.store.add_message(&m).ok();
                self.saved_at = Instant::now();
            }
            Some(id) if force || self.saved_at.elapsed() >= SAVE_EVERY => {
                let _ = self.store.update_message(id, &self.answer, status);
                self.saved_at = Instant::now();
            }
            Some(_) => {}
        }
    }

    fn ledger(&self, n: usize, phase: Phase, outcome: &str) -> Option<i64> {
        let t = crate::store::now();
        self.store
            .conn
            .execute(
                "INSERT INTO ledger(run_id, n, phase, outcome, created, updated) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                rusqlite::params![self.run_id, n as i64, phase.as_str(), outcome, t],
            )
            .ok()
            .map(|_| self.store.conn.last_insert_rowid())
    }

    fn ledger_close(&self, id: Option<i64>, outcome: &str, classification: Option<&str>, detail: Option<&str>) {
        if let Some(id) = id {
            let _ = self.store.conn.execute(
                "UPDATE ledger SET outcome = ?2, classification = ?3, detail = ?4, updated = ?5 WHERE id = ?1",
                rusqlite::params![id, outcome, classification, detail, crate::store::now()],
            );
        }
    }

    /// One model request with its `request` event and ledger entries; the
    /// turn's text streams out as it arrives.
    fn request(
        &mut self,
        provider: &mut dyn Provider,
        phase: Phase,
        messages: &[Message],
        tools: &[prompts::ToolDef],
        max_tokens: usize,
    ) -> Result<crate::provider::TurnReply, ProviderError> {
        self.turn_has_content = false;
        let req = TurnRequest { messages, tools, phase, max_tokens };
        let cancel = self.cancel;
        let entries: std::cell::RefCell<Vec<Option<i64>>> = Default::default();
        let cell = std::cell::RefCell::new(&mut *self);
        let mut attempt = |_k: u32| {
            let mut cx = cell.borrow_mut();
            cx.requests += 1;
            let n = cx.requests;
            let id = cx.ledger(n, phase, "sent");
            entries.borrow_mut().push(id);
            cx.emit(Ev::Request { n, phase: phase.as_str() });
            true
        };
        let mut on = |e: TurnEvent| {
            let mut cx = cell.borrow_mut();
            match e {
                TurnEvent::Content(s) => cx.content(&s),
                TurnEvent::Reasoning(s) => cx.emit(Ev::Reasoning(s)),
                TurnEvent::Discarded(c) => cx.emit(Ev::Discarded { name: c.name, arguments: args_value(&c.arguments) }),
            }
        };
        let result = provider.turn(&req, cancel, &mut attempt, &mut on);
        drop(cell);
        // Ledger: earlier attempts were retried; the last one decides.
        let mut entries = entries.into_inner();
        let last = entries.pop().flatten();
        for id in entries.into_iter().flatten() {
            self.ledger_close(Some(id), "retried", Some("transient"), None);
        }
        match &result {
            Ok(r) => self.ledger_close(last, if r.finish == TurnFinish::Cancelled { "cancelled" } else { "ok" }, None, None),
            Err(e) => {
                let (_, class) = e.code();
                self.ledger_close(last, "error", Some(class), Some(&e.to_string()));
            }
        }
        result
    }
}

fn args_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

/// Canonical JSON (sorted keys) of a call's arguments.
fn canonical(arguments: &str) -> String {
    fn sort(v: Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<_> = m.into_iter().collect();
                keys.sort_by(|a, b| a.0.cmp(&b.0));
                let mut out = serde_json::Map::new();
                for (k, v) in keys {
                    out.insert(k, sort(v));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.into_iter().map(sort).collect()),
            other => other,
        }
    }
    sort(args_value(arguments)).to_string()
}

fn digest(s: &str) -> String {
    Sha256::digest(s.as_bytes()).iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// Runs one research reply to its end; returns the `done` record (also
/// emitted as the last event).
pub(crate) fn run(
    provider: &mut dyn Provider,
    host: &mut Host,
    store: &Store,
    opts: &RunOptions,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Done {
    let run_id = new_id("run");
    let chat_id = opts.chat_id.clone().unwrap_or_else(|| new_id("chat"));
    let _ = store.ensure_chat(&chat_id, &opts.question);
    let history: Vec<Message> = store
        .messages(&chat_id)
        .unwrap_or_default()
        .into_iter()
        .filter(|m| (m.role == "user" || m.role == "assistant") && !m.content.trim().is_empty())
        .map(|m| Message::new(&m.role, m.content))
        .collect();
    let snapshot = json!({"max_tool_iters": opts.max_tool_iters, "provider": opts.provider, "voice": opts.voice});
    let t = crate::store::now();
    let _ = store.conn.execute(
        "INSERT INTO runs(id, chat_id, question, status, snapshot, pid, created, updated) VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?6)",
        rusqlite::params![run_id, chat_id, opts.question, snapshot.to_string(), std::process::id() as i64, t],
    );
    let _ = store.add_message(&StoredMessage {
        chat_id: chat_id.clone(),
        run_id: Some(run_id.clone()),
        role: "user".into(),
        content: opts.question.clone(),
        status: "complete".into(),
        ..Default::default()
    });
    let mut cx = Ctx {
        host,
        store,
        cancel,
        emit,
        run_id: run_id.clone(),
        chat_id: chat_id.clone(),
        requests: 0,
        answer: String::new(),
        row: None,
        saved_at: Instant::now(),
        evidence: Vec::new(),
        turn_has_content: false,
    };
    cx.emit(Ev::Run { run_id: run_id.clone(), chat_id: chat_id.clone(), max_tool_iters: opts.max_tool_iters });
    let done = research(&mut cx, provider, opts, &history);
    let status = match done.outcome {
        Outcome::Cancelled => "cancelled",
        Outcome::Error => "error",
        _ => "complete",
    };
    cx.save(status, true);
    let _ = store.conn.execute(
        "UPDATE runs SET status = ?2, outcome = ?3, stop = ?4, error = ?5, updated = ?6 WHERE id = ?1",
        rusqlite::params![
            run_id,
            if done.outcome == Outcome::Cancelled { "cancelled" } else { "finished" },
            done.outcome.as_str(),
            done.stop.as_str(),
            done.error.as_ref().map(|e| format!("{}: {}", e.code, e.message)),
            crate::store::now()
        ],
    );
    cx.emit(Ev::Done(done.clone()));
    done
}

fn done(cx: &Ctx<'_>, outcome: Outcome, stop: Stop, rounds: usize, error: Option<RunError>) -> Done {
    Done {
        outcome,
        stop,
        rounds,
        model_requests: cx.requests,
        answer: cx.answer.clone(),
        error,
        invalid_citations: Vec::new(),
    }
}

fn err(code: &str, classification: &str, message: impl Into<String>) -> Option<RunError> {
    Some(RunError { code: code.into(), classification: classification.into(), message: message.into() })
}

/// The research rounds, then the final turn when research was cut short.
fn research(cx: &mut Ctx<'_>, provider: &mut dyn Provider, opts: &RunOptions, history: &[Message]) -> Done {
    let tools = cx.host.tools();
    let mut exchanges: Vec<Message> = Vec::new();
    let mut rounds = 0usize;
    let mut same = 0usize;
    let mut last_batch: Option<Vec<(String, String, String)>> = None;
    let stop = loop {
        if cx.cancel.load(Ordering::Relaxed) {
            return done(cx, Outcome::Cancelled, Stop::Cancelled, rounds, None);
        }
        if rounds >= opts.max_tool_iters {
            break Stop::RoundLimit;
        }
        let mut view = vec![Message::new("system", texts::RESEARCH_SYSTEM.trim())];
        view.extend_from_slice(history);
        view.push(Message::new("user", opts.question.clone()));
        view.extend(exchanges.iter().cloned());
        let view = match fit(provider, &view, &tools, opts.max_tokens) {
            Ok(v) => v,
            Err(o) if rounds > 0 => {
                let _ = o;
                break Stop::ContextLimit;
            }
            Err(o) => {
                return done(cx, Outcome::Error, Stop::Error, rounds, err("INPUT_TOO_LARGE", "input", o.to_string()));
            }
        };
        let reply = match cx.request(provider, Phase::Research, &view, &tools, opts.max_tokens) {
            Ok(r) => r,
            Err(ProviderError::Context { .. }) if rounds > 0 => break Stop::ContextLimit,
            Err(e) => {
                let (code, class) = e.code();
                return done(cx, Outcome::Error, Stop::Error, rounds, err(code, class, e.to_string()));
            }
        };
        if reply.finish == TurnFinish::Cancelled || cx.cancel.load(Ordering::Relaxed) {
            return done(cx, Outcome::Cancelled, Stop::Cancelled, rounds, None);
        }
        if reply.calls.is_empty() {
            if reply.content.trim().is_empty() {
                // No calls and no text: nothing to show but the evidence.
                return fallback(cx, opts, Stop::Answer, rounds, None);
            }
            return done(cx, Outcome::Answered, Stop::Answer, rounds, None);
        }
        rounds += 1;
        let (batch, has_write) = execute(cx, &reply.calls, &reply.content, rounds, &mut exchanges);
        if cx.cancel.load(Ordering::Relaxed) {
            return done(cx, Outcome::Cancelled, Stop::Cancelled, rounds, None);
        }
        if has_write {
            same = 0;
            last_batch = None;
        } else {
            same = if last_batch.as_ref() == Some(&batch) { same + 1 } else { 1 };
            last_batch = Some(batch);
            if same >= REPEATS {
                break Stop::RepeatedBatches;
            }
        }
    };
    final_turn(cx, provider, opts, history, &exchanges, stop, rounds)
}

/// Runs the calls of one round, in order; returns the batch identity and
/// whether it held a write.
fn execute(
    cx: &mut Ctx<'_>,
    calls: &[Call],
    content: &str,
    round: usize,
    exchanges: &mut Vec<Message>,
) -> (Vec<(String, String, String)>, bool) {
    let mut assistant = Message::new("assistant", content.trim());
    assistant.tool_calls = calls.iter().map(|c| ToolCallMsg::new(&c.id, &c.name, &c.arguments)).collect();
    let _ = cx.store.add_message(&StoredMessage {
        chat_id: cx.chat_id.clone(),
        run_id: Some(cx.run_id.clone()),
        role: "assistant".into(),
        content: String::new(),
        tool_calls: Some(json!(calls.iter().map(|c| json!({"id": c.id, "name": c.name, "arguments": args_value(&c.arguments)})).collect::<Vec<_>>()).to_string()),
        status: "tool_calls".into(),
        ..Default::default()
    });
    exchanges.push(assistant);
    let mut batch = Vec::new();
    let mut has_write = false;
    for c in calls {
        cx.emit(Ev::ToolCall { round, id: c.id.clone(), name: c.name.clone(), arguments: args_value(&c.arguments) });
        let result = if cx.cancel.load(Ordering::Relaxed) {
            crate::tools::ToolResult { ok: false, content: json!({"error": {"code": "CANCELLED", "message": "the reply was cancelled"}}).to_string() }
        } else {
            cx.host.execute(&c.name, &c.arguments)
        };
        if Host::kind(&c.name) != Some(Kind::Read) {
            has_write = true;
        }
        if result.ok {
            collect_evidence(cx, &c.name, &result.content);
        }
        cx.emit(Ev::ToolResult { round, id: c.id.clone(), name: c.name.clone(), ok: result.ok, content: result.content.clone() });
        let _ = cx.store.add_message(&StoredMessage {
            chat_id: cx.chat_id.clone(),
            run_id: Some(cx.run_id.clone()),
            role: "tool".into(),
            content: result.content.clone(),
            tool_call_id: Some(c.id.clone()),
            name: Some(c.name.clone()),
            status: if result.ok { "ok".into() } else { "error".into() },
            ..Default::default()
        });
        batch.push((c.name.clone(), canonical(&c.arguments), digest(&result.content)));
        let mut m = Message::new("tool", result.content);
        m.tool_call_id = Some(c.id.clone());
        m.name = Some(c.name.clone());
        exchanges.push(m);
    }
    (batch, has_write)
}

fn collect_evidence(cx: &mut Ctx<'_>, tool: &str, content: &str) {
    let Ok(v) = serde_json::from_str::<Value>(content) else { return };
    let mut add = |handle: &str, title: &str, text: &str| {
        if text.trim().is_empty() {
            return;
        }
        // A read replaces the snippet of the same handle.
        cx.evidence.retain(|e| !(e.handle == handle && e.text.len() < text.len()));
        if !cx.evidence.iter().any(|e| e.handle == handle) {
            cx.evidence.push(Evidence { handle: handle.into(), title: title.into(), text: text.into() });
        }
    };
    match tool {
        "read_source" => add(
            v["handle"].as_str().unwrap_or_default(),
            v["title"].as_str().unwrap_or_default(),
            v["text"].as_str().unwrap_or_default(),
        ),
        "search_sources" => {
            for r in v["results"].as_array().into_iter().flatten() {
                add(r["handle"].as_str().unwrap_or_default(), r["title"].as_str().unwrap_or_default(), r["snippet"].as_str().unwrap_or_default());
            }
        }
        _ => {}
    }
}

/// Fits a view into the provider's context (when it has one).
/// A view that cannot fit, with the sizes involved.
#[derive(Debug)]
struct Overflowed {
    need: usize,
    limit: usize,
    context: usize,
}

impl std::fmt::Display for Overflowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request needs {} tokens but the context holds {} ({} after keeping {} for the reply)",
            self.need,
            self.context,
            self.limit,
            self.context - self.limit
        )
    }
}

fn fit(provider: &mut dyn Provider, view: &[Message], tools: &[prompts::ToolDef], max_tokens: usize) -> Result<Vec<Message>, Overflowed> {
    let Some(ctx) = provider.context() else { return Ok(view.to_vec()) };
    let limit = ctx.saturating_sub(max_tokens.min(ctx / 2)).max(1);
    let mut count = |m: &[Message]| provider.count(m, tools).unwrap_or(0);
    prompts::fit::fit(view, limit, &mut count).map(|(v, _)| v).map_err(|o| Overflowed { need: o.need, limit, context: ctx })
}

/// The reserved final turn: no tools offered, the research strategy
/// dropped, the question and every tool exchange kept.
fn final_turn(cx: &mut Ctx<'_>, provider: &mut dyn Provider, opts: &RunOptions, history: &[Message], exchanges: &[Message], stop: Stop, rounds: usize) -> Done {
    cx.emit(Ev::Notice { kind: "finishing", text: "Finishing the answer".into() });
    let mut view = vec![Message::new("system", texts::FINAL_SYSTEM.trim())];
    view.extend_from_slice(history);
    view.push(Message::new("user", opts.question.clone()));
    view.extend(exchanges.iter().cloned());
    view.push(Message::new("user", texts::FINAL_USER.trim()));
    let view = match fit(provider, &view, &[], opts.max_tokens) {
        Ok(v) => v,
        Err(o) => return fallback(cx, opts, stop, rounds, Some(o.to_string())),
    };
    let before = cx.answer.len();
    match cx.request(provider, Phase::Final, &view, &[], opts.max_tokens) {
        Ok(r) if r.finish == TurnFinish::Cancelled || cx.cancel.load(Ordering::Relaxed) => {
            done(cx, Outcome::Cancelled, Stop::Cancelled, rounds, None)
        }
        Ok(r) if !r.content.trim().is_empty() && cx.answer.len() > before => done(cx, Outcome::Answered, stop, rounds, None),
        Ok(_) => fallback(cx, opts, stop, rounds, Some("the final turn wrote no answer text".into())),
        Err(e) => fallback(cx, opts, stop, rounds, Some(e.to_string())),
    }
}

/// Completes the reply with the evidence excerpt (or the spoken fallback).
fn fallback(cx: &mut Ctx<'_>, opts: &RunOptions, stop: Stop, rounds: usize, why: Option<String>) -> Done {
    if let Some(why) = &why {
        cx.emit(Ev::Notice { kind: "fallback", text: format!("No answer could be written ({why}); showing the evidence instead") });
    }
    cx.turn_has_content = false;
    if opts.voice {
        let text = fallback::spoken(cx.evidence.len());
        cx.content(&text);
        return done(cx, Outcome::SpokenFallback, stop, rounds, None);
    }
    let text = fallback::excerpt(&cx.evidence, fallback::EXCERPT_MAX);
    cx.content(&text);
    done(cx, Outcome::Excerpt, stop, rounds, None)
}
