//! Server-sent events (`text/event-stream`, as the WHATWG HTML standard's
//! "Server-sent events" section parses it), read line by line: the one
//! reader of the streams the daemon consumes — an upstream's chat
//! completions (`openai.rs`, `upstream.rs`) and its own research events
//! (`commands/client.rs`).
//!
//! A line `field: value` (one space after the colon is dropped, if there)
//! sets a field of the message being read: `data` lines append to its data,
//! joined by `\n`; `event` names it; `id` and `retry`, and fields of no
//! meaning, are ignored. A line starting with `:` is a comment (keep-alive).
//! A blank line ends the message; one with no `data` line is none. The end
//! of the stream ends a message its last lines left open (a lenient reading:
//! the standard drops it, but an upstream that closes right after its
//! `data: [DONE]` line still ends the reply).

use std::io::BufRead;

/// One message of the stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Message {
    /// The `event` name; empty for the default, `message`.
    pub(crate) event: String,
    /// The `data` lines, joined by `\n`.
    pub(crate) data: String,
}

impl Message {
    /// The OpenAI-style end of the stream, `data: [DONE]`.
    pub(crate) fn is_done(&self) -> bool {
        self.data.trim() == "[DONE]"
    }
}

/// The message being read, fed one line at a time.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    event: String,
    data: String,
    /// A `data` line was seen (the data may still be empty).
    has_data: bool,
}

impl Decoder {
    pub(crate) fn new() -> Decoder {
        Decoder::default()
    }

    /// Feeds one line (its line ending, if any, is ignored); the message a
    /// blank line ends.
    pub(crate) fn line(&mut self, line: &str) -> Option<Message> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => value.clone_into(&mut self.event),
            _ => {}
        }
        None
    }

    /// The stream ended: the message its last lines left open, if any.
    pub(crate) fn finish(&mut self) -> Option<Message> {
        self.dispatch()
    }

    fn dispatch(&mut self) -> Option<Message> {
        let had = std::mem::take(&mut self.has_data);
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        had.then_some(Message { event, data })
    }
}

/// The messages of a stream read from `R`, each as soon as the blank line
/// that ends it arrives.
#[derive(Debug)]
pub(crate) struct Reader<R> {
    inner: R,
    decoder: Decoder,
    line: String,
    /// A line was read (a byte-order mark is skipped before the first).
    started: bool,
    ended: bool,
}

impl<R: BufRead> Reader<R> {
    pub(crate) fn new(inner: R) -> Reader<R> {
        Reader { inner, decoder: Decoder::new(), line: String::new(), started: false, ended: false }
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = std::io::Result<Message>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.ended {
            self.line.clear();
            match self.inner.read_line(&mut self.line) {
                Err(e) => {
                    self.ended = true;
                    return Some(Err(e));
                }
                Ok(0) => {
                    self.ended = true;
                    return self.decoder.finish().map(Ok);
                }
                Ok(_) => {}
            }
            let mut line = self.line.as_str();
            if !std::mem::replace(&mut self.started, true) {
                line = line.strip_prefix('\u{feff}').unwrap_or(line);
            }
            if let Some(m) = self.decoder.line(line) {
                return Some(Ok(m));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Vec<Message> {
        Reader::new(text.as_bytes()).collect::<std::io::Result<_>>().unwrap()
    }

    fn data(d: &str) -> Message {
        Message { event: String::new(), data: d.into() }
    }

    #[test]
    fn data_lines_with_and_without_the_space() {
        assert_eq!(
            read("data: {\"a\":1}\n\ndata:x\n\ndata:  two\n\n"),
            [data("{\"a\":1}"), data("x"), data(" two")]
        );
    }

    #[test]
    fn a_message_of_several_data_lines_joins_them() {
        assert_eq!(read("data: one\ndata:\ndata: three\n\n"), [data("one\n\nthree")]);
        // An empty data line is still a message; a lone blank line is none.
        assert_eq!(read("\n\ndata:\n\n"), [data("")]);
    }

    #[test]
    fn events_comments_and_other_fields() {
        let got =
            read(": keep-alive\n\nevent: error\nid: 7\nretry: 10\ndata: {}\n\ndata: next\n\n");
        assert_eq!(got, [Message { event: "error".into(), data: "{}".into() }, data("next")]);
        // An event name without data sends nothing, and does not leak on.
        assert_eq!(read("event: ping\n\ndata: d\n\n"), [data("d")]);
        // A field line without a colon is a field with an empty value.
        assert_eq!(read("data\n\n"), [data("")]);
    }

    #[test]
    fn line_endings_and_the_end_of_the_stream() {
        assert_eq!(read("data: a\r\n\r\ndata: b\r\n\r\n"), [data("a"), data("b")]);
        // A byte-order mark opens the stream; anywhere else it is text (here
        // of a field name, so the line means nothing).
        assert_eq!(read("\u{feff}data: a\n\n\u{feff}data: b\n\n"), [data("a")]);
        // The last message needs no blank line; `[DONE]` is a message.
        let got = read("data: a\n\ndata: [DONE]");
        assert_eq!(got, [data("a"), data("[DONE]")]);
        assert!(got[1].is_done() && !got[0].is_done());
        assert_eq!(read(""), []);
    }

    #[test]
    fn the_decoder_takes_lines_as_they_come() {
        let mut d = Decoder::new();
        assert_eq!(d.line("data: a\n"), None);
        assert_eq!(d.line("data: b"), None);
        assert_eq!(d.line("\n"), Some(data("a\nb")));
        assert_eq!(d.line(":c\n"), None);
        assert_eq!(d.line("data: [DONE]\n"), None);
        assert_eq!(d.finish(), Some(data("[DONE]")));
        assert_eq!(d.finish(), None);
    }
}
