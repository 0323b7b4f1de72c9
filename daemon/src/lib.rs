//! agentd: the command line and its rooms — `research` (the budgeted
//! research loop and its policies), `provider` (who runs the model),
//! `tools` (what the host runs for it), `server` (`agentd serve`),
//! `commands` (the other command-line fronts), `state` (the store,
//! settings, registry and home folder) and `events` (the closed enum a run
//! reports through). A library so that the binary (`src/main.rs`, which
//! only calls [`main`]) and the fuzz targets (`daemon/fuzz/`, through
//! [`fuzzing`]) share it; nothing else is public. It is the only crate that
//! knows JSON wire formats, HTTP, SQLite and tokio; it converts from the
//! types of `inference`, `prompts` and `toolparse`, which know nothing of
//! it, and it must never be a dependency of theirs.

mod clock;
mod commands;
mod events;

mod logs;
mod provider;
mod research;
mod server;
mod state;
mod tools;

/// Entry points for the fuzz targets in `daemon/fuzz/` (not an API).
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `body` as a request of one of the dialects (`dialect`
    /// picks: chat completions, Anthropic Messages, Ollama chat, Ollama
    /// generate, Responses), maps it to the one chat request every route
    /// builds and runs the checks they share, then builds what the request
    /// asks the decoder to enforce (its schema checks and each call
    /// format's grammar text). Every input must end in a value or an
    /// error message — never a panic.
    pub fn request_body(dialect: u8, body: &[u8]) {
        crate::server::fuzz_request(dialect, body);
    }

    /// The built-in tools of a run over one corpus folder and a notes
    /// folder, under the default policies (the tool-argument fuzz target).
    pub struct Tools(crate::tools::Host);

    impl std::fmt::Debug for Tools {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Tools")
        }
    }

    impl Tools {
        /// Opens the tools over `corpus` (indexed now) and `notes`.
        pub fn open(corpus: &std::path::Path, notes: &std::path::Path) -> anyhow::Result<Tools> {
            let policies = crate::state::policy::Policies::from_snapshot(&serde_json::Value::Null)?;
            let host = crate::tools::Host::for_run(
                &[corpus.to_owned()],
                Some(notes.to_owned()),
                &policies,
                None,
            )?;
            Ok(Tools(host))
        }

        /// Runs `name` with the argument text `arguments`, as a model wrote
        /// it; the result's JSON, and the note file when one was saved.
        pub fn call(&mut self, name: &str, arguments: &str) -> (String, Option<String>) {
            let out = self.0.call(name, arguments);
            let saved = match &out {
                crate::tools::ToolOutput::Saved(file) => Some(file.clone()),
                _ => None,
            };
            (out.to_json().to_string(), saved)
        }
    }
}

use clap::{Parser, Subcommand};
use commands::{ask, engine, parse, runs};
use provider::build::EngineArgs;
use state::policy::Policies;
use state::settings;
use state::store::Store;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(name = "agentd", version, about = "A local model-serving agent daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Answer QUESTION by researching the corpus, streaming the answer to stdout
    Ask {
        #[command(flatten)]
        engine: EngineArgs,
        /// Folder of sources to search and read (repeatable)
        #[arg(long)]
        corpus: Vec<std::path::PathBuf>,
        /// Folder where save_note writes
        #[arg(long)]
        notes: Option<std::path::PathBuf>,
        /// MCP configuration file, {"mcpServers": {…}} (repeatable; default $AGENTD_HOME/mcp.json)
        #[arg(long)]
        mcp: Vec<std::path::PathBuf>,
        /// Print one JSON event per line instead of text
        #[arg(long)]
        events: bool,
        /// A voice front-end asks: fallbacks are short spoken sentences
        #[arg(long)]
        voice: bool,
        /// Continue this chat (its earlier questions and answers are context)
        #[arg(long)]
        chat: Option<String>,
        /// Ask a running daemon (its socket; the default one without a value)
        #[arg(long, num_args = 0..=1, default_missing_value = "")]
        connect: Option<String>,
        question: String,
    },
    /// Interactive session with a running daemon, answers streamed
    Chat {
        /// The daemon's socket (the default one without a value)
        #[arg(long, num_args = 0..=1, default_missing_value = "")]
        connect: Option<String>,
    },
    /// Serve the local model (or, with --provider openai, an upstream engine) to many clients (Unix socket; TCP with --listen)
    Serve {
        #[command(flatten)]
        engine: EngineArgs,
        /// Folder of sources for /v1/research (repeatable)
        #[arg(long)]
        corpus: Vec<std::path::PathBuf>,
        /// Folder where save_note writes
        #[arg(long)]
        notes: Option<std::path::PathBuf>,
        /// MCP configuration file, {"mcpServers": {…}} (repeatable; default $AGENTD_HOME/mcp.json)
        #[arg(long)]
        mcp: Vec<std::path::PathBuf>,
        /// Unix socket path (default: $XDG_RUNTIME_DIR/agentd.sock, else $AGENTD_HOME/agentd.sock)
        #[arg(long)]
        socket: Option<std::path::PathBuf>,
        /// Also listen on TCP HOST:PORT (a bare port means 127.0.0.1)
        #[arg(long)]
        listen: Option<String>,
        /// File holding the bearer token TCP clients must send
        #[arg(long)]
        token_file: Option<std::path::PathBuf>,
        /// Also serve the Ollama (and OpenAI) routes without a token on
        /// HOST:PORT, loopback addresses only (Ollama's port is 11434)
        #[arg(long, value_name = "HOST:PORT")]
        ollama: Option<String>,
        /// Grant CORS on the --ollama listener to this origin (repeatable;
        /// none by default)
        #[arg(long, value_name = "ORIGIN")]
        allow_origin: Vec<String>,
        /// With --provider openai: wait up to SECONDS for the upstream to answer before giving up
        #[arg(long, value_name = "SECONDS")]
        wait_upstream: Option<u64>,
        /// Also serve every .gguf file in DIR (repeatable; the models
        /// folder always is)
        #[arg(long, value_name = "DIR")]
        models: Vec<PathBuf>,
    },
    /// MCP servers: their state and tools
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// List, audit, cancel and resume research runs
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Show and change settings
    Settings {
        #[command(subcommand)]
        command: SettingsCommand,
    },
    /// Download a registry model (the default when NAME is omitted), or
    /// any GGUF file from the Hugging Face Hub: hf:OWNER/REPO/FILE.gguf[@REVISION]
    Pull {
        /// Registry name (see `agentd models`) or hf:OWNER/REPO/FILE.gguf
        name: Option<String>,
    },
    /// Delete an installed model file
    Rm {
        /// Registry name, file name or file stem (see `agentd models`)
        name: String,
    },
    /// List registry models (present or not) and every GGUF file in the models folder
    Models {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Print the token ids of TEXT as a JSON array
    Tokenize {
        /// Registry name or .gguf path
        #[arg(long)]
        model: Option<String>,
        /// Parse control tokens written in TEXT (e.g. <|im_start|>)
        #[arg(long)]
        special: bool,
        text: String,
    },
    /// Raw completion of PROMPT (no chat template; control tokens parsed)
    Generate {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(long, default_value_t = 128)]
        max_tokens: usize,
        /// 0 is greedy
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        rules: engine::RepeatArgs,
        /// Print {"prompt_ids", "ids", "text", "finish_reason"}
        #[arg(long)]
        json: bool,
        prompt: String,
    },
    /// Print the embeddings of TEXTs as JSON (one vector per text)
    Embed {
        #[command(flatten)]
        engine: EngineArgs,
        /// mean, cls or last (default: the file's pooling, else mean)
        #[arg(long)]
        pooling: Option<String>,
        #[arg(required = true)]
        texts: Vec<String>,
    },
    /// Search the --corpus folders as the research tool `search_sources`
    /// does (full text, and vectors with AGENTD_CORPUS_EMBED_MODEL); one
    /// JSON object per hit
    Search {
        /// Folder of sources (repeatable)
        #[arg(long, required = true)]
        corpus: Vec<PathBuf>,
        /// Most hits
        #[arg(long, default_value_t = 5)]
        limit: usize,
        query: String,
    },
    /// Measure prompt processing and decode speed (like llama-bench)
    Bench {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(long, default_value_t = 512)]
        prompt_tokens: usize,
        #[arg(long, default_value_t = 128)]
        gen_tokens: usize,
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Decode this many sequences together (one batched pass per token,
        /// as `serve` does); tg is then their aggregate tokens/s
        #[arg(long, default_value_t = 1)]
        parallel: usize,
        /// Tokens already in the context before pp and tg are timed (as
        /// llama-bench's -d); the context grows to hold them
        #[arg(long, default_value_t = 0)]
        depth: usize,
        /// Print {"model", "threads", "pp_tok_s", "tg_tok_s", "peak_rss_mb", "parallel", "depth", "kv_type", "kv_bytes_per_token"}
        #[arg(long)]
        json: bool,
    },
    /// Tool-call parser utilities
    Toolparse {
        #[command(subcommand)]
        command: ToolparseCommand,
    },
}

#[derive(Subcommand, Debug)]
enum McpCommand {
    /// Start the configured servers and list each (JSON lines): its state
    /// and its tools with their read/write class
    List {
        /// MCP configuration file (repeatable; default $AGENTD_HOME/mcp.json)
        #[arg(long)]
        mcp: Vec<std::path::PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum RunsCommand {
    /// Runs, newest first (JSON lines)
    List,
    /// A run's admission snapshot and ledger
    Show { id: String },
    /// Continue an interrupted run under its own snapshot and ledger
    Resume {
        id: String,
        /// Print one JSON event per line
        #[arg(long)]
        events: bool,
    },
    /// Cancel a running or interrupted run
    Cancel { id: String },
}

#[derive(Subcommand, Debug)]
enum SettingsCommand {
    /// Every setting with its metadata (JSON lines); --policies adds every
    /// declared budget policy with its owner, unit and hard maximum
    List {
        #[arg(long)]
        policies: bool,
    },
    /// The bare value of KEY
    Get { key: String },
    /// Store VALUE for KEY (refused outside the bounds)
    Set { key: String, value: String },
    /// Forget the stored value of KEY
    Reset { key: String },
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

/// The `agentd` command: parses the command line and runs it.
pub fn main() -> ExitCode {
    logs::init();
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = Arc::clone(&cancel);
        // A second Ctrl-C exits at once.
        let _ = ctrlc::set_handler(move || {
            if c.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    match run(Cli::parse(), &cancel) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentd: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli, cancel: &AtomicBool) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Ask { engine, corpus, notes, mcp, events, voice, chat, connect, question } => {
            return ask::run(
                &ask::AskArgs {
                    engine,
                    corpus,
                    notes,
                    mcp,
                    events,
                    voice,
                    chat,
                    connect,
                    question,
                },
                cancel,
            );
        }
        Command::Chat { connect } => {
            return commands::chat::run(connect.as_deref().unwrap_or(""), cancel)
        }
        Command::Serve {
            engine,
            corpus,
            notes,
            mcp,
            socket,
            listen,
            token_file,
            ollama,
            allow_origin,
            wait_upstream,
            models,
        } => server::run(server::ServeArgs {
            engine,
            corpus,
            notes,
            mcp,
            socket,
            listen,
            token_file,
            ollama,
            allow_origin,
            wait_upstream,
            models,
        })?,
        Command::Mcp { command: McpCommand::List { mcp } } => commands::mcp::list(&mcp)?,
        Command::Runs { command } => {
            let store = Store::open()?;
            match command {
                RunsCommand::List => runs::list(&store)?,
                RunsCommand::Show { id } => runs::show(&store, &id)?,
                RunsCommand::Cancel { id } => {
                    println!("{}", research::runs::cancel(&store, &id, false)?)
                }
                RunsCommand::Resume { id, events } => {
                    let mut printer = ask::Printer::new(events);
                    let done = research::resume(&store, &id, cancel, &mut |e| printer.emit(e))?;
                    return Ok(printer.finish(&done));
                }
            }
        }
        Command::Settings { command } => {
            let store = Store::open()?;
            match command {
                SettingsCommand::List { policies } => {
                    for e in settings::list(&store)? {
                        println!("{}", e.to_json());
                    }
                    if policies {
                        for p in Policies::load(&store)?.describe() {
                            println!("{p}");
                        }
                    }
                }
                SettingsCommand::Get { key } => println!("{}", settings::get(&store, &key)?.value),
                SettingsCommand::Set { key, value } => {
                    let e = settings::set(&store, &key, &value)?;
                    if e.source == settings::Source::Env {
                        eprintln!(
                            "agentd: stored {key} = {value}, but {} overrides it (now {})",
                            e.def.env, e.value
                        );
                    }
                    println!("{}", e.value);
                }
                SettingsCommand::Reset { key } => {
                    println!("{}", settings::reset(&store, &key)?.value)
                }
            }
        }
        Command::Pull { name } => engine::pull(name.as_deref())?,
        Command::Rm { name } => engine::rm(&name)?,
        Command::Models { json } => engine::models(json)?,
        Command::Tokenize { model, special, text } => {
            engine::tokenize(model.as_deref(), special, &text)?
        }
        Command::Generate { engine: e, max_tokens, temperature, seed, rules, json, prompt } => {
            let finish = engine::generate(
                engine::GenerateArgs {
                    engine: &e,
                    max_tokens,
                    temperature,
                    seed,
                    rules,
                    json,
                    prompt: &prompt,
                },
                cancel,
            )?;
            if finish == inference::Finish::Cancelled {
                return Ok(ExitCode::from(130));
            }
        }
        Command::Search { corpus, limit, query } => tools::search_cmd(&corpus, limit, &query)?,
        Command::Embed { engine: e, pooling, texts } => {
            engine::embed(&e, pooling.as_deref(), &texts)?
        }
        Command::Bench { engine: e, prompt_tokens, gen_tokens, reps, parallel, depth, json } => {
            let run = engine::BenchRun { pp: prompt_tokens, tg: gen_tokens, reps, parallel, depth };
            engine::bench(&e, &run, json)?
        }
        Command::Toolparse { command: ToolparseCommand::Replay } => {
            parse::replay(std::io::stdin().lock(), std::io::stdout().lock())?;
        }
        Command::Toolparse {
            command:
                ToolparseCommand::Parse { format, generation_prompt, truncated, suppress, file },
        } => parse::parse(&format, generation_prompt, truncated, suppress, &file)?,
    }
    Ok(ExitCode::SUCCESS)
}
