//! The local engine: GGUF loading, tokenizer, sampling, KV and prefix cache,
//! devices, on candle.
//!
//! `inference` must not depend on tokio, HTTP, SQLite, JSON wire formats or
//! the other workspace crates (`prompts`, `toolparse`).
