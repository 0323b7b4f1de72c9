//! The `agentd` binary: command line, server, research loop, tools and
//! store. It is the only crate that knows JSON wire formats, HTTP, SQLite and
//! tokio; it converts from the types of `inference`, `prompts` and
//! `toolparse`, which know nothing of it.

mod replay;

use clap::{Parser, Subcommand};
use std::io::Read;
use std::process::ExitCode;
use toolparse::{FinishReason, Format, Options};

#[derive(Parser, Debug)]
#[command(name = "agentd", version, about = "A local model-serving agent daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Tool-call parser utilities
    Toolparse {
        #[command(subcommand)]
        command: ToolparseCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ToolparseCommand {
    /// Conformance replay: JSON lines on stdin, one reply line each on stdout
    Replay,
    /// Parse raw model output (a file, or stdin with `-`) and print what a
    /// client receives: content, reasoning and calls, as JSON
    Parse {
        /// Tool-call format name (e.g. hermes, qwen3-xml, mistral, gpt-oss)
        #[arg(long, default_value = "hermes")]
        format: String,
        /// The end of the prompt the model continued (sets the start state)
        #[arg(long)]
        generation_prompt: Option<String>,
        /// The text ended at the token limit
        #[arg(long)]
        truncated: bool,
        /// Strip call markup and report calls as discarded
        #[arg(long)]
        suppress: bool,
        /// File holding the raw output, `-` for stdin
        file: String,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentd: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Toolparse { command: ToolparseCommand::Replay } => {
            replay::run(std::io::stdin().lock(), std::io::stdout().lock())?;
        }
        Command::Toolparse {
            command:
                ToolparseCommand::Parse { format, generation_prompt, truncated, suppress, file },
        } => {
            let format = Format::from_name(&format)?;
            let mut text = String::new();
            if file == "-" {
                std::io::stdin().read_to_string(&mut text)?;
            } else {
                text = std::fs::read_to_string(&file)
                    .map_err(|e| anyhow::anyhow!("cannot read {file}: {e}"))?;
            }
            let opts = Options {
                generation_prompt,
                mode: if suppress { toolparse::Mode::Suppress } else { toolparse::Mode::Tools },
                ..Options::default()
            };
            let reason = if truncated { FinishReason::Length } else { FinishReason::Stop };
            let acc = toolparse::parse(format, opts, &text, reason);
            let calls = |cs: &[toolparse::ToolCall]| {
                cs.iter()
                    .map(|c| {
                        serde_json::json!({"id": c.id, "name": c.name,
                            "arguments": serde_json::from_str::<serde_json::Value>(&c.arguments)
                                .unwrap_or(serde_json::Value::Null)})
                    })
                    .collect::<Vec<_>>()
            };
            let out = serde_json::json!({
                "format": format.name(),
                "content": acc.content,
                "reasoning": acc.reasoning,
                "tool_calls": calls(&acc.calls),
                "discarded_calls": calls(&acc.discarded),
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
