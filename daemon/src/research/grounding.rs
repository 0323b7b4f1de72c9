//! Honest delivery (docs/budgets.md "Honest delivery"): an answer is *grounded*
//! when it cites sources it read in this run and nothing it did not. An
//! answer to a question asked over a corpus that cites none of the sources
//! it read is still delivered, with a `notice` of kind `uncited` and
//! `done.grounded: false` — no extra model request is spent on it.

use super::citations::citations;
use super::Ctx;
use crate::events::{Done, Ev, Outcome};

/// The notice's text.
pub(super) const UNCITED: &str = "This answer cites none of your sources";

/// Sets `done.grounded` and, for an uncited answer over a corpus, emits
/// the `uncited` notice (before `done`).
pub(super) fn ground(cx: &mut Ctx<'_>, done: &mut Done) {
    done.grounded = false;
    if done.outcome != Outcome::Answered {
        return;
    }
    let read = cx.host.handles.read();
    let cited = citations(&done.answer);
    let cited_read = cited.iter().filter(|h| read.contains(*h)).count();
    done.grounded =
        cited_read > 0 && cited_read == cited.len() && done.invalid_citations.is_empty();
    if cited_read == 0 && cx.host.has_corpus() {
        cx.emit(Ev::Notice { kind: "uncited", text: UNCITED.into() });
    }
}
