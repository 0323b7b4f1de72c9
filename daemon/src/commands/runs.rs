//! `agentd runs list` and `agentd runs show` (the run record: admission
//! snapshot, ledger, handles). Cancelling and resuming are the research
//! loop's (`research::runs::cancel`, `research::resume`).

use crate::research::runs::record;
use crate::state::store::Store;
use anyhow::Result;
use serde_json::json;

/// `runs list`: one JSON line per run, newest first.
pub(crate) fn list(store: &Store) -> Result<()> {
    store.mark_interrupted(false)?;
    for r in store.runs()? {
        println!(
            "{}",
            json!({"run_id": r.id, "chat_id": r.chat_id, "status": r.status.as_str(),
                   "outcome": r.outcome, "stop": r.stop,
                   "question": r.question.chars().take(80).collect::<String>(),
                   "created": r.created, "updated": r.updated})
        );
    }
    Ok(())
}

/// `runs show`: the record, pretty-printed.
pub(crate) fn show(store: &Store, id: &str) -> Result<()> {
    store.mark_interrupted(false)?;
    println!("{}", serde_json::to_string_pretty(&record(store, id)?)?);
    Ok(())
}
