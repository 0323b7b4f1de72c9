//! Model providers: one interface for the research loop, whatever runs the
//! model. `local` runs a GGUF on this machine through `inference`.

pub(crate) mod local;
