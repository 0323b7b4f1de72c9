//! Tools from MCP servers (docs/mcp.md), on the
//! official Rust SDK `rmcp`: stdio servers (child processes) and
//! Streamable HTTP servers, configured in `mcp.json` (`config`).
//!
//! The `Hub` is the process's servers: started once (in parallel, each
//! within `mcp/server-start-timeout`) by `ask`, `serve`, `runs resume` and
//! `mcp list`, on a small tokio runtime of its own so that the research
//! threads can call it synchronously. Each server's tools are offered as
//! `NAME__TOOL` with their input schemas; `readOnlyHint: true` makes a
//! read, anything else a write (the spec's conservative default). A
//! server's stderr goes to agentd's log (its stderr), never to a reply.
//!
//! `RunTools` is one run's view of the hub: the calls each server received
//! (`mcp/calls-per-server-per-run`), the per-call timeout and the result
//! size cap of the run's policies. A server that is down or whose budget is
//! spent has its tools hidden from the projection (`spent`); a call that
//! fails — a server that would not start, crashed, hung past the timeout or
//! returned an error — becomes a failed tool result with a clear message,
//! and the run continues. A server that crashed is started again for the
//! next run.

mod bounded;
mod config;

pub(crate) use config::files;

use super::{Ended, Kind, ToolOutput};
use crate::state::mcp_policy::{CALLS, CALL_TIMEOUT, RESULT_SIZE, START_TIMEOUT};
use crate::state::policy::Policies;
use anyhow::{Context, Result};
use config::{ServerSpec, Transport};
use prompts::ToolDef;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{Peer, RoleClient, ServiceError, ServiceExt};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Between a server's name and its tool's in the names the model sees.
const SEP: &str = "__";
/// OpenAI's limit on a function name.
const NAME_MAX: usize = 64;

/// One tool of a server.
#[derive(Debug, Clone)]
struct Tool {
    /// The server's own name for it.
    name: String,
    kind: Kind,
    /// What the model is offered (`NAME__TOOL`).
    def: ToolDef,
}

enum State {
    Up {
        service: RunningService<RoleClient, ()>,
        tools: Vec<Tool>,
    },
    Down {
        why: String,
        /// It ran before (and may be started again), with these tools.
        crashed: bool,
        tools: Vec<Tool>,
    },
}

impl State {
    fn tools(&self) -> &[Tool] {
        match self {
            State::Up { tools, .. } | State::Down { tools, .. } => tools,
        }
    }
}

struct Server {
    spec: ServerSpec,
    state: Mutex<State>,
}

impl Server {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it is up; a service whose transport closed is marked down.
    fn check_up(&self) -> Result<(), String> {
        let mut st = self.state();
        let closed = match &*st {
            State::Up { service, .. } => {
                service.is_closed() || service.peer().is_transport_closed()
            }
            State::Down { why, .. } => return Err(why.clone()),
        };
        if closed {
            let why = "its connection closed (the server exited or crashed)".to_owned();
            mark_down(&mut st, &why);
            return Err(why);
        }
        Ok(())
    }
}

fn mark_down(st: &mut State, why: &str) {
    let tools = st.tools().to_vec();
    *st = State::Down { why: why.to_owned(), crashed: true, tools };
}

/// The MCP servers of this process.
pub(crate) struct Hub {
    rt: Option<tokio::runtime::Runtime>,
    servers: Vec<Server>,
    files: Vec<PathBuf>,
    start_timeout: Duration,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("files", &self.files)
            .field("servers", &self.servers.iter().map(|s| &s.spec.name).collect::<Vec<_>>())
            .finish()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        // Each service is cancelled on the hub's runtime, which then kills
        // its child (children are also killed when their handles drop);
        // the runtime may be dropped from inside another one (the server's).
        let mut services = Vec::new();
        for s in &self.servers {
            let old = std::mem::replace(
                &mut *s.state(),
                State::Down { why: "agentd stopped".into(), crashed: false, tools: vec![] },
            );
            if let State::Up { service, .. } = old {
                services.push(service);
            }
        }
        if !services.is_empty() && self.rt.is_some() {
            self.block_on(async move {
                for s in services {
                    let _ = tokio::time::timeout(Duration::from_secs(2), s.cancel()).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            });
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Hub {
    /// Starts the servers `files` configure (see `files`), each within the
    /// start timeout of `policies`. A configuration that cannot be read is
    /// an error; a server that will not start is kept down with the reason.
    pub(crate) fn start(files: &[PathBuf], policies: &Policies) -> Result<Hub> {
        let specs = config::load(files)?;
        crate::state::mcp_policy::check_with_servers(policies)?;
        // HTTPS to Streamable HTTP servers: rustls with ring, the provider
        // ureq already uses (installed once per process; a second install
        // is refused and harmless).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("agentd-mcp")
            .enable_all()
            .build()
            .context("cannot start the MCP client runtime")?;
        let start_timeout = Duration::from_secs(policies.get(START_TIMEOUT).max(1) as u64);
        let mut hub = Hub {
            rt: Some(rt),
            servers: specs
                .into_iter()
                .map(|spec| Server {
                    spec,
                    state: Mutex::new(State::Down {
                        why: "not started".into(),
                        crashed: false,
                        tools: vec![],
                    }),
                })
                .collect(),
            files: files.to_vec(),
            start_timeout,
        };
        let specs: Vec<ServerSpec> = hub.servers.iter().map(|s| s.spec.clone()).collect();
        let states = hub.block_on(futures_util::future::join_all(
            specs.into_iter().map(|s| connect(s, start_timeout)),
        ));
        for (s, st) in hub.servers.iter_mut().zip(states) {
            if let State::Down { why, .. } = &st {
                eprintln!("agentd: MCP server {} did not start: {why}", s.spec.name);
            }
            *s.state.get_mut().unwrap_or_else(|e| e.into_inner()) = st;
        }
        Ok(hub)
    }

    /// Runs `f` to its end on the hub's runtime, from any thread (a
    /// thread of another runtime included).
    fn block_on<F>(&self, f: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        // INVARIANT: the runtime lives until the hub drops.
        let rt = self.rt.as_ref().expect("the MCP runtime lives as long as the hub");
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| rt.block_on(f)).join().unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
        } else {
            rt.block_on(f)
        }
    }

    /// Starts again the servers that crashed since they last ran.
    pub(crate) fn revive(&self) {
        let dead: Vec<usize> = (0..self.servers.len())
            .filter(|&i| {
                let _ = self.servers[i].check_up();
                matches!(&*self.servers[i].state(), State::Down { crashed: true, .. })
            })
            .collect();
        if dead.is_empty() {
            return;
        }
        let specs: Vec<ServerSpec> = dead.iter().map(|&i| self.servers[i].spec.clone()).collect();
        let timeout = self.start_timeout;
        let states = self.block_on(futures_util::future::join_all(
            specs.into_iter().map(|s| connect(s, timeout)),
        ));
        for (i, st) in dead.into_iter().zip(states) {
            let name = &self.servers[i].spec.name;
            match &st {
                State::Up { .. } => eprintln!("agentd: MCP server {name} started again"),
                State::Down { why, .. } => {
                    eprintln!("agentd: MCP server {name} did not start again: {why}")
                }
            }
            *self.servers[i].state() = st;
        }
    }

    /// The server a tool name `NAME__TOOL` belongs to.
    fn server_of(&self, exposed: &str) -> Option<usize> {
        let (server, _) = exposed.split_once(SEP)?;
        self.servers.iter().position(|s| s.spec.name == server)
    }

    /// The tools of the servers that are up.
    fn tools(&self) -> Vec<ToolDef> {
        let mut v = Vec::new();
        for s in &self.servers {
            if s.check_up().is_ok() {
                v.extend(s.state().tools().iter().map(|t| t.def.clone()));
            }
        }
        v
    }

    fn tool(&self, server: usize, exposed: &str) -> Option<Tool> {
        self.servers[server].state().tools().iter().find(|t| t.def.name == exposed).cloned()
    }

    /// Every server with its state and tools, for `agentd mcp list`.
    pub(crate) fn describe(&self) -> Vec<Value> {
        self.servers
            .iter()
            .map(|s| {
                let up = s.check_up();
                let st = s.state();
                let tools: Vec<Value> = st
                    .tools()
                    .iter()
                    .map(|t| {
                        json!({"name": t.def.name, "tool": t.name, "class": kind_str(t.kind),
                               "description": t.def.description})
                    })
                    .collect();
                let (transport, target) = match &s.spec.transport {
                    Transport::Stdio { command, args, .. } => (
                        "stdio",
                        std::iter::once(command.clone())
                            .chain(args.iter().cloned())
                            .collect::<Vec<_>>()
                            .join(" "),
                    ),
                    Transport::Http { url, .. } => ("streamable-http", url.clone()),
                };
                json!({"server": s.spec.name, "transport": transport, "target": target,
                       "config": s.spec.origin.display().to_string(),
                       "state": if up.is_ok() { "up" } else { "down" },
                       "error": up.err(), "tools": tools})
            })
            .collect()
    }
}

fn kind_str(k: Kind) -> &'static str {
    match k {
        Kind::Read => "read",
        Kind::Write => "write",
    }
}

/// `NAME__TOOL`, OpenAI-safe: letters, digits, `_` and `-`, at most 64.
fn exposed_name(server: &str, tool: &str) -> String {
    let mut s: String = format!("{server}{SEP}{tool}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    s.truncate(NAME_MAX);
    s
}

/// What a stdio server inherits of the daemon's environment (besides what
/// its `mcp.json` entry sets).
const INHERITED_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// Starts (or connects to) one server and lists its tools.
async fn connect(spec: ServerSpec, timeout: Duration) -> State {
    let down = |why: String| State::Down { why, crashed: false, tools: vec![] };
    let started = tokio::time::timeout(timeout, async move {
        let service = match &spec.transport {
            Transport::Stdio { command, args, env, cwd } => {
                // A server gets PATH, HOME and LANG, and what its entry
                // names: never the daemon's whole environment (API keys).
                let mut cmd = tokio::process::Command::new(command);
                cmd.env_clear();
                for k in INHERITED_ENV {
                    if let Some(v) = std::env::var_os(k) {
                        cmd.env(k, v);
                    }
                }
                cmd.args(args).envs(env).kill_on_drop(true);
                if let Some(d) = cwd {
                    cmd.current_dir(d);
                }
                // Its stdout is read through a bounded reader, so that an
                // answer over the message limit fails its call at once
                // (`bounded`).
                use std::process::Stdio;
                let mut child = cmd
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("cannot run {command:?}: {e}"))?;
                if let Some(err) = child.stderr.take() {
                    tokio::spawn(log_stderr(spec.name.clone(), err));
                }
                let transport = bounded::ChildTransport::new(child, &spec.name)
                    .ok_or_else(|| format!("{command:?} started without its stdin and stdout"))?;
                ().serve(transport).await.map_err(|e| format!("the MCP handshake failed: {e}"))?
            }
            Transport::Http { url, headers } => {
                use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
                let mut custom = std::collections::HashMap::new();
                let mut auth = None;
                for (k, v) in headers {
                    if k.eq_ignore_ascii_case("authorization") {
                        auth = Some(v.strip_prefix("Bearer ").unwrap_or(v).to_owned());
                        continue;
                    }
                    let k = http::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|e| format!("header name {k:?}: {e}"))?;
                    let v =
                        http::HeaderValue::from_str(v).map_err(|e| format!("header {k}: {e}"))?;
                    custom.insert(k, v);
                }
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom);
                if let Some(a) = auth {
                    config = config.auth_header(a);
                }
                let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
                ().serve(transport).await.map_err(|e| format!("cannot connect to {url}: {e}"))?
            }
        };
        let listed =
            service.list_all_tools().await.map_err(|e| format!("tools/list failed: {e}"))?;
        let mut tools: Vec<Tool> = Vec::new();
        for t in listed {
            let exposed = exposed_name(&spec.name, &t.name);
            if tools.iter().any(|o| o.def.name == exposed) {
                eprintln!(
                    "agentd: MCP server {}: tool {:?} is left out: its name {exposed} is taken",
                    spec.name, t.name
                );
                continue;
            }
            let read_only = t.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true);
            tools.push(Tool {
                name: t.name.to_string(),
                kind: if read_only { Kind::Read } else { Kind::Write },
                def: ToolDef {
                    name: exposed,
                    description: t
                        .description
                        .as_deref()
                        .or(t.title.as_deref())
                        .unwrap_or("a tool of an MCP server")
                        .to_owned(),
                    parameters: Value::Object((*t.input_schema).clone()),
                },
            });
        }
        Ok::<_, String>(State::Up { service, tools })
    })
    .await;
    match started {
        Ok(Ok(st)) => st,
        Ok(Err(why)) => down(why),
        Err(_) => down(format!(
            "it did not start and list its tools within {} s ({START_TIMEOUT}); check its command in mcp.json",
            timeout.as_secs()
        )),
    }
}

/// Copies a server's stderr to agentd's log, line by line.
async fn log_stderr(name: String, err: tokio::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(err).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("agentd: mcp {name}: {line}");
    }
}

/// The limits of one run's MCP calls (from its policies).
#[derive(Debug, Clone, Copy)]
struct Limits {
    calls: usize,
    timeout: Duration,
    result_size: usize,
}

/// One run's view of the hub: its calls per server under its limits.
#[derive(Debug)]
pub(crate) struct RunTools {
    hub: Arc<Hub>,
    calls: Vec<usize>,
    limits: Limits,
}

impl RunTools {
    pub(crate) fn new(hub: Arc<Hub>, policies: &Policies) -> RunTools {
        hub.revive();
        let calls = vec![0; hub.servers.len()];
        RunTools {
            hub,
            calls,
            limits: Limits {
                calls: policies.get(CALLS) as usize,
                timeout: Duration::from_secs(policies.get(CALL_TIMEOUT).max(1) as u64),
                result_size: policies.get(RESULT_SIZE) as usize,
            },
        }
    }

    /// Whether `name` is a tool of a configured server.
    pub(crate) fn owns(&self, name: &str) -> bool {
        self.hub.server_of(name).is_some()
    }

    /// The kind of an MCP tool, `None` when no server knows it.
    pub(crate) fn kind(&self, name: &str) -> Option<Kind> {
        let s = self.hub.server_of(name)?;
        self.hub.tool(s, name).map(|t| t.kind)
    }

    /// The tools of the servers that are up (the projection then hides
    /// those whose budget is spent).
    pub(crate) fn tools(&self) -> Vec<ToolDef> {
        self.hub.tools()
    }

    /// Counts a call a recovered run made before.
    pub(crate) fn count_recovered(&mut self, name: &str) {
        if let Some(s) = self.hub.server_of(name) {
            self.calls[s] += 1;
        }
    }

    /// Why a tool of a server cannot run now: the server is down, or its
    /// calls for this run are spent.
    pub(crate) fn spent(&self, name: &str) -> Option<String> {
        let s = self.hub.server_of(name)?;
        let server = &self.hub.servers[s];
        if let Err(why) = server.check_up() {
            return Some(format!("the MCP server {} is not running: {why}", server.spec.name));
        }
        (self.calls[s] >= self.limits.calls).then(|| {
            format!(
                "the MCP server {} has had its {} calls for this reply ({CALLS})",
                server.spec.name, self.limits.calls
            )
        })
    }

    /// Calls `name` with `arguments` (a JSON object). Never fails: problems
    /// become error results, and the way it ended is returned for the
    /// ledger. `sending` is called just before the call goes out.
    pub(crate) fn call(
        &mut self,
        name: &str,
        arguments: Value,
        record: &mut dyn FnMut() -> bool,
    ) -> (ToolOutput, Ended) {
        let refused = |o: ToolOutput| {
            let detail = match &o {
                ToolOutput::Error(e) => e.message.clone(),
                _ => String::new(),
            };
            (o, Ended::Refused(detail))
        };
        let Some(s) = self.hub.server_of(name) else {
            return refused(ToolOutput::error(
                "UNKNOWN_TOOL",
                format!("no MCP server offers {name}"),
            ));
        };
        if let Some(why) = self.spent(name) {
            return refused(super::unavailable(name, &why));
        }
        let server = &self.hub.servers[s];
        let Some(tool) = self.hub.tool(s, name) else {
            let known: Vec<String> =
                server.state().tools().iter().map(|t| t.def.name.clone()).collect();
            return refused(ToolOutput::error(
                "UNKNOWN_TOOL",
                format!(
                    "the MCP server {} has no tool {name}; it offers: {}",
                    server.spec.name,
                    known.join(", ")
                ),
            ));
        };
        let Value::Object(args) = arguments else {
            return refused(ToolOutput::error(
                "INVALID_ARGUMENTS",
                "arguments must be a JSON object",
            ));
        };
        let peer: Peer<RoleClient> = match &*server.state() {
            State::Up { service, .. } => service.peer().clone(),
            State::Down { why, .. } => {
                return refused(super::unavailable(
                    name,
                    &format!("the MCP server {} is not running: {why}", server.spec.name),
                ))
            }
        };
        if !record() {
            return (super::unrecorded(name), Ended::Unrecorded);
        }
        self.calls[s] += 1;
        let timeout = self.limits.timeout;
        let mut params = CallToolRequestParams::new(tool.name.clone());
        params.arguments = Some(args);
        let result = self
            .hub
            .block_on(async move { tokio::time::timeout(timeout, peer.call_tool(params)).await });
        let failed = |code: &'static str, message: String| {
            (ToolOutput::error(code, message.clone()), Ended::Sent { ok: false, detail: message })
        };
        match result {
            Ok(Ok(r)) => {
                let (text, structured) = result_text(&r, self.limits.result_size);
                if r.is_error == Some(true) {
                    failed("MCP_TOOL_ERROR", format!("{name} failed: {text}"))
                } else {
                    let detail = format!("{} characters", text.chars().count());
                    (ToolOutput::Mcp(super::output::McpResult { text, structured }), Ended::Sent { ok: true, detail })
                }
            }
            Ok(Err(
                e @ (ServiceError::TransportClosed
                | ServiceError::TransportSend(_)
                | ServiceError::Cancelled { .. }),
            )) => {
                let why = format!("its connection closed during the call ({e})");
                mark_down(&mut server.state(), &why);
                eprintln!("agentd: MCP server {} went down during {name}: {e}", server.spec.name);
                failed(
                    "MCP_SERVER_DOWN",
                    format!("the MCP server {} stopped during {name} ({e}); its tools are unavailable for the rest of this reply", server.spec.name),
                )
            }
            Ok(Err(e)) => {
                if server.check_up().is_err() {
                    return failed(
                        "MCP_SERVER_DOWN",
                        format!("the MCP server {} stopped during {name} ({e}); its tools are unavailable for the rest of this reply", server.spec.name),
                    );
                }
                failed("MCP_ERROR", format!("{name} failed: {e}"))
            }
            Err(_) => failed(
                "MCP_TIMEOUT",
                format!(
                    "{name} did not answer within {} s ({CALL_TIMEOUT}); try other tools or answer from what you have",
                    timeout.as_secs()
                ),
            ),
        }
    }
}

/// The text of a result for the model: its text blocks in order (other
/// blocks named, not inlined), cut to `cap` characters with a marker; the
/// structured content only when there is no text.
fn result_text(r: &CallToolResult, cap: usize) -> (String, Option<Value>) {
    let mut parts = Vec::new();
    for block in &r.content {
        let v = serde_json::to_value(block).unwrap_or(Value::Null);
        match v["type"].as_str() {
            Some("text") => parts.push(v["text"].as_str().unwrap_or_default().to_owned()),
            Some("resource") => match v["resource"]["text"].as_str() {
                Some(t) => parts.push(t.to_owned()),
                None => parts.push(format!(
                    "[binary resource {}]",
                    v["resource"]["uri"].as_str().unwrap_or("?")
                )),
            },
            Some("resource_link") => {
                parts.push(format!("[resource {}]", v["uri"].as_str().unwrap_or("?")))
            }
            Some(other) => parts.push(format!("[{other} content not shown]")),
            None => {}
        }
    }
    let mut text = parts.join("\n");
    let mut structured = None;
    if text.is_empty() {
        if let Some(s) = &r.structured_content {
            let t = s.to_string();
            if t.chars().count() <= cap {
                structured = Some(s.clone());
            } else {
                text = t;
            }
        }
    }
    if text.chars().count() > cap {
        let total = text.chars().count();
        text = text.chars().take(cap).collect();
        text.push_str(&format!(
            "\n[… cut: the result had {total} characters, {RESULT_SIZE} = {cap}]"
        ));
    }
    (text, structured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposed_names_are_openai_safe() {
        assert_eq!(exposed_name("fs", "list_directory"), "fs__list_directory");
        assert_eq!(exposed_name("fs", "read.file v2"), "fs__read_file_v2");
        assert_eq!(exposed_name("s", &"x".repeat(100)).len(), NAME_MAX);
    }

    #[test]
    fn results_are_cut_to_the_cap_with_a_marker() {
        let r: CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "abcdef"}, {"type": "image", "data": "", "mimeType": "image/png"}]
        }))
        .unwrap();
        let (t, s) = result_text(&r, 100);
        assert_eq!(t, "abcdef\n[image content not shown]");
        assert!(s.is_none());
        let (t, _) = result_text(&r, 3);
        assert!(t.starts_with("abc\n[… cut:") && t.contains(RESULT_SIZE), "{t}");
    }
}
