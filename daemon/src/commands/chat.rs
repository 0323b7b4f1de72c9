//! `agentd chat`: an interactive session with a running daemon over its
//! socket, one chat across questions; each answer streams as it is
//! researched, and Ctrl-C stops the reply in progress, not the session.

use super::ask::Printer;
use super::client;
use anyhow::Result;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

/// `agentd chat`: an interactive session over the daemon's socket.
pub(crate) fn run(sock: &str, cancel: &AtomicBool) -> Result<ExitCode> {
    use std::io::{BufRead, IsTerminal};
    let socket = client::socket_of(sock);
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
        let r = client::post_sse(&socket, "/v1/research", &body, cancel, &mut |data| {
            if let Some(ev) = serde_json::from_str::<serde_json::Value>(data)
                .ok()
                .as_ref()
                .and_then(crate::events::from_json)
            {
                printer.emit(&ev);
            }
        });
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
