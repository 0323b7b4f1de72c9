//! The command-line fronts besides the server: `ask` (one research reply,
//! in process or through a daemon), `chat` (an interactive session with a
//! daemon) over the socket `client`, `runs` (`list`, `show`), `mcp`
//! (`mcp list`: the MCP servers and their tools), the `engine`
//! commands (`pull`, `models`, `tokenize`, `generate`, `bench`) and the
//! tool-call `parse`r commands (`toolparse replay`, `toolparse parse`);
//! `visible` makes model text safe to print for a person.

pub(crate) mod ask;
pub(crate) mod chat;
pub(crate) mod client;
pub(crate) mod engine;
pub(crate) mod mcp;
pub(crate) mod parse;
pub(crate) mod runs;
pub(crate) mod visible;
