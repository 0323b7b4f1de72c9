//! A research round's calls, run in order: the projection of the tools the
//! next request may offer (only those the host can still run), the
//! authorization of every actual call (cancellation, the research share of
//! the deadline, what was offered), its execution by the host, the evidence
//! its results add, their persistence with the chat, and the repeated-batch
//! rule (three consecutive identical read-only batches end research; a
//! batch with a write is never counted).

use super::admission::RunOptions;
use super::request::arguments_value;
use super::Ctx;
use crate::events::{By, Ev};
use crate::provider::{Call, Provider};
use crate::state::store::{MessageStatus, NewToolCall, StoredCall, StoredMessage};
use crate::tools::{self, Coverage, Ended, Host, Kind, ToolOutput};
use prompts::fallback::Evidence;
use prompts::{Message, ToolCallMsg, ToolDef};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Consecutive identical read-only batches that end research.
const REPEATS: usize = 3;

/// One call as the repetition rule compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CallIdentity {
    name: String,
    /// Canonical JSON of the arguments (sorted keys).
    arguments: String,
    /// Digest of the result text.
    result: String,
}

/// A round's calls, as the repetition rule sees them.
#[derive(Debug, Default)]
pub(super) struct Batch {
    calls: Vec<CallIdentity>,
    has_write: bool,
}

impl Batch {
    /// Adds a call of `name` with `arguments` that returned `result` (its
    /// JSON text).
    pub(super) fn push(&mut self, kind: Option<Kind>, name: &str, arguments: &Value, result: &str) {
        if kind != Some(Kind::Read) {
            self.has_write = true;
        }
        self.calls.push(CallIdentity {
            name: name.to_owned(),
            arguments: canonical(arguments),
            result: digest(result),
        });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

/// The count of consecutive identical read-only batches.
#[derive(Debug, Default)]
pub(super) struct Repeats {
    same: usize,
    last: Option<Vec<CallIdentity>>,
}

impl Repeats {
    /// Counts a finished batch; true when it makes `REPEATS` identical
    /// read-only batches in a row. A write resets the count.
    pub(super) fn record(&mut self, batch: Batch) -> bool {
        if batch.has_write {
            self.same = 0;
            self.last = None;
            return false;
        }
        self.same = if self.last.as_ref() == Some(&batch.calls) { self.same + 1 } else { 1 };
        self.last = Some(batch.calls);
        self.same >= REPEATS
    }
}

/// Canonical JSON (sorted keys) of a call's arguments.
fn canonical(arguments: &Value) -> String {
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
    sort(arguments.clone()).to_string()
}

fn digest(s: &str) -> String {
    Sha256::digest(s.as_bytes()).iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// Adds what a successful search or read retrieved to the evidence a
/// fallback excerpt can show; a read replaces the snippet of its handle.
pub(super) fn collect_evidence(evidence: &mut Vec<Evidence>, output: &ToolOutput) {
    let mut add = |handle: &str, title: &str, text: &str, heading: &str| {
        if text.trim().is_empty() || handle.is_empty() {
            return;
        }
        evidence.retain(|e| !(e.handle == handle && e.text.len() < text.len()));
        if !evidence.iter().any(|e| e.handle == handle) {
            evidence.push(Evidence {
                handle: handle.into(),
                title: title.into(),
                text: text.into(),
                heading: heading.into(),
            });
        }
    };
    match output {
        ToolOutput::Read(p) => add(&p.handle, &p.title, &p.text, &p.heading),
        ToolOutput::Search(f) => {
            for h in &f.hits {
                add(&h.handle, &h.title, &h.snippet, "");
            }
        }
        ToolOutput::Analysis(a) => {
            let text: Vec<String> =
                a.findings.iter().map(|f| format!("(section {}) {}", f.section, f.text)).collect();
            add(&a.handle, &a.title, &text.join("\n"), "");
        }
        ToolOutput::Saved(_) | ToolOutput::Mcp(_) | ToolOutput::Error(_) => {}
    }
}

/// The tools offered for the next research request: only those the host
/// can still run (search quota spent → no search; reading stays).
pub(super) fn projection(host: &Host, all: &[ToolDef]) -> Vec<ToolDef> {
    all.iter().filter(|t| host.spent(&t.name).is_none()).cloned().collect()
}

/// The ledger's note on a call of the host's entry research.
const HOST_ENTRY: &str = "by host (entry research)";

/// A round's calls as proposed: by the model (with the text of its turn)
/// or by the host's entry research.
#[derive(Debug, Clone, Copy)]
pub(super) struct Proposed<'a> {
    pub(super) calls: &'a [Call],
    pub(super) content: &'a str,
    pub(super) by: By,
}

/// Runs the calls of round `round`, in order, each authorized by the host;
/// returns the batch for the repetition rule and each call's output.
pub(super) fn run_round(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &RunOptions,
    proposed: Proposed<'_>,
    offered: &[ToolDef],
    p: &mut super::run::Progress,
) -> (Batch, Vec<ToolOutput>) {
    let Proposed { calls, content, by } = proposed;
    let round = p.rounds;
    let args: Vec<Value> = calls.iter().map(|c| arguments_value(&c.arguments)).collect();
    let mut assistant = Message::new("assistant", content.trim());
    assistant.tool_calls =
        calls.iter().map(|c| ToolCallMsg::new(&c.id, &c.name, &c.arguments)).collect();
    let stored = cx.store.add_message(&StoredMessage {
        chat_id: cx.chat_id.to_owned(),
        run_id: Some(cx.run_id.to_owned()),
        role: "assistant".into(),
        content: content.trim().to_owned(),
        tool_calls: Some(
            calls
                .iter()
                .zip(&args)
                .map(|(c, a)| StoredCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: a.clone(),
                })
                .collect(),
        ),
        status: MessageStatus::ToolCalls,
        ..Default::default()
    });
    cx.ledger.check("the tool calls", stored);
    p.exchanges.push(assistant);
    let mut batch = Batch::default();
    let mut outputs = Vec::with_capacity(calls.len());
    for (c, args) in calls.iter().zip(args) {
        cx.emit(Ev::ToolCall {
            round,
            id: c.id.clone(),
            name: c.name.clone(),
            arguments: args.clone(),
            by,
        });
        let output = call(cx, provider, opts, c, offered, round, by);
        if output.ok() {
            collect_evidence(&mut p.evidence, &output);
            if let ToolOutput::Search(f) = &output {
                if f.coverage == Coverage::Partial {
                    cx.emit(Ev::Notice {
                        kind: "partial_coverage",
                        text: "Some search results could not be registered as sources; coverage is partial".into(),
                    });
                }
            }
        }
        for h in cx.host.handles.take_changed() {
            cx.ledger.check("a source handle", cx.store.save_handle(cx.run_id, &h));
        }
        // The result leaves the loop as JSON text: to the events, the chat
        // and the model.
        let text = output.to_json().to_string();
        cx.emit(Ev::ToolResult {
            round,
            id: c.id.clone(),
            name: c.name.clone(),
            ok: output.ok(),
            content: text.clone(),
        });
        let stored = cx.store.add_message(&StoredMessage {
            chat_id: cx.chat_id.to_owned(),
            run_id: Some(cx.run_id.to_owned()),
            role: "tool".into(),
            content: text.clone(),
            tool_call_id: Some(c.id.clone()),
            name: Some(c.name.clone()),
            status: if output.ok() { MessageStatus::Ok } else { MessageStatus::Error },
            ..Default::default()
        });
        cx.ledger.check("a tool result", stored);
        batch.push(cx.host.kind(&c.name), &c.name, &args, &text);
        let mut m = Message::new("tool", text);
        m.tool_call_id = Some(c.id.clone());
        m.name = Some(c.name.clone());
        p.exchanges.push(m);
        outputs.push(output);
    }
    (batch, outputs)
}

/// Runs one call of round `round`, each in the run's ledger of tool calls:
/// written `sent` before it runs (a call whose row cannot be written does
/// not run, nor does any call after a failed write of the run), closed with
/// how it ended; a call refused before running is written `refused`.
fn call(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &RunOptions,
    c: &Call,
    offered: &[ToolDef],
    round: usize,
    by: By,
) -> ToolOutput {
    let (ledger, store) = (cx.ledger, cx.store);
    let row = NewToolCall {
        run_id: cx.run_id,
        round,
        call_id: &c.id,
        name: &c.name,
        kind: cx.host.kind_label(&c.name),
    };
    let note = (by == By::Host).then_some(HOST_ENTRY);
    let mut entry = None;
    let mut record = || {
        if ledger.fault().is_none() {
            entry = ledger.check("a tool call", store.tool_call_open(&row, "sent", note));
        }
        entry.is_some()
    };
    let (output, ended) = match authorize(cx, c, offered) {
        Err(refusal) => {
            let why = match &refusal {
                ToolOutput::Error(e) => e.message.clone(),
                _ => String::new(),
            };
            (refusal, Ended::Refused(why))
        }
        Ok(()) if c.name == tools::ANALYZE => {
            if record() {
                let output = super::sections::analyze(cx, provider, &opts.question, &c.arguments);
                let ended = Ended::ran(&output);
                (output, ended)
            } else {
                (tools::unrecorded(&c.name), Ended::Unrecorded)
            }
        }
        Ok(()) => cx.host.call_in_run(&c.name, &c.arguments, &mut record),
    };
    match ended {
        Ended::Refused(why) => {
            ledger.check("a tool call", store.tool_call_open(&row, "refused", Some(&why)));
        }
        Ended::Sent { ok, detail } => {
            if let Some(e) = entry {
                let outcome = if ok { "ok" } else { "error" };
                let detail = match note {
                    Some(n) => format!("{n}: {detail}"),
                    None => detail,
                };
                ledger.check("a tool call", store.tool_call_close(e, outcome, Some(&detail)));
            }
        }
        Ended::Unrecorded => {}
    }
    output
}

/// The host's authorization of an actual call, whatever the model was
/// offered: refused once the reply is cancelled, once the research share
/// of the deadline is spent, and for a known tool that was not offered.
fn authorize(cx: &Ctx<'_>, c: &Call, offered: &[ToolDef]) -> Result<(), ToolOutput> {
    if cx.cancelled() {
        return Err(ToolOutput::error("CANCELLED", "the reply was cancelled"));
    }
    if cx.budget.research_time_spent() {
        return Err(tools::unavailable(&c.name, "the research share of the run deadline is spent"));
    }
    if !offered.iter().any(|t| t.name == c.name) && cx.host.kind(&c.name).is_some() {
        let why =
            cx.host.spent(&c.name).unwrap_or_else(|| "it was not offered in this turn".into());
        return Err(tools::unavailable(&c.name, &why));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_identical_read_batches_repeat_and_a_write_resets() {
        let batch = |args: &str, write: bool| {
            let mut b = Batch::default();
            b.push(Some(Kind::Read), "search_sources", &arguments_value(args), "{\"results\":[]}");
            if write {
                b.push(
                    Some(Kind::Write),
                    "save_note",
                    &serde_json::json!({}),
                    "{\"saved\":\"a.md\"}",
                );
            }
            b
        };
        let mut r = Repeats::default();
        assert!(!r.record(batch(r#"{"query":"a","limit":2}"#, false)));
        assert!(
            !r.record(batch(r#"{"limit":2,"query":"a"}"#, false)),
            "the same arguments in another order"
        );
        assert!(!r.record(batch(r#"{"query":"a","limit":2}"#, true)));
        assert!(!r.record(batch(r#"{"query":"a","limit":2}"#, false)));
        assert!(!r.record(batch(r#"{"query":"b"}"#, false)), "different calls reset");
        assert!(!r.record(batch(r#"{"query":"b"}"#, false)));
        assert!(r.record(batch(r#"{"query":"b"}"#, false)));
    }
}
