//! A stdio server's transport with a bounded reader in front of its stdout.
//!
//! rmcp reads one JSON-RPC message per line and drops, unanswered, a line
//! longer than its cap (`DEFAULT_MAX_LINE_LENGTH`, 16 MiB): a tool whose
//! result is larger never answers, and the call fails only at
//! `mcp/call-timeout`. `Bounded` reads the child's stdout first: a line that
//! fits is passed on whole; a longer one is never held — its bytes are
//! skipped as they come, only its top-level `"id"` kept — and in its place
//! rmcp gets a small JSON-RPC error answering that id, which names the
//! limit. The call then ends as soon as the server has written its
//! message, with an `MCP_ERROR` the model can act on, and the server stays
//! up for the next call.

use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use rmcp::transport::Transport;
use rmcp::RoleClient;
use serde_json::{json, Value};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The most agentd reads of one message of a stdio server, newline
/// included: rmcp's own cap, so no line it would drop reaches it.
pub(super) const MAX_MESSAGE: usize = DEFAULT_MAX_LINE_LENGTH;

/// How long `close` waits for the server to exit after its stdin closes,
/// before it is killed.
const EXIT_WAIT: Duration = Duration::from_secs(3);

/// What agentd reads at a time from the server.
const CHUNK: usize = 64 * 1024;

/// A stdio server: the child process, its stdin, and its stdout read
/// through `Bounded`. The child is killed when the transport drops (it is
/// spawned with `kill_on_drop`).
pub(super) struct ChildTransport {
    child: Child,
    rw: AsyncRwTransport<RoleClient, Bounded<ChildStdout>, ChildStdin>,
}

impl ChildTransport {
    /// The transport of `child`, spawned with piped stdin and stdout;
    /// `server` names it in the log. `None` when its pipes are missing.
    pub(super) fn new(mut child: Child, server: &str) -> Option<ChildTransport> {
        let stdin = child.stdin.take()?;
        let stdout = child.stdout.take()?;
        let rw = AsyncRwTransport::new(Bounded::new(stdout, MAX_MESSAGE, server), stdin);
        Some(ChildTransport { child, rw })
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.rw.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl std::future::Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.rw.receive()
    }

    /// Closes the server's stdin (the MCP way to stop a stdio server), waits
    /// a moment for it to exit, then kills it.
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.rw.close().await?;
        if tokio::time::timeout(EXIT_WAIT, self.child.wait()).await.is_err() {
            self.child.kill().await?;
        }
        Ok(())
    }
}

/// A reader of newline-delimited messages that passes on whole lines of at
/// most `cap` bytes (newline included) and answers a longer one with a
/// JSON-RPC error for its id (none when it has no id: it is dropped).
pub(super) struct Bounded<R> {
    inner: R,
    cap: usize,
    server: String,
    /// The line read so far, while it fits.
    line: Vec<u8>,
    /// The line being skipped, once it does not.
    over: Option<Over>,
    /// Whole lines ready for the reader, from `at`.
    ready: Vec<u8>,
    at: usize,
    chunk: Box<[u8]>,
    eof: bool,
}

/// A line over the cap, skipped as it is read.
struct Over {
    /// Its bytes so far.
    size: usize,
    id: IdScan,
}

impl<R: AsyncRead + Unpin> Bounded<R> {
    pub(super) fn new(inner: R, cap: usize, server: &str) -> Bounded<R> {
        Bounded {
            inner,
            cap,
            server: server.to_owned(),
            line: Vec::new(),
            over: None,
            ready: Vec::new(),
            at: 0,
            chunk: vec![0; CHUNK].into_boxed_slice(),
            eof: false,
        }
    }

    /// Takes in `bytes` read from the server: whole lines that fit go to
    /// `ready`, a line over the cap becomes its error line.
    fn take_in(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|&b| b == b'\n');
            let (piece, rest) = bytes.split_at(end.map_or(bytes.len(), |i| i + 1));
            bytes = rest;
            if self.over.is_none() && self.line.len() + piece.len() > self.cap {
                // Over the cap: what was held is scanned for the id and freed.
                let mut id = IdScan::default();
                id.feed(&self.line);
                self.over = Some(Over { size: self.line.len(), id });
                self.line = Vec::new();
            }
            match &mut self.over {
                Some(over) => {
                    over.size += piece.len();
                    over.id.feed(piece);
                    if end.is_some() {
                        let over = self.over.take().expect("a line over the cap");
                        self.refuse(over);
                    }
                }
                None => {
                    self.line.extend_from_slice(piece);
                    if end.is_some() {
                        self.ready.append(&mut self.line);
                    }
                }
            }
        }
    }

    /// The error that answers a line over the cap (logged; when the line
    /// has no id, nothing answers it).
    fn refuse(&mut self, over: Over) {
        let mib = self.cap / (1024 * 1024);
        let Some(id) = over.id.id() else {
            eprintln!(
                "agentd: mcp {}: a message of {} bytes without an id is over the {mib} MiB limit on one MCP message; it was dropped",
                self.server, over.size
            );
            return;
        };
        eprintln!(
            "agentd: mcp {}: the answer to request {id} is {} bytes, over the {mib} MiB limit on one MCP message; it was dropped and the call fails",
            self.server, over.size
        );
        let message = format!(
            "the server's answer was {} bytes, over agentd's {mib} MiB ({} bytes) limit on one MCP message; it was dropped unread. Ask the tool for less (a narrower query, a smaller range)",
            over.size, self.cap
        );
        let error =
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": message}});
        self.ready.extend_from_slice(error.to_string().as_bytes());
        self.ready.push(b'\n');
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Bounded<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.at < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.at);
                buf.put_slice(&this.ready[this.at..this.at + n]);
                this.at += n;
                if this.at == this.ready.len() {
                    this.ready.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // An unfinished last line is passed on as it is (rmcp drops
                // it); then the end.
                if !this.line.is_empty() {
                    this.ready.append(&mut this.line);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = ReadBuf::new(&mut this.chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut chunk) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let n = chunk.filled().len();
                    if n == 0 {
                        this.eof = true;
                    } else {
                        let chunk = std::mem::take(&mut this.chunk);
                        this.take_in(&chunk[..n]);
                        this.chunk = chunk;
                    }
                }
            }
        }
    }
}

/// Finds the top-level `"id"` of a JSON object read in pieces, keeping
/// nothing else of it.
#[derive(Default)]
struct IdScan {
    /// Nesting depth outside strings (1: inside the top-level object).
    depth: usize,
    /// Whether the text is an object at all (decided at its first byte).
    object: Option<bool>,
    in_string: bool,
    escaped: bool,
    /// At depth 1: reading a key (else a value).
    reading_key: bool,
    /// At depth 1: after a `:` (a value), until `,` or `}`.
    in_value: bool,
    /// The key being read (its first bytes).
    key: Vec<u8>,
    /// The value of the `id` key, while it is read.
    value: Option<Vec<u8>>,
    found: Option<Vec<u8>>,
}

/// The longest id kept (a longer one is no id agentd sent).
const ID_MAX: usize = 64;

impl IdScan {
    fn feed(&mut self, bytes: &[u8]) {
        if self.object == Some(false) {
            return;
        }
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if self.object == Some(false) {
            return;
        }
        if let Some(v) = &mut self.value {
            if v.len() <= ID_MAX
                && !(self.depth == 1 && !self.in_string && matches!(b, b',' | b'}'))
            {
                v.push(b);
            }
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                self.reading_key = false;
                return;
            }
            if self.reading_key && self.key.len() < 4 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b' ' | b'\t' | b'\r' | b'\n' => {}
            b'{' if self.object.is_none() => {
                self.object = Some(true);
                self.depth = 1;
            }
            _ if self.object.is_none() => self.object = Some(false),
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && !self.in_value {
                    self.reading_key = true;
                    self.key.clear();
                }
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                if self.depth == 1 {
                    self.end_value();
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 => {
                self.in_value = true;
                if self.key == b"id" {
                    self.value = Some(Vec::new());
                }
            }
            b',' if self.depth == 1 => self.end_value(),
            _ => {}
        }
    }

    fn end_value(&mut self) {
        self.in_value = false;
        if let Some(v) = self.value.take() {
            if v.len() <= ID_MAX {
                self.found = Some(v);
            }
        }
    }

    /// The id: a number or a string.
    fn id(&self) -> Option<Value> {
        let v: Value = serde_json::from_slice(self.found.as_deref()?).ok()?;
        (v.is_number() || v.is_string()).then_some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn id_of(text: &str, piece: usize) -> Option<Value> {
        let mut s = IdScan::default();
        for p in text.as_bytes().chunks(piece.max(1)) {
            s.feed(p);
        }
        s.id()
    }

    #[test]
    fn the_top_level_id_is_found_wherever_it_is() {
        for piece in [1, 2, 7, 1000] {
            let id = |t: &str| id_of(t, piece);
            assert_eq!(id(r#"{"jsonrpc":"2.0","id":3,"result":{"id":9}}"#), Some(json!(3)));
            assert_eq!(
                id(r#"{"result":{"id":9,"x":"\"id\":7"},"jsonrpc":"2.0","id":12}"#),
                Some(json!(12))
            );
            assert_eq!(
                id(r#" { "id" : "req-1" , "result": [1, {"id": 2}] }"#),
                Some(json!("req-1"))
            );
            assert_eq!(id(r#"{"idx":1,"result":{}}"#), None);
            assert_eq!(id(r#"{"method":"notifications/x","params":{"id":1}}"#), None);
            assert_eq!(id(r#"[{"id":1}]"#), None);
            assert_eq!(id(r#"{"id":null}"#), None);
        }
    }

    /// Reads all of `input` through a `Bounded` with `cap`, `piece` bytes
    /// at a time from the source.
    async fn through(input: &[u8], cap: usize, piece: usize) -> String {
        let (mut w, r) = tokio::io::duplex(piece.max(1));
        let input = input.to_vec();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for p in input.chunks(piece.max(1)) {
                w.write_all(p).await.unwrap();
            }
        });
        let mut out = String::new();
        Bounded::new(r, cap, "t").read_to_string(&mut out).await.unwrap();
        writer.await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_line_over_the_cap_becomes_an_error_for_its_id() {
        let big = format!(
            r#"{{"result":{{"content":[{{"type":"text","text":"{}"}}]}},"jsonrpc":"2.0","id":5}}"#,
            "x".repeat(500)
        );
        let input = format!("{{\"id\":1}}\n{big}\n{{\"id\":2}}\r\n{}\n", "y".repeat(300));
        for piece in [1, 3, 64, 4096] {
            let out = through(input.as_bytes(), 100, piece).await;
            let lines: Vec<&str> = out.split_terminator('\n').collect();
            assert_eq!(lines.len(), 3, "{out}");
            assert_eq!(lines[0], r#"{"id":1}"#);
            let e: Value = serde_json::from_str(lines[1]).unwrap();
            assert_eq!(e["id"], 5);
            let m = e["error"]["message"].as_str().unwrap();
            assert!(
                m.contains(&format!("{} bytes", big.len() + 1)) && m.contains("(100 bytes) limit"),
                "{m}"
            );
            assert_eq!(lines[2], "{\"id\":2}\r", "a line that fits is passed on as it is");
        }
    }

    #[tokio::test]
    async fn lines_up_to_the_cap_pass_whole() {
        let line = format!("{{\"id\":1,\"r\":\"{}\"}}\n", "z".repeat(80));
        let out = through(line.as_bytes(), line.len(), 5).await;
        assert_eq!(out, line);
        let out = through(line.as_bytes(), line.len() - 1, 5).await;
        assert!(out.contains("\"error\"") && out.contains("\"id\":1"), "{out}");
        // An unfinished last line is passed on, and the reader ends.
        assert_eq!(through(b"{\"id\":1}\n{\"id\"", 100, 2).await, "{\"id\":1}\n{\"id\"");
    }
}
