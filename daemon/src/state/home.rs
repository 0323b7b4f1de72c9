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

/// Creates `dir` and the folders above it that are missing, each readable
/// by this user only (0700): the state folder holds chats, runs, notes'
/// ledger and tokens. A folder that exists is left as it is.
pub(crate) fn create_private(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Downloaded models.
pub(crate) fn models_dir() -> PathBuf {
    home().join("models")
}

/// The `*.gguf` files in `dir`, sorted (none when it cannot be read).
pub(crate) fn gguf_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    out.sort();
    out
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
