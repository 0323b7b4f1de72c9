//! The texts a reply ends with when no answer could be written: a labelled,
//! bounded excerpt of the evidence (never presented as an answer), and a
//! brief spoken fallback for voice front-ends.

/// One piece of retrieved evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The source handle (`S3`).
    pub handle: String,
    /// The source title.
    pub title: String,
    /// What was retrieved (a segment read, or a search snippet).
    pub text: String,
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
