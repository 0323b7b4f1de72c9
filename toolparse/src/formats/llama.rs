//! The Llama formats: Llama 3.x JSON calls (`llama3_json.rs`) and Llama 4
//! pythonic calls (`llama4_pythonic.rs`).

#[path = "llama3_json.rs"]
mod llama3_json;
pub(crate) use llama3_json::Llama3Json;

#[path = "llama4_pythonic.rs"]
mod llama4_pythonic;
pub(crate) use llama4_pythonic::Llama4Pythonic;
