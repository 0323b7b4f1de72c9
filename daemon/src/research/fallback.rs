//! How a reply completes when no answer could be written (docs/budgets.md
//! "Honest delivery"): an
//! explicitly labelled, bounded excerpt of the evidence this reply
//! retrieved — its most relevant sentences with their handles, never
//! presented as a verified answer — or, for a voice request, one or two
//! plain sentences a TTS engine can read aloud (carrying the most relevant
//! sentence, when there is one).

use super::admission::RunOptions;
use super::run::{done, Progress};
use super::Ctx;
use crate::events::{Done, Ev, Outcome, Stop};
use prompts::{evidence, fallback};

/// Sentences an excerpt shows.
const SENTENCES: usize = 3;

/// Completes the reply with the evidence excerpt (or the spoken fallback),
/// saying `why` no answer was written.
pub(super) fn fallback(
    cx: &mut Ctx<'_>,
    opts: &RunOptions,
    p: &Progress,
    stop: Stop,
    why: &str,
) -> Done {
    cx.emit(Ev::Notice {
        kind: "fallback",
        text: format!("No answer could be written ({why}); showing the evidence instead"),
    });
    cx.reply.begin_turn();
    // The most relevant sentences of what the reply retrieved, not whole
    // segments.
    let units = evidence::best(&opts.question, &super::entry::retrieved(p), SENTENCES);
    if opts.voice {
        let best = units.first().map(|u| super::voice::plain(&u.text));
        let text = fallback::spoken_with(best.as_deref(), p.evidence.len());
        cx.content(&text);
        return done(cx, Outcome::SpokenFallback, stop, p.rounds, None);
    }
    let text = fallback::excerpt_sentences(&units, &p.evidence, fallback::EXCERPT_MAX);
    cx.content(&text);
    done(cx, Outcome::Excerpt, stop, p.rounds, None)
}
