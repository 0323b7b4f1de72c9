//! A small HTTP/1.1 client over the daemon's Unix socket, for `ask
//! --connect` and `chat`: one request per connection, SSE read line by
//! line (chunked transfer decoded; the messages by `provider::sse`),
//! cancellation checked between reads.

use crate::provider::sse::Decoder;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The socket named by `--connect` (empty: the default).
pub(crate) fn socket_of(arg: &str) -> PathBuf {
    if arg.is_empty() {
        crate::state::home::default_socket()
    } else {
        PathBuf::from(arg)
    }
}

/// Reads the body of a chunked response as plain bytes.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            if line.trim().is_empty() {
                line.clear();
                self.inner.read_line(&mut line)?;
            }
            self.left = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let want = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n;
        Ok(n)
    }
}

/// POSTs `body` to `path` and calls `on` with the data of every SSE
/// message.
/// Returns the HTTP status and, for non-2xx, the error body.
pub(crate) fn post_sse(
    socket: &Path,
    path: &str,
    body: &Value,
    cancel: &AtomicBool,
    on: &mut dyn FnMut(&str),
) -> Result<()> {
    let mut s = UnixStream::connect(socket).with_context(|| {
        format!("cannot connect to {} (is `agentd serve` running?)", socket.display())
    })?;
    let payload = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: agentd\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    )?;
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut r = BufReader::new(s);
    let mut status_line = String::new();
    read_line(&mut r, &mut status_line, cancel)?;
    let status: u16 =
        status_line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut chunked = false;
    loop {
        let mut h = String::new();
        read_line(&mut r, &mut h, cancel)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            }
        }
    }
    let body: Box<dyn BufRead> = if chunked {
        Box::new(BufReader::new(Chunked { inner: r, left: 0, done: false }))
    } else {
        Box::new(r)
    };
    let mut body = body;
    if !(200..300).contains(&status) {
        let mut text = String::new();
        let _ = body.read_to_string(&mut text);
        let msg = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        bail!("the daemon answered {status}: {msg}");
    }
    let mut sse = Decoder::new();
    loop {
        let mut line = String::new();
        if read_line(&mut body, &mut line, cancel)? == 0 {
            if let Some(m) = sse.finish() {
                on(&m.data);
            }
            return Ok(());
        }
        if let Some(m) = sse.line(&line) {
            on(&m.data);
        }
    }
}

/// Reads a line, retrying on read timeouts until `cancel` is raised.
fn read_line(r: &mut dyn BufRead, line: &mut String, cancel: &AtomicBool) -> Result<usize> {
    loop {
        if cancel.load(Ordering::Relaxed) {
            bail!("cancelled");
        }
        match r.read_line(line) {
            Ok(n) => return Ok(n),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e.into()),
        }
    }
}
