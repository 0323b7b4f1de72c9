//! The output side shared by every format: the visible-text channels, call
//! bookkeeping and suppress mode.
//!
//! Text is kept verbatim: whitespace around and between calls stays where
//! the model wrote it. Only the very edges of each channel are trimmed: the
//! whitespace before its first visible character, and the whitespace after
//! its last one at the end of the text (the same as a client that strips the
//! reply; whitespace inside it is held until more text shows it is inside).
//!
//! INVARIANT: what is emitted depends only on the sequence of calls made by
//! the format machine, never on how the input was split; machines keep that
//! promise by deciding only on text they have seen in full.

use crate::json;
use crate::scan::floor_boundary;
use crate::schema::Tools;
use crate::{DropReason, Event, Mode, Options, ToolCall};

/// Whitespace held back at the end of a channel's text (it is trimmed if
/// the text ends there) is released in pieces of this many bytes, counted
/// from where the run began, so what is released depends on the text only.
const WS_CAP: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    Content,
    Reasoning,
}

#[derive(Debug, Default)]
struct TextState {
    /// Trailing whitespace not yet emitted.
    pending: String,
    /// Something visible was emitted: leading whitespace is text now.
    started: bool,
}

/// The machine's view of the output.
#[derive(Debug)]
pub(crate) struct Cx {
    out: Vec<Event>,
    mode: Mode,
    tools: Tools,
    thinking: Option<bool>,
    text: [TextState; 2],
    next_index: usize,
    open: Option<OpenCall>,
}

#[derive(Debug)]
struct OpenCall {
    index: usize,
    id: Option<String>,
    name: String,
}

impl Cx {
    pub(crate) fn new(opts: Options) -> Cx {
        Cx {
            out: Vec::new(),
            mode: opts.mode,
            tools: opts.tools,
            thinking: opts.thinking,
            text: [TextState::default(), TextState::default()],
            next_index: 0,
            open: None,
        }
    }

    pub(crate) fn take(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.out)
    }

    /// The offered tools.
    pub(crate) fn tools(&self) -> &Tools {
        &self.tools
    }

    /// Whether thinking was requested (`None`: template default).
    #[allow(dead_code)]
    pub(crate) fn thinking(&self) -> Option<bool> {
        self.thinking
    }

    /// Visible answer text.
    pub(crate) fn content(&mut self, s: &str) {
        self.text(Channel::Content, s);
    }

    /// Reasoning text.
    pub(crate) fn reasoning(&mut self, s: &str) {
        self.text(Channel::Reasoning, s);
    }

    fn text(&mut self, ch: Channel, s: &str) {
        let t = &mut self.text[ch as usize];
        let mut s = s;
        if !t.started {
            s = s.trim_start();
            if s.is_empty() {
                return;
            }
            t.started = true;
        }
        let body = s.trim_end().len();
        if body == 0 {
            t.pending.push_str(s);
            while self.text[ch as usize].pending.len() > WS_CAP {
                let pending = &mut self.text[ch as usize].pending;
                let rest = pending.split_off(floor_boundary(pending, WS_CAP));
                let ws = std::mem::replace(pending, rest);
                self.emit_text(ch, ws);
            }
            return;
        }
        let mut piece = std::mem::take(&mut t.pending);
        piece.push_str(&s[..body]);
        t.pending.push_str(&s[body..]);
        self.emit_text(ch, piece);
    }

    fn emit_text(&mut self, ch: Channel, s: String) {
        match ch {
            Channel::Content => self.out.push(Event::Content(s)),
            Channel::Reasoning => self.out.push(Event::Reasoning(s)),
        }
    }

    /// A call begins (its name is known).
    pub(crate) fn start_call(&mut self, id: Option<String>, name: &str) {
        if self.open.is_some() {
            self.drop_call(DropReason::Malformed);
        }
        let index = self.next_index;
        self.next_index += 1;
        if self.mode == Mode::Tools {
            self.out.push(Event::CallStart { index, id: id.clone(), name: name.to_owned() });
        }
        self.open = Some(OpenCall { index, id, name: name.to_owned() });
    }

    /// Argument progress of the open call.
    pub(crate) fn call_args(&mut self, fragment: &str) {
        if let (Some(open), Mode::Tools) = (&self.open, self.mode) {
            if !fragment.is_empty() {
                self.out.push(Event::CallArgs { index: open.index, fragment: fragment.to_owned() });
            }
        }
    }

    /// The open call is complete with these arguments (a strict JSON object).
    pub(crate) fn end_call(&mut self, arguments: String) {
        let Some(open) = self.open.take() else {
            return;
        };
        debug_assert!(json::strict_object(&arguments).is_ok(), "arguments {arguments:?}");
        let call = ToolCall { id: open.id, name: open.name, arguments };
        match self.mode {
            Mode::Tools => self.out.push(Event::CallEnd { index: open.index, call }),
            Mode::Suppress => self.out.push(Event::Discarded(call)),
        }
    }

    /// A whole call at once.
    pub(crate) fn call(&mut self, id: Option<String>, name: &str, arguments: String) {
        self.start_call(id, name);
        self.complete_call(arguments);
    }

    /// The open call's arguments arrived whole: reported as one fragment,
    /// and the call is complete.
    pub(crate) fn complete_call(&mut self, arguments: String) {
        self.call_args(&arguments);
        self.end_call(arguments);
    }

    /// The open call will not complete.
    pub(crate) fn drop_call(&mut self, reason: DropReason) {
        if let Some(open) = self.open.take() {
            if self.mode == Mode::Tools {
                self.out.push(Event::CallDropped { index: open.index, reason });
            }
        }
    }

    /// Whether a call is open.
    #[allow(dead_code)]
    pub(crate) fn call_open(&self) -> bool {
        self.open.is_some()
    }

    /// Markup that is not a valid call: it becomes content, verbatim (in
    /// suppress mode it is stripped). An open call is dropped first.
    pub(crate) fn malformed(&mut self, raw: &str) {
        if self.open.is_some() {
            self.drop_call(DropReason::Malformed);
        }
        if self.mode == Mode::Tools && !raw.is_empty() {
            let t = &mut self.text[Channel::Content as usize];
            let mut piece = std::mem::take(&mut t.pending);
            piece.push_str(raw);
            t.started = true;
            self.out.push(Event::Content(piece));
        }
    }

    /// End of text: an open call is dropped, trailing whitespace trimmed.
    pub(crate) fn finish(&mut self) {
        if self.open.is_some() {
            self.drop_call(DropReason::Truncated);
        }
        for t in &mut self.text {
            t.pending.clear();
        }
    }
}
