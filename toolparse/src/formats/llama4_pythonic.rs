//! Llama 4 pythonic calls: a Python list of calls with keyword arguments,
//! optionally wrapped in `<|python_start|>` … `<|python_end|>`.
//!
//! ```text
//! <|python_start|>[get_weather(city="Paris", unit='c'), search(q="café \"best\"", filters={"max": 3, "tags": ["a", "b"]}, strict=True, page=None), get_time()]<|python_end|>
//! ```
//!
//! A list counts as calls when it starts the text, follows whitespace or a
//! marker (not a word, so `a[f(x=1)]` is not one), and opens like
//! `[name(` followed by `)` or `key=`; anything else is content. Each element
//! is `name(key=value, …)` (a dotted name is kept whole); values are Python
//! literals ([`super::python`]). The end of each call is found by scanning
//! Python tokens, so `]`, `)` or marker text inside a string does not end it.
//!
//! A list that does not parse is content (once it looked like calls, it is
//! malformed markup). A call whose literal has no JSON value (bytes,
//! complex, `1e999`, sets, f-strings) is dropped and its siblings are kept.
//! The list is one Python expression: its calls stand only once its `]`
//! closes it, so a list cut by the token limit yields no call (not even one
//! whose `)` came), and a list left open by a stop is content. Whitespace
//! inside the list is markup; text around it is content, verbatim. Turn tokens (`<|eot|>`, `<|eom|>`,
//! header tokens, Llama 3's `<|eot_id|>` …) are stripped.

use super::python::{ident_len, parse_call, py_ws, Bad, PyEnd, PyScan};
use super::{Machine, Step};
use crate::cx::Cx;
use crate::scan::{find_first, Find};
use crate::{FinishReason, Options};

const PY_START: &str = "<|python_start|>";

/// Markers stripped from content; `[` may open a call list.
const CONTENT_MARKERS: [&str; 14] = [
    "[",
    PY_START,
    "<|python_end|>",
    "<|eot|>",
    "<|eom|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|python_tag|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
];

/// The longest `name(` header (or whitespace run between calls) waited for.
const HEADER_MAX: usize = 512;

#[derive(Debug)]
pub(crate) enum State {
    /// `open`: a `[` here may start a call list (start of text, after
    /// whitespace or a marker).
    Content { open: bool },
    /// The input starts with the `[` of a call list.
    List(List),
}

#[derive(Debug)]
pub(crate) struct List {
    calls: Vec<(String, String)>,
    phase: Phase,
    /// Whether a whole call header was seen: failures are then malformed
    /// markup rather than prose.
    markup: bool,
}

#[derive(Debug)]
enum Phase {
    /// An element (or the closing `]`) starts at this offset.
    Element(usize),
    /// Scanning the element that starts at `start` for its `)`.
    Body { start: usize, scan: PyScan },
    /// After an element, at this offset: `,` or `]` follow.
    After(usize),
}

#[derive(Debug)]
pub(crate) struct Llama4Pythonic {
    state: State,
}

impl Llama4Pythonic {
    pub(crate) fn new(_opts: &Options) -> Llama4Pythonic {
        Llama4Pythonic { state: State::Content { open: true } }
    }
}

/// A held list is decided: this many bytes are consumed, and whether a
/// `[` right after them may open a list.
struct Decided(usize, bool);

impl Machine for Llama4Pythonic {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Content { open } => match find_first(input, &CONTENT_MARKERS, eof) {
                Find::Found { at, idx: 0 } => {
                    let before = &input[..at];
                    let ok = before.chars().next_back().map_or(*open, opens_list);
                    if !ok {
                        cx.content(&input[..=at]);
                        *open = false;
                        return Step::took(at + 1);
                    }
                    cx.content(before);
                    self.state = State::List(List {
                        calls: Vec::new(),
                        phase: Phase::Element(1),
                        markup: false,
                    });
                    Step::moved(at)
                }
                Find::Found { at, idx } => {
                    cx.content(&input[..at]);
                    *open = true;
                    Step::took(at + CONTENT_MARKERS[idx].len())
                }
                Find::Clear { safe } => {
                    cx.content(&input[..safe]);
                    if let Some(c) = input[..safe].chars().next_back() {
                        *open = opens_list(c);
                    }
                    Step::up_to(safe)
                }
            },
            State::List(list) => match list_step(list, input, end, cx) {
                None => Step::Wait,
                Some(Decided(n, open)) => {
                    self.state = State::Content { open };
                    Step::moved(n)
                }
            },
        }
    }

    /// A call list waits unconsumed from its `[`.
    fn held(&self) -> usize {
        0
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        match &self.state {
            State::List(list) if list.markup => cx.malformed(text),
            _ => cx.content(text),
        }
        self.state = State::Content { open: false };
    }
}

/// Whether a `[` right after `c` may open a call list: not after a word,
/// a closing bracket, a quote or a backtick (`a[f(x=1)]`, `` `[f()]` ``).
fn opens_list(c: char) -> bool {
    !(c.is_alphanumeric() || "_)]}[`'\"\\".contains(c))
}

/// Works through a held call list (the input starts at its `[`); `None`
/// waits for more text.
fn list_step(
    list: &mut List,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> Option<Decided> {
    loop {
        match &mut list.phase {
            Phase::Element(at) => {
                let j = *at + py_ws(&input[*at..]);
                if j - *at > HEADER_MAX {
                    return Some(not_a_list(list, input, j, cx));
                }
                if list.markup && input[j..].starts_with(']') {
                    return Some(close(list, j, cx));
                }
                if continuation_pending(input, j, end) {
                    break;
                }
                match header(&input[j..]) {
                    Head::Ok(paren) => {
                        list.markup = true;
                        list.phase = Phase::Body { start: j, scan: PyScan::new(j + paren + 1) };
                        continue;
                    }
                    Head::NeedMore => break,
                    Head::Invalid => return Some(not_a_list(list, input, j, cx)),
                }
            }
            Phase::Body { start, scan } => match scan.scan(input) {
                PyEnd::Done(e) => {
                    match parse_call(&input[*start..e]) {
                        Ok(call) => list.calls.push(call),
                        Err(Bad::Value) => {}
                        Err(Bad::Syntax) => return Some(not_a_list(list, input, e, cx)),
                    }
                    list.phase = Phase::After(e);
                }
                PyEnd::Partial => break,
                PyEnd::Invalid(at) => return Some(not_a_list(list, input, at, cx)),
            },
            Phase::After(at) => {
                let at = *at;
                let j = at + py_ws(&input[at..]);
                if j - at > HEADER_MAX {
                    return Some(not_a_list(list, input, j, cx));
                }
                if continuation_pending(input, j, end) {
                    break;
                }
                match input.as_bytes().get(j) {
                    Some(b']') => return Some(close(list, j, cx)),
                    Some(b',') => list.phase = Phase::Element(j + 1),
                    Some(_) => return Some(not_a_list(list, input, at, cx)),
                    None => break,
                }
            }
        }
    }
    // The list goes on past the text seen so far.
    match end {
        None => return None,
        // Cut by the token limit before the list closed: no call of it
        // stands, and nothing of the cut markup is shown.
        Some(FinishReason::Length) => {}
        Some(FinishReason::Stop) if list.markup => cx.malformed(input),
        Some(FinishReason::Stop) => cx.content(input),
    }
    Some(Decided(input.len(), false))
}

/// Whether the whitespace at `j` may still be a line continuation: a `\`
/// that ends the text seen so far (its `\n` may come in the next delta).
fn continuation_pending(input: &str, j: usize, end: Option<FinishReason>) -> bool {
    end.is_none() && &input[j..] == "\\"
}

/// The list closes with the `]` at `at`: its calls stand.
fn close(list: &mut List, at: usize, cx: &mut Cx) -> Decided {
    for (name, args) in list.calls.drain(..) {
        cx.call(None, &name, args);
    }
    Decided(at + 1, true)
}

/// The held text up to `at` is not a call list: it is shown as it is.
fn not_a_list(list: &mut List, input: &str, at: usize, cx: &mut Cx) -> Decided {
    if !list.markup {
        // Prose: only the `[` is decided; the rest is read as content again.
        cx.content("[");
        return Decided(1, false);
    }
    cx.malformed(&input[..at]);
    Decided(at, false)
}

enum Head {
    /// A call header; the offset of its `(`.
    Ok(usize),
    NeedMore,
    Invalid,
}

/// Checks that `s` begins like a call: `name(` then `)` or `key=`.
fn header(s: &str) -> Head {
    let more = Head::NeedMore;
    let mut i = 0;
    // The dotted name.
    loop {
        let n = ident_len(&s[i..]);
        if n == 0 {
            return if i == s.len() { more } else { Head::Invalid };
        }
        i += n;
        if i >= HEADER_MAX {
            return Head::Invalid;
        }
        if s[i..].starts_with('.') {
            i += 1;
            continue;
        }
        break;
    }
    i += py_ws(&s[i..]);
    if &s[i..] == "\\" {
        return more;
    }
    match s.as_bytes().get(i) {
        None => return more,
        Some(b'(') => {}
        Some(_) => return Head::Invalid,
    }
    let paren = i;
    i += 1;
    i += py_ws(&s[i..]);
    if &s[i..] == "\\" {
        return more;
    }
    match s.as_bytes().get(i) {
        None => return more,
        Some(b')') => return Head::Ok(paren),
        Some(_) => {}
    }
    let n = ident_len(&s[i..]);
    if n == 0 {
        return Head::Invalid;
    }
    i += n;
    if i == s.len() {
        return more;
    }
    i += py_ws(&s[i..]);
    if &s[i..] == "\\" {
        return more;
    }
    match s.as_bytes().get(i) {
        None => more,
        // `key=`, not `key==`.
        Some(b'=') => match s.as_bytes().get(i + 1) {
            None => more,
            Some(b'=') => Head::Invalid,
            Some(_) => Head::Ok(paren),
        },
        Some(_) => Head::Invalid,
    }
}

/// The grammar of calls in this format (see `grammar.rs`): not written
/// yet.
pub(crate) fn grammar(
    _tools: &[crate::grammar::GrammarTool<'_>],
    _special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    None
}

#[cfg(test)]
mod tests {
    use crate::{Accumulator, FinishReason, Format, Options, Parser};

    const GEN: &str = "<|header_start|>assistant<|header_end|>\n\n";

    fn opts() -> Options {
        Options { generation_prompt: Some(GEN.to_owned()), ..Options::default() }
    }

    #[test]
    fn long_call_pushed_by_char_is_linear() {
        let body = "y".repeat(200_000);
        let t = format!("[f(s='{body}', t=\"\"\"{body}\"\"\")]");
        let mut p = Parser::new(Format::Llama4Pythonic, opts());
        let mut acc = Accumulator::default();
        for c in t.chars() {
            acc.extend(p.push(&c.to_string()));
        }
        acc.extend(p.finish(FinishReason::Stop));
        assert_eq!(acc.calls.len(), 1);
    }
}
