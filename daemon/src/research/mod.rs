//! The research loop (docs/research.md, docs/budgets.md "The reserved final
//! turn") under the budget rules of docs/budgets.md. A question is admitted as a run with its
//! snapshot (`admission`) and researched round by round until the model
//! answers or a bound ends research, then one reserved, tools-free final
//! turn answers from the evidence (`run`). Each model request is admitted
//! against the run's `budget` and written to its `ledger` before it is sent
//! (`request`); each round's calls are authorized, run and compared
//! for repeats (`execution`); an answer citing what it did not read gets
//! one correction (`citations`); a reply that cannot be answered completes
//! with a labelled excerpt or a spoken fallback (`fallback`). The streamed
//! text and its persistence are `reply`, what the model sees is `view`, the
//! continuation of an interrupted run under its own snapshot and ledger is
//! `recovery`, and a run's audit record and cancellation are `runs`.
//! Long sources are read by section workers (`sections`: `analyze_source`
//! and condensing the final view), and an answer over a corpus that cites
//! none of it is delivered marked (`grounding`). The sentences a voice
//! request speaks as they complete are `voice`. The limits it reads are
//! declared in `state::policy`.

mod admission;
mod budget;
mod citations;
mod entry;
mod execution;
mod fallback;
mod grounding;
mod junk;
mod ledger;
mod recovery;
mod reply;
mod request;
mod run;
pub(crate) mod runs;
mod sections;
#[cfg(test)]
mod tests;
mod view;
mod voice;

pub(crate) use admission::{run, RunConfig, RunOptions};
pub(crate) use recovery::{resume, resume_with};

use crate::events::Ev;
use crate::state::store::Store;
use crate::tools::Host;
use budget::Budget;
use ledger::Ledger;
use reply::Reply;
use std::sync::atomic::{AtomicBool, Ordering};

/// A run in progress: what every part of the loop works on.
struct Ctx<'a> {
    host: &'a mut Host,
    store: &'a Store,
    cancel: &'a AtomicBool,
    emit: &'a mut dyn FnMut(&Ev),
    run_id: &'a str,
    chat_id: &'a str,
    budget: Budget,
    ledger: Ledger<'a>,
    reply: Reply<'a>,
    /// Why the last request's text was stopped as junk, if it was.
    junk: Option<junk::Junk>,
    /// The decoding of the run's model requests so far (`Done::decode`).
    decode: crate::events::Decode,
}

impl Ctx<'_> {
    fn emit(&mut self, e: Ev) {
        (self.emit)(&e);
    }

    /// Streams visible text of the reply.
    fn content(&mut self, s: &str) {
        self.reply.content(s, self.emit);
    }

    /// Whether the run is cancelled: by this process, or by `agentd runs
    /// cancel ID` from another one.
    fn cancelled(&self) -> bool {
        if self.cancel.load(Ordering::Relaxed) {
            return true;
        }
        if self.store.cancel_requested(self.run_id) {
            self.cancel.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }
}
