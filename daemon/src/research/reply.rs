//! The reply a run writes: every visible piece of text streams out as a
//! `content` event and is kept, in order, in one assistant message that is
//! saved as it arrives (at most every `SAVE_EVERY`) and settled when the run
//! ends — so text already streamed survives a crash, a cancellation or a
//! failed final turn. It also knows where the current answer starts: a new
//! turn's text opens a new paragraph, and the answer is the last turn's.

use super::budget::Clock;
use super::ledger::Ledger;
use crate::events::Ev;
use crate::state::store::{MessageStatus, Store, StoredMessage};
use std::time::{Duration, Instant};

/// How often streamed text is saved while it arrives.
const SAVE_EVERY: Duration = Duration::from_millis(250);

/// The visible text of this process's part of a run, and its message.
#[derive(Debug)]
pub(super) struct Reply<'a> {
    store: &'a Store,
    ledger: Ledger<'a>,
    clock: Clock,
    chat_id: &'a str,
    run_id: &'a str,
    visible: String,
    /// Where the current answer starts in `visible`.
    answer_from: usize,
    /// The assistant message that holds the streamed text.
    row: Option<i64>,
    saved_at: Instant,
    turn_has_content: bool,
}

impl<'a> Reply<'a> {
    pub(super) fn new(
        store: &'a Store,
        ledger: Ledger<'a>,
        clock: Clock,
        chat_id: &'a str,
        run_id: &'a str,
    ) -> Reply<'a> {
        Reply {
            store,
            ledger,
            clock,
            chat_id,
            run_id,
            visible: String::new(),
            answer_from: 0,
            row: None,
            saved_at: Instant::now(),
            turn_has_content: false,
        }
    }

    /// A new model turn (or a fallback) starts writing.
    pub(super) fn begin_turn(&mut self) {
        self.turn_has_content = false;
    }

    /// The current turn has written visible text.
    pub(super) fn turn_has_content(&self) -> bool {
        self.turn_has_content
    }

    /// Streams visible text: emitted, kept, saved.
    pub(super) fn content(&mut self, s: &str, emit: &mut dyn FnMut(&Ev)) {
        if s.is_empty() {
            return;
        }
        if !self.turn_has_content && !self.visible.is_empty() {
            // A new turn's text starts a new paragraph.
            self.visible.push_str("\n\n");
            emit(&Ev::Content("\n\n".into()));
        }
        if !self.turn_has_content {
            self.answer_from = self.visible.len();
        }
        self.turn_has_content = true;
        self.visible.push_str(s);
        emit(&Ev::Content(s.to_owned()));
        self.save(MessageStatus::Streaming, false);
    }

    /// The current answer: the text of the last turn that wrote some.
    pub(super) fn answer(&self) -> String {
        self.visible[self.answer_from.min(self.visible.len())..].to_owned()
    }

    /// All visible text (what a cancelled or failed run delivers).
    pub(super) fn visible(&self) -> &str {
        &self.visible
    }

    /// Where the current answer starts (for [`Reply::replace_answer`]).
    pub(super) fn answer_at(&self) -> usize {
        self.answer_from
    }

    /// Replaces the answer `text` that starts at `from` (its
    /// [`Reply::answer_at`]) by `marked` (invalid citations marked), which
    /// becomes the answer; text a later turn streamed after it (a failed
    /// correction) is not part of the answer and is dropped.
    pub(super) fn replace_answer(&mut self, from: usize, text: &str, marked: &str) {
        let end = from.saturating_add(text.len());
        if self.visible.get(from..end) == Some(text) {
            self.visible.truncate(end);
            self.visible.replace_range(from.., marked);
            self.answer_from = from;
        } else {
            // Not where it was written (never expected): the marked answer
            // follows the text as a paragraph of its own.
            self.answer_from = self.visible.len();
            if !self.visible.is_empty() {
                self.visible.push_str("\n\n");
                self.answer_from = self.visible.len();
            }
            self.visible.push_str(marked);
        }
    }

    /// Saves the text with `status` (at once when `force`, else when
    /// `SAVE_EVERY` has passed), and the run time with it.
    pub(super) fn save(&mut self, status: MessageStatus, force: bool) {
        if self.visible.is_empty() && self.row.is_none() {
            return;
        }
        match self.row {
            None => {
                let m = StoredMessage {
                    chat_id: self.chat_id.to_owned(),
                    run_id: Some(self.run_id.to_owned()),
                    role: "assistant".into(),
                    content: self.visible.clone(),
                    status,
                    ..Default::default()
                };
                self.row = self.ledger.check("the reply", self.store.add_message(&m));
                self.saved_at = Instant::now();
            }
            Some(id) if force || self.saved_at.elapsed() >= SAVE_EVERY => {
                self.ledger
                    .check("the reply", self.store.update_message(id, &self.visible, status));
                self.saved_at = Instant::now();
            }
            Some(_) => {}
        }
        self.ledger.elapsed(self.clock.elapsed());
    }
}
