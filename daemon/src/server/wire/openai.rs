//! OpenAI's chat completions (`POST /v1/chat/completions`): the request,
//! the reply, its stream chunks and the error body, as serde types, and
//! the request's mapping to [`ChatRequest`].

use super::{knob_fields, ChatRequest, Choice, Collected, Piece, Text};
use crate::provider::chat::ChatOutput;
use crate::provider::constrain::Constraint;
use crate::provider::TurnFinish;
use prompts::{Message, ToolCallMsg, ToolDef};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

// The request.

knob_fields! {
    /// A chat completions request. Fields this server has no use for
    /// (`user`, `metadata`, `logit_bias`, `strict`, …) are accepted and
    /// ignored; `model` was resolved before (`State::for_body`).
    #[derive(Debug, Deserialize)]
    pub(crate) struct Request {
        pub(crate) messages: Vec<ChatMessage>,
        pub(crate) tools: Option<Vec<Tool>>,
        pub(crate) tool_choice: Option<ToolChoice>,
        pub(crate) response_format: Option<ResponseFormat>,
        pub(crate) max_tokens: Option<u64>,
        pub(crate) max_completion_tokens: Option<u64>,
        pub(crate) n: Option<u64>,
        pub(crate) stop: Option<Stop>,
        pub(crate) stream: Option<bool>,
        pub(crate) stream_options: Option<StreamOptions>,
    }
}

/// A message of the conversation.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatMessage {
    pub(crate) role: Role,
    pub(crate) content: Option<Text>,
    pub(crate) tool_calls: Option<Vec<CallParam>>,
    pub(crate) tool_call_id: Option<String>,
    pub(crate) name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// The template's role (`developer` is `system`).
    fn as_template(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A call in an assistant message of the history.
#[derive(Debug, Deserialize)]
pub(crate) struct CallParam {
    pub(crate) id: Option<String>,
    pub(crate) function: FunctionParam,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FunctionParam {
    pub(crate) name: String,
    pub(crate) arguments: Option<Arguments>,
}

/// Arguments as JSON text (OpenAI) or an object (what Ollama sends).
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be a JSON string (or an object)")]
pub(crate) enum Arguments {
    Text(String),
    Object(Map<String, Value>),
}

impl Arguments {
    pub(crate) fn text(&self) -> String {
        match self {
            Arguments::Text(s) if s.trim().is_empty() => "{}".into(),
            Arguments::Text(s) => s.clone(),
            Arguments::Object(o) => Value::Object(o.clone()).to_string(),
        }
    }
}

/// A tool offered: `{"type": "function", "function": {…}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct Tool {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) function: FunctionDef,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FunctionDef {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    pub(crate) parameters: Option<Map<String, Value>>,
}

impl FunctionDef {
    /// The tool as the template takes it (no parameters: an empty object).
    pub(crate) fn into_def(self, at: &str) -> Result<ToolDef, String> {
        if self.name.is_empty() {
            return Err(format!("{at}.name must be a non-empty string"));
        }
        let parameters = match self.parameters {
            Some(p) => Value::Object(p),
            None => serde_json::json!({"type": "object", "properties": {}}),
        };
        Ok(ToolDef {
            name: self.name,
            description: self.description.unwrap_or_default(),
            parameters,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}"
)]
pub(crate) enum ToolChoice {
    Mode(Mode),
    Named { function: Named },
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    Auto,
    None,
    Required,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Named {
    pub(crate) name: String,
}

/// `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchema },
}

#[derive(Debug, Deserialize)]
pub(crate) struct JsonSchema {
    pub(crate) schema: Option<Value>,
}

/// What a JSON Schema `schema` field enforces: an object or boolean
/// schema, or (absent) any JSON object.
pub(crate) fn schema_constraint(schema: Option<Value>, at: &str) -> Result<Constraint, String> {
    match schema {
        Some(s @ (Value::Object(_) | Value::Bool(_))) => Ok(Constraint::JsonSchema(s)),
        None | Some(Value::Null) => Ok(Constraint::JsonObject),
        Some(_) => Err(format!("`{at}` must be a JSON Schema object")),
    }
}

impl ResponseFormat {
    fn constraint(self) -> Result<Option<Constraint>, String> {
        match self {
            ResponseFormat::Text => Ok(None),
            ResponseFormat::JsonObject => Ok(Some(Constraint::JsonObject)),
            ResponseFormat::JsonSchema { json_schema } => {
                schema_constraint(json_schema.schema, "response_format.json_schema.schema")
                    .map(Some)
            }
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be a string or an array of up to 4 strings")]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub(crate) struct StreamOptions {
    pub(crate) include_usage: Option<bool>,
}

/// What the reply's shape depends on besides the chat request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) stream: bool,
    pub(crate) usage_in_stream: bool,
}

/// The template's messages of a conversation (`developer` is `system`).
pub(crate) fn messages(list: Vec<ChatMessage>) -> Result<Vec<Message>, String> {
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let text = match &m.content {
            None => String::new(),
            Some(c) => c.text(&format!("{at}.content"), &["text"])?,
        };
        let mut msg = Message::new(m.role.as_template(), text);
        for c in m.tool_calls.into_iter().flatten() {
            let args = c.function.arguments.as_ref().map_or_else(|| "{}".into(), Arguments::text);
            let id = c.id.as_deref().unwrap_or("call_0");
            msg.tool_calls.push(ToolCallMsg::new(id, &c.function.name, &args));
        }
        if m.role == Role::Tool {
            msg.tool_call_id = m.tool_call_id;
            msg.name = m.name;
        }
        messages.push(msg);
    }
    Ok(messages)
}

impl Request {
    /// The chat request this asks for, and the reply's shape.
    pub(crate) fn into_chat(self) -> Result<(ChatRequest, Shape), String> {
        let knobs = self.knobs();
        if self.messages.is_empty() {
            return Err("`messages` must be a non-empty array".into());
        }
        let messages = messages(self.messages)?;
        let mut tools = Vec::new();
        for (i, t) in self.tools.into_iter().flatten().enumerate() {
            if t.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(format!("`tools[{i}].type` must be \"function\""));
            }
            tools.push(t.function.into_def(&format!("`tools[{i}].function`"))?);
        }
        let choice = match self.tool_choice {
            None | Some(ToolChoice::Mode(Mode::Auto)) => Choice::Auto,
            Some(ToolChoice::Mode(Mode::None)) => Choice::None,
            Some(ToolChoice::Mode(Mode::Required)) => Choice::Required,
            Some(ToolChoice::Named { function }) => Choice::Named(function.name),
        };
        let format = match self.response_format {
            Some(f) => f.constraint()?,
            None => None,
        };
        if self.n.is_some_and(|n| n != 1) {
            return Err("only `n: 1` is supported".into());
        }
        let stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) if v.len() <= 4 => v,
            Some(Stop::Many(_)) => {
                return Err("`stop` must be a string or an array of up to 4 strings".into())
            }
        };
        let max_tokens = self.max_completion_tokens.or(self.max_tokens).map(|n| n as usize);
        let shape = Shape {
            stream: self.stream.unwrap_or(false),
            usage_in_stream: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
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
            reasoning_budget: None,
        };
        Ok((chat, shape))
    }
}

// The reply.

/// A whole reply (`object: chat.completion`).
#[derive(Debug, Serialize)]
pub(crate) struct Completion {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) choices: Vec<CompletionChoice>,
    pub(crate) usage: Usage,
}

#[derive(Debug, Serialize)]
pub(crate) struct CompletionChoice {
    pub(crate) index: u32,
    pub(crate) message: Reply,
    pub(crate) finish_reason: &'static str,
    pub(crate) logprobs: Option<Value>,
}

/// The assistant's message; `content` is null when it only calls.
#[derive(Debug, Serialize)]
pub(crate) struct Reply {
    pub(crate) role: &'static str,
    pub(crate) content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<CallOut>,
}

/// A call the model made (`index` only in a stream's delta).
#[derive(Debug, Serialize)]
pub(crate) struct CallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) index: Option<usize>,
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) function: FunctionOut,
}

#[derive(Debug, Serialize)]
pub(crate) struct FunctionOut {
    pub(crate) name: String,
    pub(crate) arguments: String,
}

impl CallOut {
    pub(crate) fn of(c: &toolparse::ToolCall, index: Option<usize>) -> CallOut {
        CallOut {
            index,
            id: super::call_id(c, "call"),
            kind: "function",
            function: FunctionOut { name: c.name.clone(), arguments: c.arguments.clone() },
        }
    }
}

#[derive(Debug, Serialize, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
    pub(crate) total_tokens: usize,
    pub(crate) prompt_tokens_details: Cached,
}

#[derive(Debug, Serialize, Clone, Copy)]
pub(crate) struct Cached {
    pub(crate) cached_tokens: usize,
}

impl Usage {
    pub(crate) fn of(o: &ChatOutput) -> Usage {
        Usage {
            prompt_tokens: o.prompt_tokens,
            completion_tokens: o.completion_tokens,
            total_tokens: o.prompt_tokens + o.completion_tokens,
            prompt_tokens_details: Cached { cached_tokens: o.reused_tokens },
        }
    }
}

/// Why the reply ended.
pub(crate) fn finish_reason(o: &ChatOutput, calls: usize) -> &'static str {
    if calls > 0 {
        "tool_calls"
    } else if o.finish == TurnFinish::Length {
        "length"
    } else {
        "stop"
    }
}

impl Completion {
    /// The whole reply of a collected turn.
    pub(crate) fn of(
        id: String,
        created: u64,
        model: String,
        c: &Collected,
        o: &ChatOutput,
    ) -> Completion {
        let tool_calls: Vec<CallOut> =
            c.calls().into_iter().map(|call| CallOut::of(call, None)).collect();
        let text = c.text();
        let reasoning = c.reasoning();
        let message = Reply {
            role: "assistant",
            content: if text.is_empty() && !tool_calls.is_empty() { None } else { Some(text) },
            reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
            tool_calls,
        };
        let calls = message.tool_calls.len();
        Completion {
            id,
            object: "chat.completion",
            created,
            model,
            choices: vec![CompletionChoice {
                index: 0,
                message,
                finish_reason: finish_reason(o, calls),
                logprobs: None,
            }],
            usage: Usage::of(o),
        }
    }
}

/// A stream chunk (`object: chat.completion.chunk`).
#[derive(Debug, Serialize)]
pub(crate) struct Chunk<'a> {
    pub(crate) id: &'a str,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<Usage>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ChunkChoice {
    pub(crate) index: u32,
    pub(crate) delta: Delta,
    pub(crate) finish_reason: Option<&'static str>,
    pub(crate) logprobs: Option<Value>,
}

/// What a chunk adds.
#[derive(Debug, Serialize, Default)]
pub(crate) struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<CallOut>,
}

impl Delta {
    /// The delta of one piece of the reply (`calls` numbers the calls).
    pub(crate) fn of(p: Piece, calls: &mut usize) -> Delta {
        match p {
            Piece::Text(s) => Delta { content: Some(s), ..Delta::default() },
            Piece::Reasoning(s) => Delta { reasoning_content: Some(s), ..Delta::default() },
            Piece::Call(c) => {
                *calls += 1;
                Delta { tool_calls: vec![CallOut::of(&c, Some(*calls - 1))], ..Delta::default() }
            }
        }
    }
}

/// OpenAI's error body: `{"error": {"code", "message", "type"}}`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorDetail {
    pub(crate) code: String,
    pub(crate) message: String,
    #[serde(rename = "type")]
    pub(crate) kind: String,
}

impl ErrorBody {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail { code: code.into(), message: message.into(), kind: code.into() },
        }
    }
}

/// `GET /v1/models`.
#[derive(Debug, Serialize)]
pub(crate) struct ModelList {
    pub(crate) object: &'static str,
    pub(crate) data: Vec<ModelCard>,
}

/// A model of `GET /v1/models`; `loaded` where models load on demand,
/// `upstream` in front of an upstream engine.
#[derive(Debug, Serialize)]
pub(crate) struct ModelCard {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) owned_by: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) loaded: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) upstream: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) upstream_models: Option<Vec<String>>,
}

impl ModelCard {
    pub(crate) fn new(id: String) -> ModelCard {
        ModelCard {
            id,
            object: "model",
            created: 0,
            owned_by: "agentd",
            loaded: None,
            upstream: None,
            upstream_models: None,
        }
    }
}

impl ModelList {
    pub(crate) fn of(data: Vec<ModelCard>) -> ModelList {
        ModelList { object: "list", data }
    }
}
