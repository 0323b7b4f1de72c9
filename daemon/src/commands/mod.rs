//! The command-line fronts besides the server: `ask` (one research reply,
//! in process or through a daemon, and the interactive `chat`) over the
//! socket `client`, `runs` (list, show, cancel, resume), the `engine`
//! commands (`pull`, `models`, `tokenize`, `generate`, `bench`) and the
//! tool-call `parse`r's conformance `replay`.

pub(crate) mod ask;
pub(crate) mod client;
pub(crate) mod engine;
pub(crate) mod parse;
pub(crate) mod runs;
