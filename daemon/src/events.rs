//! The research events (docs/events.md): one closed enum whose serde form
//! is the wire format — the JSON objects `ask --events` prints, `POST
//! /v1/research` streams and `ask --connect` reads back. The JSON of every
//! variant is pinned by `daemon/tests/data/events.jsonl`.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// A closed set of names with their wire text, written once: the enum, its
/// `as_str` (for SQL columns and messages) and its serde form.
macro_rules! names {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        pub(crate) enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant,)*
        }

        // Not every set uses both (`By` is only ever serialized).
        #[allow(dead_code)]
        impl $name {
            /// Every value, in declaration order.
            pub(crate) const ALL: &'static [$name] = &[$($name::$variant,)*];

            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }
    };
}

names! {
    /// Who asked for a tool call: the model, or the host's entry research
    /// (for models that do not drive their own rounds).
    By {
        Model => "model",
        Host => "host",
    }
}

names! {
    /// What kind of request a turn is.
    Phase {
        Research => "research",
        Final => "final",
        Correction => "correction",
        /// A section worker (`analyze_source`, or condensing the final view).
        Section => "section",
    }
}

names! {
    /// Why research ended.
    Stop {
        Answer => "answer",
        RoundLimit => "round_limit",
        RepeatedBatches => "repeated_batches",
        ContextLimit => "context_limit",
        Deadline => "deadline",
        Budget => "budget",
        /// The section-request limit cut an analysis short (section limits
        /// prevent more research after tools have run).
        SectionLimit => "section_limit",
        Cancelled => "cancelled",
        Error => "error",
    }
}

names! {
    /// How the reply completed.
    Outcome {
        Answered => "answered",
        Excerpt => "excerpt",
        SpokenFallback => "spoken_fallback",
        Cancelled => "cancelled",
        Error => "error",
    }
}

names! {
    /// The kinds of `notice` the daemon sends (docs/events.md "Notices").
    /// `Ev::Notice` keeps its kind as the `&'static str` of one of these;
    /// a test checks that every kind the code emits is listed here, so a
    /// notice reads back as it was sent.
    NoticeKind {
        Finishing => "finishing",
        PartialCoverage => "partial_coverage",
        SectionAnalysis => "section_analysis",
        CitationRejected => "citation_rejected",
        CitationsUnverified => "citations_unverified",
        Uncited => "uncited",
        Fallback => "fallback",
        Error => "error",
    }
}

/// The kind a notice of a kind this build does not know reads back as (a
/// newer daemon may add kinds; its notices are still shown).
pub(crate) const OTHER_NOTICE: &str = "notice";

/// A name the code writes as a literal (`Ev::Notice`'s kind). An alias so
/// that serde does not take the field for text borrowed from the input
/// (which a `&'static str` field would make it require to live forever);
/// [`notice_kind`] reads it back.
pub(crate) type StaticName = &'static str;

/// An error with its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunError {
    pub(crate) code: String,
    pub(crate) classification: String,
    pub(crate) message: String,
}

impl RunError {
    pub(crate) fn new(code: &str, classification: &str, message: impl Into<String>) -> RunError {
        RunError {
            code: code.into(),
            classification: classification.into(),
            message: message.into(),
        }
    }

    /// `{code, classification, message}`, as `done.error` and the run's row
    /// hold it.
    pub(crate) fn to_json(&self) -> Value {
        // Infallible: plain strings under string keys.
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// What a backend's decoding of one or more model requests took: tokens
/// generated, seconds spent generating them (after each prompt), and the
/// prompt-lookup drafts verified and confirmed (`GenParams::speculate` in
/// the inference crate). Zero where the backend does not tell (an upstream).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Decode {
    pub(crate) tokens: usize,
    pub(crate) seconds: f64,
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
}

impl std::ops::AddAssign for Decode {
    fn add_assign(&mut self, o: Decode) {
        self.tokens += o.tokens;
        self.seconds += o.seconds;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
    }
}

/// The last event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Done {
    /// The run and its chat (so a client can fetch both).
    pub(crate) run_id: String,
    pub(crate) chat_id: String,
    pub(crate) outcome: Outcome,
    pub(crate) stop: Stop,
    pub(crate) rounds: usize,
    pub(crate) model_requests: usize,
    pub(crate) answer: String,
    /// `null` when the run ended without one.
    pub(crate) error: Option<RunError>,
    /// Citations marked invalid after a failed correction.
    pub(crate) invalid_citations: Vec<String>,
    /// The answer cites sources it read (`research::grounding`).
    pub(crate) grounded: bool,
    /// The run's model requests' decoding, summed.
    #[serde(default)]
    pub(crate) decode: Decode,
}

/// One research event: `{"type": "<snake_case name>", …fields}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Ev {
    Run {
        run_id: String,
        chat_id: String,
        max_tool_iters: usize,
    },
    Request {
        n: usize,
        phase: Phase,
    },
    /// `{"type": "reasoning", "delta": …}`.
    #[serde(with = "delta")]
    Reasoning(String),
    /// `{"type": "content", "delta": …}`.
    #[serde(with = "delta")]
    Content(String),
    ToolCall {
        round: usize,
        id: String,
        name: String,
        arguments: Value,
        by: By,
    },
    ToolResult {
        round: usize,
        id: String,
        name: String,
        ok: bool,
        content: String,
    },
    Notice {
        /// One of [`NoticeKind`]'s names.
        #[serde(deserialize_with = "notice_kind")]
        kind: StaticName,
        text: String,
    },
    #[serde(rename = "discarded_call")]
    Discarded {
        name: String,
        arguments: Value,
    },
    /// Voice requests only: a completed sentence of the spoken text, plain;
    /// `progress` (on the wire `"kind": "progress"`, absent otherwise) for
    /// the short sentence said when a tool round begins.
    Sentence {
        text: String,
        #[serde(rename = "kind", default, skip_serializing_if = "is_false", with = "progress")]
        progress: bool,
    },
    Done(Done),
}

impl Ev {
    /// The event as a JSON object.
    pub(crate) fn to_json(&self) -> Value {
        // Infallible: every map key of an event is a string.
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// An event read back from its JSON (a client of the daemon prints it like
/// a local run): `None` for what is not an event of this build.
pub(crate) fn from_json(v: &Value) -> Option<Ev> {
    Ev::deserialize(v).ok()
}

/// A notice's kind, as the `&'static str` of its [`NoticeKind`].
fn notice_kind<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
    Ok(NoticeKind::ALL.iter().map(|k| k.as_str()).find(|k| *k == name).unwrap_or(OTHER_NOTICE))
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A text delta as its own object, `{"delta": …}` (an internally tagged
/// variant cannot hold a bare string).
mod delta {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Delta<T> {
        delta: T,
    }

    pub(super) fn serialize<S: Serializer>(delta: &str, s: S) -> Result<S::Ok, S::Error> {
        Delta { delta }.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(Delta::<String>::deserialize(d)?.delta)
    }
}

/// A sentence's `progress` flag as `"kind": "progress"`.
mod progress {
    use serde::{Deserialize, Deserializer, Serializer};

    const PROGRESS: &str = "progress";

    pub(super) fn serialize<S: Serializer>(progress: &bool, s: S) -> Result<S::Ok, S::Error> {
        match progress {
            true => s.serialize_str(PROGRESS),
            false => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        Ok(Option::<std::borrow::Cow<'de, str>>::deserialize(d)?.is_some_and(|k| k == PROGRESS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    /// Every variant, every name of every enum it holds, every notice kind.
    fn samples() -> Vec<Ev> {
        let mut v =
            vec![Ev::Run { run_id: "run_1".into(), chat_id: "chat_1".into(), max_tool_iters: 12 }];
        for &phase in Phase::ALL {
            v.push(Ev::Request { n: 3, phase });
        }
        v.push(Ev::Reasoning("think \"q\"\n".into()));
        v.push(Ev::Content("answer [S1] é".into()));
        for &by in By::ALL {
            v.push(Ev::ToolCall {
                round: 2,
                id: "call_1".into(),
                name: "search_sources".into(),
                arguments: json!({"query": "budget", "n": 2}),
                by,
            });
        }
        for ok in [true, false] {
            v.push(Ev::ToolResult {
                round: 2,
                id: "call_1".into(),
                name: "read_source".into(),
                ok,
                content: "{\"handle\":\"S1\"}".into(),
            });
        }
        for kind in NoticeKind::ALL.iter().map(|k| k.as_str()).chain([OTHER_NOTICE]) {
            v.push(Ev::Notice { kind, text: format!("a {kind} notice") });
        }
        v.push(Ev::Discarded {
            name: "save_note".into(),
            arguments: json!({"title": "t", "text": "x"}),
        });
        for progress in [false, true] {
            v.push(Ev::Sentence { text: "One sentence.".into(), progress });
        }
        for (i, &stop) in Stop::ALL.iter().enumerate() {
            let outcome = Outcome::ALL[i % Outcome::ALL.len()];
            let error = outcome == Outcome::Error;
            v.push(Ev::Done(Done {
                run_id: "run_1".into(),
                chat_id: "chat_1".into(),
                outcome,
                stop,
                rounds: i,
                model_requests: i + 2,
                answer: if error { String::new() } else { "The answer [S1].".into() },
                error: error.then(|| RunError::new("provider_failed", "provider", "it broke")),
                invalid_citations: if i == 1 { vec!["S9".into()] } else { Vec::new() },
                grounded: i % 2 == 0,
                decode: Decode { tokens: 40 + i, seconds: 0.5, drafted: 12, accepted: 9 },
            }));
        }
        v
    }

    /// The wire `type` of each variant; a new variant fails to compile here
    /// until it is given samples.
    fn type_of(e: &Ev) -> &'static str {
        match e {
            Ev::Run { .. } => "run",
            Ev::Request { .. } => "request",
            Ev::Reasoning(_) => "reasoning",
            Ev::Content(_) => "content",
            Ev::ToolCall { .. } => "tool_call",
            Ev::ToolResult { .. } => "tool_result",
            Ev::Notice { .. } => "notice",
            Ev::Discarded { .. } => "discarded_call",
            Ev::Sentence { .. } => "sentence",
            Ev::Done(_) => "done",
        }
    }

    /// Each sample's JSON is the line of `daemon/tests/data/events.jsonl`
    /// (the format clients read: `tests/*.rs`, `tests/python/`, the chat
    /// page), and reads back as the same event.
    #[test]
    fn every_event_has_its_pinned_json_and_reads_back() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/events.jsonl");
        let samples = samples();
        let got: String = samples.iter().map(|e| format!("{}\n", e.to_json())).collect();
        if std::env::var_os("UPDATE_EXPECT").is_some() {
            std::fs::write(&path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap();
        for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
            assert_eq!(g, w, "line {} of {}", i + 1, path.display());
        }
        assert_eq!(got.lines().count(), want.lines().count(), "{}", path.display());
        let mut types = std::collections::BTreeSet::new();
        for (e, line) in samples.iter().zip(want.lines()) {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["type"], type_of(e), "{line}");
            assert_eq!(from_json(&v).as_ref(), Some(e), "{line}");
            types.insert(type_of(e));
        }
        assert_eq!(types.len(), 10, "a variant has no sample: {types:?}");
    }

    #[test]
    fn unknown_notice_kinds_and_types_read_leniently() {
        let v = json!({"type": "notice", "kind": "brand_new", "text": "t"});
        assert_eq!(from_json(&v), Some(Ev::Notice { kind: OTHER_NOTICE, text: "t".into() }));
        assert_eq!(from_json(&json!({"type": "brand_new"})), None);
        assert_eq!(from_json(&json!({"type": "content"})), None);
        let v = json!({"type": "sentence", "text": "t", "kind": "other"});
        assert_eq!(from_json(&v), Some(Ev::Sentence { text: "t".into(), progress: false }));
    }

    /// Every notice kind written as a literal in the daemon's sources is a
    /// [`NoticeKind`], so every notice sent reads back with its kind.
    #[test]
    fn every_notice_kind_the_code_sends_is_declared() {
        fn walk(dir: &Path, out: &mut Vec<(String, String)>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (at, _) in text.match_indices("Ev::Notice {") {
                        let rest = &text[at..];
                        let rest = &rest[..rest.find('}').unwrap_or(rest.len())];
                        if let Some(k) = rest.split("kind: \"").nth(1) {
                            let kind = k.split('"').next().unwrap_or_default();
                            out.push((p.display().to_string(), kind.to_owned()));
                        }
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut found);
        assert!(found.len() >= 5, "the scan found too few notices: {found:?}");
        for (file, kind) in found {
            let declared = NoticeKind::ALL.iter().any(|k| k.as_str() == kind);
            assert!(declared || kind == OTHER_NOTICE, "{file}: notice kind {kind:?} undeclared");
        }
    }
}
