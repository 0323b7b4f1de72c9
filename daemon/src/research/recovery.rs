//! Recovery (docs/budgets.md "Recovery cannot mint a fresh budget"): an
//! interrupted run continues under its own admission snapshot — provider,
//! model, corpus, limits — and its ledger: a newer, larger default never
//! enlarges it, used requests stay used, its clock keeps the time already
//! spent. What it did before — exchanges, rounds, quotas, the repeat count,
//! evidence, handles — is rebuilt from the chat and the store.

use super::admission::{RunOptions, Snapshot};
use super::budget::Budget;
use super::execution::{collect_evidence, Batch};
use super::run::{drive, Admitted, Progress};
use super::view::chat_history;
use crate::events::{Done, Ev};
use crate::provider::Provider;
use crate::state::store::{MessageStatus, RunStatus, Store};
use crate::tools::{Host, ToolOutput};
use anyhow::{bail, Context, Result};
use prompts::{Message, ToolCallMsg};
use std::sync::atomic::AtomicBool;

/// Continues an interrupted run under its snapshot and ledger, with the
/// provider its snapshot names.
pub(crate) fn resume(
    store: &Store,
    id: &str,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Result<Done> {
    resume_on(store, id, None, cancel, emit, false)
}

/// Continues an interrupted run on a provider already loaded (the
/// daemon's model).
pub(crate) fn resume_with(
    store: &Store,
    id: &str,
    provider: &mut dyn Provider,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Result<Done> {
    // Inside the daemon: runs under its own process id are live.
    resume_on(store, id, Some(provider), cancel, emit, true)
}

fn resume_on(
    store: &Store,
    id: &str,
    given: Option<&mut dyn Provider>,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
    in_daemon: bool,
) -> Result<Done> {
    store.mark_interrupted(in_daemon)?;
    let run = store.run(id)?.with_context(|| format!("no run {id:?} (see `agentd runs list`)"))?;
    if run.status != RunStatus::Interrupted {
        bail!("run {id} is {}; only an interrupted run can be resumed", run.status.as_str());
    }
    let snap = Snapshot::decode(&run.snapshot)?;
    let mut host = snap.config.host(&snap.policies)?;
    host.handles.restore(store.handles(id)?);
    let progress = replay(store, id, &run.chat_id, &mut host)?;
    let budget = Budget::recovered(&snap.policies, store.usage(id)?, run.elapsed);
    let history = chat_history(store, &run.chat_id, Some(id));
    let mut built;
    let provider: &mut dyn Provider = match given {
        Some(p) => p,
        None => {
            built = crate::provider::build::build(&snap.config.engine, &snap.policies)?;
            built.as_mut()
        }
    };
    store.claim_run(id)?;
    let opts = RunOptions {
        question: run.question,
        chat_id: Some(run.chat_id.clone()),
        voice: snap.voice,
        provider: provider.describe(),
        config: snap.config,
    };
    let admitted =
        Admitted { run_id: id.to_owned(), chat_id: run.chat_id, history, budget, progress };
    Ok(drive(provider, &mut host, store, admitted, &opts, cancel, emit))
}

/// What the run did before, from its messages: its exchanges, rounds,
/// quotas spent, repeat count and evidence.
fn replay(store: &Store, id: &str, chat_id: &str, host: &mut Host) -> Result<Progress> {
    let mut p = Progress::default();
    let mut batch = Batch::default();
    let flush = |p: &mut Progress, batch: &mut Batch| {
        if !batch.is_empty() {
            p.repeats.record(std::mem::take(batch));
        }
    };
    // The host's entry research is one round however many batches it took
    // (its calls' ids are `host_…`).
    let mut in_entry = false;
    for m in store.messages(chat_id)?.into_iter().filter(|m| m.run_id.as_deref() == Some(id)) {
        match (m.role.as_str(), &m.tool_calls) {
            ("assistant", Some(calls)) => {
                flush(&mut p, &mut batch);
                let by_host = !calls.is_empty() && calls.iter().all(|c| c.id.starts_with("host_"));
                if !(by_host && in_entry) {
                    p.rounds += 1;
                }
                in_entry = by_host;
                let mut a = Message::new("assistant", m.content.clone());
                a.tool_calls = calls
                    .iter()
                    .map(|c| ToolCallMsg::new(&c.id, &c.name, &c.arguments.to_string()))
                    .collect();
                p.exchanges.push(a);
            }
            ("tool", _) => {
                let name = m.name.clone().unwrap_or_default();
                host.count_recovered(&name);
                if m.status == MessageStatus::Ok {
                    if let Some(output) = ToolOutput::from_stored(&name, &m.content) {
                        collect_evidence(&mut p.evidence, &output);
                    }
                }
                let args = p
                    .exchanges
                    .last()
                    .and_then(|a| {
                        a.tool_calls.iter().find(|c| Some(&c.id) == m.tool_call_id.as_ref())
                    })
                    .map_or_else(|| serde_json::json!({}), |c| c.function.arguments.clone());
                batch.push(host.kind(&name), &name, &args, &m.content);
                let mut t = Message::new("tool", m.content.clone());
                t.tool_call_id = m.tool_call_id.clone();
                t.name = Some(name);
                p.exchanges.push(t);
            }
            _ => {}
        }
    }
    flush(&mut p, &mut batch);
    Ok(p)
}
