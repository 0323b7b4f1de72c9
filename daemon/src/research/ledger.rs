//! A run's durable ledger (docs/budgets.md "Every request is written to the
//! ledger first"): one entry per attempt —
//! first tries, retries and fallbacks alike — written `sent` before the
//! attempt goes out and closed with what became of it; a request the
//! budget refuses is written `refused` and never sent. The run time spent
//! is kept beside it, so a recovered run continues its own clock.
//!
//! The ledger fails closed: a write that fails (to it, or to the run's
//! chat, which recovery reads) is kept as the run's fault, and no request
//! goes out after it — the run stops with `LEDGER_WRITE_FAILED`.

use crate::events::Phase;
use crate::provider::{ProviderError, TurnFinish, TurnReply};
use crate::state::store::{LedgerOutcome, Store};
use std::cell::RefCell;
use std::time::Duration;

/// The ledger of one run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ledger<'a> {
    store: &'a Store,
    run_id: &'a str,
    /// The first write of the run that failed, with why.
    fault: &'a RefCell<Option<String>>,
}

/// The entries one request's attempts wrote, in order.
#[derive(Debug, Default)]
pub(super) struct Attempts(Vec<Option<i64>>);

impl<'a> Ledger<'a> {
    pub(super) fn new(
        store: &'a Store,
        run_id: &'a str,
        fault: &'a RefCell<Option<String>>,
    ) -> Ledger<'a> {
        Ledger { store, run_id, fault }
    }

    /// The first failed write of the run, if one failed: no request may go
    /// out after it.
    pub(super) fn fault(&self) -> Option<String> {
        self.fault.borrow().clone()
    }

    /// The value of a write of the run (`what` names it), or `None` when it
    /// failed — then the failure is the run's fault.
    pub(super) fn check<T>(&self, what: &str, r: anyhow::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let mut f = self.fault.borrow_mut();
                if f.is_none() {
                    *f = Some(format!("cannot write {what} of run {}: {e:#}", self.run_id));
                }
                None
            }
        }
    }

    /// Writes attempt `n` as sent; call before sending it. `false` when the
    /// write failed: the attempt must not be sent.
    pub(super) fn sent(&self, attempts: &mut Attempts, n: usize, phase: Phase) -> bool {
        let entry = self.check("the ledger entry", self.store.ledger_sent(self.run_id, n, phase));
        attempts.0.push(entry);
        entry.is_some()
    }

    /// Writes request `n` as refused by the run's own allowance.
    pub(super) fn refused(&self, n: usize, phase: Phase, detail: &str) {
        self.check("the ledger entry", self.store.ledger_refused(self.run_id, n, phase, detail));
    }

    /// Closes a request's entries: earlier attempts were retried; the last
    /// one decides.
    pub(super) fn settle(&self, attempts: Attempts, result: &Result<TurnReply, ProviderError>) {
        let mut entries = attempts.0;
        let last = entries.pop().flatten();
        for id in entries.into_iter().flatten() {
            self.close(Some(id), LedgerOutcome::Retried, Some("transient"), None);
        }
        let failed = |e: &ProviderError| {
            self.close(last, LedgerOutcome::Error, Some(e.code().1), Some(&e.to_string()));
        };
        match result {
            Ok(r) if r.finish == TurnFinish::Cancelled => {
                self.close(last, LedgerOutcome::Cancelled, None, None)
            }
            Ok(_) => self.close(last, LedgerOutcome::Ok, None, None),
            // A refused first attempt wrote its own entry; a refused retry
            // leaves the attempt before it failed with its transient error.
            Err(ProviderError::Budget { retrying }) => {
                if let Some(e) = retrying {
                    failed(e);
                }
            }
            Err(e) => failed(e),
        }
    }

    /// Stores the run time spent so far.
    pub(super) fn elapsed(&self, elapsed: Duration) {
        self.check("the run time", self.store.set_run_elapsed(self.run_id, elapsed));
    }

    fn close(
        &self,
        entry: Option<i64>,
        outcome: LedgerOutcome,
        classification: Option<&str>,
        detail: Option<&str>,
    ) {
        if let Some(id) = entry {
            self.check(
                "the ledger entry",
                self.store.ledger_close(id, outcome, classification, detail),
            );
        }
    }
}
