//! The engine's error type: a kind callers can match on and a message that
//! says what failed, with which value, and what to do.

use std::fmt;

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file could not be read or written.
    Io,
    /// The model file is not a GGUF this engine can load (bad header,
    /// missing tensor or metadata, unsupported architecture or type).
    Model,
    /// The tokenizer could not be built or used.
    Tokenizer,
    /// The request does not fit: a prompt beyond the context, bad options.
    Input,
    /// The requested device is not available in this build or machine.
    Device,
    /// The compute backend failed.
    Backend,
    /// A grammar could not be compiled (llguidance refused it: a schema
    /// keyword it cannot enforce, a bad pattern, a syntax error).
    Grammar,
}

/// An engine error.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn model_err(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Model, msg)
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Error {
        Error::new(ErrorKind::Backend, format!("candle: {e}"))
    }
}
