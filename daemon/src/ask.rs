//! `agentd ask`: one reply, in this process, streamed to stdout.

use crate::engine_cmd::EngineArgs;
use crate::provider::local::Local;
use anyhow::Result;
use prompts::Message;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use toolparse::Event;

pub(crate) fn run(engine: &EngineArgs, tool_format: Option<&str>, question: &str, cancel: &AtomicBool) -> Result<ExitCode> {
    let mut local = Local::load(engine, tool_format)?;
    let messages = vec![Message::new("user", question)];
    let stdout = std::io::stdout();
    let mut wrote = false;
    let out = local.turn(&messages, &[], 512, cancel, &mut |e| {
        if let Event::Content(s) = e {
            let mut o = stdout.lock();
            let _ = o.write_all(s.as_bytes());
            let _ = o.flush();
            wrote = true;
        }
    })?;
    if wrote {
        println!();
    }
    if out.finish == inference::Finish::Cancelled {
        eprintln!("agentd: cancelled");
        return Ok(ExitCode::from(130));
    }
    Ok(ExitCode::SUCCESS)
}
