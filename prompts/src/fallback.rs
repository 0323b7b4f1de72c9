//! The texts a reply ends with when no answer could be written: a labelled,
//! bounded excerpt of the evidence (never presented as an answer), and a
//! brief spoken fallback for voice front-ends.

use crate::evidence::Unit;

/// One piece of retrieved evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The source handle (`S3`).
    pub handle: String,
    /// The source title.
    pub title: String,
    /// What was retrieved (a segment read, or a search snippet).
    pub text: String,
    /// The heading of the section a read segment continues (may be empty).
    pub heading: String,
}

/// The label line of an excerpt.
pub const EXCERPT_LABEL: &str = "Unverified excerpt of the evidence retrieved — not an answer:";

/// At most this many characters in an excerpt, label included.
pub const EXCERPT_MAX: usize = 1500;

/// A labelled excerpt of `evidence`, at most `max` characters.
pub fn excerpt(evidence: &[Evidence], max: usize) -> String {
    let mut out = String::from(EXCERPT_LABEL);
    if evidence.is_empty() {
        out.push_str("\n(no sources were retrieved for this question)");
        return truncate(&out, max);
    }
    let budget = max.saturating_sub(out.chars().count());
    let per = (budget / evidence.len().clamp(1, 6)).max(80);
    for e in evidence {
        let used = out.chars().count();
        if used + 20 >= max {
            break;
        }
        let head = format!("\n[{}] {}: ", e.handle, e.title.trim());
        let text: String = e.text.split_whitespace().collect::<Vec<_>>().join(" ");
        let room = per.min(max - used).saturating_sub(head.chars().count());
        if room < 10 {
            break;
        }
        let body = truncate(&text, room);
        out.push_str(&head);
        out.push_str(&body);
    }
    truncate(&out, max)
}

/// A labelled excerpt of the most relevant sentences (`units`, best
/// first), each with its handle, at most `max` characters; with none, the
/// excerpt of the evidence as retrieved.
pub fn excerpt_sentences(units: &[Unit], evidence: &[Evidence], max: usize) -> String {
    if units.is_empty() {
        return excerpt(evidence, max);
    }
    let mut out = String::from(EXCERPT_LABEL);
    for u in units {
        let line = format!("\n[{}] {}", u.handle, u.text);
        if out.chars().count() + line.chars().count() > max {
            break;
        }
        out.push_str(&line);
    }
    truncate(&out, max)
}

/// The spoken fallback that still carries what the sources say: the most
/// relevant sentence (`best`, plain text), introduced as what the sources
/// say rather than a checked answer; without one, [`spoken`].
pub fn spoken_with(best: Option<&str>, sources: usize) -> String {
    match best.map(str::trim).filter(|b| !b.is_empty()) {
        Some(b) => {
            let words: Vec<&str> = b.split_whitespace().take(40).collect();
            let mut b = words.join(" ");
            if !b.ends_with(['.', '!', '?']) {
                b.push('.');
            }
            format!("I could not write a checked answer, but your sources say: {b}")
        }
        None => spoken(sources),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// One or two plain sentences a TTS engine can read: no markup, no URLs,
/// at most 40 words.
pub fn spoken(sources: usize) -> String {
    match sources {
        0 => "Sorry, I could not finish an answer this time. Please try asking again in a different way.".into(),
        1 => "Sorry, I could not finish a checked answer. I found one source that may help, so please ask again a little more narrowly.".into(),
        n => format!(
            "Sorry, I could not finish a checked answer. I found {n} sources that may help, so please ask again a little more narrowly."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_labelled_bounded_and_cite_handles() {
        let ev: Vec<Evidence> = (1..=9)
            .map(|i| Evidence {
                handle: format!("S{i}"),
                title: format!("Doc {i}"),
                text: "word ".repeat(400),
                heading: String::new(),
            })
            .collect();
        let x = excerpt(&ev, EXCERPT_MAX);
        assert!(x.chars().count() <= EXCERPT_MAX);
        assert!(x.lines().next().unwrap().contains("excerpt"));
        assert!(x.contains("[S1] Doc 1: "));
        let empty = excerpt(&[], EXCERPT_MAX);
        assert!(empty.contains("excerpt") && empty.contains("no sources"));
    }

    #[test]
    fn sentence_excerpts_are_labelled_and_cite_each_sentence() {
        let u = Unit {
            handle: "S2".into(),
            text: "Requests time out after 300000 ms.".into(),
            heading: String::new(),
            score: 1.0,
            order: (0, 0),
        };
        let x = excerpt_sentences(&[u], &[], EXCERPT_MAX);
        assert_eq!(x, format!("{EXCERPT_LABEL}\n[S2] Requests time out after 300000 ms."));
        assert!(excerpt_sentences(&[], &[], EXCERPT_MAX).contains("no sources"));
        let s = spoken_with(Some("Requests time out after 300000 ms"), 1);
        assert!(s.ends_with("300000 ms.") && s.contains("sources say"), "{s}");
    }

    #[test]
    fn spoken_fallbacks_are_short_and_plain() {
        for n in [0, 1, 5] {
            let s = spoken(n);
            assert!(s.split_whitespace().count() <= 40);
            assert!(
                !s.contains('[') && !s.contains("http") && !s.contains('<') && !s.contains('*')
            );
        }
    }
}
