//! `agentd mcp list`: starts the configured MCP servers (the `--mcp` files,
//! else `$AGENTD_HOME/mcp.json`) and prints one JSON line per server: its
//! transport, its state (`up`, or `down` with the reason) and its tools as
//! the model is offered them, each with its read/write class.

use crate::state::policy::Policies;
use crate::state::store::Store;
use crate::tools::mcp::{files, Hub};
use anyhow::{bail, Result};
use std::path::PathBuf;

pub(crate) fn list(given: &[PathBuf]) -> Result<()> {
    let files = files(given);
    if files.is_empty() {
        bail!(
            "no MCP servers are configured: pass --mcp FILE or write {}",
            crate::state::home::home().join("mcp.json").display()
        );
    }
    let store = Store::open()?;
    let policies = Policies::load(&store)?;
    let hub = Hub::start(&files, &policies)?;
    for s in hub.describe() {
        println!("{s}");
    }
    Ok(())
}
