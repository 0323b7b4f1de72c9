//! Ollama's chat and generate requests (`POST /api/chat`,
//! `/api/generate`) and their replies (NDJSON lines while streaming, one
//! object otherwise), as serde types, and the requests' mapping to
//! [`ChatRequest`]:
//!
//! | Ollama | chat request |
//! |---|---|
//! | `messages[].tool_calls[].function.arguments` (an object) | the call's arguments |
//! | `messages[].tool_name` (role `tool`) | the tool message's name |
//! | `format: "json"` / `format: {schema}` | any JSON object / the schema, enforced |
//! | `options.num_predict` (> 0; -1, -2: up to the context) | the token limit |
//! | `options.temperature` / `top_p` / `top_k` / `min_p` / `seed` / `stop` / `repeat_penalty` / `repeat_last_n` / `frequency_penalty` / `presence_penalty` / `no_repeat_ngram` | the same knobs |
//! | `think: false` | reasoning left out of the reply |
//!
//! `keep_alive` is how long the model stays loaded after the reply
//! (`State::for_body` reads it); `options.num_ctx` is accepted and has no
//! effect (the model's context is the daemon's).

use super::openai::{Arguments, FunctionDef};
use super::{knob_fields, ChatRequest, Choice};
use crate::provider::constrain::Constraint;
use prompts::{Message, ToolCallMsg};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /api/chat` and `POST /api/generate`: chat has `messages` and
/// `tools`; generate `prompt`, `system`, `suffix`, `raw` and `images`; the
/// rest both (a field of the other route is ignored, as Ollama does).
#[derive(Debug, Deserialize)]
pub(crate) struct Body {
    pub(crate) messages: Option<Vec<InMessage>>,
    pub(crate) tools: Option<Vec<Tool>>,
    pub(crate) prompt: Option<String>,
    pub(crate) system: Option<String>,
    pub(crate) suffix: Option<String>,
    pub(crate) raw: Option<bool>,
    pub(crate) images: Option<Vec<Value>>,
    pub(crate) format: Option<Format>,
    pub(crate) options: Option<Options>,
    pub(crate) stream: Option<bool>,
    pub(crate) think: Option<Think>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be \"json\" or a JSON schema object")]
pub(crate) enum Format {
    Named(String),
    Schema(Map<String, Value>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be a boolean or \"low\", \"medium\", \"high\"")]
pub(crate) enum Think {
    On(bool),
    Level(String),
}

knob_fields! {
    /// `options`: a Modelfile's parameters for this request.
    #[derive(Debug, Deserialize, Default)]
    pub(crate) struct Options {
        pub(crate) num_predict: Option<i64>,
        /// Read for its type only (a context size must be a positive
        /// integer); the model's context is the daemon's.
        #[allow(dead_code)]
        pub(crate) num_ctx: Option<u64>,
        pub(crate) stop: Option<Vec<String>>,
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct InMessage {
    pub(crate) role: Role,
    pub(crate) content: Option<String>,
    pub(crate) images: Option<Vec<Value>>,
    pub(crate) tool_calls: Option<Vec<InCall>>,
    pub(crate) tool_name: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Deserialize)]
pub(crate) struct InCall {
    pub(crate) id: Option<String>,
    pub(crate) function: InFunction,
}

#[derive(Debug, Deserialize)]
pub(crate) struct InFunction {
    pub(crate) name: String,
    pub(crate) arguments: Option<Arguments>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Tool {
    pub(crate) function: FunctionDef,
}

/// What the reply's shape depends on besides the chat request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) stream: bool,
    /// Whether reasoning is shown (`think` not false).
    pub(crate) think: bool,
}

impl Body {
    /// The request's common part over `messages` (`context`: the
    /// model's, for an unbounded `num_predict`).
    fn common(
        self,
        messages: Vec<Message>,
        context: usize,
    ) -> Result<(ChatRequest, Shape), String> {
        let format = match self.format {
            None => None,
            Some(Format::Named(s)) if s.is_empty() => None,
            Some(Format::Named(s)) if s == "json" => Some(Constraint::JsonObject),
            Some(Format::Named(_)) => {
                return Err("`format` must be \"json\" or a JSON schema object".into())
            }
            Some(Format::Schema(s)) => Some(Constraint::JsonSchema(Value::Object(s))),
        };
        let o = self.options.unwrap_or_default();
        let max_tokens = match o.num_predict {
            None => None,
            Some(n) if n > 0 => Some(n as usize),
            // -1 (unbounded) and -2 (fill the context): up to the context.
            Some(n) if n < 0 => Some(context),
            Some(_) => return Err("`options.num_predict` must be a non-zero integer".into()),
        };
        let think = match self.think {
            None => true,
            Some(Think::On(b)) => b,
            // gpt-oss style levels: reasoning on.
            Some(Think::Level(s)) if ["low", "medium", "high"].contains(&s.as_str()) => true,
            Some(Think::Level(_)) => {
                return Err("`think` must be a boolean or \"low\", \"medium\", \"high\"".into())
            }
        };
        let knobs = o.knobs();
        let chat = ChatRequest {
            messages,
            format,
            max_tokens,
            knobs,
            stop: o.stop.unwrap_or_default(),
            ..ChatRequest::default()
        };
        Ok((chat, Shape { stream: self.stream.unwrap_or(true), think }))
    }

    /// The chat request `/api/chat` asks for, and the reply's shape.
    pub(crate) fn into_chat(mut self, context: usize) -> Result<(ChatRequest, Shape), String> {
        let list = self.messages.take().unwrap_or_default();
        let mut messages = Vec::with_capacity(list.len());
        for (i, m) in list.into_iter().enumerate() {
            let at = format!("messages[{i}]");
            if m.images.as_ref().is_some_and(|a| !a.is_empty()) {
                return Err(format!("{at}.images: this model takes no images"));
            }
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            };
            let mut msg = Message::new(role, m.content.unwrap_or_default());
            for (j, c) in m.tool_calls.into_iter().flatten().enumerate() {
                let args =
                    c.function.arguments.as_ref().map_or_else(|| "{}".into(), Arguments::text);
                let id = c.id.unwrap_or_else(|| format!("call_{j}"));
                msg.tool_calls.push(ToolCallMsg::new(&id, &c.function.name, &args));
            }
            if m.role == Role::Tool {
                msg.name = m.tool_name.or(m.name);
                msg.tool_call_id = m.tool_call_id;
            }
            messages.push(msg);
        }
        if messages.is_empty() {
            return Err("`messages` must be a non-empty array".into());
        }
        let mut tools = Vec::new();
        for (i, t) in self.tools.take().into_iter().flatten().enumerate() {
            tools.push(t.function.into_def(&format!("`tools[{i}].function`"))?);
        }
        let (mut chat, shape) = self.common(messages, context)?;
        chat.tools = tools;
        chat.choice = Choice::Auto;
        Ok((chat, shape))
    }

    /// What `/api/generate` asks for: `fim` is the model's
    /// fill-in-the-middle tokens (prefix, suffix, middle) where it has
    /// them; `model` names it in the message of a refusal.
    pub(crate) fn into_generate(
        mut self,
        context: usize,
        fim: Option<&[String; 3]>,
        model: &str,
    ) -> Result<Generate, String> {
        if self.images.as_ref().is_some_and(|a| !a.is_empty()) {
            return Err("`images`: this model takes no images".into());
        }
        let prompt = self.prompt.take().unwrap_or_default();
        let suffix = self.suffix.take().unwrap_or_default();
        let system = self.system.take().unwrap_or_default();
        if prompt.is_empty() && suffix.is_empty() {
            return Ok(Generate::Load);
        }
        let raw = if !suffix.is_empty() {
            let Some([pre, suf, mid]) = fim else {
                return Err(format!(
                    "{model} does not support insert: `suffix` needs a model with fill-in-the-middle tokens"
                ));
            };
            Some(format!("{pre}{prompt}{suf}{suffix}{mid}"))
        } else if self.raw == Some(true) {
            Some(prompt.clone())
        } else {
            None
        };
        let mut messages = Vec::new();
        if !system.is_empty() && raw.is_none() {
            messages.push(Message::new("system", system));
        }
        messages.push(Message::new("user", prompt));
        let (mut chat, shape) = self.common(messages, context)?;
        chat.raw = raw;
        Ok(Generate::Reply(Box::new(chat), shape))
    }
}

/// How a generate request is answered.
#[derive(Debug)]
pub(crate) enum Generate {
    /// No prompt: Ollama's way to load a model (or, with `keep_alive: 0`,
    /// to unload it).
    Load,
    /// A reply to the prompt.
    Reply(Box<ChatRequest>, Shape),
}

// The reply.

/// One line of a reply (or the whole reply): a chat message or a
/// generate response, then, on the last line, the timings.
#[derive(Debug, Serialize)]
pub(crate) struct Line {
    pub(crate) model: String,
    pub(crate) created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<OutMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) response: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) thinking: Option<String>,
    pub(crate) done: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(crate) end: Option<End>,
}

#[derive(Debug, Serialize)]
pub(crate) struct OutMessage {
    pub(crate) role: &'static str,
    pub(crate) content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) thinking: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<OutCall>,
}

#[derive(Debug, Serialize)]
pub(crate) struct OutCall {
    pub(crate) id: String,
    pub(crate) function: OutFunction,
}

#[derive(Debug, Serialize)]
pub(crate) struct OutFunction {
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) arguments: Value,
}

impl OutCall {
    pub(crate) fn of(index: usize, c: &toolparse::ToolCall) -> OutCall {
        let arguments =
            serde_json::from_str(&c.arguments).unwrap_or_else(|_| Value::Object(Map::new()));
        let function = OutFunction { index, name: c.name.clone(), arguments };
        OutCall { id: super::call_id(c, "call"), function }
    }
}

/// The last line's fields: why it ended and the timings (nanoseconds).
#[derive(Debug, Serialize)]
pub(crate) struct End {
    pub(crate) done_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) total_duration: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) load_duration: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_eval_count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_eval_duration: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) eval_count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) eval_duration: Option<u64>,
}

/// Ollama's error body (and a stream's error line): `{"error": "…"}`.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: String,
}

/// A body that names a model (`/api/show`, `/api/pull`): `model`, or
/// Ollama's older `name`.
#[derive(Debug, Deserialize)]
pub(crate) struct Named {
    pub(crate) model: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) stream: Option<bool>,
}

impl Named {
    /// The model's name, if given.
    pub(crate) fn model(&self) -> Option<&str> {
        self.model.as_deref().or(self.name.as_deref()).filter(|m| !m.is_empty())
    }
}

// Listings and model facts.

/// A model's `details`.
#[derive(Debug, Serialize, Clone)]
pub(crate) struct Details {
    pub(crate) parent_model: &'static str,
    pub(crate) format: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) family: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) families: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) parameter_size: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quantization_level: Option<String>,
}

impl Details {
    /// What a file that cannot be read is listed with.
    pub(crate) fn unknown() -> Details {
        Details {
            parent_model: "",
            format: "gguf",
            family: None,
            families: None,
            parameter_size: None,
            quantization_level: None,
        }
    }
}

/// A model of `GET /api/tags` (`modified_at`, `size`, `digest`) or of
/// `GET /api/ps` (`expires_at`, `size_vram`, `context_length`).
#[derive(Debug, Serialize)]
pub(crate) struct ModelEntry {
    pub(crate) name: String,
    pub(crate) model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) modified_at: Option<String>,
    pub(crate) size: u64,
    pub(crate) digest: String,
    pub(crate) details: Details,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) size_vram: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) context_length: Option<usize>,
}

/// `GET /api/tags` and `GET /api/ps`.
#[derive(Debug, Serialize)]
pub(crate) struct Models {
    pub(crate) models: Vec<ModelEntry>,
}

/// `POST /api/show`.
#[derive(Debug, Serialize)]
pub(crate) struct Show {
    pub(crate) modelfile: String,
    pub(crate) parameters: String,
    pub(crate) template: String,
    pub(crate) details: Details,
    /// GGUF metadata keys (`general.architecture`, `ARCH.context_length`, …).
    pub(crate) model_info: Map<String, Value>,
    pub(crate) capabilities: Vec<&'static str>,
    pub(crate) modified_at: String,
}

/// `GET /api/version`.
#[derive(Debug, Serialize)]
pub(crate) struct Version {
    pub(crate) version: &'static str,
}

/// A line of `POST /api/pull`'s progress (or its one answer).
#[derive(Debug, Serialize, Default)]
pub(crate) struct Progress {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) completed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

impl Progress {
    pub(crate) fn status(s: impl Into<String>) -> Progress {
        Progress { status: Some(s.into()), ..Progress::default() }
    }

    pub(crate) fn failed(e: impl Into<String>) -> Progress {
        Progress { error: Some(e.into()), ..Progress::default() }
    }

    /// Bytes of a layer fetched so far.
    pub(crate) fn layer(digest: &str, total: u64, completed: u64) -> Progress {
        Progress {
            status: Some(format!("pulling {}", digest.get(7..19).unwrap_or(digest))),
            digest: Some(digest.to_owned()),
            total: Some(total),
            completed: Some(completed),
            error: None,
        }
    }
}
