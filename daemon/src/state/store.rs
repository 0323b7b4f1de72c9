//! The SQLite store under `$AGENTD_HOME/agentd.db`: settings, chats and
//! their messages, runs and their ledger. One connection per process user;
//! writes are small and immediate so that text already streamed survives a
//! crash.

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::PathBuf;

/// The database.
#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) conn: Connection,
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
";

/// The current time as RFC 3339 UTC (seconds).
pub(crate) fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
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

impl Store {
    /// Opens (and creates) the store under the state folder.
    pub(crate) fn open() -> Result<Store> {
        let home = crate::state::home::home();
        std::fs::create_dir_all(&home)
            .with_context(|| format!("cannot create {}", home.display()))?;
        Store::open_at(home.join("agentd.db"))
    }

    pub(crate) fn open_at(path: PathBuf) -> Result<Store> {
        let conn =
            Connection::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
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

    /// Creates the chat if it does not exist.
    pub(crate) fn ensure_chat(&self, id: &str, title: &str) -> Result<()> {
        let t = now();
        self.conn.execute(
            "INSERT OR IGNORE INTO chats(id, title, created, updated) VALUES (?1, ?2, ?3, ?3)",
            params![id, title.chars().take(80).collect::<String>(), t],
        )?;
        Ok(())
    }

    /// Adds a message; returns its id.
    pub(crate) fn add_message(&self, m: &StoredMessage) -> Result<i64> {
        let t = now();
        self.conn.execute(
            "INSERT INTO messages(chat_id, run_id, role, content, tool_calls, tool_call_id, name, status, created, updated)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)",
            params![m.chat_id, m.run_id, m.role, m.content, m.tool_calls, m.tool_call_id, m.name, m.status, t],
        )?;
        self.conn.execute("UPDATE chats SET updated = ?2 WHERE id = ?1", params![m.chat_id, t])?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Updates a message's text and status (streamed text is saved as it
    /// arrives).
    pub(crate) fn update_message(&self, id: i64, content: &str, status: &str) -> Result<()> {
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
                tool_calls: r.get(5)?,
                tool_call_id: r.get(6)?,
                name: r.get(7)?,
                status: r.get(8)?,
                created: r.get(9)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Marks messages and runs left `streaming`/`running` by a process that
    /// is gone as interrupted. `ours_live`: runs under this process id are
    /// in progress here (a running daemon); at start they are not (a
    /// restarted daemon may get the id of the one that was killed).
    pub(crate) fn mark_interrupted(&self, ours_live: bool) -> Result<usize> {
        let mut n = 0;
        let mut st = self.conn.prepare("SELECT id, pid FROM runs WHERE status = 'running'")?;
        let stale: Vec<(String, Option<i64>)> =
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
        for (id, pid) in stale {
            let ours = pid.is_some_and(|p| p as u32 == std::process::id());
            if (ours && ours_live) || pid.is_some_and(|p| !ours && pid_alive(p as u32)) {
                continue;
            }
            let t = now();
            n += self.conn.execute(
                "UPDATE runs SET status = 'interrupted', updated = ?2 WHERE id = ?1",
                params![id, t],
            )?;
            self.conn.execute(
                "UPDATE messages SET status = 'interrupted', updated = ?2 WHERE run_id = ?1 AND status = 'streaming'",
                params![id, t],
            )?;
        }
        Ok(n)
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A message row.
#[derive(Debug, Clone, Default)]
pub(crate) struct StoredMessage {
    #[allow(dead_code)] // read by the HTTP chats routes
    pub(crate) id: i64,
    pub(crate) chat_id: String,
    pub(crate) run_id: Option<String>,
    pub(crate) role: String,
    pub(crate) content: String,
    pub(crate) tool_calls: Option<String>,
    pub(crate) tool_call_id: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) status: String,
    #[allow(dead_code)] // read by the HTTP chats routes
    pub(crate) created: String,
}

#[cfg(test)]
mod tests {
    use super::*;

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
                status: "streaming".into(),
                ..Default::default()
            })
            .unwrap();
        s.update_message(id, "partial text", "cancelled").unwrap();
        let m = s.messages("c1").unwrap();
        assert_eq!(m[0].content, "partial text");
        assert_eq!(m[0].status, "cancelled");
        assert!(now().ends_with('Z'));
        assert!(new_id("run").starts_with("run_"));
    }
}
