//! `agentd ask`: one research reply in this process. Without `--events` the
//! answer streams to stdout and notices to stderr; with it, one JSON event
//! per line. Exit status: 0 for an answer, an excerpt or a spoken fallback,
//! 1 for an error, 130 when cancelled.

use crate::engine_cmd::EngineArgs;
use crate::events::{Done, Ev, Outcome};
use crate::policy::{self, Policies};
use crate::research::{self, RunOptions};
use crate::store::Store;
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
    pub(crate) question: String,
}

pub(crate) fn run(a: &AskArgs, cancel: &AtomicBool) -> Result<ExitCode> {
    if a.question.trim().is_empty() {
        anyhow::bail!("the question is empty");
    }
    let store = Store::open()?;
    store.mark_interrupted()?;
    let policies = Policies::load(&store)?;
    let corpus = if a.corpus.is_empty() {
        None
    } else {
        Some(Corpus::open(&a.corpus, policies.get(policy::SEGMENT) as usize)?)
    };
    let mut host = Host::new(corpus, a.notes.clone(), crate::runs::tool_limits(&policies));
    let mut provider = crate::provider_build::build(
        &a.engine,
        crate::runs::retry(&policies),
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
            "engine": crate::runs::engine_json(&a.engine),
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
    wrote: bool,
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
