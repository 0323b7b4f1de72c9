//! Where state lives: `$AGENTD_HOME`, else `$XDG_DATA_HOME/agentd`, else
//! `~/.local/share/agentd`. Every command honours it, so a test can isolate
//! itself. The daemon's default socket is placed from it too.

use std::path::PathBuf;

/// The state folder (not created here).
pub(crate) fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("AGENTD_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h);
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("agentd");
    }
    let base = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    base.join(".local/share/agentd")
}

/// Downloaded models.
pub(crate) fn models_dir() -> PathBuf {
    home().join("models")
}

/// The default socket: `$XDG_RUNTIME_DIR/agentd.sock`, else under the state
/// folder.
pub(crate) fn default_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) if std::env::var_os("AGENTD_HOME").is_none() => {
            PathBuf::from(d).join("agentd.sock")
        }
        _ => home().join("agentd.sock"),
    }
}
