//! OpenAI's Responses API (`POST /v1/responses`, `/v1/responses/input_tokens`):
//! the request, the response object, its output items and its streamed
//! events, as serde types, and the request's mapping to [`ChatRequest`]:
//!
//! | Responses | chat request |
//! |---|---|
//! | `instructions`; `system` / `developer` messages | system messages |
//! | `input` (a string, or `message` items with `input_text` / `output_text` parts) | user / assistant messages |
//! | `function_call` items | an assistant message's calls |
//! | `function_call_output` items | `tool` messages |
//! | `reasoning` items, other item types | left out |
//! | `tools[]` of `type: function` | tools (other tool types are left out) |
//! | `tool_choice` `auto` / `none` / `required` / `{"type": "function", "name"}` | [`Choice`] |
//! | `text.format` `json_schema` / `json_object` | the schema / any object, enforced |
//! | `max_output_tokens`, `temperature`, `top_p` | the token limit, the same knobs |
//! | `previous_response_id` (a kept response) | its conversation, then this input |

use super::openai::schema_constraint;
use super::{ChatRequest, Choice, Knobs, Text};
use crate::provider::constrain::Constraint;
use prompts::{Message, ToolCallMsg, ToolDef};
use serde::{Deserialize, Serialize};
use serde_json::Value;

// The request.

/// `POST /v1/responses`. Fields this server does not use (`metadata`,
/// `reasoning`, `include`, `truncation`, `user`, …) are accepted and
/// ignored.
#[derive(Debug, Deserialize)]
pub(crate) struct Create {
    #[serde(default)]
    pub(crate) input: Input,
    pub(crate) instructions: Option<String>,
    #[serde(default)]
    pub(crate) tools: Vec<Tool>,
    pub(crate) tool_choice: Option<ToolChoice>,
    pub(crate) parallel_tool_calls: Option<bool>,
    pub(crate) text: Option<TextParam>,
    pub(crate) max_output_tokens: Option<u64>,
    pub(crate) temperature: Option<f64>,
    pub(crate) top_p: Option<f64>,
    #[serde(default)]
    pub(crate) stream: bool,
    pub(crate) previous_response_id: Option<String>,
    pub(crate) store: Option<bool>,
    pub(crate) metadata: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be a string or an array of input items")]
pub(crate) enum Input {
    Text(String),
    Items(Vec<Item>),
}

impl Default for Input {
    fn default() -> Input {
        Input::Items(Vec::new())
    }
}

/// An input item: typed, or a bare `{role, content}` message.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "must be an input item: {\"type\": \"message\" | \"function_call\" | \"function_call_output\", …} or {\"role\", \"content\"}"
)]
pub(crate) enum Item {
    Typed(Typed),
    Message(MessageItem),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Typed {
    Message(MessageItem),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    /// Reasoning, web search calls, item references, …: left out.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
pub(crate) struct MessageItem {
    pub(crate) role: String,
    pub(crate) content: Text,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FunctionCallItem {
    pub(crate) call_id: String,
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) arguments: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FunctionCallOutputItem {
    pub(crate) call_id: String,
    pub(crate) output: Text,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Tool {
    Function {
        name: String,
        description: Option<String>,
        parameters: Option<Value>,
    },
    /// `custom`, `local_shell`, `web_search`, `file_search`, MCP …: there
    /// is nothing here to run them, so they are left out.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(untagged)]
pub(crate) enum ToolChoice {
    Mode(String),
    Object {
        #[serde(rename = "type")]
        kind: String,
        name: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
pub(crate) struct TextParam {
    pub(crate) format: Option<Format>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Format {
    Text,
    JsonObject,
    JsonSchema { schema: Value },
}

// What comes back.

/// A response object.
#[derive(Debug, Serialize, Clone)]
pub(crate) struct ResponseObject {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created_at: u64,
    pub(crate) status: &'static str,
    pub(crate) model: String,
    pub(crate) output: Vec<OutputItem>,
    pub(crate) usage: Option<Usage>,
    pub(crate) error: Option<ErrorBody>,
    pub(crate) incomplete_details: Option<Incomplete>,
    pub(crate) instructions: Option<String>,
    pub(crate) max_output_tokens: Option<u64>,
    pub(crate) parallel_tool_calls: bool,
    pub(crate) previous_response_id: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) top_p: Option<f64>,
    pub(crate) tool_choice: ToolChoice,
    pub(crate) tools: Vec<ToolOut>,
    pub(crate) text: TextOut,
    pub(crate) store: bool,
    /// The client's own key-value pairs, as it sent them.
    pub(crate) metadata: serde_json::Map<String, Value>,
}

/// A function tool as a response object lists it.
#[derive(Debug, Serialize, Clone)]
pub(crate) struct ToolOut {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    pub(crate) parameters: Option<Value>,
    pub(crate) strict: bool,
}

/// `text` of a response object: the format's type.
#[derive(Debug, Serialize, Clone)]
pub(crate) struct TextOut {
    pub(crate) format: FormatOut,
}

#[derive(Debug, Serialize, Clone)]
pub(crate) struct FormatOut {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
}

#[derive(Debug, Serialize, Clone)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputItem {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<TextPart>,
    },
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
}

#[derive(Debug, Serialize, Clone)]
pub(crate) struct TextPart {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) text: String,
    pub(crate) annotations: Vec<Value>,
    pub(crate) logprobs: Vec<Value>,
}

impl TextPart {
    pub(crate) fn new(text: String) -> TextPart {
        TextPart { kind: "output_text", text, annotations: Vec::new(), logprobs: Vec::new() }
    }
}

#[derive(Debug, Serialize, Clone)]
pub(crate) struct ReasoningPart {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) text: String,
}

#[derive(Debug, Serialize, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) input_tokens: usize,
    pub(crate) input_tokens_details: CachedTokens,
    pub(crate) output_tokens: usize,
    pub(crate) output_tokens_details: ReasoningTokens,
    pub(crate) total_tokens: usize,
}

#[derive(Debug, Serialize, Clone, Copy)]
pub(crate) struct CachedTokens {
    pub(crate) cached_tokens: usize,
}

#[derive(Debug, Serialize, Clone, Copy)]
pub(crate) struct ReasoningTokens {
    pub(crate) reasoning_tokens: usize,
}

#[derive(Debug, Serialize, Clone)]
pub(crate) struct ErrorBody {
    pub(crate) code: String,
    pub(crate) message: String,
}

#[derive(Debug, Serialize, Clone)]
pub(crate) struct Incomplete {
    pub(crate) reason: &'static str,
}

/// One streamed event: its payload (whose `type` is also the SSE event
/// name) and its place in the stream.
#[derive(Debug, Serialize)]
pub(crate) struct StreamEvent<'a> {
    #[serde(flatten)]
    pub(crate) payload: Payload<'a>,
    pub(crate) sequence_number: u64,
}

/// What a streamed event says, in the documented order: `created`,
/// `in_progress`; per output item `output_item.added`, its parts and
/// deltas, their `.done`s, `output_item.done`; last `completed`,
/// `incomplete` or `failed`.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub(crate) enum Payload<'a> {
    #[serde(rename = "response.created")]
    Created { response: &'a ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: &'a ResponseObject },
    #[serde(rename = "response.completed")]
    Completed { response: &'a ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: &'a ResponseObject },
    #[serde(rename = "response.failed")]
    Failed { response: &'a ResponseObject },
    #[serde(rename = "response.output_item.added")]
    ItemAdded { output_index: usize, item: &'a OutputItem },
    #[serde(rename = "response.output_item.done")]
    ItemDone { output_index: usize, item: &'a OutputItem },
    #[serde(rename = "response.content_part.added")]
    PartAdded { item_id: &'a str, output_index: usize, content_index: usize, part: &'a TextPart },
    #[serde(rename = "response.content_part.done")]
    PartDone { item_id: &'a str, output_index: usize, content_index: usize, part: &'a TextPart },
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        delta: &'a str,
        logprobs: &'a [Value],
    },
    #[serde(rename = "response.output_text.done")]
    TextDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        text: &'a str,
        logprobs: &'a [Value],
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta { item_id: &'a str, output_index: usize, content_index: usize, delta: &'a str },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone { item_id: &'a str, output_index: usize, content_index: usize, text: &'a str },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta { item_id: &'a str, output_index: usize, delta: &'a str },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone { item_id: &'a str, output_index: usize, name: &'a str, arguments: &'a str },
}

impl Payload<'_> {
    /// The SSE `event:` name (the `type`).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Payload::Created { .. } => "response.created",
            Payload::InProgress { .. } => "response.in_progress",
            Payload::Completed { .. } => "response.completed",
            Payload::Incomplete { .. } => "response.incomplete",
            Payload::Failed { .. } => "response.failed",
            Payload::ItemAdded { .. } => "response.output_item.added",
            Payload::ItemDone { .. } => "response.output_item.done",
            Payload::PartAdded { .. } => "response.content_part.added",
            Payload::PartDone { .. } => "response.content_part.done",
            Payload::TextDelta { .. } => "response.output_text.delta",
            Payload::TextDone { .. } => "response.output_text.done",
            Payload::ReasoningDelta { .. } => "response.reasoning_text.delta",
            Payload::ReasoningDone { .. } => "response.reasoning_text.done",
            Payload::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Payload::ArgumentsDone { .. } => "response.function_call_arguments.done",
        }
    }
}

/// `DELETE /v1/responses/{id}`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct Deleted {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) deleted: bool,
}

/// `POST /v1/responses/input_tokens`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct InputTokens {
    pub(crate) object: &'static str,
    pub(crate) input_tokens: usize,
}

// From a request to the chat request.

/// The parts of a message this server reads.
const READABLE: [&str; 4] = ["input_text", "output_text", "text", "refusal"];

/// A message item as a chat message (`developer` is `system`).
fn message(m: &MessageItem, at: &str) -> Result<Message, String> {
    let role = match m.role.as_str() {
        "user" | "assistant" | "system" => m.role.as_str(),
        "developer" => "system",
        other => {
            return Err(format!("{at}.role {other:?}: use user, assistant, system or developer"))
        }
    };
    Ok(Message::new(role, m.content.text(&format!("{at}.content"), &READABLE)?))
}

/// Tokens a response may write when the request does not say.
const DEFAULT_MAX_OUTPUT: u64 = 4096;

impl Create {
    /// The conversation of `input` after `earlier` (a kept one): what a
    /// kept response continues from.
    pub(crate) fn conversation(&self, earlier: Vec<Message>) -> Result<Vec<Message>, String> {
        let mut msgs = earlier;
        let items = match &self.input {
            Input::Text(s) => {
                msgs.push(Message::new("user", s.clone()));
                return Ok(msgs);
            }
            Input::Items(items) => items,
        };
        for (i, item) in items.iter().enumerate() {
            let at = format!("input[{i}]");
            match item {
                Item::Message(m) | Item::Typed(Typed::Message(m)) => msgs.push(message(m, &at)?),
                Item::Typed(Typed::FunctionCall(c)) => {
                    let args = if c.arguments.trim().is_empty() { "{}" } else { &c.arguments };
                    let call = ToolCallMsg::new(&c.call_id, &c.name, args);
                    match msgs.last_mut() {
                        Some(last) if last.role == "assistant" => last.tool_calls.push(call),
                        _ => {
                            let mut m = Message::new("assistant", "");
                            m.tool_calls.push(call);
                            msgs.push(m);
                        }
                    }
                }
                Item::Typed(Typed::FunctionCallOutput(o)) => {
                    let mut m =
                        Message::new("tool", o.output.text(&format!("{at}.output"), &READABLE)?);
                    m.tool_call_id = Some(o.call_id.clone());
                    msgs.push(m);
                }
                Item::Typed(Typed::Other) => {}
            }
        }
        if msgs.is_empty() {
            return Err("input: give a string or at least one item".into());
        }
        Ok(msgs)
    }

    /// The chat request for `conversation` (instructions first).
    pub(crate) fn chat(&self, conversation: &[Message]) -> Result<ChatRequest, String> {
        let mut messages = Vec::with_capacity(conversation.len() + 1);
        if let Some(i) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            messages.push(Message::new("system", i.clone()));
        }
        messages.extend(conversation.iter().cloned());
        let tools: Vec<ToolDef> =
            self.tools
                .iter()
                .filter_map(|t| match t {
                    Tool::Function { name, description, parameters } => Some(ToolDef {
                        name: name.clone(),
                        description: description.clone().unwrap_or_default(),
                        parameters: parameters.clone().filter(|p| !p.is_null()).unwrap_or_else(
                            || serde_json::json!({"type": "object", "properties": {}}),
                        ),
                    }),
                    Tool::Other => None,
                })
                .collect();
        // A choice among tools none of which is here (a `custom` or
        // hosted tool) leaves the model free.
        let choice = match &self.tool_choice {
            _ if tools.is_empty() => Choice::Auto,
            Some(ToolChoice::Mode(m)) => match m.as_str() {
                "auto" => Choice::Auto,
                "none" => Choice::None,
                "required" => Choice::Required,
                other => return Err(format!("tool_choice {other:?}: use auto, none or required")),
            },
            Some(ToolChoice::Object { kind, name: Some(n) }) if kind == "function" => {
                Choice::Named(n.clone())
            }
            Some(ToolChoice::Object { .. }) | None => Choice::Auto,
        };
        let format = match self.text.as_ref().and_then(|t| t.format.as_ref()) {
            Some(Format::JsonSchema { schema, .. }) => {
                Some(schema_constraint(Some(schema.clone()), "text.format.schema")?)
            }
            Some(Format::JsonObject) => Some(Constraint::JsonObject),
            Some(Format::Text) | None => None,
        };
        let knobs = Knobs { temperature: self.temperature, top_p: self.top_p, ..Knobs::default() };
        Ok(ChatRequest {
            messages,
            tools,
            choice,
            format,
            max_tokens: Some(self.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT) as usize),
            knobs,
            ..ChatRequest::default()
        })
    }
}
