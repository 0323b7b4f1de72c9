//! The daemon's state and configuration under `$AGENTD_HOME`: where it
//! lives (`home`), the SQLite store (`store`: settings, chats, messages,
//! runs, their ledger and handles — the only module that speaks SQL), the
//! user settings with their metadata (`settings`), the declared budget
//! policies and the values in force (`policy`; the `mcp` module's in
//! `mcp_policy`), the model registry
//! (`registry`) and the fetching of its verified files (`pull`).

pub(crate) mod home;
pub(crate) mod mcp_policy;
pub(crate) mod policy;
pub(crate) mod pull;
pub(crate) mod registry;
pub(crate) mod settings;
pub(crate) mod store;
