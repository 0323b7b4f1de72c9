//! No junk delivered as an answer (docs/research.md, "Junk is never
//! delivered as an answer"): a watch over the text a turn streams that
//! says, as soon as it can be told, that the text loops (a sentence said
//! again, a phrase repeated, the tail repeating text already written) or
//! drifts away from the evidence the run read (few of its topic words
//! occur in the evidence or the question). The loop then stops the turn
//! and completes the reply with the labelled excerpt of the most relevant
//! sentences (`fallback`); the text already streamed stays.

use super::citations::citations;
use prompts::evidence;
use std::collections::HashSet;

/// Why a turn's text was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Junk {
    Loops,
    Drifts,
}

impl Junk {
    /// Says why, for the notice.
    pub(super) fn why(self) -> &'static str {
        match self {
            Junk::Loops => "the answer was repeating itself",
            Junk::Drifts => "the answer had nothing to do with the sources read",
        }
    }
}

/// Topic words needed before drift is judged.
const DRIFT_AFTER: usize = 40;
/// Below this share of topic words found in the evidence, text drifts.
const DRIFT_BELOW: f64 = 0.3;

/// The watch over one turn's text.
#[derive(Debug, Default)]
pub(super) struct Monitor {
    text: String,
    /// Topic words of the evidence and the question; `None`: no evidence,
    /// so drift is not judged.
    evidence: Option<HashSet<String>>,
    verdict: Option<Junk>,
}

impl Monitor {
    /// A watch judging drift against `evidence` (texts read) and the
    /// question; with no evidence only loops are judged.
    pub(super) fn new(question: &str, evidence: &[&str]) -> Monitor {
        let evidence = (!evidence.is_empty()).then(|| {
            evidence
                .iter()
                .chain(std::iter::once(&question))
                .flat_map(|t| evidence::terms(t))
                .collect()
        });
        Monitor { text: String::new(), evidence, verdict: None }
    }

    /// The verdict so far.
    pub(super) fn verdict(&self) -> Option<Junk> {
        self.verdict
    }

    /// Adds streamed text; returns the verdict once the text is junk.
    pub(super) fn push(&mut self, delta: &str) -> Option<Junk> {
        if self.verdict.is_some() {
            return self.verdict;
        }
        self.text.push_str(delta);
        self.verdict = judge(&self.text, self.evidence.as_ref());
        self.verdict
    }
}

fn loops(text: &str) -> bool {
    evidence::loops(text, evidence::WATCH_PHRASE, evidence::WATCH_REPEATS, evidence::WATCH_TAIL)
}

fn judge(text: &str, evidence: Option<&HashSet<String>>) -> Option<Junk> {
    if loops(text) {
        return Some(Junk::Loops);
    }
    let ev = evidence?;
    // Text that cites what was read is judged by the citation check, not
    // by its words (an answer in another language than the sources).
    if !citations(text).is_empty() {
        return None;
    }
    let t = evidence::terms(text);
    if t.len() >= DRIFT_AFTER && evidence::overlap(&t, ev) < DRIFT_BELOW {
        return Some(Junk::Drifts);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(question: &str, evidence: &[&str], text: &str) -> Option<Junk> {
        let mut m = Monitor::new(question, evidence);
        // Streamed a few characters at a time, as a model writes.
        let chars: Vec<char> = text.chars().collect();
        for c in chars.chunks(3) {
            m.push(&c.iter().collect::<String>());
        }
        m.verdict()
    }

    const EVIDENCE: &str = "When research reaches the round limit, the loop emits the notice Finishing the answer and makes one reserved final turn with no tools offered. The final turn keeps the question and every tool exchange.";

    #[test]
    fn a_looping_answer_is_caught() {
        let q = "What happens at the round limit?";
        let looped = "The round limit is removed when the round limit is reached, and the round limit is removed. The round limit is removed.";
        assert_eq!(verdict(q, &[EVIDENCE], looped), Some(Junk::Loops));
        let sentence = "It stops. Research ends at the bound now. Research ends at the bound now.";
        assert_eq!(verdict(q, &[], sentence), Some(Junk::Loops), "caught without evidence too");
    }

    #[test]
    fn a_drifting_answer_is_caught_and_a_grounded_one_is_not() {
        let q = "What happens when research reaches the round limit?";
        let drift = "In Python, a function that takes too many arguments is hard to read and to test. Consider grouping related parameters into a data class, or splitting the function into smaller helpers that each do one thing well, which also makes naming easier. Keyword-only parameters help callers, default values reduce noise, and type hints document intent for reviewers and editors alike. Linters such as pylint warn about long signatures, and refactoring tools rename arguments safely across modules, packages and notebooks.";
        assert_eq!(verdict(q, &[EVIDENCE], drift), Some(Junk::Drifts));
        let good = "At the round limit the loop emits the notice \"Finishing the answer\" and makes one reserved final turn with no tools offered [S1]. That turn keeps the question and every tool exchange, so the answer is written from the evidence gathered [S1].";
        assert_eq!(verdict(q, &[EVIDENCE], good), None);
        assert_eq!(verdict(q, &[], drift), None, "no evidence: drift is not judged");
        let cited = format!("{drift} [S1]");
        assert_eq!(
            verdict(q, &[EVIDENCE], &cited),
            Some(Junk::Drifts),
            "judged before the citation came"
        );
        let german = "Wenn die Recherche das Rundenlimit erreicht, schreibt agentd den Hinweis und beantwortet die Frage in einem letzten Zug ohne Werkzeuge, wie die Quelle sagt [S1]. Die Antwort stützt sich auf alles Gelesene und nennt die Quellen [S1].";
        assert_eq!(verdict(q, &[EVIDENCE], german), None, "a cited answer in another language");
    }

    #[test]
    fn ordinary_lists_and_code_are_not_loops() {
        let text = "Steps:\n- run `npm ci` in the project\n- run `npm test` in the project\n- run `npm pack` to check the files\n```\nnpm ci\nnpm test\n```";
        assert_eq!(verdict("how do I test", &[], text), None);
    }

    proptest::proptest! {
        /// Model output is arbitrary: the watch judges any text, in any
        /// pieces, without a panic, and a verdict once given stays.
        #[test]
        fn any_stream_is_judged_without_panic(
            pieces in proptest::collection::vec("\\PC{0,12}", 0..80),
            q in "\\PC{0,40}",
        ) {
            let mut m = Monitor::new(&q, &[EVIDENCE]);
            let mut first = None;
            for p in &pieces {
                let v = m.push(p);
                if first.is_none() {
                    first = v;
                }
                proptest::prop_assert_eq!(m.verdict(), first);
            }
        }
    }
}
