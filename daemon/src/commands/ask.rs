//! `agentd ask`: one research reply in this process, or through a running
//! daemon with `--connect`. Without `--events` the answer streams to stdout
//! and notices to stderr (`Printer`), every control character but newline
//! and tab shown, not sent (`visible`); with it, one JSON event per line.
//! Exit status: 0 for an answer, an excerpt or a spoken fallback, 1 for an
//! error, 130 when cancelled.

use super::client;
use super::visible::visible;
use crate::events::{Done, Ev, Outcome};
use crate::provider::build::EngineArgs;
use crate::research::{self, RunConfig, RunOptions};
use crate::state::policy::Policies;
use crate::state::store::Store;
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
    /// `--mcp` files (none: `$AGENTD_HOME/mcp.json` when it exists).
    pub(crate) mcp: Vec<PathBuf>,
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
    let mut config = RunConfig {
        engine: a.engine.clone(),
        corpus: a.corpus.clone(),
        notes: a.notes.clone(),
        mcp: crate::tools::mcp::files(&a.mcp),
        servers: None,
    };
    config.start_servers(&policies)?;
    let mut host = config.host(&policies)?;
    let mut provider = crate::provider::build::build(&a.engine, &policies)?;
    let opts = RunOptions {
        question: a.question.clone(),
        chat_id: a.chat.clone(),
        voice: a.voice,
        provider: provider.describe(),
        config,
    };
    let mut printer = Printer::new(a.events);
    let done =
        research::run(provider.as_mut(), &mut host, &store, &policies, &opts, cancel, &mut |e| {
            printer.emit(e)
        });
    Ok(printer.finish(&done))
}

/// Prints events: text to stdout and notices to stderr, or JSON lines.
/// Model text (the answer, a call's name and arguments, notices, errors)
/// goes out through `visible`: a model's escape sequences never reach the
/// terminal.
#[derive(Debug)]
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
                let _ = o.write_all(visible(d).as_bytes());
                let _ = o.flush();
                self.wrote = true;
            }
            Ev::Notice { text, .. } => eprintln!("agentd: {}", visible(text)),
            Ev::ToolCall { name, arguments, .. } => {
                eprintln!("agentd: → {} {}", visible(name), visible(&arguments.to_string()))
            }
            Ev::Discarded { name, .. } => {
                eprintln!(
                    "agentd: discarded a call to {} proposed in the final turn",
                    visible(name)
                )
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
                    eprintln!("agentd: {} ({}): {}", e.code, e.classification, visible(&e.message));
                }
                ExitCode::from(1)
            }
        }
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
    let r =
        client::post_sse(&client::socket_of(sock), "/v1/research", &body, cancel, &mut |data| {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else { return };
            if a.events {
                println!("{v}");
            } else if let Some(ev) = crate::events::from_json(&v) {
                printer.emit(&ev);
            }
            if v["type"] == "done" {
                last = Some(v);
            }
        });
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
                visible(done["error"]["message"].as_str().unwrap_or("the reply failed"))
            );
            ExitCode::from(1)
        }
    })
}
