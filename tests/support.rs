//! Helpers for the end-to-end tests: where the built `agentd` and the shared
//! fixtures are.

use std::path::PathBuf;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}

/// The built `agentd` binary (`AGENTD_BIN` overrides).
pub fn agentd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("AGENTD_BIN") {
        return PathBuf::from(p);
    }
    let root = workspace_root();
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or(root.join("target"));
    for profile in ["release", "debug"] {
        let p = target.join(profile).join("agentd");
        if p.exists() {
            return p;
        }
    }
    target.join("debug").join("agentd")
}
