//! Marker search over a growing buffer, holding back only what could still
//! be the start of a marker.
//!
//! INVARIANT: the answer depends only on the text, never on how it was split
//! into deltas: a position is reported as a match only when no longer marker
//! could still match there, and a position is reported safe only when no
//! marker can start there whatever text follows.

/// The outcome of [`find_first`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Find {
    /// Marker number `idx` starts at byte `at`; no marker starts earlier.
    Found { at: usize, idx: usize },
    /// No marker starts before byte `safe`. Without `eof`, the bytes from
    /// `safe` on may still begin a marker once more text arrives; with `eof`,
    /// `safe` is the whole input.
    Clear { safe: usize },
}

/// Finds the earliest marker in `hay`; at one position the longest marker
/// wins. Without `eof`, a position whose text is a proper prefix of a marker
/// (or of a longer marker than the one that matched) stops the search.
pub(crate) fn find_first(hay: &str, markers: &[&str], eof: bool) -> Find {
    let bytes = hay.as_bytes();
    let mut firsts = [false; 256];
    for m in markers {
        if let Some(&b) = m.as_bytes().first() {
            firsts[b as usize] = true;
        }
    }
    for (i, &b) in bytes.iter().enumerate() {
        if !firsts[b as usize] {
            continue;
        }
        let rest = &bytes[i..];
        let mut best: Option<(usize, usize)> = None; // (len, idx)
        let mut pending = false;
        for (idx, m) in markers.iter().enumerate() {
            let mb = m.as_bytes();
            if mb.is_empty() {
                continue;
            }
            if rest.len() >= mb.len() {
                if &rest[..mb.len()] == mb && best.is_none_or(|(len, _)| mb.len() > len) {
                    best = Some((mb.len(), idx));
                }
            } else if !eof && mb.starts_with(rest) {
                pending = true;
            }
        }
        if pending {
            return Find::Clear { safe: i };
        }
        if let Some((_, idx)) = best {
            return Find::Found { at: i, idx };
        }
    }
    Find::Clear { safe: hay.len() }
}

/// Whether `hay` starts with `lit`, or could once more text arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prefix {
    Yes,
    No,
    NeedMore,
}

/// Checks whether `hay` begins with `lit`.
pub(crate) fn starts_with(hay: &str, lit: &str, eof: bool) -> Prefix {
    if hay.starts_with(lit) {
        Prefix::Yes
    } else if !eof && lit.starts_with(hay) {
        Prefix::NeedMore
    } else {
        Prefix::No
    }
}

/// Length of the leading whitespace of `s`.
pub(crate) fn ws_len(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_a_partial_marker() {
        assert_eq!(find_first("abc<tool", &["<tool_call>"], false), Find::Clear { safe: 3 });
        assert_eq!(find_first("abc<tool", &["<tool_call>"], true), Find::Clear { safe: 8 });
        assert_eq!(find_first("abc<toolx", &["<tool_call>"], false), Find::Clear { safe: 9 });
    }

    #[test]
    fn longest_marker_wins_and_waits_for_it() {
        let m = ["[THINK]", "[THINK]x"];
        assert_eq!(find_first("a[THINK]", &m, false), Find::Clear { safe: 1 });
        assert_eq!(find_first("a[THINK]", &m, true), Find::Found { at: 1, idx: 0 });
        assert_eq!(find_first("a[THINK]x", &m, false), Find::Found { at: 1, idx: 1 });
        assert_eq!(find_first("a[THINK]y", &m, false), Find::Found { at: 1, idx: 0 });
    }

    #[test]
    fn multibyte_markers() {
        let m = ["<｜tool▁sep｜>"];
        let s = "ab<｜tool▁";
        assert_eq!(find_first(s, &m, false), Find::Clear { safe: 2 });
        assert_eq!(find_first("ab<｜tool▁sep｜>c", &m, false), Find::Found { at: 2, idx: 0 });
    }
}
