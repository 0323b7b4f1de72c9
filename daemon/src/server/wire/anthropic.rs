//! Anthropic's Messages API (`POST /v1/messages`,
//! `/v1/messages/count_tokens`): the request, the message, the stream's
//! events and the error body, as serde types, and the request's mapping
//! to [`ChatRequest`]:
//!
//! | Messages | chat request |
//! |---|---|
//! | `system` (string or text blocks), then `system`-role messages among `messages` (Claude Code) | one first system message, joined in order |
//! | `tool_use` block (assistant) | a call of the assistant message, `arguments` = `input` |
//! | `tool_result` block (user) | a `tool` message answering `tool_use_id` (`is_error`: its text begins `Error: `) |
//! | `thinking`, `redacted_thinking`, server tools' blocks | left out |
//! | `tools[]` (`custom` or untyped) | tools; server tools (`web_search_…`, `bash_…`) left out |
//! | `tool_choice` `auto` / `any` / `tool` / `none` | [`Choice`] |
//! | `output_config.format` (or the beta's `output_format`) `json_schema` | the schema, enforced |
//! | `max_tokens`, `stop_sequences`, `temperature` (0..1), `top_p`, `top_k` | the same |
//! | `thinking` `enabled` + `budget_tokens` | the reasoning budget; `disabled`: reasoning not shown |

use super::{ChatRequest, Choice, Knobs, Text};
use crate::provider::constrain::Constraint;
use prompts::{Message, ToolCallMsg, ToolDef};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

// The request.

/// A Messages request (the count route's has no `max_tokens`). Unknown
/// fields (`metadata`, `cache_control`, `context_management`, …) are
/// accepted and ignored, as is the `anthropic-beta` header.
#[derive(Debug, Deserialize)]
pub(crate) struct Request {
    pub(crate) model: String,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) messages: Vec<InMessage>,
    pub(crate) system: Option<Text>,
    pub(crate) tools: Option<Vec<Tool>>,
    pub(crate) tool_choice: Option<ToolChoice>,
    pub(crate) output_config: Option<OutputConfig>,
    pub(crate) output_format: Option<OutputFormat>,
    pub(crate) stop_sequences: Option<Vec<String>>,
    pub(crate) temperature: Option<f64>,
    pub(crate) top_p: Option<f64>,
    pub(crate) top_k: Option<f64>,
    pub(crate) stream: Option<bool>,
    pub(crate) thinking: Option<Thinking>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct InMessage {
    pub(crate) role: InRole,
    pub(crate) content: Blocks,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum InRole {
    User,
    Assistant,
    /// Claude Code sends these beside the top-level `system`.
    System,
}

/// A message's content: a string or blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be a string or an array of content blocks")]
pub(crate) enum Blocks {
    Plain(String),
    Blocks(Vec<Block>),
}

/// A content block: one this server reads, or another kind (by name).
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be a content block with a string `type`")]
pub(crate) enum Block {
    Known(Known),
    Other {
        #[serde(rename = "type")]
        kind: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Known {
    Text { text: String },
    ToolUse { id: String, name: String, input: Option<Map<String, Value>> },
    ToolResult { tool_use_id: String, content: Option<Text>, is_error: Option<bool> },
    Thinking {},
    RedactedThinking {},
}

/// A tool offered. Server tools (a `type` other than `custom`) have no
/// schema and run on Anthropic's side.
#[derive(Debug, Deserialize)]
pub(crate) struct Tool {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) description: Option<String>,
    pub(crate) input_schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ToolChoice {
    Auto {},
    Any {},
    None {},
    Tool { name: String },
}

#[derive(Debug, Deserialize)]
pub(crate) struct OutputConfig {
    pub(crate) format: Option<OutputFormat>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputFormat {
    JsonSchema { schema: Map<String, Value> },
}

/// Extended thinking.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Thinking {
    Enabled { budget_tokens: u64 },
    Adaptive {},
    Disabled {},
}

/// What the reply's shape depends on besides the chat request.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub(crate) model: String,
    pub(crate) stream: bool,
    /// Whether reasoning is shown as `thinking` blocks.
    pub(crate) show_thinking: bool,
    /// The request's stop sequences (a reply that ends at one says which).
    pub(crate) stop_sequences: Vec<String>,
}

impl Request {
    /// The chat request this asks for (`count`: for counting, where
    /// `max_tokens` is not asked for), and the reply's shape.
    pub(crate) fn into_chat(self, count: bool) -> Result<(ChatRequest, Shape), String> {
        let max_tokens = match self.max_tokens {
            Some(n) => Some(n as usize),
            None if count => None,
            None => return Err("max_tokens: Field required".into()),
        };
        let mut system = Vec::new();
        if let Some(s) = &self.system {
            system.push(s.text("system", &["text"])?);
        }
        let mut messages = Vec::new();
        for (i, m) in self.messages.iter().enumerate() {
            let at = format!("messages.{i}");
            let plain;
            let blocks: &[Block] = match &m.content {
                Blocks::Plain(s) => {
                    plain = [Block::Known(Known::Text { text: s.clone() })];
                    &plain
                }
                Blocks::Blocks(b) => b,
            };
            if m.role == InRole::System {
                let mut text = String::new();
                for (j, b) in blocks.iter().enumerate() {
                    match b {
                        Block::Known(Known::Text { text: t }) => text.push_str(t),
                        _ => {
                            return Err(format!(
                                "{at}.content.{j}: a system message holds only text blocks"
                            ))
                        }
                    }
                }
                system.push(text);
                continue;
            }
            let role = if m.role == InRole::User { "user" } else { "assistant" };
            let (mut text, mut calls) = (String::new(), Vec::new());
            for (j, b) in blocks.iter().enumerate() {
                let at = format!("{at}.content.{j}");
                match b {
                    Block::Known(Known::Text { text: t }) => text.push_str(t),
                    Block::Known(Known::ToolUse { id, name, input }) if role == "assistant" => {
                        let input = Value::Object(input.clone().unwrap_or_default());
                        calls.push(ToolCallMsg::new(id, name, &input.to_string()));
                    }
                    Block::Known(Known::ToolResult { tool_use_id, content, is_error }) if role == "user" => {
                        let content = match content {
                            Some(c) => c.text(&format!("{at}.content"), &["text"])?,
                            None => String::new(),
                        };
                        let content =
                            if *is_error == Some(true) { format!("Error: {content}") } else { content };
                        let mut msg = Message::new("tool", content);
                        msg.tool_call_id = Some(tool_use_id.clone());
                        messages.push(msg);
                    }
                    // Earlier reasoning is not replayed, nor server tools'
                    // use and results (there are none here).
                    Block::Known(Known::Thinking {} | Known::RedactedThinking {}) if role == "assistant" => {}
                    Block::Other { kind } if kind.starts_with("server_tool_use") || kind.ends_with("_tool_result") => {}
                    Block::Other { kind } if ["text", "tool_use", "tool_result"].contains(&kind.as_str()) => {
                        return Err(format!(
                            "{at}: a malformed {kind} block (text needs `text`; tool_use `id`, `name`, `input`; tool_result `tool_use_id`)"
                        ))
                    }
                    Block::Known(k) => {
                        let kind = match k {
                            Known::Text { .. } => "text",
                            Known::ToolUse { .. } => "tool_use",
                            Known::ToolResult { .. } => "tool_result",
                            Known::Thinking {} => "thinking",
                            Known::RedactedThinking {} => "redacted_thinking",
                        };
                        return Err(format!("{at}: a {kind:?} block is not supported in a {role} message"));
                    }
                    Block::Other { kind } => {
                        return Err(format!("{at}: a {kind:?} block is not supported in a {role} message"))
                    }
                }
            }
            if role == "assistant" || !text.is_empty() {
                let mut msg = Message::new(role, text);
                msg.tool_calls = calls;
                messages.push(msg);
            }
        }
        if messages.is_empty() {
            return Err("messages must hold at least one user or assistant message".into());
        }
        let system = system.join("\n\n");
        let system = system.trim_start();
        if !system.is_empty() {
            messages.insert(0, Message::new("system", system));
        }
        let mut tools = Vec::new();
        for (i, t) in self.tools.into_iter().flatten().enumerate() {
            // Server tools (`web_search_…`, `code_execution_…`, `bash_…`)
            // run on Anthropic's side; there is none here, so they are left
            // out, as a client that offers them expects of a server without
            // them.
            if t.kind.as_deref().is_some_and(|k| k != "custom") {
                continue;
            }
            let Some(name) = t.name.filter(|n| !n.is_empty()) else {
                return Err(format!("tools.{i}.name must be a non-empty string"));
            };
            let Some(schema @ Value::Object(_)) = t.input_schema else {
                return Err(format!("tools.{i}.input_schema must be a JSON Schema object"));
            };
            tools.push(ToolDef {
                name,
                description: t.description.unwrap_or_default(),
                parameters: schema,
            });
        }
        let choice = match self.tool_choice {
            None | Some(ToolChoice::Auto {}) => Choice::Auto,
            Some(ToolChoice::Any {}) => Choice::Required,
            Some(ToolChoice::None {}) => Choice::None,
            Some(ToolChoice::Tool { name }) => Choice::Named(name),
        };
        let format = self.output_config.and_then(|c| c.format).or(self.output_format).map(
            |OutputFormat::JsonSchema { schema }| Constraint::JsonSchema(Value::Object(schema)),
        );
        if let Some(t) = self.temperature {
            if !(0.0..=1.0).contains(&t) {
                return Err("temperature must be between 0 and 1".into());
            }
        }
        let knobs = Knobs {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            ..Knobs::default()
        };
        let stop = self.stop_sequences.unwrap_or_default();
        let (show_thinking, reasoning_budget) = match self.thinking {
            Some(Thinking::Disabled {}) => (false, None),
            Some(Thinking::Enabled { budget_tokens }) => (true, Some(budget_tokens as usize)),
            Some(Thinking::Adaptive {}) | None => (true, None),
        };
        let shape = Shape {
            model: self.model,
            stream: self.stream.unwrap_or(false),
            show_thinking,
            stop_sequences: stop.clone(),
        };
        let chat = ChatRequest {
            messages,
            tools,
            choice,
            format,
            max_tokens,
            knobs,
            stop,
            raw: None,
            reasoning_budget,
        };
        Ok((chat, shape))
    }
}

// The reply.

/// A whole message, and `message_start`'s (empty) one.
#[derive(Debug, Serialize)]
pub(crate) struct MessageOut {
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) role: &'static str,
    pub(crate) model: String,
    pub(crate) content: Vec<BlockOut>,
    pub(crate) stop_reason: Option<&'static str>,
    pub(crate) stop_sequence: Option<String>,
    pub(crate) usage: Usage,
}

/// A content block of the reply.
#[derive(Debug, Serialize, Clone)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum BlockOut {
    Text { text: String },
    Thinking { thinking: String, signature: String },
    ToolUse { id: String, name: String, input: Value },
}

#[derive(Debug, Serialize, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) input_tokens: usize,
    pub(crate) output_tokens: usize,
    pub(crate) cache_creation_input_tokens: usize,
    pub(crate) cache_read_input_tokens: usize,
}

/// A streamed event; its SSE event name is its `type`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum StreamEvent {
    MessageStart { message: MessageOut },
    Ping,
    ContentBlockStart { index: usize, content_block: BlockOut },
    ContentBlockDelta { index: usize, delta: DeltaOut },
    ContentBlockStop { index: usize },
    MessageDelta { delta: Ending, usage: Usage },
    MessageStop,
    Error { error: ErrorDetail },
}

impl StreamEvent {
    /// The SSE `event:` name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::Ping => "ping",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
            StreamEvent::Error { .. } => "error",
        }
    }
}

/// What a `content_block_delta` adds (`type` `text_delta`, …).
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub(crate) enum DeltaOut {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
}

/// How the message ended (`message_delta`).
#[derive(Debug, Serialize)]
pub(crate) struct Ending {
    pub(crate) stop_reason: &'static str,
    pub(crate) stop_sequence: Option<String>,
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorBody {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) error: ErrorDetail,
}

#[derive(Debug, Serialize)]
pub(crate) struct ErrorDetail {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

/// The error `type` Anthropic gives a status.
pub(crate) fn error_kind(status: u16) -> &'static str {
    match status {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// `count_tokens`' answer.
#[derive(Debug, Serialize)]
pub(crate) struct InputTokens {
    pub(crate) input_tokens: usize,
}
