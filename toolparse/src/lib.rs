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
//! Rules every format obeys: content around calls is kept verbatim and in
//! order (only the edges of the reply are trimmed: whitespace before its
//! first visible character and after its last); markers never reach
//! content, reasoning, names or arguments; marker text inside a JSON string
//! does not end a call; arguments are a strict JSON object; the events add up
//! to the same result however the text is split; output cut by the token
//! limit never yields an unclosed call; malformed markup becomes content;
//! buffering is bounded by [`Options::buffer_cap`].

mod cx;
mod formats;
mod grammar;
mod json;
mod registry;
mod scan;
mod schema;

pub use crate::grammar::{
    alternatives, args_json, bounded, call_object_json, closed, lit, rehome, CallGrammar,
    GrammarTool, Special, MAX_WS,
};
pub use crate::json::JsonType;
pub use crate::registry::{Format, UnknownFormat};
pub use crate::schema::{ParamSpec, ToolSpec, Tools};

use crate::cx::Cx;
use crate::formats::{Machine, Step};
use crate::scan::{ceil_boundary, floor_boundary};
use std::mem::{discriminant, Discriminant};

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
    /// The most text (bytes) held back while a call's markup is undecided.
    ///
    /// A parser holds text it cannot decide yet: above all a tool call's
    /// markup, from its opening marker (for gpt-oss, from the start of the
    /// call body) until the call closes, whether it was consumed into the
    /// call already or is still waited on. The rule depends on the text
    /// only, never on how it was split into deltas: when such a held region
    /// runs longer than `buffer_cap` bytes without being decided, exactly its
    /// first `buffer_cap` bytes (cut back to a char boundary) are malformed
    /// markup: shown as content in [`Mode::Tools`] (a started call is dropped
    /// as [`DropReason::Malformed`]), stripped in [`Mode::Suppress`]. Parsing
    /// then resumes in the content state right after them. So no call whose
    /// markup is longer than the cap is ever accepted, even when its close
    /// is in the text. (Held text not yet known to be call markup, such as a
    /// bare JSON value that might be a Llama call, is shown as content
    /// instead; an opening marker is always read whole, even when it is
    /// longer than the cap.) The same bound applies to text held outside a
    /// call, counted from the first held byte. The parser's memory is
    /// O(`buffer_cap`) whatever the input.
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
    driver: Box<dyn Drive>,
    finished: bool,
}

impl Parser {
    /// A parser for `format`, set up by `opts`.
    pub fn new(format: Format, opts: Options) -> Parser {
        Parser { driver: formats::machine_for(format, &opts), finished: false }
    }

    /// Feeds one text delta; returns the events it decided.
    pub fn push(&mut self, delta: &str) -> Vec<Event> {
        if self.finished {
            return Vec::new();
        }
        self.driver.push(delta);
        self.driver.run(None);
        self.driver.cx().take()
    }

    /// Ends the text; returns the remaining events. Later pushes are ignored.
    pub fn finish(&mut self, reason: FinishReason) -> Vec<Event> {
        if self.finished {
            return Vec::new();
        }
        self.driver.run(Some(reason));
        self.driver.clear();
        self.finished = true;
        let cx = self.driver.cx();
        cx.finish();
        cx.take()
    }
}

/// A machine in its driver, behind one object type for every format.
pub(crate) trait Drive: Send + std::fmt::Debug {
    /// Appends a delta to the text.
    fn push(&mut self, delta: &str);
    /// Steps the machine over the text (`end`: the text is complete).
    fn run(&mut self, end: Option<FinishReason>);
    /// Drops the text kept (after the end).
    fn clear(&mut self);
    fn cx(&mut self) -> &mut Cx;
    /// Bytes of text kept, for the memory bound's tests.
    #[cfg(test)]
    fn buffered(&self) -> usize;
}

/// The driver: keeps the text a machine has not consumed and steps it.
#[derive(Debug)]
pub(crate) struct Driver<M> {
    machine: M,
    /// The consumed bytes of the held region (the first `kept` bytes), then
    /// the text not consumed yet.
    buf: String,
    kept: usize,
    cap: usize,
    cx: Cx,
}

impl<M: Machine + 'static> Driver<M> {
    pub(crate) fn boxed(machine: M, opts: &Options) -> Box<dyn Drive> {
        Box::new(Driver {
            machine,
            buf: String::new(),
            kept: 0,
            cap: opts.buffer_cap,
            cx: Cx::new(opts.clone()),
        })
    }
}

/// The state kinds a machine entered since it last consumed text.
///
/// INVARIANT: a transition enters a kind not in the chain, so a chain is
/// never longer than the machine's state enum has variants, and the driver
/// always makes progress.
struct Chain<K>(Vec<K>);

impl<K: PartialEq> Chain<K> {
    /// Records `kind`; false when the chain already holds it.
    fn enter(&mut self, kind: K) -> bool {
        if self.0.contains(&kind) {
            return false;
        }
        self.0.push(kind);
        true
    }
}

impl<M: Machine> Drive for Driver<M> {
    fn push(&mut self, delta: &str) {
        self.buf.push_str(delta);
    }

    fn clear(&mut self) {
        self.buf = String::new();
        self.kept = 0;
    }

    fn cx(&mut self) -> &mut Cx {
        &mut self.cx
    }

    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Steps the machine over the buffered text.
    ///
    /// The machine sees a window: the unconsumed text up to `cap` bytes
    /// past the start of its held region ([`Machine::held`]), cut back to a
    /// char boundary. The window is a function of the text (the region
    /// starts at a point the machine chose by the text), so the machine's
    /// decisions are too. When the window stops short of the text, `end` is
    /// withheld (more text follows it); if the machine then waits, the
    /// region has outgrown the cap and the driver hands its first `cap`
    /// bytes to [`Machine::overflow`].
    fn run(&mut self, end: Option<FinishReason>) {
        let mut pos = self.kept;
        let mut chain: Chain<Discriminant<M::State>> = Chain(Vec::new());
        loop {
            let len = self.buf.len();
            let held = self.machine.held().min(pos);
            let start = pos - held;
            let mut wend = floor_boundary(&self.buf, start.saturating_add(self.cap).min(len));
            if wend < pos {
                // Only an opening marker longer than the cap gets here.
                wend = pos;
            }
            if wend == pos && held == 0 && pos < len {
                // A cap smaller than one char still lets the machine see it.
                wend = ceil_boundary(&self.buf, pos + 1);
            }
            let truncated = wend < len;
            if !truncated && pos == len && end.is_none() {
                break;
            }
            let e = if truncated { None } else { end };
            let window = &self.buf[pos..wend];
            if chain.0.is_empty() {
                chain.0.push(discriminant(self.machine.state()));
            }
            let step = if window.is_empty() && truncated {
                Step::Wait
            } else {
                self.machine.step(window, e, &mut self.cx)
            };
            match step {
                Step::Consumed(n) => {
                    let n = n.get();
                    debug_assert!(
                        n <= window.len() && window.is_char_boundary(n),
                        "consumed {n} of {} bytes",
                        window.len()
                    );
                    pos = ceil_boundary(&self.buf, pos + n.min(window.len()));
                    chain.0.clear();
                }
                Step::Transition => {
                    if !chain.enter(discriminant(self.machine.state())) {
                        // INVARIANT broken (a bug): the region is dropped as
                        // malformed rather than stepped forever.
                        debug_assert!(false, "a transition back to a state of this chain");
                        let held = self.machine.held().min(pos);
                        let text = &self.buf[pos - held..wend];
                        self.machine.overflow(text, &mut self.cx);
                        pos = wend;
                        chain.0.clear();
                        if window.is_empty() {
                            // Nothing left to drop: stepping again would
                            // only go round the same circle.
                            break;
                        }
                    }
                }
                Step::Wait => {
                    chain.0.clear();
                    if truncated {
                        // The held region outgrew the cap: its first `cap`
                        // bytes are malformed, and the machine goes back to
                        // content.
                        let held = self.machine.held().min(pos);
                        let text = &self.buf[pos - held..wend];
                        self.machine.overflow(text, &mut self.cx);
                        debug_assert_eq!(
                            self.machine.held(),
                            0,
                            "a machine holds nothing after overflow"
                        );
                        pos = wend;
                        continue;
                    }
                    if e.is_none() || window.is_empty() {
                        // More text is needed, or the machine is done.
                        break;
                    }
                    // INVARIANT: at the end a machine consumes everything; a
                    // machine that does not is a bug, and its text is kept.
                    debug_assert!(false, "a machine left {window:?} at the end");
                    self.cx.content(window);
                    pos = wend;
                }
            }
        }
        let keep = self.machine.held().min(pos);
        self.buf.drain(..pos - keep);
        self.kept = keep;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory stays O(cap) however long an unclosed call runs.
    #[test]
    fn held_text_is_bounded_by_the_cap() {
        let cases: [(Format, Option<&str>, &str); 11] = [
            (Format::Hermes, None, "<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": \""),
            (Format::Qwen3Xml, None, "<tool_call>\n<function=x>\n<parameter=a>\n"),
            (Format::Glm47, None, "<tool_call>x\n<arg_key>a</arg_key><arg_value>"),
            (Format::Llama3Json, None, "{\"name\": \"x\", \"parameters\": {\"a\": \""),
            (Format::Llama4Pythonic, None, "[x(a=\""),
            (Format::Mistral, None, "[TOOL_CALLS]x[ARGS]{\"a\": \""),
            (
                Format::DeepSeekV31,
                None,
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>x<｜tool▁sep｜>{\"a\": \"",
            ),
            (
                Format::GptOss,
                Some("<|start|>assistant"),
                " to=functions.x<|channel|>commentary<|message|>{\"a\": \"",
            ),
            (
                Format::KimiK2,
                None,
                "<|tool_call_begin|>functions.x:0<|tool_call_argument_begin|>{\"a\": \"",
            ),
            (
                Format::KimiK3,
                None,
                "<|open|>tools<|sep|><|open|>call tool=\"x\"<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>",
            ),
            (Format::Gemma4, None, "<|tool_call>call:x{a:<|\"|>"),
        ];
        let cap = 1000;
        for (format, prompt, opener) in cases {
            let opts = Options {
                generation_prompt: prompt.map(str::to_owned),
                buffer_cap: cap,
                ..Options::default()
            };
            let mut p = Parser::new(format, opts);
            let mut acc = Accumulator::default();
            acc.extend(p.push(opener));
            for i in 0..20_000 {
                acc.extend(p.push(if i % 7 == 0 { "y, é " } else { "yy" }));
                let buffered = p.driver.buffered();
                assert!(buffered <= cap + 16, "{format:?}: buffer {buffered}");
                let state = format!("{:?}", p.driver).len();
                assert!(state <= 4 * cap + 8192, "{format:?}: machine state {state}");
            }
            acc.extend(p.finish(FinishReason::Stop));
            assert!(acc.calls.is_empty(), "{format:?}");
            // The held region starts at the call (gpt-oss: at its body).
            let region = match format {
                Format::GptOss => opener.rsplit("<|message|>").next().unwrap(),
                Format::KimiK3 => opener.trim_start_matches("<|open|>tools<|sep|>"),
                _ => opener,
            };
            assert!(acc.content.starts_with(region), "{format:?}");
        }
    }

    /// A long run of whitespace at the end of the text is released in
    /// pieces counted from its start, so the result is the same whatever
    /// the deltas (one delta released it whole, one char per delta cut it).
    #[test]
    fn a_long_trailing_whitespace_run_is_released_the_same_for_every_split() {
        let text = format!("Hi.{}\u{3000}{}", " ".repeat(4100), "\n".repeat(5000));
        let whole = parse(Format::Hermes, Options::default(), &text, FinishReason::Stop);
        let mut p = Parser::new(Format::Hermes, Options::default());
        let mut acc = Accumulator::default();
        for c in text.chars() {
            acc.extend(p.push(&c.to_string()));
        }
        acc.extend(p.finish(FinishReason::Stop));
        assert_eq!(acc, whole);
        assert!(whole.content.starts_with("Hi.    "));
    }

    /// A machine that only changes state at the end, then reads the text as
    /// reasoning: the driver steps it again instead of keeping the text as
    /// content.
    #[derive(Debug, Default)]
    struct Lazy {
        state: LazyState,
    }

    #[derive(Debug, Default)]
    enum LazyState {
        #[default]
        Waiting,
        Ready,
    }

    impl Machine for Lazy {
        type State = LazyState;

        fn state(&self) -> &LazyState {
            &self.state
        }

        fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
            if end.is_none() {
                return Step::Wait;
            }
            match self.state {
                LazyState::Waiting => {
                    self.state = LazyState::Ready;
                    Step::Transition
                }
                LazyState::Ready => {
                    cx.reasoning(input);
                    Step::up_to(input.len())
                }
            }
        }

        fn held(&self) -> usize {
            0
        }

        fn overflow(&mut self, text: &str, cx: &mut Cx) {
            cx.content(text);
        }
    }

    fn lazy_parser(machine: Lazy) -> Parser {
        let opts = Options { buffer_cap: 64, ..Options::default() };
        Parser { driver: Driver::boxed(machine, &opts), finished: false }
    }

    #[test]
    fn a_machine_that_changes_state_without_consuming_is_stepped_again() {
        let mut p = lazy_parser(Lazy::default());
        let mut acc = Accumulator::default();
        acc.extend(p.push("some text"));
        acc.extend(p.finish(FinishReason::Stop));
        assert_eq!(acc.reasoning, "some text");
        assert_eq!(acc.content, "");
    }

    /// A machine whose transitions go round in a circle without consuming.
    #[derive(Debug, Default)]
    struct Circle {
        state: LazyState,
    }

    impl Machine for Circle {
        type State = LazyState;

        fn state(&self) -> &LazyState {
            &self.state
        }

        fn step(&mut self, _input: &str, _end: Option<FinishReason>, _cx: &mut Cx) -> Step {
            self.state = match self.state {
                LazyState::Waiting => LazyState::Ready,
                LazyState::Ready => LazyState::Waiting,
            };
            Step::Transition
        }

        fn held(&self) -> usize {
            0
        }

        fn overflow(&mut self, text: &str, cx: &mut Cx) {
            cx.malformed(text);
        }
    }

    /// The progress guarantee: a transition back into a state kind of the
    /// same chain is refused (a debug build stops at it), so a machine with
    /// such a bug cannot hang the driver.
    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "a transition back"))]
    fn a_transition_that_goes_round_in_a_circle_is_refused() {
        let opts = Options::default();
        let mut p = Parser { driver: Driver::boxed(Circle::default(), &opts), finished: false };
        let mut acc = Accumulator::default();
        acc.extend(p.push("text"));
        acc.extend(p.finish(FinishReason::Stop));
        assert_eq!(acc.content, "text");
    }
}
