//! The local engine: GGUF loading, tokenizer, sampling, KV and prefix cache,
//! devices, on candle.
//!
//! `inference` owns running a quantized model on this machine. Its principal
//! type is [`Engine`]: load a GGUF, tokenize, and [`Engine::generate`] into a
//! [`Session`] whose KV cache is reused by the next request that extends it;
//! or, on any model and on the embedding models' encoders (`bert`,
//! `nomic-bert`), [`Engine::embed`] and, on a reranker, [`Engine::rerank`].
//! The CPU path runs its own SIMD kernels (`kernels`) beside candle, which
//! reads the GGUF and covers tensor types and devices the fast path lacks.
//!
//! It must not depend on tokio, HTTP, SQLite, JSON wire formats or the other
//! workspace crates (`prompts`, `toolparse`).

mod arch;
mod candle_path;
mod constraint;
mod embed;
mod encoder;
mod engine;
mod error;
pub mod gguf;
pub mod kernels;
mod kv;
mod model;
mod moe;
mod pool;
mod quant;
mod rope;
mod sampler;
mod tokenizer;

pub use arch::{Act, Arch, Config};
pub use constraint::{Constraint, Grammar, Grammars, Marker};
pub use embed::{normalize, Embedding, Pooling};
pub use engine::{
    inspect, Device, Engine, EngineOptions, Facts, Finish, GenParams, Generation, ModelInfo,
    Output, Session, Step, DRAFT_WINDOW, SPECULATE,
};
pub use error::{Error, ErrorKind, Result};
pub use kv::KvType;
pub use pool::Pool;
pub use sampler::Sampling;
pub use tokenizer::Tok;
