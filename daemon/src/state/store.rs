//! The SQLite store under `$AGENTD_HOME/agentd.db`: settings, chats and
//! their messages, runs with their admission snapshot, ledger and source
//! handles. It is the only module that speaks SQL; the rest of the daemon
//! calls its typed methods and gets typed rows back. One connection per
//! process user; writes are small and immediate so that text already
//! streamed survives a crash.

use crate::events::Phase;
use crate::events::{Outcome, Stop};
use anyhow::{Context, Result};
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// The database.
#[derive(Debug)]
pub(crate) struct Store {
    conn: Connection,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chats (
  id TEXT PRIMARY KEY, title TEXT NOT NULL, created TEXT NOT NULL, updated TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
  id INTEGER PRIMARY KEY AUTOINCREMENT, chat_id TEXT NOT NULL REFERENCES chats(id),
  run_id TEXT, role TEXT NOT NULL, content TEXT NOT NULL, tool_calls TEXT,
  tool_call_id TEXT, name TEXT, status TEXT NOT NULL, created TEXT NOT NULL, updated TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS messages_chat ON messages(chat_id, id);
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, chat_id TEXT NOT NULL, question TEXT NOT NULL, status TEXT NOT NULL,
  snapshot TEXT NOT NULL, outcome TEXT, stop TEXT, error TEXT, pid INTEGER,
  elapsed_ms INTEGER NOT NULL DEFAULT 0, cancel_requested INTEGER NOT NULL DEFAULT 0,
  created TEXT NOT NULL, updated TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(id), n INTEGER NOT NULL,
  phase TEXT NOT NULL, outcome TEXT NOT NULL, classification TEXT, detail TEXT,
  created TEXT NOT NULL, updated TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ledger_run ON ledger(run_id, n);
CREATE TABLE IF NOT EXISTS run_handles (
  run_id TEXT NOT NULL REFERENCES runs(id), handle TEXT NOT NULL, path TEXT NOT NULL, segment INTEGER NOT NULL,
  title TEXT NOT NULL, issued INTEGER NOT NULL, read_ok INTEGER NOT NULL, PRIMARY KEY (run_id, handle));
CREATE TABLE IF NOT EXISTS tool_calls (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(id), round INTEGER NOT NULL,
  call_id TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, outcome TEXT NOT NULL, detail TEXT,
  created TEXT NOT NULL, updated TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS tool_calls_run ON tool_calls(run_id, id);
CREATE TABLE IF NOT EXISTS responses (
  id TEXT PRIMARY KEY, response TEXT NOT NULL, conversation TEXT NOT NULL, created TEXT NOT NULL);
";

/// The current time as RFC 3339 UTC (seconds), as every row keeps it.
pub(crate) fn now() -> String {
    crate::clock::rfc3339(std::time::SystemTime::now())
}

/// A random id with a prefix (`run_3f9a…`).
pub(crate) fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        let t =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        b = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    format!("{prefix}_{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
}

/// A status column: a closed set of names, stored as text.
macro_rules! status {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub(crate) enum $name {
            #[default]
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $name {
            fn column_result(v: ValueRef<'_>) -> FromSqlResult<$name> {
                match v.as_str()? {
                    $($text => Ok($name::$variant),)*
                    _ => Err(FromSqlError::InvalidType),
                }
            }
        }
    };
}

status! {
    /// Where a run stands.
    RunStatus {
        /// Researching in a live process.
        Running => "running",
        /// Its process is gone; `runs resume` continues it.
        Interrupted => "interrupted",
        Cancelled => "cancelled",
        Finished => "finished",
    }
}

status! {
    /// A message row's state.
    MessageStatus {
        /// Text still arriving.
        Streaming => "streaming",
        Complete => "complete",
        Cancelled => "cancelled",
        /// The reply ended in an error; or a tool call failed.
        Error => "error",
        /// Its process went away while it streamed.
        Interrupted => "interrupted",
        /// An assistant turn that called tools.
        ToolCalls => "tool_calls",
        /// A tool call that succeeded.
        Ok => "ok",
    }
}

status! {
    /// What became of one model request in the ledger.
    LedgerOutcome {
        /// Written before it is sent; replaced when it ends.
        Sent => "sent",
        /// It failed transiently and was tried again.
        Retried => "retried",
        Ok => "ok",
        Cancelled => "cancelled",
        Error => "error",
        /// The run's own allowance refused it: never sent.
        Refused => "refused",
    }
}

/// A call as an assistant message keeps it: `{id, name, arguments}`, as
/// the row and the chats route hold it (a field a row lacks reads as empty).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct StoredCall {
    pub(crate) id: String,
    pub(crate) name: String,
    /// A JSON object.
    pub(crate) arguments: Value,
}

impl StoredCall {
    /// The call's JSON.
    pub(crate) fn to_json(&self) -> Value {
        // Infallible: strings and a JSON value under string keys.
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// A message row.
#[derive(Debug, Clone, Default)]
pub(crate) struct StoredMessage {
    pub(crate) id: i64,
    pub(crate) chat_id: String,
    pub(crate) run_id: Option<String>,
    pub(crate) role: String,
    pub(crate) content: String,
    /// The calls of an assistant turn that called tools.
    pub(crate) tool_calls: Option<Vec<StoredCall>>,
    pub(crate) tool_call_id: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) status: MessageStatus,
    pub(crate) created: String,
}

/// A source handle a run registered (`tools::Handles`), as the run keeps
/// it for recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandleRec {
    pub(crate) handle: String,
    pub(crate) path: String,
    pub(crate) segment: usize,
    pub(crate) title: String,
    /// Seconds since the Unix epoch when it was issued.
    pub(crate) issued: u64,
    pub(crate) read_ok: bool,
}

/// A chat row.
#[derive(Debug, Clone)]
pub(crate) struct ChatRow {
    pub(crate) id: String,
    pub(crate) title: String,
    pub(crate) created: String,
    pub(crate) updated: String,
}

/// A new run, as admission stores it.
#[derive(Debug)]
pub(crate) struct NewRun<'a> {
    pub(crate) id: &'a str,
    pub(crate) chat_id: &'a str,
    pub(crate) question: &'a str,
    /// The admission snapshot (JSON text).
    pub(crate) snapshot: &'a str,
}

/// A run row.
#[derive(Debug, Clone)]
pub(crate) struct RunRow {
    pub(crate) id: String,
    pub(crate) chat_id: String,
    pub(crate) question: String,
    pub(crate) status: RunStatus,
    /// The admission snapshot (JSON text).
    pub(crate) snapshot: String,
    pub(crate) outcome: Option<String>,
    pub(crate) stop: Option<String>,
    /// The run's error (JSON text), when it ended in one.
    pub(crate) error: Option<String>,
    /// Run time spent by the processes that ran it.
    pub(crate) elapsed: Duration,
    pub(crate) created: String,
    pub(crate) updated: String,
}

/// How a run ended, as it is settled.
#[derive(Debug)]
pub(crate) struct Settled<'a> {
    pub(crate) status: RunStatus,
    pub(crate) outcome: Outcome,
    pub(crate) stop: Stop,
    /// The error (JSON text), when there is one.
    pub(crate) error: Option<&'a str>,
}

/// One tool call in a run's ledger of MCP calls (`tool_calls`): written
/// `sent` before the call goes to its server, closed with `ok`, `error`
/// or `refused` (never sent) and a detail.
#[derive(Debug, Clone)]
pub(crate) struct ToolCallRow {
    pub(crate) round: i64,
    pub(crate) call_id: String,
    pub(crate) name: String,
    /// `read` or `write`.
    pub(crate) kind: String,
    pub(crate) outcome: String,
    pub(crate) detail: Option<String>,
    pub(crate) created: String,
    pub(crate) updated: String,
}

/// A tool call about to be written to the `tool_calls` ledger.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewToolCall<'a> {
    pub(crate) run_id: &'a str,
    pub(crate) round: usize,
    pub(crate) call_id: &'a str,
    pub(crate) name: &'a str,
    /// `read` or `write`.
    pub(crate) kind: &'a str,
}

/// A ledger row.
#[derive(Debug, Clone)]
pub(crate) struct LedgerRow {
    pub(crate) n: i64,
    pub(crate) phase: String,
    pub(crate) outcome: LedgerOutcome,
    pub(crate) classification: Option<String>,
    pub(crate) detail: Option<String>,
    pub(crate) created: String,
}

/// Requests a run has sent, by allowance (refused ones are not usage).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Research requests.
    pub(crate) research: usize,
    /// Final and correction requests (the finalization reserve).
    pub(crate) reserve: usize,
    /// Section-worker requests (also counted in `research`).
    pub(crate) section: usize,
}

const RUN_COLUMNS: &str =
    "id, chat_id, question, status, snapshot, outcome, stop, error, elapsed_ms, created, updated";

fn run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        id: r.get(0)?,
        chat_id: r.get(1)?,
        question: r.get(2)?,
        status: r.get(3)?,
        snapshot: r.get(4)?,
        outcome: r.get(5)?,
        stop: r.get(6)?,
        error: r.get(7)?,
        elapsed: Duration::from_millis(r.get::<_, i64>(8)?.max(0) as u64),
        created: r.get(9)?,
        updated: r.get(10)?,
    })
}

fn encode_calls(calls: &[StoredCall]) -> String {
    // Infallible: see `StoredCall::to_json`.
    serde_json::to_string(calls).unwrap_or_default()
}

fn decode_calls(text: &str) -> Vec<StoredCall> {
    serde_json::from_str(text).unwrap_or_default()
}

fn this_process() -> i64 {
    i64::from(std::process::id())
}

impl Store {
    /// Opens (and creates) the store under the state folder.
    pub(crate) fn open() -> Result<Store> {
        let home = super::home::home();
        super::home::create_private(&home)
            .with_context(|| format!("cannot create {}", home.display()))?;
        Store::open_at(home.join("agentd.db"))
    }

    pub(crate) fn open_at(path: PathBuf) -> Result<Store> {
        let conn =
            Connection::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        // The database (and the WAL files SQLite gives its mode) for this
        // user only.
        {
            use std::os::unix::fs::PermissionsExt;
            if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            {
                tracing::warn!(path = %path.display(), error = %e, "cannot make the store private");
            }
        }
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(SCHEMA).context("cannot create the schema")?;
        // Columns added after the first schema.
        for (table, col, decl) in [
            ("runs", "elapsed_ms", "INTEGER NOT NULL DEFAULT 0"),
            ("runs", "cancel_requested", "INTEGER NOT NULL DEFAULT 0"),
        ] {
            let has: bool = conn
                .prepare(&format!("SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"))?
                .exists([col])?;
            if !has {
                conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {col} {decl}"))?;
            }
        }
        Ok(Store { conn })
    }

    /// Makes every later write fail as on a read-only database (for the
    /// tests of a ledger that fails closed).
    #[cfg(test)]
    pub(crate) fn fail_writes(&self) {
        self.conn.pragma_update(None, "query_only", true).expect("query_only");
    }

    /// Caps the database at its current size, so the next write that needs
    /// a page fails as on a full disk (`SQLITE_FULL`).
    #[cfg(test)]
    pub(crate) fn fill_disk(&self) {
        let pages: i64 =
            self.conn.query_row("PRAGMA page_count", [], |r| r.get(0)).expect("page_count");
        self.conn.pragma_update(None, "max_page_count", pages).expect("max_page_count");
    }

    // Responses (`/v1/responses` with `store`).

    /// Keeps a response: its object as the API returns it, and the
    /// conversation a later `previous_response_id` continues (the chat
    /// messages sent and the reply, as JSON).
    pub(crate) fn save_response(&self, id: &str, response: &str, conversation: &str) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO responses (id, response, conversation, created) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![id, response, conversation, now()],
        )?;
        Ok(())
    }

    /// A kept response: `(response, conversation)`.
    pub(crate) fn response(&self, id: &str) -> Result<Option<(String, String)>> {
        Ok(self
            .conn
            .query_row("SELECT response, conversation FROM responses WHERE id = ?1", [id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?)
    }

    /// Forgets a kept response; whether there was one.
    pub(crate) fn delete_response(&self, id: &str) -> Result<bool> {
        Ok(self.conn.execute("DELETE FROM responses WHERE id = ?1", [id])? > 0)
    }

    // Settings.

    pub(crate) fn setting(&self, key: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    pub(crate) fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        self.conn.execute(
            "INSERT INTO settings(key, value, updated) VALUES (?1, ?2, ?3)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated = excluded.updated",
            params![key, value, now()],
        )?;
        Ok(())
    }

    pub(crate) fn reset_setting(&self, key: &str) -> Result<()> {
        self.conn.execute("DELETE FROM settings WHERE key = ?1", [key])?;
        Ok(())
    }

    // Chats and messages.

    /// Creates the chat if it does not exist.
    pub(crate) fn ensure_chat(&self, id: &str, title: &str) -> Result<()> {
        let t = now();
        self.conn.execute(
            "INSERT OR IGNORE INTO chats(id, title, created, updated) VALUES (?1, ?2, ?3, ?3)",
            params![id, title.chars().take(80).collect::<String>(), t],
        )?;
        Ok(())
    }

    /// Every chat, the most recently updated first.
    pub(crate) fn chats(&self) -> Result<Vec<ChatRow>> {
        let mut st = self
            .conn
            .prepare("SELECT id, title, created, updated FROM chats ORDER BY updated DESC")?;
        let rows = st.query_map([], |r| {
            Ok(ChatRow { id: r.get(0)?, title: r.get(1)?, created: r.get(2)?, updated: r.get(3)? })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub(crate) fn chat_exists(&self, id: &str) -> Result<bool> {
        Ok(self.conn.prepare("SELECT 1 FROM chats WHERE id = ?1")?.exists([id])?)
    }

    /// Adds a message; returns its id.
    pub(crate) fn add_message(&self, m: &StoredMessage) -> Result<i64> {
        let t = now();
        self.conn.execute(
            "INSERT INTO messages(chat_id, run_id, role, content, tool_calls, tool_call_id, name, status, created, updated)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)",
            params![
                m.chat_id,
                m.run_id,
                m.role,
                m.content,
                m.tool_calls.as_deref().map(encode_calls),
                m.tool_call_id,
                m.name,
                m.status,
                t
            ],
        )?;
        self.conn.execute("UPDATE chats SET updated = ?2 WHERE id = ?1", params![m.chat_id, t])?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Updates a message's text and status (streamed text is saved as it
    /// arrives).
    pub(crate) fn update_message(
        &self,
        id: i64,
        content: &str,
        status: MessageStatus,
    ) -> Result<()> {
        self.conn.execute(
            "UPDATE messages SET content = ?2, status = ?3, updated = ?4 WHERE id = ?1",
            params![id, content, status, now()],
        )?;
        Ok(())
    }

    /// Messages of a chat, oldest first.
    pub(crate) fn messages(&self, chat_id: &str) -> Result<Vec<StoredMessage>> {
        let mut st = self.conn.prepare(
            "SELECT id, chat_id, run_id, role, content, tool_calls, tool_call_id, name, status, created
             FROM messages WHERE chat_id = ?1 ORDER BY id",
        )?;
        let rows = st.query_map([chat_id], |r| {
            Ok(StoredMessage {
                id: r.get(0)?,
                chat_id: r.get(1)?,
                run_id: r.get(2)?,
                role: r.get(3)?,
                content: r.get(4)?,
                tool_calls: r.get::<_, Option<String>>(5)?.as_deref().map(decode_calls),
                tool_call_id: r.get(6)?,
                name: r.get(7)?,
                status: r.get(8)?,
                created: r.get(9)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    // Runs.

    /// Stores a newly admitted run, running in this process.
    pub(crate) fn insert_run(&self, r: &NewRun<'_>) -> Result<()> {
        self.conn.execute(
            "INSERT INTO runs(id, chat_id, question, status, snapshot, pid, created, updated) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
            params![r.id, r.chat_id, r.question, RunStatus::Running, r.snapshot, this_process(), now()],
        )?;
        Ok(())
    }

    /// A run, when there is one with this id.
    pub(crate) fn run(&self, id: &str) -> Result<Option<RunRow>> {
        Ok(self
            .conn
            .query_row(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"), [id], run_row)
            .optional()?)
    }

    /// Every run, newest first.
    pub(crate) fn runs(&self) -> Result<Vec<RunRow>> {
        let mut st = self.conn.prepare(&format!(
            "SELECT {RUN_COLUMNS} FROM runs ORDER BY created DESC, rowid DESC"
        ))?;
        let rows = st.query_map([], run_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Stores the run time spent so far (recovery resumes from it).
    pub(crate) fn set_run_elapsed(&self, id: &str, elapsed: Duration) -> Result<()> {
        self.conn.execute(
            "UPDATE runs SET elapsed_ms = ?2, updated = ?3 WHERE id = ?1",
            params![id, elapsed.as_millis() as i64, now()],
        )?;
        Ok(())
    }

    /// Records how a run ended.
    pub(crate) fn settle_run(&self, id: &str, s: &Settled<'_>) -> Result<()> {
        self.conn.execute(
            "UPDATE runs SET status = ?2, outcome = ?3, stop = ?4, error = ?5, updated = ?6 WHERE id = ?1",
            params![id, s.status, s.outcome.as_str(), s.stop.as_str(), s.error, now()],
        )?;
        Ok(())
    }

    /// This process takes an interrupted run over (resume).
    pub(crate) fn claim_run(&self, id: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE runs SET status = ?2, pid = ?3, updated = ?4 WHERE id = ?1",
            params![id, RunStatus::Running, this_process(), now()],
        )?;
        Ok(())
    }

    /// Asks the process running a run to cancel it (`agentd runs cancel`).
    pub(crate) fn request_cancel(&self, id: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE runs SET cancel_requested = 1, updated = ?2 WHERE id = ?1",
            params![id, now()],
        )?;
        Ok(())
    }

    /// Whether another process asked to cancel the run.
    pub(crate) fn cancel_requested(&self, id: &str) -> bool {
        let flag: Option<i64> = self
            .conn
            .query_row("SELECT cancel_requested FROM runs WHERE id = ?1", [id], |r| r.get(0))
            .ok();
        flag == Some(1)
    }

    /// Settles an interrupted run as cancelled (nothing runs it).
    pub(crate) fn cancel_interrupted(&self, id: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE runs SET status = ?2, outcome = ?3, stop = ?4, updated = ?5 WHERE id = ?1",
            params![
                id,
                RunStatus::Cancelled,
                Outcome::Cancelled.as_str(),
                Stop::Cancelled.as_str(),
                now()
            ],
        )?;
        Ok(())
    }

    /// Marks messages and runs left `streaming`/`running` by a process that
    /// is gone as interrupted. `ours_live`: runs under this process id are
    /// in progress here (a running daemon); at start they are not (a
    /// restarted daemon may get the id of the one that was killed).
    pub(crate) fn mark_interrupted(&self, ours_live: bool) -> Result<usize> {
        let mut n = 0;
        let mut st = self.conn.prepare("SELECT id, pid FROM runs WHERE status = ?1")?;
        let stale: Vec<(String, Option<i64>)> = st
            .query_map([RunStatus::Running], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        for (id, pid) in stale {
            let ours = pid.is_some_and(|p| p as u32 == std::process::id());
            if (ours && ours_live) || pid.is_some_and(|p| !ours && pid_alive(p as u32)) {
                continue;
            }
            let t = now();
            n += self.conn.execute(
                "UPDATE runs SET status = ?2, updated = ?3 WHERE id = ?1",
                params![id, RunStatus::Interrupted, t],
            )?;
            self.conn.execute(
                "UPDATE messages SET status = ?2, updated = ?3 WHERE run_id = ?1 AND status = ?4",
                params![id, MessageStatus::Interrupted, t, MessageStatus::Streaming],
            )?;
        }
        Ok(n)
    }

    // The ledger.

    /// Writes request `n` of a run as sent, before it is sent; returns the
    /// entry to close when it ends.
    pub(crate) fn ledger_sent(&self, run_id: &str, n: usize, phase: Phase) -> Result<i64> {
        self.conn.execute(
            "INSERT INTO ledger(run_id, n, phase, outcome, created, updated) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
            params![run_id, n as i64, phase.as_str(), LedgerOutcome::Sent, now()],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Records what became of a sent request.
    pub(crate) fn ledger_close(
        &self,
        entry: i64,
        outcome: LedgerOutcome,
        classification: Option<&str>,
        detail: Option<&str>,
    ) -> Result<()> {
        self.conn.execute(
            "UPDATE ledger SET outcome = ?2, classification = ?3, detail = ?4, updated = ?5 WHERE id = ?1",
            params![entry, outcome, classification, detail, now()],
        )?;
        Ok(())
    }

    /// Records request `n` as refused by the run's own allowance (never sent).
    pub(crate) fn ledger_refused(
        &self,
        run_id: &str,
        n: usize,
        phase: Phase,
        detail: &str,
    ) -> Result<()> {
        self.conn.execute(
            "INSERT INTO ledger(run_id, n, phase, outcome, classification, detail, created, updated)
             VALUES (?1, ?2, ?3, ?4, 'local_budget_exhausted', ?5, ?6, ?6)",
            params![run_id, n as i64, phase.as_str(), LedgerOutcome::Refused, detail, now()],
        )?;
        Ok(())
    }

    /// A run's ledger, in the order it was written.
    pub(crate) fn ledger(&self, run_id: &str) -> Result<Vec<LedgerRow>> {
        let mut st = self.conn.prepare(
            "SELECT n, phase, outcome, classification, detail, created FROM ledger WHERE run_id = ?1 ORDER BY id",
        )?;
        let rows = st.query_map([run_id], |r| {
            Ok(LedgerRow {
                n: r.get(0)?,
                phase: r.get(1)?,
                outcome: r.get(2)?,
                classification: r.get(3)?,
                detail: r.get(4)?,
                created: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The requests a run has sent, by allowance.
    pub(crate) fn usage(&self, run_id: &str) -> Result<Usage> {
        let mut st = self.conn.prepare(
            "SELECT phase, count(*) FROM ledger WHERE run_id = ?1 AND outcome != ?2 GROUP BY phase",
        )?;
        let rows = st.query_map(params![run_id, LedgerOutcome::Refused], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as usize))
        })?;
        let mut usage = Usage::default();
        for row in rows {
            match row? {
                (phase, n) if phase == Phase::Research.as_str() => usage.research += n,
                // Section workers spend the research allowance.
                (phase, n) if phase == Phase::Section.as_str() => {
                    usage.research += n;
                    usage.section += n;
                }
                (_, n) => usage.reserve += n,
            }
        }
        Ok(usage)
    }

    // Tool calls sent to MCP servers.

    /// Writes a tool call as `outcome` (`sent` before it goes out, or
    /// `refused`); returns the entry to close.
    pub(crate) fn tool_call_open(
        &self,
        c: &NewToolCall<'_>,
        outcome: &str,
        detail: Option<&str>,
    ) -> Result<i64> {
        self.conn.execute(
            "INSERT INTO tool_calls(run_id, round, call_id, name, kind, outcome, detail, created, updated)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
            params![c.run_id, c.round as i64, c.call_id, c.name, c.kind, outcome, detail, now()],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Records what became of a sent tool call.
    pub(crate) fn tool_call_close(
        &self,
        entry: i64,
        outcome: &str,
        detail: Option<&str>,
    ) -> Result<()> {
        self.conn.execute(
            "UPDATE tool_calls SET outcome = ?2, detail = ?3, updated = ?4 WHERE id = ?1",
            params![entry, outcome, detail, now()],
        )?;
        Ok(())
    }

    /// A run's tool calls to MCP servers, in the order they were made.
    pub(crate) fn tool_calls(&self, run_id: &str) -> Result<Vec<ToolCallRow>> {
        let mut st = self.conn.prepare(
            "SELECT round, call_id, name, kind, outcome, detail, created, updated FROM tool_calls WHERE run_id = ?1 ORDER BY id",
        )?;
        let rows = st.query_map([run_id], |r| {
            Ok(ToolCallRow {
                round: r.get(0)?,
                call_id: r.get(1)?,
                name: r.get(2)?,
                kind: r.get(3)?,
                outcome: r.get(4)?,
                detail: r.get(5)?,
                created: r.get(6)?,
                updated: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    // Source handles.

    /// Stores a handle a run registered, or that it was read.
    pub(crate) fn save_handle(&self, run_id: &str, h: &HandleRec) -> Result<()> {
        self.conn.execute(
            "INSERT INTO run_handles(run_id, handle, path, segment, title, issued, read_ok) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT(run_id, handle) DO UPDATE SET read_ok = excluded.read_ok",
            params![run_id, h.handle, h.path, h.segment as i64, h.title, h.issued as i64, h.read_ok],
        )?;
        Ok(())
    }

    /// The handles a run registered.
    pub(crate) fn handles(&self, run_id: &str) -> Result<Vec<HandleRec>> {
        let mut st = self.conn.prepare(
            "SELECT handle, path, segment, title, issued, read_ok FROM run_handles WHERE run_id = ?1",
        )?;
        let rows = st.query_map([run_id], |r| {
            Ok(HandleRec {
                handle: r.get(0)?,
                path: r.get(1)?,
                segment: r.get::<_, i64>(2)? as usize,
                title: r.get(3)?,
                issued: r.get::<_, i64>(4)? as u64,
                read_ok: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    /// The state folder and the database are this user's only (0700,
    /// 0600), the WAL files too; a folder that existed keeps its mode.
    #[test]
    fn the_state_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("a/b/agentd");
        crate::state::home::create_private(&home).unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&home), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        let db = home.join("agentd.db");
        let s = Store::open_at(db.clone()).unwrap();
        s.set_setting("chat.max_tool_iters", "7").ok();
        assert_eq!(mode(&db), 0o600);
        for wal in ["agentd.db-wal", "agentd.db-shm"] {
            let p = home.join(wal);
            if p.exists() {
                assert_eq!(mode(&p), 0o600, "{wal}");
            }
        }
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn settings_and_messages_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_at(dir.path().join("a.db")).unwrap();
        assert_eq!(s.setting("k").unwrap(), None);
        s.set_setting("k", "6").unwrap();
        s.set_setting("k", "7").unwrap();
        assert_eq!(s.setting("k").unwrap().as_deref(), Some("7"));
        s.reset_setting("k").unwrap();
        assert_eq!(s.setting("k").unwrap(), None);
        s.ensure_chat("c1", "hello").unwrap();
        let id = s
            .add_message(&StoredMessage {
                chat_id: "c1".into(),
                role: "assistant".into(),
                status: MessageStatus::Streaming,
                ..Default::default()
            })
            .unwrap();
        s.update_message(id, "partial text", MessageStatus::Cancelled).unwrap();
        let call = StoredCall { id: "c".into(), name: "f".into(), arguments: json!({"x": 1}) };
        s.add_message(&StoredMessage {
            chat_id: "c1".into(),
            role: "assistant".into(),
            tool_calls: Some(vec![call.clone()]),
            status: MessageStatus::ToolCalls,
            ..Default::default()
        })
        .unwrap();
        let m = s.messages("c1").unwrap();
        assert_eq!(m[0].content, "partial text");
        assert_eq!(m[0].status, MessageStatus::Cancelled);
        assert_eq!(m[0].tool_calls, None);
        assert_eq!(m[1].tool_calls, Some(vec![call.clone()]));
        assert_eq!(call.to_json().to_string(), r#"{"id":"c","name":"f","arguments":{"x":1}}"#);
        let lax = decode_calls(r#"[{"name":"g"}]"#);
        assert_eq!(lax, vec![StoredCall { name: "g".into(), ..Default::default() }]);
        assert!(s.chat_exists("c1").unwrap() && !s.chat_exists("c2").unwrap());
        assert!(now().ends_with('Z'));
        assert!(new_id("run").starts_with("run_"));
    }

    #[test]
    fn runs_ledger_and_usage_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_at(dir.path().join("a.db")).unwrap();
        s.insert_run(&NewRun { id: "r", chat_id: "c", question: "q", snapshot: "{}" }).unwrap();
        assert_eq!(s.run("r").unwrap().unwrap().status, RunStatus::Running);
        let a = s.ledger_sent("r", 1, Phase::Research).unwrap();
        s.ledger_close(a, LedgerOutcome::Retried, Some("transient"), None).unwrap();
        let b = s.ledger_sent("r", 2, Phase::Research).unwrap();
        s.ledger_close(b, LedgerOutcome::Ok, None, None).unwrap();
        let c = s.ledger_sent("r", 3, Phase::Final).unwrap();
        s.ledger_close(c, LedgerOutcome::Ok, None, None).unwrap();
        s.ledger_refused("r", 4, Phase::Final, "not sent").unwrap();
        assert_eq!(s.usage("r").unwrap(), Usage { research: 2, reserve: 1, section: 0 });
        let l = s.ledger("r").unwrap();
        assert_eq!(l.len(), 4);
        assert_eq!(l[3].outcome, LedgerOutcome::Refused);
        assert_eq!(l[3].classification.as_deref(), Some("local_budget_exhausted"));
        s.set_run_elapsed("r", Duration::from_millis(1500)).unwrap();
        s.settle_run(
            "r",
            &Settled {
                status: RunStatus::Finished,
                outcome: Outcome::Answered,
                stop: Stop::Answer,
                error: None,
            },
        )
        .unwrap();
        let r = s.run("r").unwrap().unwrap();
        assert_eq!((r.status, r.elapsed), (RunStatus::Finished, Duration::from_millis(1500)));
        assert_eq!(r.outcome.as_deref(), Some("answered"));
        assert!(!s.cancel_requested("r"));
        s.request_cancel("r").unwrap();
        assert!(s.cancel_requested("r"));
        assert_eq!(s.runs().unwrap().len(), 1);
    }
}
