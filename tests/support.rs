//! Helpers for the end-to-end tests: the built `agentd`, isolated state
//! folders, event parsing, and a mock OpenAI-compatible server.

#![allow(clippy::missing_panics_doc)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

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

/// A test dependency that `test.sh` sets up and names in the environment
/// variable `var` (see `scripts/test-deps.sh`). Without it the test is
/// skipped, and says so on stderr — unless `AGENTD_TEST_STRICT=1` (set by
/// `test.sh`), where a missing dependency fails the test instead of hiding it.
pub fn dep(var: &str, test: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => {
            let p = PathBuf::from(v);
            assert!(p.exists(), "{var}={} does not exist", p.display());
            Some(p)
        }
        _ => {
            assert!(
                std::env::var("AGENTD_TEST_STRICT").as_deref() != Ok("1"),
                "{test}: {var} is not set, and AGENTD_TEST_STRICT=1 says every dependency must be present (run ./test.sh)"
            );
            eprintln!("SKIPPED {test}: {var} is not set (./test.sh sets it up)");
            None
        }
    }
}

/// The test venv's Python (`AGENTD_TEST_PYTHON`), with the client packages.
pub fn python(test: &str) -> Option<PathBuf> {
    dep("AGENTD_TEST_PYTHON", test)
}

/// A child process (a daemon a test started) killed and reaped when
/// dropped.
#[derive(Debug)]
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `tests/python/SCRIPT ARGS` with the test venv's `python` and fails
/// the test, showing both outputs, unless it succeeds; its stdout.
pub fn python_check(python: &Path, script: &str, args: &[&str]) -> String {
    let out = Command::new(python)
        .arg(workspace_root().join("tests/python").join(script))
        .args(args)
        .output()
        .expect("the test venv's python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// An isolated state folder and the command to run agentd in it.
#[derive(Debug)]
pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Home {
        Home { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `agentd ARGS` with AGENTD_HOME set and the Hub switched off.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(agentd_bin());
        c.args(args)
            .env("AGENTD_HOME", self.path())
            .env("AGENTD_NO_HUB", "1")
            .env_remove("AGENTD_CHAT_MAX_TOOL_ITERS")
            .env_remove("AGENTD_KV_TYPE")
            .env_remove("AGENTD_LOG")
            .env_remove("RUST_LOG");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("agentd runs")
    }

    /// Writes a file under the home folder and returns its path.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
        p
    }

    /// A small corpus of markdown sources.
    pub fn corpus(&self) -> PathBuf {
        self.write("corpus/budget.md", "# Budget rules\n\nThe run reserves two requests for the final answer.\n\nResearch may spend the rest.\n");
        self.write(
            "corpus/sockets.md",
            "# Sockets\n\nThe daemon listens on a Unix socket created with mode 0600.\n",
        );
        self.write(
            "corpus/voice.md",
            "# Voice\n\nVoice front-ends get one or two plain sentences.\n",
        );
        self.path().join("corpus")
    }
}

impl Default for Home {
    fn default() -> Home {
        Home::new()
    }
}

/// Events printed by `ask --events`.
pub fn events(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON event ({e}): {l}")))
        .collect()
}

/// The events of one type.
pub fn of<'a>(evs: &'a [Value], ty: &str) -> Vec<&'a Value> {
    evs.iter().filter(|e| e["type"] == ty).collect()
}

/// The `done` event (the last one).
/// The run's record as `agentd runs show RUN` prints it.
pub fn runs_show(h: &Home, run: &str) -> Value {
    let out = h.run(&["runs", "show", run]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("runs show prints JSON")
}

/// Makes every insert into the ledger of tool calls of `h`'s store fail
/// from now on, as a full or broken disk would (the store must exist: run
/// something first).
pub fn break_tool_call_ledger(h: &Home) {
    let db = rusqlite::Connection::open(h.path().join("agentd.db")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER broken BEFORE INSERT ON tool_calls BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END;",
    )
    .unwrap();
}

pub fn done(evs: &[Value]) -> &Value {
    let last = evs.last().expect("events");
    assert_eq!(last["type"], "done", "last event is not done: {last}");
    last
}

/// One HTTP request the mock received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

/// What the mock answers.
#[derive(Debug)]
pub enum Reply {
    /// A streamed completion: content, then tool calls (name, arguments JSON).
    Stream { content: String, calls: Vec<(String, String)> },
    /// A plain HTTP status with a body.
    Status(u16, String),
}

type Behave = dyn Fn(usize, &Value) -> Reply + Send + Sync;

/// A mock OpenAI-compatible server on 127.0.0.1.
#[derive(Debug)]
pub struct MockOpenAi {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl MockOpenAi {
    pub fn start(behave: impl Fn(usize, &Value) -> Reply + Send + Sync + 'static) -> MockOpenAi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let behave: Arc<Behave> = Arc::new(behave);
        let s2 = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = Arc::clone(&s2);
                let behave = Arc::clone(&behave);
                std::thread::spawn(move || serve(stream, &seen, &*behave));
            }
        });
        MockOpenAi { port, seen }
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

fn serve(stream: TcpStream, seen: &Mutex<Vec<Seen>>, behave: &Behave) {
    let mut r = BufReader::new(stream.try_clone().expect("clone"));
    let mut w = stream;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut headers = Vec::new();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let n = {
            let mut s = seen.lock().expect("lock");
            s.push(Seen { path, headers, body: body.clone() });
            s.len()
        };
        let reply = behave(n, &body);
        let ok = match reply {
            Reply::Status(code, text) => write!(
                w,
                "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                text.len()
            ),
            Reply::Stream { content, calls } => {
                let mut sse = String::new();
                let chunk = |delta: Value| format!("data: {}\n\n", serde_json::json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]}));
                for piece in content.as_bytes().chunks(7) {
                    sse.push_str(&chunk(serde_json::json!({"content": String::from_utf8_lossy(piece)})));
                }
                for (i, (name, args)) in calls.iter().enumerate() {
                    sse.push_str(&chunk(serde_json::json!({"tool_calls": [{"index": i, "id": format!("call_{n}_{i}"), "type": "function", "function": {"name": name, "arguments": ""}}]})));
                    for piece in args.as_bytes().chunks(5) {
                        sse.push_str(&chunk(serde_json::json!({"tool_calls": [{"index": i, "function": {"arguments": String::from_utf8_lossy(piece)}}]})));
                    }
                }
                let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
                sse.push_str(&format!("data: {}\n\n", serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})));
                sse.push_str("data: [DONE]\n\n");
                write!(w, "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{sse}", sse.len())
            }
        };
        if ok.is_err() || w.flush().is_err() {
            return;
        }
    }
}
