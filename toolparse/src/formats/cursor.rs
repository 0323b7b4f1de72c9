//! A cursor over complete text, with the primitives the recursive-descent
//! parsers of call bodies read it by: Gemma 4's object notation and Python
//! literals (Llama 4's pythonic calls).
//!
//! ```text
//! {city:<|"|>Paris<|"|>,days:3}
//! get_weather(city="Paris", days=3)
//! ```
//!
//! Each syntax says what whitespace is ([`Cursor::new`]); the rest is
//! alike: look at what comes next, read a literal or a run of a kind, go
//! back to a saved position.

/// A position in complete text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor<'a> {
    text: &'a str,
    at: usize,
    /// The length of the whitespace at the start of a text, as the syntax
    /// counts it.
    ws: fn(&str) -> usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `text`, skipping whitespace as `ws`
    /// measures it.
    pub(crate) fn new(text: &'a str, ws: fn(&str) -> usize) -> Cursor<'a> {
        Cursor { text, at: 0, ws }
    }

    /// The text not read yet.
    pub(crate) fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    /// Whether the whole text has been read.
    pub(crate) fn done(&self) -> bool {
        self.at == self.text.len()
    }

    /// The next byte, not read.
    pub(crate) fn peek(&self) -> Option<u8> {
        self.rest().as_bytes().first().copied()
    }

    /// Where the cursor is, for [`Cursor::reset`].
    pub(crate) fn pos(&self) -> usize {
        self.at
    }

    /// Goes back to a position [`Cursor::pos`] gave.
    pub(crate) fn reset(&mut self, pos: usize) {
        self.at = pos;
    }

    /// Reads the whitespace that follows.
    pub(crate) fn ws(&mut self) {
        self.at += (self.ws)(self.rest());
    }

    /// Reads `n` bytes (ending on a char boundary).
    pub(crate) fn skip(&mut self, n: usize) {
        self.at += n;
    }

    /// Reads `lit` when the text goes on with it; says whether it did.
    pub(crate) fn eat(&mut self, lit: &str) -> bool {
        let found = self.rest().starts_with(lit);
        if found {
            self.at += lit.len();
        }
        found
    }

    /// Reads the run that `len` measures at the start of the rest (an
    /// identifier, say); `None`, reading nothing, when it is empty.
    pub(crate) fn word(&mut self, len: fn(&str) -> usize) -> Option<&'a str> {
        let rest = self.rest();
        let n = len(rest);
        self.at += n;
        (n > 0).then(|| &rest[..n])
    }

    /// Reads the text up to `delim` and `delim` itself, and gives the text;
    /// `None`, reading nothing, when no `delim` follows.
    pub(crate) fn until(&mut self, delim: &str) -> Option<&'a str> {
        let rest = self.rest();
        let n = rest.find(delim)?;
        self.at += n + delim.len();
        Some(&rest[..n])
    }
}
