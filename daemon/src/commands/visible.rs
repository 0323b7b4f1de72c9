//! Model text made safe to print for a person: every control character
//! but newline and tab (C0, DEL and C1) shown as a visible stand-in, so a
//! model — or a document it quotes — cannot drive the terminal (retitle
//! it, clear it, hide or rewrite text, ring it) through `agentd ask`,
//! `agentd chat` or `agentd generate`. JSON output is left alone: JSON
//! already escapes control characters.

use std::borrow::Cow;

/// `text` with every control character except `\n` and `\t` replaced by a
/// visible stand-in: a C0 character by its Unicode control picture (ESC is
/// `␛`, BEL `␇`, CR `␍`), DEL by `␡`, and a C1 character (U+0080–U+009F) by
/// its escape, `\u{9b}`. Everything else, newlines and tabs included, is
/// kept as it is; text with nothing to replace is not copied.
pub(crate) fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(replaced) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !replaced(c) => out.push(c),
            // U+2400 CONTROL PICTURE FOR NULL onwards, in C0's order.
            '\0'..='\u{1f}' => out.push(char::from_u32(0x2400 + c as u32).unwrap_or('\u{fffd}')),
            '\u{7f}' => out.push('\u{2421}'),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// Whether `visible` replaces `c`.
fn replaced(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_shown_not_sent() {
        assert_eq!(visible("a\x1b]0;pwned\x07b"), "a␛]0;pwned␇b");
        assert_eq!(visible("\x1b[2J\x1b[8mhidden"), "␛[2J␛[8mhidden");
        assert_eq!(visible("over\rwrite\x7f"), "over␍write␡");
        assert_eq!(visible("\u{9b}31m \u{9d}0;x\u{9c}"), "\\u{9b}31m \\u{9d}0;x\\u{9c}");
        assert_eq!(visible("\0"), "␀");
    }

    #[test]
    fn text_without_controls_is_kept_as_is() {
        for s in ["", "plain", "two\nlines\tand a tab", "é 日本語 🎉 ␛ \\u{1b}"] {
            assert!(matches!(visible(s), Cow::Borrowed(b) if b == s), "{s:?}");
        }
    }

    proptest::proptest! {
        /// Any text: what is printed holds no control character but `\n`
        /// and `\t`, keeps every other character in order, and is the same
        /// whether the text comes whole or in pieces (streamed deltas).
        #[test]
        fn nothing_printed_is_a_control(text in "(\\PC|[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}]){0,200}", at in 0usize..200) {
            let out = visible(&text);
            proptest::prop_assert!(!out.chars().any(replaced), "{:?}", out);
            // The other characters are all there, in order.
            let mut rest = out.chars();
            for c in text.chars().filter(|c| !replaced(*c)) {
                proptest::prop_assert!(rest.any(|o| o == c), "{:?} lost {:?}", out, c);
            }
            let cut = text.char_indices().map(|(i, _)| i).find(|&i| i >= at).unwrap_or(text.len());
            let pieces = format!("{}{}", visible(&text[..cut]), visible(&text[cut..]));
            proptest::prop_assert_eq!(pieces, out.into_owned());
        }
    }
}
