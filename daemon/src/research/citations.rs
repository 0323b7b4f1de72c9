//! Citations (docs/budgets.md "Citations"): an answer cites sources by handle,
//! `[S3]`, and may cite only handles it read successfully in this run. A
//! violation is rejected once, with the reason, and the model gets one
//! correction turn from the finalization reserve; if that fails too, the
//! answer is delivered with the invalid citations marked, never silently.

use super::run::{done, failed, Progress};
use super::Ctx;
use crate::events::{Done, Ev, Outcome, Phase, RunError, Stop};
use crate::provider::{Provider, ProviderError, TurnFinish};
use prompts::{texts, Message};
use std::collections::BTreeSet;

/// Citations `[S3]` in a text, in order, without repeats.
pub(super) fn citations(text: &str) -> Vec<String> {
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

/// The handles `text` cites that were not read.
fn unread(text: &str, read: &BTreeSet<String>) -> Vec<String> {
    citations(text).into_iter().filter(|h| !read.contains(h)).collect()
}

/// Settles an answer after its citation check (with `view`, the request
/// that wrote it, for the correction).
pub(super) fn check_citations(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    view: &[Message],
    answer: String,
    stop: Stop,
    p: &Progress,
) -> Done {
    let read = cx.host.handles.read().clone();
    let invalid = unread(&answer, &read);
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
    let answer_at = cx.reply.answer_at();
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
        Ok(r) if !r.content.trim().is_empty() && cx.reply.turn_has_content() => {
            Some(cx.reply.answer())
        }
        Err(e @ ProviderError::Ledger(_)) => {
            let (code, class) = e.code();
            return failed(cx, p, RunError::new(code, class, e.to_string()));
        }
        _ => None,
    };
    let (text, at, still) = match corrected {
        Some(t) => {
            let still = unread(&t, &read);
            (t, cx.reply.answer_at(), still)
        }
        None => (answer, answer_at, invalid),
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
    cx.reply.replace_answer(at, &text, &marked);
    let mut d = done(cx, Outcome::Answered, stop, p.rounds, None);
    d.invalid_citations = still;
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citations_are_found_once_each() {
        assert_eq!(citations("a [S1] b [S12], [S1] [X3] [S] [S4"), vec!["S1", "S12"]);
    }
}
