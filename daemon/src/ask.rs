//! `agentd ask`: one research reply in this process. Without `--events` the
//! answer streams to stdout and notices to stderr; with it, one JSON event
//! per line. Exit status: 0 for an answer, an excerpt or a spoken fallback,
//! 1 for an error, 130 when cancelled.

use crate::engine_cmd::EngineArgs;
use crate::events::{Ev, Outcome};
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

/// Characters per corpus segment.
pub(crate) const SEGMENT_CHARS: usize = 1500;

pub(crate) fn run(a: &AskArgs, cancel: &AtomicBool) -> Result<ExitCode> {
    if a.question.trim().is_empty() {
        anyhow::bail!("the question is empty");
    }
    let store = Store::open()?;
    store.mark_interrupted()?;
    let max = crate::settings::get(&store, "chat.max_tool_iters")?.value as usize;
    let corpus = if a.corpus.is_empty() { None } else { Some(Corpus::open(&a.corpus, SEGMENT_CHARS)?) };
    let mut host = Host::new(corpus, a.notes.clone());
    let mut provider = crate::provider_build::build(&a.engine, Default::default())?;
    let opts = RunOptions {
        question: a.question.clone(),
        chat_id: a.chat.clone(),
        voice: a.voice,
        max_tool_iters: max,
        max_tokens: 512,
        provider: provider.describe(),
    };
    let stdout = std::io::stdout();
    let events = a.events;
    let mut wrote = false;
    let mut emit = |e: &Ev| {
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
                wrote = true;
            }
            Ev::Notice { text, .. } => eprintln!("agentd: {text}"),
            Ev::ToolCall { name, arguments, .. } => eprintln!("agentd: → {name} {arguments}"),
            Ev::Discarded { name, .. } => eprintln!("agentd: discarded a call to {name} proposed in the final turn"),
            _ => {}
        }
    };
    let done = research::run(provider.as_mut(), &mut host, &store, &opts, cancel, &mut emit);
    if !events && wrote {
        println!();
    }
    Ok(match done.outcome {
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
    })
}
