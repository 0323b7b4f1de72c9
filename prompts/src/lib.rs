//! Prompt construction: chat-template rendering, prompt texts, fitting the
//! model's view into its context, and the fallback texts.
//!
//! `prompts` owns what the model is shown. Its principal type is
//! [`ChatTemplate`]: a model's own Jinja chat template (from the GGUF),
//! rendered with minijinja and the Hugging Face extensions templates use
//! (`tojson`, `raise_exception`, `strftime_now`, Python string methods, loop
//! controls). When a template cannot show tools, the model family's tool
//! instructions ([`ToolStyle`]) are added to the system message.
//!
//! It must not depend on candle, tokio, HTTP, SQLite or the other workspace
//! crates; the types it shares with them (such as a chat [`Message`]) live
//! here, the lowest crate that needs them.

pub mod evidence;
pub mod fallback;
pub mod fit;
mod template;
pub mod texts;

pub use template::{
    CallWriter, ChatTemplate, FunctionCall, Message, TemplateError, ToolCallMsg, ToolDef, ToolStyle,
};
