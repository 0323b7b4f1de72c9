//! What a tool call returns, typed: a search's hits and its coverage, a
//! segment read, a saved note, what an MCP tool returned, or an error with its code. The research loop
//! reads these fields; the JSON text the model, the events and the chat see
//! (docs/tools.md) is these types' serde form, made at the edge
//! (`to_json`), and read back only here, when a run is recovered from its
//! stored messages (`from_stored`).

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// Whether a search could list every source it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Coverage {
    Complete,
    /// Some sources could not be registered as handles and are left out.
    Partial,
}

/// One search result: a registered source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hit {
    pub(crate) handle: String,
    pub(crate) title: String,
    pub(crate) path: String,
    pub(crate) segment: usize,
    pub(crate) snippet: String,
}

/// What `search_sources` found: `{results, coverage, note?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Found {
    #[serde(rename = "results")]
    pub(crate) hits: Vec<Hit>,
    pub(crate) coverage: Coverage,
    /// Why coverage is partial, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
}

/// What `read_source` read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Passage {
    pub(crate) handle: String,
    pub(crate) title: String,
    pub(crate) segment: usize,
    pub(crate) segments: usize,
    pub(crate) text: String,
    /// The heading of the section the segment continues (host use only:
    /// not in the tool's JSON, so empty when read back from a chat).
    #[serde(skip)]
    pub(crate) heading: String,
}

/// What one section worker found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Finding {
    /// 1-based section number.
    pub(crate) section: usize,
    pub(crate) text: String,
}

/// What `analyze_source` found: section workers' findings over a whole
/// source; partial when the section limit (or a failed worker) left
/// sections unanalyzed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Analysis {
    pub(crate) handle: String,
    pub(crate) title: String,
    pub(crate) sections: usize,
    pub(crate) analyzed: usize,
    pub(crate) coverage: Coverage,
    pub(crate) findings: Vec<Finding>,
    /// Section numbers that were not analyzed (left out when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) unanalyzed: Vec<usize>,
    /// Why coverage is partial, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
}

/// A failed call, as the model sees it: it never ends the loop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ToolError {
    /// `INVALID_SOURCE`, `TOOL_NOT_AVAILABLE`, …
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

/// What a tool of an MCP server returned: its text (cut to the
/// `mcp/result-size` cap), or its structured content when it wrote no text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct McpResult {
    pub(crate) text: String,
    pub(crate) structured: Option<Value>,
}

/// By hand, through [`McpWire`]: exactly one of the two fields goes out —
/// `{"structured": …}` when there is structured content, else `{"text": …}`
/// — which field attributes cannot say (one field's presence depends on
/// the other's).
impl Serialize for McpResult {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.structured {
            Some(v) => McpWire::Structured(v),
            None => McpWire::Text(&self.text),
        }
        .serialize(s)
    }
}

/// [`McpResult`]'s wire form.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum McpWire<'a> {
    Structured(&'a Value),
    Text(&'a str),
}

/// The result of one tool call, as its JSON result (docs/tools.md): a
/// saved note `{"saved": FILE}` and an error `{"error": {code, message}}`
/// under their names, the other results as their own objects (which tool
/// answered tells them apart, never a tag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ToolOutput {
    /// `save_note` wrote this file under the notes folder.
    Saved(String),
    Error(ToolError),
    #[serde(untagged)]
    Search(Found),
    #[serde(untagged)]
    Read(Passage),
    #[serde(untagged)]
    Analysis(Box<Analysis>),
    /// A tool of an MCP server answered.
    #[serde(untagged)]
    Mcp(McpResult),
}

impl ToolOutput {
    pub(crate) fn error(code: &'static str, message: impl Into<String>) -> ToolOutput {
        ToolOutput::Error(ToolError { code, message: message.into() })
    }

    /// The call succeeded.
    pub(crate) fn ok(&self) -> bool {
        !matches!(self, ToolOutput::Error(_))
    }

    /// The JSON result (docs/tools.md).
    pub(crate) fn to_json(&self) -> Value {
        // Infallible: every map key of a result is a string.
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The successful search or read a stored tool message of `tool` holds
    /// (recovery: a run's earlier results, read back from the chat).
    pub(crate) fn from_stored(tool: &str, content: &str) -> Option<ToolOutput> {
        match tool {
            super::SEARCH => serde_json::from_str(content).ok().map(ToolOutput::Search),
            super::READ => serde_json::from_str(content).ok().map(ToolOutput::Read),
            super::ANALYZE => serde_json::from_str(content).ok().map(ToolOutput::Analysis),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_round_trip_through_their_stored_json() {
        let found = ToolOutput::Search(Found {
            hits: vec![Hit {
                handle: "S1".into(),
                title: "Budget".into(),
                path: "corpus/budget.md".into(),
                segment: 1,
                snippet: "two \"requests\"".into(),
            }],
            coverage: Coverage::Partial,
            note: Some("the handle registry is full".into()),
        });
        let text = found.to_json().to_string();
        assert!(
            text.starts_with(r#"{"results":[{"handle":"S1","title":"Budget","path":"#),
            "{text}"
        );
        assert_eq!(ToolOutput::from_stored(super::super::SEARCH, &text), Some(found));
        let read = ToolOutput::Read(Passage {
            handle: "S2".into(),
            title: "T".into(),
            segment: 2,
            segments: 3,
            text: "x".into(),
            heading: String::new(),
        });
        let text = read.to_json().to_string();
        assert_eq!(text, r#"{"handle":"S2","title":"T","segment":2,"segments":3,"text":"x"}"#);
        assert_eq!(ToolOutput::from_stored(super::super::READ, &text), Some(read));
        let analysis = ToolOutput::Analysis(Box::new(Analysis {
            handle: "S3".into(),
            title: "Long".into(),
            sections: 4,
            analyzed: 2,
            coverage: Coverage::Partial,
            findings: vec![Finding { section: 2, text: "two [S3]".into() }],
            unanalyzed: vec![3, 4],
            note: Some("the section-request limit".into()),
        }));
        let text = analysis.to_json().to_string();
        assert!(
            text.starts_with(
                r#"{"handle":"S3","title":"Long","sections":4,"analyzed":2,"coverage":"partial","findings":[{"section":2,"text":"two [S3]"}]"#
            ),
            "{text}"
        );
        assert_eq!(ToolOutput::from_stored(super::super::ANALYZE, &text), Some(analysis));
        let e = ToolOutput::error("INVALID_SOURCE", "no");
        assert!(!e.ok());
        assert_eq!(
            e.to_json().to_string(),
            r#"{"error":{"code":"INVALID_SOURCE","message":"no"}}"#
        );
    }

    /// Each kind of result has the JSON docs/tools.md gives it, exactly.
    #[test]
    fn every_result_has_its_pinned_json() {
        let hit = Hit {
            handle: "S1".into(),
            title: "Budget".into(),
            path: "corpus/budget.md".into(),
            segment: 1,
            snippet: "two \"requests\"".into(),
        };
        let analysis = |sections, coverage, findings, unanalyzed, note| Analysis {
            handle: "S3".into(),
            title: "Long".into(),
            sections,
            analyzed: usize::min(sections, 2),
            coverage,
            findings,
            unanalyzed,
            note,
        };
        let cases = [
            (
                ToolOutput::Search(Found {
                    hits: vec![hit],
                    coverage: Coverage::Partial,
                    note: Some("the handle registry is full".into()),
                }),
                r#"{"results":[{"handle":"S1","title":"Budget","path":"corpus/budget.md","segment":1,"snippet":"two \"requests\""}],"coverage":"partial","note":"the handle registry is full"}"#,
            ),
            (
                ToolOutput::Search(Found {
                    hits: vec![],
                    coverage: Coverage::Complete,
                    note: None,
                }),
                r#"{"results":[],"coverage":"complete"}"#,
            ),
            (
                ToolOutput::Read(Passage {
                    handle: "S2".into(),
                    title: "T".into(),
                    segment: 2,
                    segments: 3,
                    text: "x".into(),
                    heading: "H".into(),
                }),
                r#"{"handle":"S2","title":"T","segment":2,"segments":3,"text":"x"}"#,
            ),
            (
                ToolOutput::Analysis(Box::new(analysis(
                    4,
                    Coverage::Partial,
                    vec![Finding { section: 2, text: "two [S3]".into() }],
                    vec![3, 4],
                    Some("the section-request limit".into()),
                ))),
                r#"{"handle":"S3","title":"Long","sections":4,"analyzed":2,"coverage":"partial","findings":[{"section":2,"text":"two [S3]"}],"unanalyzed":[3,4],"note":"the section-request limit"}"#,
            ),
            (
                ToolOutput::Analysis(Box::new(analysis(
                    1,
                    Coverage::Complete,
                    vec![],
                    vec![],
                    None,
                ))),
                r#"{"handle":"S3","title":"Long","sections":1,"analyzed":1,"coverage":"complete","findings":[]}"#,
            ),
            (ToolOutput::Saved("notes/a.md".into()), r#"{"saved":"notes/a.md"}"#),
            (
                ToolOutput::Mcp(McpResult { text: "hello".into(), structured: None }),
                r#"{"text":"hello"}"#,
            ),
            (
                ToolOutput::Mcp(McpResult {
                    text: "hello".into(),
                    structured: Some(serde_json::json!({"a": [1, 2]})),
                }),
                r#"{"structured":{"a":[1,2]}}"#,
            ),
            (
                ToolOutput::error("INVALID_SOURCE", "no"),
                r#"{"error":{"code":"INVALID_SOURCE","message":"no"}}"#,
            ),
        ];
        for (out, want) in cases {
            assert_eq!(out.to_json().to_string(), want);
        }
    }
}
