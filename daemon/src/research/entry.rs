//! Host-led research (docs/research.md "Small models", docs/budgets.md
//! "Host-led entry research"): for a model that does not drive its own tool rounds
//! (models.toml `research = "host"`), the host opens a run that has
//! sources by searching with the question itself and reading the best
//! segments, before the first model turn. The calls are the model's tools,
//! run through the same authorization (quotas, deadline, cancellation),
//! handle registry, chat and events as a model's round (`tool_call` with
//! `by: "host"`); they make round 1.
//!
//! The answer is then *composed* from what was read (`choices`): the most
//! relevant sentences of the read segments (three; two for a voice), best
//! first, each followed by its handle — the only text the model's reserved
//! final turn may write, so what it writes is grounded.

use super::execution::{projection, run_round, Proposed};
use super::run::Progress;
use super::Ctx;
use crate::events::By;
use crate::provider::{Call, Provider};
use crate::state::store::new_id;
use crate::tools::{self, Hit, ToolOutput};
use prompts::evidence::{self, Passage, Unit};
use prompts::fallback::Evidence;

/// Sentences a composed answer says (a voice answer: two).
const CANDIDATES: usize = 3;
const SPOKEN: usize = 2;

/// Searches with the question and reads the best `entry-reads` segments
/// and the one after the best, as round 1 of the run.
pub(super) fn entry(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &super::RunOptions,
    p: &mut Progress,
) {
    let offered = projection(cx.host, &cx.host.tools());
    p.rounds += 1;
    let call = |name: &str, arguments: serde_json::Value| Call {
        id: new_id("host"),
        name: name.to_owned(),
        arguments: arguments.to_string(),
    };
    let search = call(tools::SEARCH, serde_json::json!({"query": opts.question}));
    let proposed = Proposed { calls: &[search], content: "", by: By::Host };
    let (_, outputs) = run_round(cx, provider, opts, proposed, &offered, p);
    if cx.cancelled() {
        return;
    }
    let Some(ToolOutput::Search(found)) = outputs.first() else { return };
    let reads: Vec<Call> = to_read(&found.hits, cx.budget.entry_reads)
        .into_iter()
        .map(|h| call(tools::READ, serde_json::json!({"handle": h.handle})))
        .collect();
    if reads.is_empty() {
        return;
    }
    let offered = projection(cx.host, &cx.host.tools());
    let proposed = Proposed { calls: &reads, content: "", by: By::Host };
    let (_, outputs) = run_round(cx, provider, opts, proposed, &offered, p);
    if cx.cancelled() {
        return;
    }
    // Read on: what answers a question often follows the passage that
    // matches it best (a section cut at a segment's end), so the segment
    // after the best one is read too, unless the search found it already.
    let Some(ToolOutput::Read(best)) = outputs.first() else { return };
    let next = best.segment + 1;
    let best_path = found.hits.iter().find(|h| h.handle == best.handle).map(|h| h.path.as_str());
    let found_next = to_read(&found.hits, cx.budget.entry_reads)
        .iter()
        .any(|h| Some(h.path.as_str()) == best_path && h.segment == next);
    if next > best.segments || found_next {
        return;
    }
    let more = [call(tools::READ, serde_json::json!({"handle": best.handle, "segment": next}))];
    let offered = projection(cx.host, &cx.host.tools());
    let proposed = Proposed { calls: &more, content: "", by: By::Host };
    run_round(cx, provider, opts, proposed, &offered, p);
}

/// The hits the entry reads: the search's best `n`. (Reading the best
/// hit of each file first instead was measured on the research-qa set:
/// it brought in other files' near-misses and lost more answers than it
/// found.)
fn to_read(hits: &[Hit], n: usize) -> Vec<&Hit> {
    hits.iter().take(n).collect()
}

/// The segments the run read, in the order they were read (which for the
/// entry's reads is the search's order), ranked so.
pub(super) fn passages(cx: &Ctx<'_>, p: &Progress) -> Vec<Passage> {
    let read = cx.host.handles.read();
    p.evidence
        .iter()
        .filter(|e| read.contains(&e.handle))
        .enumerate()
        .map(|(i, e)| passage(e, Some(i + 1)))
        .collect()
}

/// Every passage the run retrieved (read segments and search snippets),
/// unranked, for an excerpt.
pub(super) fn retrieved(p: &Progress) -> Vec<Passage> {
    p.evidence.iter().map(|e| passage(e, None)).collect()
}

fn passage(e: &Evidence, rank: Option<usize>) -> Passage {
    Passage {
        handle: e.handle.clone(),
        title: e.title.clone(),
        text: e.text.clone(),
        heading: e.heading.clone(),
        rank,
    }
}

/// The most relevant sentences of what was read (fewer for a voice).
pub(super) fn candidates(question: &str, passages: &[Passage], voice: bool) -> Vec<Unit> {
    evidence::best(question, passages, if voice { SPOKEN } else { CANDIDATES })
}

/// A unit as answer text: the sentence and its handle.
fn cited(u: &Unit) -> String {
    format!("{} [{}]", u.text, u.handle)
}

/// The answer a composed turn may write: the candidates, best first, each
/// followed by its handle. Measured on the default model, letting it order
/// them by its own likelihood put the answering sentence last (the
/// README's question), so the ranking decides the order; the turn is held
/// to this text by a grammar where the provider can hold it.
pub(super) fn choices(units: &[Unit]) -> Vec<String> {
    if units.is_empty() {
        return Vec::new();
    }
    vec![units.iter().map(cited).collect::<Vec<_>>().join(" ")]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_choice_is_the_candidates_best_first_each_cited() {
        let u = |h: &str, t: &str| Unit {
            handle: h.into(),
            text: t.into(),
            heading: String::new(),
            score: 1.0,
            order: (0, 0),
        };
        assert_eq!(choices(&[u("S1", "A."), u("S2", "B.")]), vec!["A. [S1] B. [S2]"]);
        assert!(choices(&[]).is_empty());
    }
}
