//! Prompt construction: chat-template rendering, prompt texts, fitting the
//! model's view into its context, and the fallback texts.
//!
//! `prompts` must not depend on candle, tokio, HTTP, SQLite or the other
//! workspace crates; the types it shares with them (such as a chat message)
//! live here, the lowest crate that needs them.
