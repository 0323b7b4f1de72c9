//! The research loop (DESIGN.md "The research loop", seed 000): model turns
//! that call tools, bounded in rounds, always followed by an answer. At the
//! round bound, after three identical read-only batches, or when the
//! context cannot hold another research request, one reserved final turn
//! runs with no tools offered; if it cannot produce answer text, the reply
//! completes with a labelled excerpt of the evidence (or, for voice, a brief
//! spoken fallback).

use crate::events::{Done, Ev, Outcome, RunError, Stop};
use crate::provider::{Call, Phase, Provider, ProviderError, TurnEvent, TurnFinish, TurnRequest};
use crate::state::policy::{self, Policies};
use crate::state::store::{new_id, Store, StoredMessage};
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
    /// A description of the provider, stored with the run.
    pub(crate) provider: String,
    /// Everything needed to run this question again elsewhere (provider
    /// options, corpus, notes), stored in the admission snapshot.
    pub(crate) config: Value,
}

/// A run's budget: the admission snapshot's limits and what was spent.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    pub(crate) rounds: usize,
    pub(crate) total: usize,
    pub(crate) reserve: usize,
    pub(crate) deadline: Duration,
    pub(crate) research_share: Duration,
    pub(crate) turn_tokens: usize,
    /// Requests already in the ledger (research, and final + correction).
    pub(crate) research_used: usize,
    pub(crate) reserve_used: usize,
    /// Run time spent before this process took the run over.
    pub(crate) elapsed_before: Duration,
    pub(crate) started: Instant,
}

impl Budget {
    pub(crate) fn from_policies(p: &Policies) -> Budget {
        let deadline = Duration::from_secs(p.get(policy::DEADLINE) as u64);
        Budget {
            rounds: p.get(policy::ROUNDS) as usize,
            total: p.get(policy::TOTAL_REQUESTS) as usize,
            reserve: p.get(policy::RESERVE) as usize,
            deadline,
            research_share: deadline * p.get(policy::RESEARCH_SHARE) as u32 / 100,
            turn_tokens: p.get(policy::TURN_TOKENS) as usize,
            research_used: 0,
            reserve_used: 0,
            elapsed_before: Duration::ZERO,
            started: Instant::now(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.elapsed_before + self.started.elapsed()
    }

    /// Research may continue: requests and time checked together.
    fn research_open(&self) -> Result<(), Stop> {
        if self.research_used >= self.total - self.reserve {
            return Err(Stop::Budget);
        }
        if self.elapsed() >= self.research_share {
            return Err(Stop::Deadline);
        }
        Ok(())
    }

    /// Admits one request of `phase`, spending from the right allowance.
    fn admit(&mut self, phase: Phase) -> bool {
        match phase {
            Phase::Research => {
                if self.research_open().is_err() {
                    return false;
                }
                self.research_used += 1;
            }
            Phase::Final | Phase::Correction => {
                if self.reserve_used >= self.reserve || self.elapsed() >= self.deadline {
                    return false;
                }
                self.reserve_used += 1;
            }
        }
        true
    }
}

/// Consecutive identical read-only batches that end research.
const REPEATS: usize = 3;

/// How often streamed text is saved while it arrives.
const SAVE_EVERY: Duration = Duration::from_millis(250);

/// The state of a run in progress: what a crash must not lose.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub(crate) exchanges: Vec<Message>,
    pub(crate) rounds: usize,
    pub(crate) same: usize,
    pub(crate) last_batch: Option<Vec<(String, String, String)>>,
    pub(crate) evidence: Vec<Evidence>,
}

struct Ctx<'a> {
    host: &'a mut Host,
    store: &'a Store,
    cancel: &'a AtomicBool,
    emit: &'a mut dyn FnMut(&Ev),
    run_id: String,
    chat_id: String,
    budget: Budget,
    /// All visible text of this process's part of the run.
    visible: String,
    /// Where the current answer starts in `visible`.
    answer_from: usize,
    /// The assistant message that holds the streamed text.
    row: Option<i64>,
    saved_at: Instant,
    turn_has_content: bool,
    /// The provider refused an attempt because our own allowance is spent.
    refused: bool,
}

impl Ctx<'_> {
    fn emit(&mut self, e: Ev) {
        (self.emit)(&e);
    }

    fn requests(&self) -> usize {
        self.budget.research_used + self.budget.reserve_used
    }

    /// Streams visible text: emitted, kept, saved.
    fn content(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        if !self.turn_has_content && !self.visible.is_empty() {
            // A new turn's text starts a new paragraph.
            self.visible.push_str("\n\n");
            self.emit(Ev::Content("\n\n".into()));
        }
        if !self.turn_has_content {
            self.answer_from = self.visible.len();
        }
        self.turn_has_content = true;
        self.visible.push_str(s);
        self.emit(Ev::Content(s.to_owned()));
        self.save("streaming", false);
    }

    fn answer(&self) -> String {
        self.visible[self.answer_from.min(self.visible.len())..].to_owned()
    }

    fn save(&mut self, status: &str, force: bool) {
        if self.visible.is_empty() && self.row.is_none() {
            return;
        }
        match self.row {
            None => {
                let m = StoredMessage {
                    chat_id: self.chat_id.clone(),
                    run_id: Some(self.run_id.clone()),
                    role: "assistant".into(),
                    content: self.visible.clone(),
                    status: status.into(),
                    ..Default::default()
                };
                self.row = self.store.add_message(&m).ok();
                self.saved_at = Instant::now();
            }
            Some(id) if force || self.saved_at.elapsed() >= SAVE_EVERY => {
                let _ = self.store.update_message(id, &self.visible, status);
                self.saved_at = Instant::now();
            }
            Some(_) => {}
        }
        self.progress_time();
    }

    /// Stores the run time spent so far (recovery resumes from it).
    fn progress_time(&self) {
        let _ = self.store.conn.execute(
            "UPDATE runs SET elapsed_ms = ?2, updated = ?3 WHERE id = ?1",
            rusqlite::params![
                self.run_id,
                self.budget.elapsed().as_millis() as i64,
                crate::state::store::now()
            ],
        );
    }

    fn ledger_open(&self, n: usize, phase: Phase) -> Option<i64> {
        let t = crate::state::store::now();
        self.store
            .conn
            .execute(
                "INSERT INTO ledger(run_id, n, phase, outcome, created, updated) VALUES (?1, ?2, ?3, 'sent', ?4, ?4)",
                rusqlite::params![self.run_id, n as i64, phase.as_str(), t],
            )
            .ok()
            .map(|_| self.store.conn.last_insert_rowid())
    }

    fn ledger_close(
        &self,
        id: Option<i64>,
        outcome: &str,
        classification: Option<&str>,
        detail: Option<&str>,
    ) {
        if let Some(id) = id {
            let _ = self.store.conn.execute(
                "UPDATE ledger SET outcome = ?2, classification = ?3, detail = ?4, updated = ?5 WHERE id = ?1",
                rusqlite::params![id, outcome, classification, detail, crate::state::store::now()],
            );
        }
    }

    fn ledger_refusal(&self, phase: Phase) {
        let t = crate::state::store::now();
        let _ = self.store.conn.execute(
            "INSERT INTO ledger(run_id, n, phase, outcome, classification, detail, created, updated)
             VALUES (?1, ?2, ?3, 'refused', 'local_budget_exhausted', ?4, ?5, ?5)",
            rusqlite::params![
                self.run_id,
                self.requests() as i64 + 1,
                phase.as_str(),
                format!(
                    "not sent: research used {} of {}, reserve used {} of {}, {:.0} s of {:.0} s",
                    self.budget.research_used,
                    self.budget.total - self.budget.reserve,
                    self.budget.reserve_used,
                    self.budget.reserve,
                    self.budget.elapsed().as_secs_f64(),
                    self.budget.deadline.as_secs_f64()
                ),
                t
            ],
        );
    }

    /// One model request: every attempt (first try and each retry) is
    /// admitted against the budget and written to the ledger before it is
    /// sent; the turn's text streams out as it arrives.
    fn request(
        &mut self,
        provider: &mut dyn Provider,
        phase: Phase,
        messages: &[Message],
        tools: &[prompts::ToolDef],
    ) -> Result<crate::provider::TurnReply, ProviderError> {
        self.turn_has_content = false;
        self.refused = false;
        let req = TurnRequest { messages, tools, phase, max_tokens: self.budget.turn_tokens };
        let cancel = self.cancel;
        let entries: std::cell::RefCell<Vec<Option<i64>>> = Default::default();
        let cell = std::cell::RefCell::new(&mut *self);
        let mut attempt = |_k: u32| {
            let mut cx = cell.borrow_mut();
            if !cx.budget.admit(phase) {
                cx.refused = true;
                cx.ledger_refusal(phase);
                return false;
            }
            let n = cx.requests();
            let id = cx.ledger_open(n, phase);
            entries.borrow_mut().push(id);
            cx.emit(Ev::Request { n, phase: phase.as_str() });
            true
        };
        let mut on = |e: TurnEvent| {
            let mut cx = cell.borrow_mut();
            match e {
                TurnEvent::Content(s) => cx.content(&s),
                TurnEvent::Reasoning(s) => cx.emit(Ev::Reasoning(s)),
                TurnEvent::Discarded(c) => {
                    cx.emit(Ev::Discarded { name: c.name, arguments: args_value(&c.arguments) })
                }
            }
        };
        let result = provider.turn(&req, cancel, &mut attempt, &mut on);
        // Ledger: earlier attempts were retried; the last one decides.
        let mut entries = entries.into_inner();
        let last = entries.pop().flatten();
        for id in entries.into_iter().flatten() {
            self.ledger_close(Some(id), "retried", Some("transient"), None);
        }
        match &result {
            Ok(r) => self.ledger_close(
                last,
                if r.finish == TurnFinish::Cancelled { "cancelled" } else { "ok" },
                None,
                None,
            ),
            Err(_) if self.refused && last.is_none() => {}
            Err(e) => {
                let (_, class) = e.code();
                self.ledger_close(last, "error", Some(class), Some(&e.to_string()));
            }
        }
        self.progress_time();
        result
    }

    fn cancelled(&self) -> bool {
        if self.cancel.load(Ordering::Relaxed) {
            return true;
        }
        // `agentd runs cancel ID` from another process.
        let flag: Option<i64> = self
            .store
            .conn
            .query_row("SELECT cancel_requested FROM runs WHERE id = ?1", [&self.run_id], |r| {
                r.get(0)
            })
            .ok();
        if flag == Some(1) {
            self.cancel.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    fn store_handles(&mut self) {
        for h in self.host.handles.take_changed() {
            let _ = self.store.conn.execute(
                "INSERT INTO run_handles(run_id, handle, path, segment, title, issued, read_ok) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(run_id, handle) DO UPDATE SET read_ok = excluded.read_ok",
                rusqlite::params![self.run_id, h.handle, h.path, h.segment as i64, h.title, h.issued as i64, h.read_ok],
            );
        }
    }
}

fn args_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

/// Canonical JSON (sorted keys) of a call's arguments.
pub(crate) fn canonical(arguments: &str) -> String {
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

pub(crate) fn digest(s: &str) -> String {
    Sha256::digest(s.as_bytes()).iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// Admits a new run: stores its snapshot (the policies in force and the
/// run's own configuration) and its question, then researches it.
pub(crate) fn run(
    provider: &mut dyn Provider,
    host: &mut Host,
    store: &Store,
    policies: &Policies,
    opts: &RunOptions,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Done {
    let run_id = new_id("run");
    let chat_id = opts.chat_id.clone().unwrap_or_else(|| new_id("chat"));
    let _ = store.ensure_chat(&chat_id, &opts.question);
    let snapshot = json!({
        "policies": policies.snapshot(),
        "config": opts.config,
        "question": opts.question,
        "voice": opts.voice,
        "provider": opts.provider,
    });
    let t = crate::state::store::now();
    let _ = store.conn.execute(
        "INSERT INTO runs(id, chat_id, question, status, snapshot, pid, created, updated) VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?6)",
        rusqlite::params![run_id, chat_id, opts.question, snapshot.to_string(), std::process::id() as i64, t],
    );
    let history = chat_history(store, &chat_id, None);
    let _ = store.add_message(&StoredMessage {
        chat_id: chat_id.clone(),
        run_id: Some(run_id.clone()),
        role: "user".into(),
        content: opts.question.clone(),
        status: "complete".into(),
        ..Default::default()
    });
    drive(
        provider,
        host,
        store,
        Budget::from_policies(policies),
        Progress::default(),
        &run_id,
        &chat_id,
        &history,
        opts,
        cancel,
        emit,
    )
}

/// The earlier questions and answers of a chat (before `before_run`).
fn chat_history(store: &Store, chat_id: &str, before_run: Option<&str>) -> Vec<Message> {
    let msgs = store.messages(chat_id).unwrap_or_default();
    let cut = before_run
        .and_then(|r| msgs.iter().position(|m| m.run_id.as_deref() == Some(r)))
        .unwrap_or(msgs.len());
    msgs[..cut]
        .iter()
        .filter(|m| {
            (m.role == "user" || (m.role == "assistant" && m.tool_calls.is_none()))
                && !m.content.trim().is_empty()
        })
        .map(|m| Message::new(&m.role, m.content.clone()))
        .collect()
}

/// Runs (or continues) research to its end and settles the run.
#[allow(clippy::too_many_arguments)]
pub(crate) fn drive(
    provider: &mut dyn Provider,
    host: &mut Host,
    store: &Store,
    budget: Budget,
    progress: Progress,
    run_id: &str,
    chat_id: &str,
    history: &[Message],
    opts: &RunOptions,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Done {
    let mut cx = Ctx {
        host,
        store,
        cancel,
        emit,
        run_id: run_id.to_owned(),
        chat_id: chat_id.to_owned(),
        budget,
        visible: String::new(),
        answer_from: 0,
        row: None,
        saved_at: Instant::now(),
        turn_has_content: false,
        refused: false,
    };
    cx.emit(Ev::Run {
        run_id: run_id.to_owned(),
        chat_id: chat_id.to_owned(),
        max_tool_iters: cx.budget.rounds,
    });
    let done = research(&mut cx, provider, opts, history, progress);
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
            done.error.as_ref().map(|e| json!({"code": e.code, "classification": e.classification, "message": e.message}).to_string()),
            crate::state::store::now()
        ],
    );
    cx.emit(Ev::Done(done.clone()));
    done
}

fn done(
    cx: &Ctx<'_>,
    outcome: Outcome,
    stop: Stop,
    rounds: usize,
    error: Option<RunError>,
) -> Done {
    Done {
        outcome,
        stop,
        rounds,
        model_requests: cx.requests(),
        answer: if outcome == Outcome::Cancelled || outcome == Outcome::Error {
            cx.visible.clone()
        } else {
            cx.answer()
        },
        error,
        invalid_citations: Vec::new(),
    }
}

fn err(code: &str, classification: &str, message: impl Into<String>) -> Option<RunError> {
    Some(RunError {
        code: code.into(),
        classification: classification.into(),
        message: message.into(),
    })
}

fn budget_error(cx: &Ctx<'_>) -> Option<RunError> {
    err(
        "PROVIDER_CALL_BUDGET_EXCEEDED",
        "local_budget_exhausted",
        format!(
            "this run's own request allowance is spent ({} research of {}, {} final of {}); the provider was not asked",
            cx.budget.research_used,
            cx.budget.total - cx.budget.reserve,
            cx.budget.reserve_used,
            cx.budget.reserve
        ),
    )
}

/// The tools offered for the next research request: only those the host
/// can still run (search quota spent → no search; reading stays).
fn projection(cx: &Ctx<'_>, all: &[prompts::ToolDef]) -> Vec<prompts::ToolDef> {
    all.iter().filter(|t| cx.host.spent(&t.name).is_none()).cloned().collect()
}

/// The research rounds, then the final turn when research was cut short.
fn research(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &RunOptions,
    history: &[Message],
    mut p: Progress,
) -> Done {
    let all_tools = cx.host.tools();
    let stop = loop {
        if cx.cancelled() {
            return done(cx, Outcome::Cancelled, Stop::Cancelled, p.rounds, None);
        }
        if p.rounds >= cx.budget.rounds {
            break Stop::RoundLimit;
        }
        if let Err(stop) = cx.budget.research_open() {
            break stop;
        }
        let tools = projection(cx, &all_tools);
        let mut view = vec![Message::new("system", texts::RESEARCH_SYSTEM.trim())];
        view.extend_from_slice(history);
        view.push(Message::new("user", opts.question.clone()));
        view.extend(p.exchanges.iter().cloned());
        let view = match fit(provider, &view, &tools, cx.budget.turn_tokens) {
            Ok(v) => v,
            Err(_) if p.rounds > 0 => break Stop::ContextLimit,
            Err(o) => {
                return done(
                    cx,
                    Outcome::Error,
                    Stop::Error,
                    p.rounds,
                    err("INPUT_TOO_LARGE", "input", o.to_string()),
                );
            }
        };
        let reply = match cx.request(provider, Phase::Research, &view, &tools) {
            Ok(r) => r,
            Err(_) if cx.refused => break Stop::Budget,
            Err(ProviderError::Context { .. }) if p.rounds > 0 => break Stop::ContextLimit,
            Err(e) => {
                let (code, class) = e.code();
                return done(
                    cx,
                    Outcome::Error,
                    Stop::Error,
                    p.rounds,
                    err(code, class, e.to_string()),
                );
            }
        };
        if reply.finish == TurnFinish::Cancelled || cx.cancelled() {
            return done(cx, Outcome::Cancelled, Stop::Cancelled, p.rounds, None);
        }
        if reply.calls.is_empty() {
            if reply.content.trim().is_empty() {
                // No calls and no text: nothing to show but the evidence.
                return fallback(
                    cx,
                    opts,
                    &p,
                    Stop::Answer,
                    Some("the model wrote no answer".into()),
                );
            }
            let answer = cx.answer();
            let mut view = view.clone();
            view[0] = Message::new("system", texts::FINAL_SYSTEM.trim());
            return check_citations(cx, provider, &view, answer, Stop::Answer, &p);
        }
        p.rounds += 1;
        let (batch, has_write) =
            execute(cx, &reply.calls, &reply.content, p.rounds, &tools, &mut p);
        if cx.cancelled() {
            return done(cx, Outcome::Cancelled, Stop::Cancelled, p.rounds, None);
        }
        if has_write {
            p.same = 0;
            p.last_batch = None;
        } else {
            p.same = if p.last_batch.as_ref() == Some(&batch) { p.same + 1 } else { 1 };
            p.last_batch = Some(batch);
            if p.same >= REPEATS {
                break Stop::RepeatedBatches;
            }
        }
    };
    final_turn(cx, provider, opts, history, &p, stop)
}

/// Runs the calls of one round, in order, each authorized by the host;
/// returns the batch identity and whether it held a write.
fn execute(
    cx: &mut Ctx<'_>,
    calls: &[Call],
    content: &str,
    round: usize,
    offered: &[prompts::ToolDef],
    p: &mut Progress,
) -> (Vec<(String, String, String)>, bool) {
    let mut assistant = Message::new("assistant", content.trim());
    assistant.tool_calls =
        calls.iter().map(|c| ToolCallMsg::new(&c.id, &c.name, &c.arguments)).collect();
    let _ = cx.store.add_message(&StoredMessage {
        chat_id: cx.chat_id.clone(),
        run_id: Some(cx.run_id.clone()),
        role: "assistant".into(),
        content: content.trim().to_owned(),
        tool_calls: Some(
            json!(calls
                .iter()
                .map(|c| json!({"id": c.id, "name": c.name, "arguments": args_value(&c.arguments)}))
                .collect::<Vec<_>>())
            .to_string(),
        ),
        status: "tool_calls".into(),
        ..Default::default()
    });
    p.exchanges.push(assistant);
    let mut batch = Vec::new();
    let mut has_write = false;
    for c in calls {
        cx.emit(Ev::ToolCall {
            round,
            id: c.id.clone(),
            name: c.name.clone(),
            arguments: args_value(&c.arguments),
        });
        let result = if cx.cancelled() {
            crate::tools::ToolResult {
                ok: false,
                content:
                    json!({"error": {"code": "CANCELLED", "message": "the reply was cancelled"}})
                        .to_string(),
            }
        } else if cx.budget.elapsed() >= cx.budget.research_share {
            crate::tools::unavailable(&c.name, "the research share of the run deadline is spent")
        } else if !offered.iter().any(|t| t.name == c.name) && Host::kind(&c.name).is_some() {
            crate::tools::unavailable(
                &c.name,
                &cx.host.spent(&c.name).unwrap_or_else(|| "it was not offered in this turn".into()),
            )
        } else {
            cx.host.execute(&c.name, &c.arguments)
        };
        if Host::kind(&c.name) != Some(Kind::Read) {
            has_write = true;
        }
        if result.ok {
            collect_evidence(&mut p.evidence, &c.name, &result.content);
            if result.content.contains("\"coverage\":\"partial\"") {
                cx.emit(Ev::Notice {
                    kind: "partial_coverage",
                    text: "Some search results could not be registered as sources; coverage is partial".into(),
                });
            }
        }
        cx.store_handles();
        cx.emit(Ev::ToolResult {
            round,
            id: c.id.clone(),
            name: c.name.clone(),
            ok: result.ok,
            content: result.content.clone(),
        });
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
        p.exchanges.push(m);
    }
    (batch, has_write)
}

pub(crate) fn collect_evidence(evidence: &mut Vec<Evidence>, tool: &str, content: &str) {
    let Ok(v) = serde_json::from_str::<Value>(content) else { return };
    let mut add = |handle: &str, title: &str, text: &str| {
        if text.trim().is_empty() || handle.is_empty() {
            return;
        }
        // A read replaces the snippet of the same handle.
        evidence.retain(|e| !(e.handle == handle && e.text.len() < text.len()));
        if !evidence.iter().any(|e| e.handle == handle) {
            evidence.push(Evidence {
                handle: handle.into(),
                title: title.into(),
                text: text.into(),
            });
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
                add(
                    r["handle"].as_str().unwrap_or_default(),
                    r["title"].as_str().unwrap_or_default(),
                    r["snippet"].as_str().unwrap_or_default(),
                );
            }
        }
        _ => {}
    }
}

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

/// Fits a view into the provider's context (when it has one).
fn fit(
    provider: &mut dyn Provider,
    view: &[Message],
    tools: &[prompts::ToolDef],
    max_tokens: usize,
) -> Result<Vec<Message>, Overflowed> {
    let Some(ctx) = provider.context() else { return Ok(view.to_vec()) };
    let limit = ctx.saturating_sub(max_tokens.min(ctx / 2)).max(1);
    let mut count = |m: &[Message]| provider.count(m, tools).unwrap_or(0);
    prompts::fit::fit(view, limit, &mut count).map(|(v, _)| v).map_err(|o| Overflowed {
        need: o.need,
        limit,
        context: ctx,
    })
}

/// The reserved final turn: no tools offered, the research strategy
/// dropped, the question and every tool exchange kept.
fn final_turn(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &RunOptions,
    history: &[Message],
    p: &Progress,
    stop: Stop,
) -> Done {
    cx.emit(Ev::Notice { kind: "finishing", text: "Finishing the answer".into() });
    let mut view = vec![Message::new("system", texts::FINAL_SYSTEM.trim())];
    view.extend_from_slice(history);
    view.push(Message::new("user", opts.question.clone()));
    view.extend(p.exchanges.iter().cloned());
    view.push(Message::new("user", texts::FINAL_USER.trim()));
    let view = match fit(provider, &view, &[], cx.budget.turn_tokens) {
        Ok(v) => v,
        Err(o) => return fallback(cx, opts, p, stop, Some(o.to_string())),
    };
    match cx.request(provider, Phase::Final, &view, &[]) {
        Ok(r) if r.finish == TurnFinish::Cancelled || cx.cancelled() => {
            done(cx, Outcome::Cancelled, Stop::Cancelled, p.rounds, None)
        }
        Ok(r) if !r.content.trim().is_empty() && cx.turn_has_content => {
            let answer = cx.answer();
            check_citations(cx, provider, &view, answer, stop, p)
        }
        Ok(_) => fallback(cx, opts, p, stop, Some("the final turn wrote no answer text".into())),
        Err(_) if cx.refused => {
            let e = budget_error(cx);
            let mut d = fallback(
                cx,
                opts,
                p,
                Stop::Budget,
                Some("no request allowance is left for the answer".into()),
            );
            d.error = e;
            d
        }
        Err(e) => fallback(cx, opts, p, stop, Some(e.to_string())),
    }
}

/// Citations `[S3]` in a text, in order, without repeats.
pub(crate) fn citations(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'[' && i + 2 < b.len() && b[i + 1] == b'S' && b[i + 2].is_ascii_digit() {
            let mut j = i + 2;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j < b.len() && b[j] == b']' {
                let h = text[i + 1..j].to_owned();
                if !out.contains(&h) {
                    out.push(h);
                }
                i = j;
            }
        }
        i += 1;
    }
    out
}

/// An answer must cite only handles it read in this run: a violation is
/// rejected once, with the reason, and one correction turn runs from the
/// reserve; if that fails too, the answer is delivered with the invalid
/// citations marked.
fn check_citations(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    view: &[Message],
    answer: String,
    stop: Stop,
    p: &Progress,
) -> Done {
    let read = cx.host.handles.read().clone();
    let invalid: Vec<String> =
        citations(&answer).into_iter().filter(|h| !read.contains(h)).collect();
    if invalid.is_empty() {
        return done(cx, Outcome::Answered, stop, p.rounds, None);
    }
    let list = invalid.join(", ");
    cx.emit(Ev::Notice {
        kind: "citation_rejected",
        text: format!("The answer cites {list}, which was not read successfully in this reply; asking for one correction"),
    });
    let read_list = if read.is_empty() {
        "none".to_owned()
    } else {
        read.iter().cloned().collect::<Vec<_>>().join(", ")
    };
    let mut view = view.to_vec();
    view.push(Message::new("assistant", answer.clone()));
    view.push(Message::new(
        "user",
        texts::CORRECTION_USER.trim().replace("{invalid}", &list).replace("{read}", &read_list),
    ));
    let corrected = match cx.request(provider, Phase::Correction, &view, &[]) {
        Ok(r) if r.finish == TurnFinish::Cancelled || cx.cancelled() => {
            return done(cx, Outcome::Cancelled, Stop::Cancelled, p.rounds, None);
        }
        Ok(r) if !r.content.trim().is_empty() && cx.turn_has_content => Some(cx.answer()),
        _ => None,
    };
    let (text, still) = match corrected {
        Some(t) => {
            let still: Vec<String> =
                citations(&t).into_iter().filter(|h| !read.contains(h)).collect();
            (t, still)
        }
        None => (answer, invalid),
    };
    if still.is_empty() {
        return done(cx, Outcome::Answered, stop, p.rounds, None);
    }
    // Delivered with the invalid citations marked, never silently.
    let mut marked = text.clone();
    for h in &still {
        marked = marked.replace(&format!("[{h}]"), &format!("[{h}: not read, unverified]"));
    }
    cx.emit(Ev::Notice {
        kind: "citations_unverified",
        text: format!("The answer still cites {} without having read it; those citations are marked unverified", still.join(", ")),
    });
    // The stored message carries the marked answer.
    let from = cx.visible.len() - text.len().min(cx.visible.len());
    cx.visible.replace_range(from.., &marked);
    cx.answer_from = from;
    let mut d = done(cx, Outcome::Answered, stop, p.rounds, None);
    d.invalid_citations = still;
    d
}

/// Completes the reply with the evidence excerpt (or the spoken fallback).
fn fallback(
    cx: &mut Ctx<'_>,
    opts: &RunOptions,
    p: &Progress,
    stop: Stop,
    why: Option<String>,
) -> Done {
    if let Some(why) = &why {
        cx.emit(Ev::Notice {
            kind: "fallback",
            text: format!("No answer could be written ({why}); showing the evidence instead"),
        });
    }
    cx.turn_has_content = false;
    if opts.voice {
        let text = fallback::spoken(p.evidence.len());
        cx.content(&text);
        return done(cx, Outcome::SpokenFallback, stop, p.rounds, None);
    }
    let text = fallback::excerpt(&p.evidence, fallback::EXCERPT_MAX);
    cx.content(&text);
    done(cx, Outcome::Excerpt, stop, p.rounds, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citations_are_found_once_each() {
        assert_eq!(citations("a [S1] b [S12], [S1] [X3] [S] [S4"), vec!["S1", "S12"]);
    }
}
