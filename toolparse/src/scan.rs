//! Marker search over a growing buffer, holding back only what could still
//! be the start of a marker.
//!
//! INVARIANT: the answer depends only on the text, never on how it was split
//! into deltas: a position is reported as a match only when no longer marker
//! could still match there, and a position is reported safe only when no
//! marker can start there whatever text follows.

/// Counts the bytes the scanners examine, so tests can check that parsing
/// a long text pushed a char at a time stays linear (a count of work, not a
/// clock). Only test builds count.
#[cfg(test)]
pub(crate) mod work {
    use std::cell::Cell;

    thread_local! {
        static SCANNED: Cell<u64> = const { Cell::new(0) };
    }

    pub(crate) fn add(n: usize) {
        SCANNED.with(|c| c.set(c.get() + n as u64));
    }

    /// Runs `f`; returns its result and the bytes scanned meanwhile.
    pub(crate) fn measure<T>(f: impl FnOnce() -> T) -> (T, u64) {
        let before = SCANNED.with(Cell::get);
        let out = f();
        (out, SCANNED.with(Cell::get) - before)
    }
}

/// Records that a scanner examined `n` bytes (test builds only).
#[inline]
pub(crate) fn scanned(n: usize) {
    #[cfg(test)]
    work::add(n);
    #[cfg(not(test))]
    let _ = n;
}

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
            scanned(i + 1);
            return Find::Clear { safe: i };
        }
        if let Some((_, idx)) = best {
            scanned(i + 1);
            return Find::Found { at: i, idx };
        }
    }
    scanned(hay.len());
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

/// The last char boundary of `s` at or before `i`.
pub(crate) fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The first char boundary of `s` at or after `i` (or its length).
pub(crate) fn ceil_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Appends `text` to `buf`, which may hold at most `cap` bytes.
///
/// `Err(k)` when `text` would take `buf` past the cap: then only `text[..k]`
/// was appended, ending at the first char boundary past the cap, so `buf` is
/// cut at a fixed offset from its start whatever the deltas were.
pub(crate) fn push_capped(buf: &mut String, text: &str, cap: usize) -> Result<(), usize> {
    if buf.len() + text.len() <= cap {
        buf.push_str(text);
        return Ok(());
    }
    let k = ceil_boundary(text, (cap + 1).saturating_sub(buf.len()));
    buf.push_str(&text[..k]);
    Err(k)
}

/// Which of several literals text begins with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lead {
    /// With literal number `idx`.
    Is(usize),
    /// It may, once more text arrives.
    More,
    /// With none of them.
    No,
}

/// Checks which of `lits` `t` begins with (the first that matches).
pub(crate) fn lead_any(t: &str, lits: &[&str], eof: bool) -> Lead {
    let mut more = false;
    for (i, lit) in lits.iter().enumerate() {
        match starts_with(t, lit, eof) {
            Prefix::Yes => return Lead::Is(i),
            Prefix::NeedMore => more = true,
            Prefix::No => {}
        }
    }
    if more {
        Lead::More
    } else {
        Lead::No
    }
}

/// Whether a candidate closing tag really closes, judged by what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Follow {
    Accept,
    Wait,
    Reject,
}

/// A closing tag is structural when, after whitespace, the text ends or one
/// of `next` follows.
pub(crate) fn follow(after: &str, next: &[&str], eof: bool) -> Follow {
    let t = &after[ws_len(after)..];
    if t.is_empty() {
        return if eof { Follow::Accept } else { Follow::Wait };
    }
    match lead_any(t, next, eof) {
        Lead::Is(_) => Follow::Accept,
        Lead::More => Follow::Wait,
        Lead::No => Follow::Reject,
    }
}

/// [`follow`], except that more than `hold` bytes of whitespace after the
/// tag decide on their own (the tag is not structural), so the verdict
/// never waits on an unbounded run.
pub(crate) fn follow_within(after: &str, next: &[&str], eof: bool, hold: usize) -> Follow {
    if ws_len(after) > hold {
        return Follow::Reject;
    }
    follow(after, next, eof)
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
