//! Fitting the model's view into its context: the system prompt, the
//! original question and every call/result pair stay; the oldest tool
//! results are shortened first, each with a visible marker.

use crate::Message;

/// The view cannot fit even with every result shortened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overflow {
    /// Tokens the smallest view needs.
    pub need: usize,
    /// Tokens available.
    pub limit: usize,
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request needs {} tokens but the context allows {}", self.need, self.limit)
    }
}

impl std::error::Error for Overflow {}

/// Characters a shortened result keeps.
pub const SHORTENED_KEEP: usize = 240;

/// The marker that replaces the cut part of a result.
pub fn marker(omitted: usize) -> String {
    format!("\n[… {omitted} characters of this tool result were shortened to fit the context …]\n")
}

fn shorten(text: &str, keep: usize) -> Option<String> {
    let chars = text.chars().count();
    if chars <= keep + 80 {
        return None;
    }
    let head: String = text.chars().take(keep * 2 / 3).collect();
    let tail: String = text.chars().skip(chars - keep / 3).collect();
    Some(format!("{head}{}{tail}", marker(chars - keep)))
}

/// Returns `messages` fitted to `limit` tokens as measured by `count`,
/// shortening tool results oldest first. `Ok` carries how many results were
/// shortened.
pub fn fit(
    messages: &[Message],
    limit: usize,
    count: &mut dyn FnMut(&[Message]) -> usize,
) -> Result<(Vec<Message>, usize), Overflow> {
    let mut view = messages.to_vec();
    let mut n = count(&view);
    if n <= limit {
        return Ok((view, 0));
    }
    let mut shortened = 0;
    for i in 0..view.len() {
        if view[i].role != "tool" {
            continue;
        }
        if let Some(s) = shorten(&view[i].content, SHORTENED_KEEP) {
            view[i].content = s;
            shortened += 1;
            n = count(&view);
            if n <= limit {
                return Ok((view, shortened));
            }
        }
    }
    Err(Overflow { need: n, limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_results_are_shortened_first_and_marked() {
        let big = "x".repeat(4000);
        let msgs = vec![
            Message::new("system", "s"),
            Message::new("user", "q"),
            Message::new("tool", big.clone()),
            Message::new("tool", big.clone()),
        ];
        let mut count = |m: &[Message]| m.iter().map(|m| m.content.len() / 4).sum();
        let (v, k) = fit(&msgs, 1200, &mut count).unwrap();
        assert_eq!(k, 1);
        assert!(v[2].content.contains("shortened to fit"));
        assert_eq!(v[3].content, big);
        assert_eq!(v[1].content, "q");
        let e = fit(&msgs, 10, &mut count).unwrap_err();
        assert!(e.need > 10 && e.limit == 10);
        assert!(e.to_string().contains("10"));
    }
}
