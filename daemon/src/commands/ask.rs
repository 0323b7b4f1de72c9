//! `agentd ask`: one research reply in this process. Without `--events` the
//! answer streams to stdout and notices to stderr; with it, one JSON event
//! per line. Exit status: 0 for an answer, an excerpt or a spoken fallback,
//! 1 for an error, 130 when cancelled.

use crate::commands::engine::EngineArgs;
use crate::events::{Done, Ev, Outcome};
use crate::research::{self, RunOptions};
use crate::state::policy::{self, Policies};
use crate::state::store::Store;
use crate::tools::corpus::Corpus;
use crate::tools::Host;
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

/// Options of `ask`.
#[derive(Debug)]
pub(crate) struct AskArgs {
    pub(crate) engine: EngineArgs,
    pub(crate) corpus: Vec<PathBuf>,
    pub(crate) notes: Option<PathBuf>,
    pub(crate) events: bool,
    pub(crate) voice: bool,
    pub(crate) chat: Option<String>,
    /// Go through a running daemon (its socket; empty: the default one).
    pub(crate) connect: Option<String>,
    pub(crate) question: String,
}

pub(crate) fn run(a: &AskArgs, cancel: &AtomicBool) -> Result<ExitCode> {
    if a.question.trim().is_empty() {
        anyhow::bail!("the question is empty");
    }
    if let Some(sock) = &a.connect {
        return connected(a, sock, cancel);
    }
    let store = Store::open()?;
    store.mark_interrupted(false)?;
    let policies = Policies::load(&store)?;
    let corpus = if a.corpus.is_empty() {
        None
    } else {
        Some(Corpus::open(&a.corpus, policies.get(policy::SEGMENT) as usize)?)
    };
    let mut host =
        Host::new(corpus, a.notes.clone(), crate::commands::runs::tool_limits(&policies));
    let mut provider = crate::provider::build::build(
        &a.engine,
        crate::commands::runs::retry(&policies),
        Some(policies.get(policy::CONTEXT) as usize),
    )?;
    let abs =
        |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()).display().to_string();
    let opts = RunOptions {
        question: a.question.clone(),
        chat_id: a.chat.clone(),
        voice: a.voice,
        provider: provider.describe(),
        config: serde_json::json!({
            "engine": crate::commands::runs::engine_json(&a.engine),
            "corpus": a.corpus.iter().map(abs).collect::<Vec<_>>(),
            "notes": a.notes.as_ref().map(abs),
        }),
    };
    let mut printer = Printer::new(a.events);
    let done =
        research::run(provider.as_mut(), &mut host, &store, &policies, &opts, cancel, &mut |e| {
            printer.emit(e)
        });
    Ok(printer.finish(&done))
}

/// Prints events: text to stdout and notices to stderr, or JSON lines.
pub(crate) struct Printer {
    events: bool,
    pub(crate) wrote: bool,
}

impl Printer {
    pub(crate) fn new(events: bool) -> Printer {
        Printer { events, wrote: false }
    }

    pub(crate) fn emit(&mut self, e: &Ev) {
        let stdout = std::io::stdout();
        let events = self.events;
        let mut o = stdout.lock();
        if events {
            let _ = writeln!(o, "{}", e.to_json());
            let _ = o.flush();
            return;
        }
        match e {
            Ev::Content(d) => {
                let _ = o.write_all(d.as_bytes());
                let _ = o.flush();
                self.wrote = true;
            }
            Ev::Notice { text, .. } => eprintln!("agentd: {text}"),
            Ev::ToolCall { name, arguments, .. } => eprintln!("agentd: → {name} {arguments}"),
            Ev::Discarded { name, .. } => {
                eprintln!("agentd: discarded a call to {name} proposed in the final turn")
            }
            _ => {}
        }
    }

    /// The exit status for a finished run.
    pub(crate) fn finish(&self, done: &Done) -> ExitCode {
        let events = self.events;
        if !events && self.wrote {
            println!();
        }
        match done.outcome {
            Outcome::Answered | Outcome::Excerpt | Outcome::SpokenFallback => ExitCode::SUCCESS,
            Outcome::Cancelled => {
                if !events {
                    eprintln!("agentd: cancelled");
                }
                ExitCode::from(130)
            }
            Outcome::Error => {
                if let Some(e) = &done.error {
                    eprintln!("agentd: {} ({}): {}", e.code, e.classification, e.message);
                }
                ExitCode::from(1)
            }
        }
    }
}

/// The socket named by `--connect` (empty: the default).
pub(crate) fn socket_of(arg: &str) -> PathBuf {
    if arg.is_empty() {
        crate::server::default_socket()
    } else {
        PathBuf::from(arg)
    }
}

/// `ask --connect`: the same reply, researched by a running daemon.
fn connected(a: &AskArgs, sock: &str, cancel: &AtomicBool) -> Result<ExitCode> {
    if !a.corpus.is_empty() || a.notes.is_some() {
        eprintln!("agentd: --corpus/--notes are ignored with --connect: the daemon's own apply");
    }
    let body = serde_json::json!({"question": a.question, "chat_id": a.chat, "voice": a.voice, "stream": true});
    let mut printer = Printer::new(a.events);
    let mut last: Option<serde_json::Value> = None;
    let r = crate::commands::client::post_sse(
        &socket_of(sock),
        "/v1/research",
        &body,
        cancel,
        &mut |data| {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else { return };
            if a.events {
                println!("{v}");
            } else if let Some(ev) = crate::events::from_json(&v) {
                printer.emit(&ev);
            }
            if v["type"] == "done" {
                last = Some(v);
            }
        },
    );
    if cancel.load(std::sync::atomic::Ordering::Relaxed) {
        if !a.events {
            eprintln!("agentd: cancelled");
        }
        return Ok(ExitCode::from(130));
    }
    r?;
    let Some(done) = last else {
        anyhow::bail!("the daemon closed the stream before the reply ended")
    };
    if !a.events && printer.wrote {
        println!();
    }
    Ok(match done["outcome"].as_str() {
        Some("answered" | "excerpt" | "spoken_fallback") => ExitCode::SUCCESS,
        Some("cancelled") => ExitCode::from(130),
        _ => {
            eprintln!(
                "agentd: {}",
                done["error"]["message"].as_str().unwrap_or("the reply failed")
            );
            ExitCode::from(1)
        }
    })
}

/// `agentd chat`: an interactive session over the daemon's socket.
pub(crate) fn chat(sock: &str, cancel: &AtomicBool) -> Result<ExitCode> {
    use std::io::{BufRead, IsTerminal};
    let socket = socket_of(sock);
    let chat_id = crate::state::store::new_id("chat");
    let tty = std::io::stdin().is_terminal();
    if tty {
        eprintln!(
            "agentd chat {chat_id} on {} — an empty line or Ctrl-D ends; Ctrl-C stops a reply",
            socket.display()
        );
    }
    let stdin = std::io::stdin();
    loop {
        if tty {
            eprint!("> ");
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(ExitCode::SUCCESS);
        }
        cancel.store(false, std::sync::atomic::Ordering::Relaxed);
        let body = serde_json::json!({"question": line.trim(), "chat_id": chat_id, "stream": true});
        let mut printer = Printer::new(false);
        let r = crate::commands::client::post_sse(
            &socket,
            "/v1/research",
            &body,
            cancel,
            &mut |data| {
                if let Some(ev) = serde_json::from_str::<serde_json::Value>(data)
                    .ok()
                    .as_ref()
                    .and_then(crate::events::from_json)
                {
                    printer.emit(&ev);
                }
            },
        );
        println!();
        if let Err(e) = r {
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                eprintln!("agentd: reply stopped");
                continue;
            }
            return Err(e);
        }
    }
}
