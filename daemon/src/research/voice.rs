//! Voice-grade streaming (docs/events.md "Voice: `sentence`"): for a
//! voice request the visible text is cut into sentences as it streams, and
//! each completed one goes out at once as plain speech — no markup,
//! citations (`[S3]`), URLs or markdown — so a TTS engine starts speaking
//! while the rest generates. When research begins a tool round, a short
//! spoken progress sentence (`kind: "progress"`) says what is happening, so
//! the listener does not wait in silence.
//!
//! A sentence ends at `.`, `!` or `?` (with any closing quotes or brackets)
//! followed by whitespace; a turn's unfinished tail is spoken when the next
//! request begins, a tool round starts, or the run ends. A sentence that
//! cleans to nothing speakable (a list of citations, a code fence) is
//! skipped.

use crate::events::Ev;

/// Longest run of text held waiting for a sentence end; beyond it the text
/// is spoken at the last word boundary (a model that never ends sentences
/// still gets spoken).
const HOLD_MAX: usize = 400;

/// Cuts streamed text into plain spoken sentences.
#[derive(Debug, Default)]
pub(super) struct Speaker {
    pending: String,
    /// The last tool round announced.
    round: usize,
}

impl Speaker {
    /// Wraps `emit`: every event goes through, and the voice events follow
    /// the events that complete them.
    pub(super) fn relay(&mut self, e: &Ev, emit: &mut dyn FnMut(&Ev)) {
        match e {
            // The tail of the text so far is a sentence now.
            Ev::Request { .. } | Ev::Done(_) => self.flush(emit),
            Ev::ToolCall { round, name, .. } if *round != self.round => {
                self.round = *round;
                self.flush(emit);
                emit(&Ev::Sentence { text: progress(name, *round).into(), progress: true });
            }
            _ => {}
        }
        emit(e);
        if let Ev::Content(d) = e {
            self.pending.push_str(d);
            while let Some(end) = sentence_end(&self.pending) {
                let s: String = self.pending.drain(..end).collect();
                speak(&s, emit);
            }
        }
    }

    fn flush(&mut self, emit: &mut dyn FnMut(&Ev)) {
        let s = std::mem::take(&mut self.pending);
        speak(&s, emit);
    }
}

fn speak(s: &str, emit: &mut dyn FnMut(&Ev)) {
    let text = plain(s);
    if text.chars().any(char::is_alphanumeric) {
        emit(&Ev::Sentence { text, progress: false });
    }
}

/// The spoken progress sentence for a tool round that begins with `tool`.
fn progress(tool: &str, round: usize) -> &'static str {
    match (tool, round) {
        ("search_sources", 1) => "Let me look that up.",
        ("search_sources", _) => "Searching a little further.",
        ("read_source", _) => "Reading a source.",
        ("analyze_source", _) => "Going through a source in detail.",
        ("save_note", _) => "Saving a note.",
        (_, 1) => "Let me check that.",
        _ => "Checking one more thing.",
    }
}

/// Where the first complete sentence of `s` ends (a byte index), if one
/// has: a terminator, closing marks, then whitespace; or a paragraph break;
/// or a long run cut at a word boundary.
fn sentence_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'.' | b'!' | b'?' => {
                let mut j = i + 1;
                while j < b.len() && matches!(b[j], b'.' | b'!' | b'?' | b'"' | b'\'' | b')' | b']')
                {
                    j += 1;
                }
                if j < b.len() && b[j].is_ascii_whitespace() {
                    // "e.g. " and "3. " (a list number) are not ends.
                    let word = s[..i].rsplit(|c: char| c.is_whitespace()).next().unwrap_or("");
                    let numbered = !word.is_empty() && word.bytes().all(|c| c.is_ascii_digit());
                    let abbrev = word.contains('.') || matches!(word, "Mr" | "Mrs" | "Dr" | "vs");
                    if !numbered && !abbrev {
                        return Some(j + 1);
                    }
                }
                i = j;
            }
            b'\n' if i + 1 < b.len() && b[i + 1] == b'\n' => return Some(i + 2),
            _ => i += 1,
        }
    }
    if s.len() > HOLD_MAX {
        // Held text is cut at a char boundary (a script without spaces,
        // such as Chinese, has none of its own).
        let hold = (0..=HOLD_MAX).rev().find(|&k| s.is_char_boundary(k)).unwrap_or(0);
        // At the last whitespace that leaves something before it, else at
        // the hold; never inside a character (a leading ideographic space
        // is three bytes).
        let cut = s[..hold]
            .char_indices()
            .rev()
            .find(|&(k, c)| k > 0 && c.is_whitespace())
            .map_or(hold, |(k, _)| k);
        let cut = if cut == 0 { s.chars().next().map_or(s.len(), char::len_utf8) } else { cut };
        return Some(cut);
    }
    None
}

/// A sentence as plain speech: citations, URLs, markup and markdown
/// removed, whitespace collapsed.
pub(super) fn plain(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        // A citation `[S3]` or `[S1, S2]`, or any bracketed handle list.
        if c == '[' {
            if let Some(close) = rest.find(']') {
                let inner = &rest[1..close];
                if inner.split([',', ' ']).filter(|p| !p.is_empty()).all(is_handle) {
                    rest = &rest[close + 1..];
                    continue;
                }
                // A markdown link `[text](url)`: keep the text.
                if rest[close + 1..].starts_with('(') {
                    if let Some(end) = rest[close + 1..].find(')') {
                        out.push_str(inner);
                        rest = &rest[close + 1 + end + 1..];
                        continue;
                    }
                }
            }
        }
        // Markup `<…>` (a tag, a control token).
        if c == '<' {
            if let Some(close) = rest.find('>') {
                if !rest[1..close].contains(char::is_whitespace) || rest[1..].starts_with('/') {
                    rest = &rest[close + 1..];
                    continue;
                }
            }
        }
        let word_start = out.is_empty() || out.ends_with(char::is_whitespace);
        if word_start
            && (rest.starts_with("http://")
                || rest.starts_with("https://")
                || rest.starts_with("www."))
        {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            rest = &rest[end..];
            continue;
        }
        match c {
            '*' | '_' | '`' | '#' | '>' | '|' | '~' => out.push(' '),
            // A list bullet at the start of a line.
            '-' | '+' if word_start && rest[1..].starts_with(' ') => out.push(' '),
            _ => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    let words: Vec<&str> = out.split_whitespace().collect();
    let mut text = words.join(" ");
    // "word ." left by a removed citation.
    for p in [" .", " ,", " !", " ?", " ;", " :"] {
        text = text.replace(p, &p[1..]);
    }
    text
}

fn is_handle(p: &str) -> bool {
    p.len() >= 2 && p.starts_with('S') && p[1..].bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentences(deltas: &[&str]) -> Vec<(String, bool)> {
        let mut sp = Speaker::default();
        let mut out = Vec::new();
        let mut sink = |e: &Ev| {
            if let Ev::Sentence { text, progress } = e {
                out.push((text.clone(), *progress));
            }
        };
        for d in deltas {
            sp.relay(&Ev::Content((*d).into()), &mut sink);
        }
        sp.flush(&mut sink);
        out
    }

    #[test]
    fn sentences_come_out_plain_as_they_complete_however_the_text_is_split() {
        let text = "## Sockets\n\nThe daemon uses a **Unix socket** [S1]. See https://example.com/x for more! \
                    It is created with mode `0600`, e.g. only you can connect [S1, S2]. Done";
        let want = vec![
            "Sockets",
            "The daemon uses a Unix socket.",
            "See for more!",
            "It is created with mode 0600, e.g. only you can connect.",
            "Done",
        ];
        let whole: Vec<String> = sentences(&[text]).into_iter().map(|(s, _)| s).collect();
        assert_eq!(whole, want);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        let split: Vec<String> = sentences(&refs).into_iter().map(|(s, _)| s).collect();
        assert_eq!(split, want);
    }

    #[test]
    fn long_text_without_spaces_or_ends_is_cut_at_char_boundaries() {
        let mut sp = Speaker::default();
        let mut spoken = Vec::new();
        let text = "研究在达到轮次上限时结束".repeat(20);
        for c in text.chars() {
            sp.relay(&Ev::Content(c.to_string()), &mut |e: &Ev| {
                if let Ev::Sentence { text, .. } = e {
                    spoken.push(text.clone());
                }
            });
        }
        sp.flush(&mut |e: &Ev| {
            if let Ev::Sentence { text, .. } = e {
                spoken.push(text.clone());
            }
        });
        assert!(spoken.len() >= 2, "{spoken:?}");
        assert_eq!(spoken.concat(), text);
    }

    #[test]
    fn a_tool_round_is_announced_once_and_list_numbers_do_not_end_sentences() {
        let mut sp = Speaker::default();
        let mut out = Vec::new();
        let mut sink = |e: &Ev| {
            if let Ev::Sentence { text, progress } = e {
                out.push((text.clone(), *progress));
            }
        };
        let call = |round| Ev::ToolCall {
            round,
            id: "c".into(),
            name: "search_sources".into(),
            arguments: serde_json::json!({}),
            by: crate::events::By::Model,
        };
        sp.relay(&Ev::Content("Checking".into()), &mut sink);
        sp.relay(&call(1), &mut sink);
        sp.relay(&call(1), &mut sink);
        sp.relay(&Ev::Content("1. First point. 2. Second".into()), &mut sink);
        sp.flush(&mut sink);
        assert_eq!(
            out,
            vec![
                ("Checking".to_owned(), false),
                ("Let me look that up.".to_owned(), true),
                ("1. First point.".to_owned(), false),
                ("2. Second".to_owned(), false),
            ]
        );
        assert_eq!(
            plain("<tool_call>{\"a\": 1}</tool_call> [link](http://x.y) - item"),
            "{\"a\": 1} link item"
        );
    }

    proptest::proptest! {
        /// Any text: a sentence end is a char boundary inside the text and
        /// past its start (a long run of a script without spaces, a leading
        /// ideographic space: the cut never splits a character).
        #[test]
        fn a_sentence_end_is_always_a_char_boundary(s in "\\PC{0,40}", n in 0usize..300) {
            for text in [s.repeat(n / s.len().max(1) + 1), format!("\u{3000}{}", "天".repeat(n + 140)), "天".repeat(n + 140)] {
                if let Some(end) = sentence_end(&text) {
                    proptest::prop_assert!(end > 0 && end <= text.len() && text.is_char_boundary(end));
                }
            }
        }
    }
}
