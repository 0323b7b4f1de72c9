//! What a tool call returns, typed: a search's hits and its coverage, a
//! segment read, a saved note, what an MCP tool returned, or an error with its code. The research loop
//! reads these fields; the JSON text the model, the events and the chat see
//! (CONTRACTS.md "Built-in tools") is made here, at the edge (`to_json`),
//! and read back only here, when a run is recovered from its stored
//! messages (`from_stored`).

use serde_json::{json, Value};

/// Whether a search could list every source it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coverage {
    Complete,
    /// Some sources could not be registered as handles and are left out.
    Partial,
}

impl Coverage {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Coverage::Complete => "complete",
            Coverage::Partial => "partial",
        }
    }
}

/// One search result: a registered source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hit {
    pub(crate) handle: String,
    pub(crate) title: String,
    pub(crate) path: String,
    pub(crate) segment: usize,
    pub(crate) snippet: String,
}

/// What `search_sources` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) hits: Vec<Hit>,
    pub(crate) coverage: Coverage,
    /// Why coverage is partial, for the model.
    pub(crate) note: Option<String>,
}

/// What `read_source` read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Passage {
    pub(crate) handle: String,
    pub(crate) title: String,
    pub(crate) segment: usize,
    pub(crate) segments: usize,
    pub(crate) text: String,
    /// The heading of the section the segment continues (host use only:
    /// not in the tool's JSON, so empty when read back from a chat).
    pub(crate) heading: String,
}

/// What one section worker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// 1-based section number.
    pub(crate) section: usize,
    pub(crate) text: String,
}

/// What `analyze_source` found: section workers' findings over a whole
/// source; partial when the section limit (or a failed worker) left
/// sections unanalyzed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Analysis {
    pub(crate) handle: String,
    pub(crate) title: String,
    pub(crate) sections: usize,
    pub(crate) analyzed: usize,
    pub(crate) coverage: Coverage,
    pub(crate) findings: Vec<Finding>,
    /// Section numbers that were not analyzed.
    pub(crate) unanalyzed: Vec<usize>,
    /// Why coverage is partial, for the model.
    pub(crate) note: Option<String>,
}

/// A failed call, as the model sees it: it never ends the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolOutput {
    Search(Found),
    Read(Passage),
    Analysis(Box<Analysis>),
    /// `save_note` wrote this file under the notes folder.
    Saved(String),
    /// A tool of an MCP server answered.
    Mcp(McpResult),
    Error(ToolError),
}

impl ToolOutput {
    pub(crate) fn error(code: &'static str, message: impl Into<String>) -> ToolOutput {
        ToolOutput::Error(ToolError { code, message: message.into() })
    }

    /// The call succeeded.
    pub(crate) fn ok(&self) -> bool {
        !matches!(self, ToolOutput::Error(_))
    }

    /// The JSON result (CONTRACTS.md "Built-in tools").
    pub(crate) fn to_json(&self) -> Value {
        match self {
            ToolOutput::Search(f) => {
                let results: Vec<Value> = f
                    .hits
                    .iter()
                    .map(|h| json!({"handle": h.handle, "title": h.title, "path": h.path, "segment": h.segment, "snippet": h.snippet}))
                    .collect();
                let mut out = json!({"results": results, "coverage": f.coverage.as_str()});
                if let Some(note) = &f.note {
                    out["note"] = json!(note);
                }
                out
            }
            ToolOutput::Read(p) => {
                json!({"handle": p.handle, "title": p.title, "segment": p.segment, "segments": p.segments, "text": p.text})
            }
            ToolOutput::Analysis(a) => {
                let findings: Vec<Value> = a
                    .findings
                    .iter()
                    .map(|f| json!({"section": f.section, "text": f.text}))
                    .collect();
                let mut out = json!({"handle": a.handle, "title": a.title, "sections": a.sections,
                    "analyzed": a.analyzed, "coverage": a.coverage.as_str(), "findings": findings});
                if !a.unanalyzed.is_empty() {
                    out["unanalyzed"] = json!(a.unanalyzed);
                }
                if let Some(note) = &a.note {
                    out["note"] = json!(note);
                }
                out
            }
            ToolOutput::Saved(name) => json!({"saved": name}),
            ToolOutput::Mcp(r) => match &r.structured {
                Some(s) => json!({"structured": s}),
                None => json!({"text": r.text}),
            },
            ToolOutput::Error(e) => json!({"error": {"code": e.code, "message": e.message}}),
        }
    }

    /// The successful search or read a stored tool message of `tool` holds
    /// (recovery: a run's earlier results, read back from the chat).
    pub(crate) fn from_stored(tool: &str, content: &str) -> Option<ToolOutput> {
        let v: Value = serde_json::from_str(content).ok()?;
        let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_owned();
        let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0) as usize;
        match tool {
            super::SEARCH => Some(ToolOutput::Search(Found {
                hits: v["results"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| Hit {
                        handle: s(r, "handle"),
                        title: s(r, "title"),
                        path: s(r, "path"),
                        segment: n(r, "segment"),
                        snippet: s(r, "snippet"),
                    })
                    .collect(),
                coverage: if v["coverage"] == "partial" {
                    Coverage::Partial
                } else {
                    Coverage::Complete
                },
                note: v["note"].as_str().map(str::to_owned),
            })),
            super::READ => Some(ToolOutput::Read(Passage {
                handle: s(&v, "handle"),
                title: s(&v, "title"),
                segment: n(&v, "segment"),
                segments: n(&v, "segments"),
                text: s(&v, "text"),
                heading: String::new(),
            })),
            super::ANALYZE => Some(ToolOutput::Analysis(Box::new(Analysis {
                handle: s(&v, "handle"),
                title: s(&v, "title"),
                sections: n(&v, "sections"),
                analyzed: n(&v, "analyzed"),
                coverage: if v["coverage"] == "partial" {
                    Coverage::Partial
                } else {
                    Coverage::Complete
                },
                findings: v["findings"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|f| Finding { section: n(f, "section"), text: s(f, "text") })
                    .collect(),
                unanalyzed: v["unanalyzed"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_u64)
                    .map(|x| x as usize)
                    .collect(),
                note: v["note"].as_str().map(str::to_owned),
            }))),
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
}
