//! Runs as their fronts see them (`agentd runs`, `/v1/runs/{id}`): the
//! audit record of a run — its row, admission snapshot, ledger, its calls
//! to MCP servers (`tool_calls`) and handles,
//! as JSON — and cancelling one: a running run is asked to stop (its
//! process checks between steps), an interrupted one is settled cancelled.

use crate::state::store::{RunRow, RunStatus, Store};
use anyhow::{Context, Result};
use serde_json::{json, Value};

fn row_json(r: RunRow) -> Value {
    json!({"run_id": r.id, "chat_id": r.chat_id, "status": r.status.as_str(),
           "outcome": r.outcome, "stop": r.stop,
           "error": r.error.and_then(|e| serde_json::from_str::<Value>(&e).ok()),
           "snapshot": serde_json::from_str::<Value>(&r.snapshot).unwrap_or(Value::Null),
           "elapsed_ms": r.elapsed.as_millis() as i64, "created": r.created, "updated": r.updated,
           "question": r.question})
}

/// The run record with snapshot, ledger and handles.
pub(crate) fn record(store: &Store, id: &str) -> Result<Value> {
    let row = store.run(id)?.with_context(|| format!("no run {id:?} (see `agentd runs list`)"))?;
    let mut out = row_json(row);
    out["ledger"] = json!(store
        .ledger(id)?
        .into_iter()
        .map(|l| json!({"n": l.n, "phase": l.phase, "outcome": l.outcome.as_str(),
                        "classification": l.classification, "detail": l.detail, "at": l.created}))
        .collect::<Vec<_>>());
    out["tool_calls"] = json!(store
        .tool_calls(id)?
        .into_iter()
        .map(|c| json!({"round": c.round, "id": c.call_id, "name": c.name, "kind": c.kind,
                        "outcome": c.outcome, "detail": c.detail, "at": c.created, "ended": c.updated}))
        .collect::<Vec<_>>());
    out["handles"] = json!(store
        .handles(id)?
        .into_iter()
        .map(
            |h| json!({"handle": h.handle, "path": h.path, "segment": h.segment, "read": h.read_ok})
        )
        .collect::<Vec<_>>());
    Ok(out)
}

/// Cancels a run; `in_daemon`: called by the daemon, whose own runs are
/// live (see `Store::mark_interrupted`).
pub(crate) fn cancel(store: &Store, id: &str, in_daemon: bool) -> Result<&'static str> {
    store.mark_interrupted(in_daemon)?;
    let run = store.run(id)?.with_context(|| format!("no run {id:?}"))?;
    Ok(match run.status {
        RunStatus::Running => {
            store.request_cancel(id)?;
            "cancel requested"
        }
        RunStatus::Interrupted => {
            store.cancel_interrupted(id)?;
            "cancelled"
        }
        RunStatus::Cancelled | RunStatus::Finished => "already finished",
    })
}
