//! Streaming parser for the native tool-call markup of local models.
//!
//! `toolparse` owns one thing: turning the raw text a model writes (special
//! tokens spelled out) into visible content, reasoning and tool calls, while
//! the text streams in. It must not depend on candle, tokio, HTTP or any wire
//! format: callers hand it text deltas and get [`Event`]s back.
//!
//! The format is chosen by name ([`Format`], or [`Format::for_model`] from a
//! Hugging Face repo id), never by trying formats in turn. A [`Parser`] is a
//! push parser in the manner of httparse: [`Parser::push`] a delta, receive
//! the events that text decided; [`Parser::finish`] with the finish reason to
//! receive the rest.
//!
//! ```
//! use toolparse::{Accumulator, Event, FinishReason, Format, Options, Parser};
//!
//! let mut p = Parser::new(Format::Hermes, Options::default());
//! let mut acc = Accumulator::default();
//! for delta in ["Let me look.\n<tool_", "call>\n{\"name\": \"search\", ", "\"arguments\": {\"q\": \"x\"}}\n</tool_call>"] {
//!     acc.extend(p.push(delta));
//! }
//! acc.extend(p.finish(FinishReason::Stop));
//! assert_eq!(acc.content, "Let me look.");
//! assert_eq!(acc.calls[0].name, "search");
//! assert_eq!(acc.calls[0].arguments, r#"{"q":"x"}"#);
//! ```
//!
//! Rules every format obeys: content around calls is kept in order (only the
//! separator whitespace next to markup is dropped); markers never reach
//! content, reasoning, names or arguments; marker text inside a JSON string
//! does not end a call; arguments are a strict JSON object; the events add up
//! to the same result however the text is split; output cut by the token
//! limit never yields an unclosed call; malformed markup becomes content;
//! buffering is bounded by [`Options::buffer_cap`].

mod cx;
mod formats;
mod json;
mod registry;
mod scan;
mod schema;

pub use crate::json::JsonType;
pub use crate::registry::{Format, UnknownFormat};
pub use crate::schema::{ParamSpec, ToolSpec, Tools};

use crate::cx::Cx;
use crate::formats::Machine;

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string ended the text: it is complete.
    Stop,
    /// The token limit cut the text: anything left open is incomplete.
    Length,
}

/// What happens to calls the model proposes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// Calls are parsed and reported ([`Event::CallStart`] … [`Event::CallEnd`]).
    #[default]
    Tools,
    /// No tools are offered: call markup is stripped from the visible stream
    /// and every complete call is reported as [`Event::Discarded`].
    Suppress,
}

/// How a parser is set up for one generation.
#[derive(Debug, Clone)]
pub struct Options {
    /// The end of the prompt the model continues (e.g. `<|im_start|>assistant\n<think>\n`):
    /// it sets the start state, such as starting inside reasoning.
    pub generation_prompt: Option<String>,
    /// Whether thinking was requested (`None`: the template default).
    pub thinking: Option<bool>,
    /// The tools offered, used to type parameter values written as bare text.
    pub tools: Tools,
    /// Parse calls, or strip and discard them.
    pub mode: Mode,
    /// The most text held back while waiting for a call to close; beyond it
    /// the call is treated as malformed (bytes).
    pub buffer_cap: usize,
}

/// The default [`Options::buffer_cap`]: 4 MiB.
pub const DEFAULT_BUFFER_CAP: usize = 4 << 20;

impl Default for Options {
    fn default() -> Options {
        Options {
            generation_prompt: None,
            thinking: None,
            tools: Tools::default(),
            mode: Mode::Tools,
            buffer_cap: DEFAULT_BUFFER_CAP,
        }
    }
}

/// One complete tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call id the model wrote, when the format has one.
    pub id: Option<String>,
    /// The function name.
    pub name: String,
    /// The arguments: a strict JSON object, as text.
    pub arguments: String,
}

/// Why a started call produced no call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The text ended (token limit) before the call closed.
    Truncated,
    /// The call closed but its markup or arguments were not valid; its text
    /// follows as content.
    Malformed,
}

/// What the parser reports while text streams in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Visible answer text.
    Content(String),
    /// Reasoning text (think blocks, analysis channels).
    Reasoning(String),
    /// A call began: its name is known.
    CallStart {
        /// Position of this call among the calls started in this generation.
        index: usize,
        /// The id the model wrote, if any.
        id: Option<String>,
        /// The function name.
        name: String,
    },
    /// Progress on a call's arguments; for a UI only. The complete arguments
    /// come with [`Event::CallEnd`].
    CallArgs {
        /// The call's index.
        index: usize,
        /// Argument text as it arrived.
        fragment: String,
    },
    /// A call is complete.
    CallEnd {
        /// The call's index.
        index: usize,
        /// The complete call.
        call: ToolCall,
    },
    /// A started call will not complete.
    CallDropped {
        /// The call's index.
        index: usize,
        /// Why.
        reason: DropReason,
    },
    /// Suppress mode: a complete call the model proposed; never to be run.
    Discarded(ToolCall),
}

/// A streaming parser for one generation.
#[derive(Debug)]
pub struct Parser {
    machine: Box<dyn Machine>,
    buf: String,
    cx: Cx,
    finished: bool,
}

impl Parser {
    /// A parser for `format`, set up by `opts`.
    pub fn new(format: Format, opts: Options) -> Parser {
        let machine = formats::machine_for(format, &opts);
        Parser { machine, buf: String::new(), cx: Cx::new(opts), finished: false }
    }

    /// Feeds one text delta; returns the events it decided.
    pub fn push(&mut self, delta: &str) -> Vec<Event> {
        if self.finished {
            return Vec::new();
        }
        self.buf.push_str(delta);
        self.run(None);
        self.cx.take()
    }

    /// Ends the text; returns the remaining events. Later pushes are ignored.
    pub fn finish(&mut self, reason: FinishReason) -> Vec<Event> {
        if self.finished {
            return Vec::new();
        }
        self.run(Some(reason));
        self.cx.finish();
        self.finished = true;
        self.cx.take()
    }

    fn run(&mut self, end: Option<FinishReason>) {
        let mut pos = 0;
        while pos < self.buf.len() || end.is_some() {
            let input = &self.buf[pos..];
            let n = self.machine.step(input, end, &mut self.cx).min(input.len());
            if n == 0 {
                if end.is_some() && !input.is_empty() {
                    // INVARIANT: at the end a machine consumes everything; a
                    // machine that does not is a bug, and its text is kept.
                    self.cx.content(input);
                    pos = self.buf.len();
                }
                break;
            }
            pos += n;
            while !self.buf.is_char_boundary(pos) {
                pos += 1;
            }
        }
        self.buf.drain(..pos);
    }
}

/// Folds events into what an OpenAI client accumulates from the default
/// stream: content and reasoning concatenated, calls once complete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accumulator {
    /// All content deltas.
    pub content: String,
    /// All reasoning deltas.
    pub reasoning: String,
    /// Complete calls, in order.
    pub calls: Vec<ToolCall>,
    /// Calls discarded in suppress mode, in order.
    pub discarded: Vec<ToolCall>,
}

impl Accumulator {
    /// Adds events.
    pub fn extend(&mut self, events: impl IntoIterator<Item = Event>) {
        for e in events {
            match e {
                Event::Content(s) => self.content.push_str(&s),
                Event::Reasoning(s) => self.reasoning.push_str(&s),
                Event::CallEnd { call, .. } => self.calls.push(call),
                Event::Discarded(call) => self.discarded.push(call),
                Event::CallStart { .. } | Event::CallArgs { .. } | Event::CallDropped { .. } => {}
            }
        }
    }
}

/// Parses a whole text at once.
pub fn parse(format: Format, opts: Options, text: &str, reason: FinishReason) -> Accumulator {
    let mut p = Parser::new(format, opts);
    let mut acc = Accumulator::default();
    acc.extend(p.push(text));
    acc.extend(p.finish(reason));
    acc
}
