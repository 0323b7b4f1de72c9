//! How a reply completes when no answer could be written (seed 000): an
//! explicitly labelled, bounded excerpt of the evidence this reply
//! retrieved — never presented as a verified answer — or, for a voice
//! request, one or two plain sentences a TTS engine can read aloud.

use super::admission::RunOptions;
use super::run::{done, Progress};
use super::Ctx;
use crate::events::{Done, Ev, Outcome, Stop};
use prompts::fallback;

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
    if opts.voice {
        let text = fallback::spoken(p.evidence.len());
        cx.content(&text);
        return done(cx, Outcome::SpokenFallback, stop, p.rounds, None);
    }
    let text = fallback::excerpt(&p.evidence, fallback::EXCERPT_MAX);
    cx.content(&text);
    done(cx, Outcome::Excerpt, stop, p.rounds, None)
}
