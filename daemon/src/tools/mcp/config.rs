//! `mcp.json`, in the format users already have (Cursor, Claude Desktop):
//!
//! ```text
//! {"mcpServers": {
//!     "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "env": {"K": "V"}},
//!     "web":   {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer …"}}
//! }}
//! ```
//!
//! A server is a child process spoken to over stdio (`command`, `args`,
//! `env`, optional `cwd`) or a Streamable HTTP endpoint (`url`,
//! `headers`); `"disabled": true` leaves it out. Names become the prefix of
//! the tools offered to the model (`NAME__TOOL`), so they must be
//! OpenAI-safe and free of `__`.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How agentd reaches a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// One configured server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerSpec {
    pub(crate) name: String,
    pub(crate) transport: Transport,
    /// The file that configured it.
    pub(crate) origin: PathBuf,
}

/// The files a command reads: the `--mcp` files given, else
/// `$AGENTD_HOME/mcp.json` when it exists.
pub(crate) fn files(given: &[PathBuf]) -> Vec<PathBuf> {
    if !given.is_empty() {
        return given.to_vec();
    }
    let default = crate::state::home::home().join("mcp.json");
    if default.is_file() {
        vec![default]
    } else {
        Vec::new()
    }
}

/// The servers `files` configure, in order; one name configured twice is
/// refused naming both files.
pub(crate) fn load(files: &[PathBuf]) -> Result<Vec<ServerSpec>> {
    let mut out: Vec<ServerSpec> = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the MCP configuration {}", f.display()))?;
        for s in parse(&text, f)? {
            if let Some(old) = out.iter().find(|o| o.name == s.name) {
                bail!(
                    "MCP server {:?} is configured twice, in {} and in {}; rename one of them",
                    s.name,
                    old.origin.display(),
                    f.display()
                );
            }
            out.push(s);
        }
    }
    Ok(out)
}

fn strings(v: &Value, what: &str) -> Result<BTreeMap<String, String>> {
    let mut m = BTreeMap::new();
    match v {
        Value::Null => {}
        Value::Object(o) => {
            for (k, v) in o {
                let Some(s) = v.as_str() else { bail!("{what}.{k} must be a string, got {v}") };
                m.insert(k.clone(), s.to_owned());
            }
        }
        other => bail!("{what} must be an object of strings, got {other}"),
    }
    Ok(m)
}

/// The servers one file's text configures.
pub(crate) fn parse(text: &str, origin: &Path) -> Result<Vec<ServerSpec>> {
    let o = origin.display();
    let v: Value = serde_json::from_str(text)
        .with_context(|| format!("{o} is not JSON (expected {{\"mcpServers\": {{…}}}})"))?;
    let Some(servers) = v.get("mcpServers").and_then(Value::as_object) else {
        bail!("{o} has no \"mcpServers\" object (expected {{\"mcpServers\": {{\"NAME\": {{\"command\": …}} | {{\"url\": …}}}}}})");
    };
    let mut out = Vec::new();
    for (name, s) in servers {
        let valid = !name.is_empty()
            && name.len() <= 32
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && !name.contains("__");
        if !valid {
            bail!("{o}: MCP server name {name:?} must be 1 to 32 letters, digits, '-' or '_' without \"__\" (its tools are offered as NAME__TOOL)");
        }
        if s.get("disabled").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        let what = format!("{o}: mcpServers.{name}");
        let transport = match (s.get("command"), s.get("url")) {
            (Some(Value::String(command)), None) => Transport::Stdio {
                command: command.clone(),
                args: match s.get("args") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(a)) => a
                        .iter()
                        .map(|x| {
                            x.as_str().map(str::to_owned).with_context(|| {
                                format!("{what}.args must hold strings, got {x}")
                            })
                        })
                        .collect::<Result<_>>()?,
                    Some(other) => bail!("{what}.args must be an array of strings, got {other}"),
                },
                env: strings(s.get("env").unwrap_or(&Value::Null), &format!("{what}.env"))?,
                cwd: s.get("cwd").and_then(Value::as_str).map(PathBuf::from),
            },
            (None, Some(Value::String(url))) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    bail!("{what}.url must be an http:// or https:// URL, got {url:?}");
                }
                Transport::Http {
                    url: url.clone(),
                    headers: strings(
                        s.get("headers").unwrap_or(&Value::Null),
                        &format!("{what}.headers"),
                    )?,
                }
            }
            (Some(_), Some(_)) => bail!("{what} has both \"command\" and \"url\"; give one"),
            _ => bail!(
                "{what} needs \"command\" (a string: a stdio server) or \"url\" (a string: a Streamable HTTP server)"
            ),
        };
        out.push(ServerSpec { name: name.clone(), transport, origin: origin.to_path_buf() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_and_claude_format_parses_and_bad_entries_are_named() {
        let f = Path::new("mcp.json");
        let s = parse(
            r#"{"mcpServers": {
                "fs": {"command": "npx", "args": ["-y", "pkg", "/tmp"], "env": {"A": "1"}},
                "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"X-Key": "k"}},
                "off": {"command": "x", "disabled": true}}}"#,
            f,
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "fs");
        assert!(
            matches!(&s[0].transport, Transport::Stdio { args, env, .. } if args.len() == 3 && env["A"] == "1")
        );
        assert!(
            matches!(&s[1].transport, Transport::Http { headers, .. } if headers["X-Key"] == "k")
        );
        for (bad, says) in [
            (r#"{"servers": {}}"#, "mcpServers"),
            (r#"{"mcpServers": {"a__b": {"command": "x"}}}"#, "a__b"),
            (r#"{"mcpServers": {"a": {"args": []}}}"#, "needs \"command\""),
            (r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#, "args"),
            (r#"{"mcpServers": {"a": {"url": "ftp://x"}}}"#, "http://"),
        ] {
            let e = parse(bad, f).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
