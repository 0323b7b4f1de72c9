#!/usr/bin/env python3
"""Soak bench for `agentd serve` (issue 31, "a soak test"): hours of mixed
traffic compressed into `--minutes`, looking for what only shows over time —
replies lost, memory that grows, runs left `running`.

It starts `agentd serve` on its own fresh AGENTD_HOME (a temp dir) with the
Unix socket, a TCP listener with a token and the Ollama listener, then
drives it with `--clients` (8) concurrent clients for `--minutes` (20). Each
client loops over a weighted mix:

- chat completions, streamed and not, with and without `tools` (a small
  function schema, `tool_choice` auto or required);
- research runs (`POST /v1/research`, a short question about the corpus,
  `max_tool_iters` 1 or 2);
- streams cancelled mid-way (chat and research: the client closes the
  connection after the first few chunks or events);
- malformed requests (bad JSON, fields of the wrong type, an oversized
  `max_tokens`, an unknown model, out-of-range values) on every front,
  expecting a 4xx with a JSON error body;
- Ollama `/api/chat` streamed (on the `--ollama` listener) and Anthropic
  `/v1/messages` streamed.

Requests go out as raw HTTP (http.client over TCP or the Unix socket), so
the bench sees every byte's timing. Standard library only.

It reports, as a table and (`--json PATH`) as JSON:

- requests per kind, with their outcome;
- errors by class. Expected: `expected_4xx` (malformed requests),
  `cancelled_by_client`. Unexpected: `http_5xx`, `http_4xx` (to a valid
  request), `accepted_malformed`, `bad_error_body`, `bad_reply`,
  `stream_error` (an error sent inside a stream), `run_error` (a research
  run that ended with outcome `error`), `connection_error`, `timeout`, and
  `lost`: a stream that ended without its terminator (`data: [DONE]`,
  `message_stop`, Ollama's `"done": true`, research's `done` event);
- TTFT p50/p95 of the streamed chat kinds (not the forced tool call,
  which streams only once complete) over the first and the last 5
  minutes (runs shorter than 20 minutes: the first and last quarter);
- the daemon's RSS (VmRSS of /proc/PID/status) every minute;
- after the clients stop (and a few seconds for cancels to settle):
  `agentd runs list` must show no run `running`.

Verdicts: nothing lost (no `lost`, `connection_error` or `timeout`: every
request ended with a reply or a clear error), no unexpected error at all
(5xx and the rest), RSS growth after the warm-up (5 minutes, or the first
quarter) at most 10% (the largest RSS after it against the RSS at its
end), no stuck runs. `--check` exits 1 when one fails.

    python3 benches/soak.py --minutes 20 --json /tmp/soak.json --check
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# -- transports ------------------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Target:
    """Where the daemon listens: the socket, TCP with the token, Ollama."""

    def __init__(self, sock_path, tcp_port, ollama_port, token, timeout):
        self.sock_path = sock_path
        self.tcp_port = tcp_port
        self.ollama_port = ollama_port
        self.token = token
        self.timeout = timeout

    def conn(self, via):
        if via == "unix":
            return UnixHTTPConnection(self.sock_path, self.timeout), {}
        if via == "tcp":
            c = http.client.HTTPConnection("127.0.0.1", self.tcp_port, timeout=self.timeout)
            return c, {"Authorization": "Bearer " + self.token}
        c = http.client.HTTPConnection("127.0.0.1", self.ollama_port, timeout=self.timeout)
        return c, {}


# -- the mix ---------------------------------------------------------------

QUESTIONS = [
    "Name a city and say one fact about it.",
    "Write one sentence about the sea.",
    "What is two plus three? Answer briefly.",
    "Give me a short tip for sleeping well.",
    "Say hello in French and in Spanish.",
    "Describe a cat in five words.",
    "What colour is the sky on a clear day?",
    "Suggest a name for a small robot.",
]

TOOL_QUESTIONS = [
    "What is the weather in Paris right now?",
    "Look up the weather in Tokyo for me.",
    "Is it raining in London?",
    "Check the temperature in Berlin.",
]

RESEARCH_QUESTIONS = [
    "What does GET /health return?",
    "How do I cancel a research run?",
    "What is the default request queue capacity?",
    "Which environment variable sets the log level?",
    "What fields does the done event carry?",
    "What happens when agentd serve receives SIGTERM?",
    "What does the --ollama listener serve?",
    "Where does agentd keep its state?",
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

# kind -> weight
MIX = {
    "chat_stream": 4,
    "chat_unary": 2,
    "tools_auto_stream": 2,
    "tools_required_unary": 1,
    "tools_required_stream": 1,
    "research": 1,
    "cancel_chat": 1.5,
    "cancel_research": 0.5,
    "malformed": 2,
    "ollama_chat_stream": 2,
    "anthropic_stream": 2,
}

# The streamed chat kinds whose first token is timed.
# (A forced call streams only once complete, so tools_required_stream is
# left out: its first chunk is the whole call.)
TTFT_KINDS = (
    "chat_stream",
    "tools_auto_stream",
    "ollama_chat_stream",
    "anthropic_stream",
)

EXPECTED = ("ok", "expected_4xx", "cancelled_by_client")
NOT_LOST = ("lost", "connection_error", "timeout")


def malformed_cases():
    """(name, via, path, raw body bytes) of requests that must be a 4xx."""
    msgs = [{"role": "user", "content": "hi"}]
    j = lambda o: json.dumps(o).encode()
    return [
        ("openai_bad_json", "tcp", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"'),
        ("openai_messages_string", "unix", "/v1/chat/completions", j({"messages": "hello", "max_tokens": 8})),
        ("openai_role_unknown", "tcp", "/v1/chat/completions", j({"messages": [{"role": "wizard", "content": "hi"}]})),
        ("openai_max_tokens_oversized", "tcp", "/v1/chat/completions",
         b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000000000000000000000}'),
        ("openai_max_tokens_negative", "unix", "/v1/chat/completions", j({"messages": msgs, "max_tokens": -5})),
        ("openai_max_tokens_zero", "tcp", "/v1/chat/completions", j({"messages": msgs, "max_tokens": 0})),
        ("openai_max_tokens_string", "tcp", "/v1/chat/completions", j({"messages": msgs, "max_tokens": "lots"})),
        ("openai_unknown_model", "unix", "/v1/chat/completions",
         j({"model": "no-such-model-soak", "messages": msgs, "max_tokens": 8})),
        ("openai_temperature_range", "tcp", "/v1/chat/completions",
         j({"messages": msgs, "max_tokens": 8, "temperature": 7})),
        ("openai_tool_choice_unknown", "tcp", "/v1/chat/completions",
         j({"messages": msgs, "max_tokens": 8, "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "nope"}}})),
        ("openai_stream_bad_messages", "tcp", "/v1/chat/completions", j({"messages": [], "stream": True})),
        ("anthropic_bad_json", "tcp", "/v1/messages", b'{"max_tokens": 8, "messages": ['),
        ("anthropic_no_max_tokens", "unix", "/v1/messages", j({"messages": msgs, "stream": True})),
        ("anthropic_content_number", "tcp", "/v1/messages",
         j({"max_tokens": 8, "messages": [{"role": "user", "content": 42}]})),
        ("ollama_bad_json", "ollama", "/api/chat", b"{not json"),
        ("ollama_messages_wrong_type", "ollama", "/api/chat", j({"messages": {"role": "user"}})),
        ("ollama_unknown_model", "ollama", "/api/chat",
         j({"model": "no-such-model-soak:latest", "messages": msgs})),
        ("research_question_number", "tcp", "/v1/research", j({"question": 5})),
        ("research_iters_zero", "unix", "/v1/research", j({"question": "What is agentd?", "max_tool_iters": 0})),
        ("research_iters_huge", "tcp", "/v1/research", j({"question": "What is agentd?", "max_tool_iters": 1000})),
        ("research_bad_json", "unix", "/v1/research", b'{"question": '),
    ]


class Result:
    __slots__ = ("kind", "variant", "via", "start", "end", "ttft", "cls", "status", "detail", "run_id", "chunks", "streaming")

    def __init__(self, kind, via, start):
        self.kind = kind
        self.variant = None
        self.via = via
        self.start = start
        self.end = None
        self.ttft = None
        self.cls = None
        self.status = None
        self.detail = ""
        self.run_id = None
        self.chunks = 0
        self.streaming = False  # a 200 stream has begun

    def as_dict(self, t0):
        return {
            "kind": self.kind,
            "variant": self.variant,
            "via": self.via,
            "t_s": round(self.start - t0, 3),
            "dur_s": round((self.end or self.start) - self.start, 3),
            "ttft_s": None if self.ttft is None else round(self.ttft, 4),
            "class": self.cls,
            "status": self.status,
            "detail": self.detail[:500],
            "run_id": self.run_id,
        }


class Client:
    def __init__(self, idx, target, rng, max_tokens):
        self.idx = idx
        self.t = target
        self.rng = rng
        self.max_tokens = max_tokens
        self.cases = malformed_cases()
        self.cases_next = None

    # -- plumbing

    def _open(self, via, method, path, body, res):
        """Sends the request; returns (conn, response)."""
        conn, headers = self.t.conn(via)
        headers = dict(headers)
        headers["Content-Type"] = "application/json"
        if body is not None:
            headers["Content-Length"] = str(len(body))
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        res.status = resp.status
        return conn, resp

    def _mt(self):
        return self.rng.randint(max(1, self.max_tokens // 4), self.max_tokens)

    def _via(self):
        return self.rng.choice(("tcp", "unix"))

    def run(self, kind):
        via = "ollama" if kind.startswith("ollama") else self._via()
        res = Result(kind, via, time.monotonic())
        try:
            getattr(self, "k_" + kind)(res)
        except socket.timeout as e:
            res.cls, res.detail = "timeout", "no byte for %ss: %s" % (self.t.timeout, e)
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            # A stream cut after it began (a reset, a chunk left
            # incomplete) is a lost reply; before, a connection error.
            res.cls = "lost" if res.streaming else "connection_error"
            res.detail = "%s: %s (after %d chunks)" % (type(e).__name__, e, res.chunks)
        except Exception as e:  # a bug of the bench or a reply of the wrong shape
            res.cls = "bad_reply"
            res.detail = "%s: %s" % (type(e).__name__, e)
        res.end = time.monotonic()
        if res.cls is None:
            res.cls = "bad_reply"
            res.detail = res.detail or "no outcome recorded"
        return res

    def _status_class(self, resp, res):
        """The class of a non-200 answer to a valid request; None for 200."""
        if resp.status == 200:
            return None
        body = resp.read()[:400].decode("utf-8", "replace")
        res.detail = "HTTP %d: %s" % (resp.status, body)
        return "http_5xx" if resp.status >= 500 else "http_4xx"

    def _chat_body(self, stream, tools=None, choice=None):
        if tools:
            q = self.rng.choice(TOOL_QUESTIONS)
        else:
            q = self.rng.choice(QUESTIONS)
        body = {
            "messages": [{"role": "user", "content": q}],
            "max_tokens": self._mt(),
            "temperature": 0.7,
            "seed": self.rng.randint(0, 1 << 30),
            "stream": stream,
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = choice
        return json.dumps(body).encode()

    # -- OpenAI chat completions

    def _openai_stream(self, res, body, cancel_after=None):
        conn, resp = self._open(res.via, "POST", "/v1/chat/completions", body, res)
        try:
            cls = self._status_class(resp, res)
            if cls:
                res.cls = cls
                return
            got_error = None
            res.streaming = True
            while True:
                line = resp.readline()
                if not line:
                    res.cls = "lost"
                    res.detail = "stream ended without data: [DONE] after %d chunks" % res.chunks
                    return
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    if got_error is not None:
                        res.cls, res.detail = "stream_error", got_error
                    else:
                        res.cls = "ok"
                    return
                obj = json.loads(data)
                if "error" in obj:
                    got_error = json.dumps(obj["error"])[:400]
                    continue
                res.chunks += 1
                delta = (obj.get("choices") or [{}])[0].get("delta") or {}
                if res.ttft is None and (delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content")):
                    res.ttft = time.monotonic() - res.start
                if cancel_after is not None and res.chunks >= cancel_after:
                    res.cls = "cancelled_by_client"
                    return
        finally:
            conn.close()

    def _openai_unary(self, res, body):
        conn, resp = self._open(res.via, "POST", "/v1/chat/completions", body, res)
        try:
            cls = self._status_class(resp, res)
            if cls:
                res.cls = cls
                return
            obj = json.loads(resp.read())
            ch = obj["choices"][0]
            if ch.get("finish_reason") not in ("stop", "length", "tool_calls"):
                res.cls, res.detail = "bad_reply", "finish_reason %r" % ch.get("finish_reason")
                return
            res.cls = "ok"
        finally:
            conn.close()

    def k_chat_stream(self, res):
        self._openai_stream(res, self._chat_body(True))

    def k_chat_unary(self, res):
        self._openai_unary(res, self._chat_body(False))

    def k_tools_auto_stream(self, res):
        self._openai_stream(res, self._chat_body(True, [WEATHER_TOOL], "auto"))

    def k_tools_required_stream(self, res):
        self._openai_stream(res, self._chat_body(True, [WEATHER_TOOL], "required"))

    def k_tools_required_unary(self, res):
        self._openai_unary(res, self._chat_body(False, [WEATHER_TOOL], "required"))

    def k_cancel_chat(self, res):
        body = json.loads(self._chat_body(True))
        body["max_tokens"] = 256  # long enough to be cut mid-way
        self._openai_stream(res, json.dumps(body).encode(), cancel_after=self.rng.randint(1, 4))

    # -- Anthropic, Ollama

    def k_anthropic_stream(self, res):
        body = {
            "model": "claude-soak",
            "max_tokens": self._mt(),
            "messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}],
            "temperature": 0.7,
            "stream": True,
        }
        conn, resp = self._open(res.via, "POST", "/v1/messages", json.dumps(body).encode(), res)
        try:
            cls = self._status_class(resp, res)
            if cls:
                res.cls = cls
                return
            event = None
            res.streaming = True
            while True:
                line = resp.readline()
                if not line:
                    res.cls = "lost"
                    res.detail = "stream ended without message_stop after %d events (last %r)" % (res.chunks, event)
                    return
                line = line.strip()
                if line.startswith(b"event:"):
                    event = line[6:].strip().decode()
                    continue
                if not line.startswith(b"data:"):
                    continue
                obj = json.loads(line[5:])
                typ = obj.get("type", event)
                res.chunks += 1
                if typ == "error":
                    res.cls, res.detail = "stream_error", json.dumps(obj)[:400]
                    return
                if typ == "content_block_delta" and res.ttft is None:
                    res.ttft = time.monotonic() - res.start
                if typ == "message_stop":
                    res.cls = "ok"
                    return
        finally:
            conn.close()

    def k_ollama_chat_stream(self, res):
        body = {
            "messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}],
            "options": {"num_predict": self._mt(), "temperature": 0.7, "seed": self.rng.randint(0, 1 << 30)},
            "stream": True,
        }
        conn, resp = self._open("ollama", "POST", "/api/chat", json.dumps(body).encode(), res)
        try:
            cls = self._status_class(resp, res)
            if cls:
                res.cls = cls
                return
            res.streaming = True
            while True:
                line = resp.readline()
                if not line:
                    res.cls = "lost"
                    res.detail = 'stream ended without "done": true after %d lines' % res.chunks
                    return
                if not line.strip():
                    continue
                obj = json.loads(line)
                res.chunks += 1
                if "error" in obj:
                    res.cls, res.detail = "stream_error", json.dumps(obj)[:400]
                    return
                if res.ttft is None and (obj.get("message") or {}).get("content"):
                    res.ttft = time.monotonic() - res.start
                if obj.get("done") is True:
                    res.cls = "ok"
                    return
        finally:
            conn.close()

    # -- research

    def _research(self, res, cancel_after=None):
        body = {
            "question": self.rng.choice(RESEARCH_QUESTIONS),
            "max_tool_iters": self.rng.randint(1, 2),
        }
        conn, resp = self._open(res.via, "POST", "/v1/research", json.dumps(body).encode(), res)
        try:
            cls = self._status_class(resp, res)
            if cls:
                res.cls = cls
                return
            last = None
            res.streaming = True
            while True:
                line = resp.readline()
                if not line:
                    if res.detail.startswith("notice error"):
                        # The documented end of a run that could not start.
                        res.cls = "run_error"
                    else:
                        res.cls = "lost"
                        res.detail = "research stream ended without done after %d events (last %r)" % (res.chunks, last)
                    return
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                obj = json.loads(line[5:])
                res.chunks += 1
                last = obj.get("type")
                if last == "run":
                    res.run_id = obj.get("run_id")
                elif last == "content" and res.ttft is None and obj.get("delta"):
                    res.ttft = time.monotonic() - res.start
                elif last == "notice" and obj.get("kind") == "error":
                    res.detail = "notice error: %s" % obj.get("text")
                elif last == "done":
                    if obj.get("outcome") == "error":
                        res.cls = "run_error"
                        res.detail = json.dumps(obj.get("error"))[:400]
                    elif obj.get("outcome") == "cancelled":
                        res.cls, res.detail = "run_error", "cancelled though the client did not cancel"
                    else:
                        res.cls = "ok"
                    return
                # Cancel once the run is under way (its id known).
                if cancel_after is not None and res.run_id and res.chunks >= cancel_after:
                    res.cls = "cancelled_by_client"
                    return
        finally:
            conn.close()

    def k_research(self, res):
        self._research(res)

    def k_cancel_research(self, res):
        # Events: run, request, tool_call, tool_result, request, content…:
        # cut anywhere from the entry research to the answer's first words.
        self._research(res, cancel_after=self.rng.randint(1, 10))

    # -- malformed

    def k_malformed(self, res):
        name, via, path, body = self.cases_next or self.rng.choice(self.cases)
        res.variant, res.via = name, via
        conn, resp = self._open(via, "POST", path, body, res)
        try:
            raw = resp.read()
            if 400 <= resp.status < 500:
                try:
                    obj = json.loads(raw)
                    ok = isinstance(obj, dict) and "error" in obj
                except ValueError:
                    ok = False
                if ok:
                    res.cls = "expected_4xx"
                else:
                    res.cls = "bad_error_body"
                    res.detail = "%s: HTTP %d, body %r" % (name, resp.status, raw[:300])
            elif resp.status >= 500:
                res.cls = "http_5xx"
                res.detail = "%s: HTTP %d %r" % (name, resp.status, raw[:300])
            else:
                res.cls = "accepted_malformed"
                res.detail = "%s: HTTP %d %r" % (name, resp.status, raw[:300])
        finally:
            conn.close()


# -- measurement helpers -----------------------------------------------------


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def rss_kb(pid, field="VmRSS"):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def http_get(target, via, path, timeout=10):
    conn, headers = target.conn(via)
    conn.timeout = timeout
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def runs_list(agentd, env):
    p = subprocess.run([agentd, "runs", "list"], env=env, capture_output=True, text=True, timeout=60)
    rows = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return p.returncode, rows, p.stderr.strip()


def fmt(x, scale=1.0, nd=2):
    return "-" if x is None else ("%.*f" % (nd, x * scale))


# -- main ---------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agentd", default=os.path.join(ROOT, "target/release/agentd"))
    ap.add_argument("--model", default=os.path.join(ROOT, "target/agentd-test-home/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--corpus", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48, help="the largest max_tokens a reply asks for (16..N)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds without a byte before a request is a timeout")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds to wait for runs to settle after the clients stop")
    ap.add_argument("--rss-growth", type=float, default=10.0, help="largest RSS growth after the warm-up, percent")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a verdict fails")
    ap.add_argument("--keep", action="store_true", help="keep the temp AGENTD_HOME (its path is printed)")
    args = ap.parse_args()

    for path, what in ((args.agentd, "--agentd"), (args.model, "--model"), (args.corpus, "--corpus")):
        if not os.path.exists(path):
            sys.exit("soak: %s %s does not exist" % (what, path))

    home = tempfile.mkdtemp(prefix="agentd-soak-")
    token = "soak-" + os.urandom(12).hex()
    token_file = os.path.join(home, "token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    os.chmod(token_file, 0o600)
    sock_path = os.path.join(home, "agentd.sock")
    tcp_port, ollama_port = free_port(), free_port()
    env = dict(os.environ)
    env["AGENTD_HOME"] = home
    env.setdefault("AGENTD_LOG", "warn")
    cmd = [
        args.agentd, "serve", "--model", args.model, "--threads", str(args.threads),
        "--corpus", args.corpus, "--socket", sock_path,
        "--listen", "127.0.0.1:%d" % tcp_port, "--token-file", token_file,
        "--ollama", "127.0.0.1:%d" % ollama_port,
    ]
    stderr_path = os.path.join(home, "serve.stderr")
    errf = open(stderr_path, "wb")
    print("soak: %s" % " ".join(cmd), flush=True)
    print("soak: AGENTD_HOME=%s" % home, flush=True)
    daemon = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf)
    target = Target(sock_path, tcp_port, ollama_port, token, args.timeout)

    def stop_daemon():
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        errf.close()

    # Ready when /health answers on every listener.
    deadline = time.monotonic() + 120
    ready = False
    while time.monotonic() < deadline and daemon.poll() is None:
        try:
            if all(http_get(target, v, "/health", 5)[0] == 200 for v in ("unix", "tcp", "ollama")):
                ready = True
                break
        except OSError:
            pass
        time.sleep(0.25)
    if not ready:
        stop_daemon()
        with open(stderr_path, "rb") as f:
            sys.stderr.write(f.read()[-4000:].decode("utf-8", "replace"))
        sys.exit("soak: the daemon did not become healthy (exit %s)" % daemon.poll())

    # Preflight, serially: every malformed variant once and every kind once,
    # so each is seen even in a short run (and the model is warm).
    preflight = []
    pc = Client(-1, target, random.Random(args.seed), args.max_tokens)
    for case in pc.cases:
        pc.cases_next = case
        preflight.append(pc.run("malformed"))
    pc.cases_next = None
    for kind in MIX:
        if kind != "malformed":
            preflight.append(pc.run(kind))
    pre_bad = [r for r in preflight if r.cls not in EXPECTED]
    print("soak: preflight %d requests, %d unexpected" % (len(preflight), len(pre_bad)), flush=True)

    duration = args.minutes * 60.0
    window = min(300.0, duration / 4.0)
    results = []
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.monotonic()
    t_end = t0 + duration
    kinds = list(MIX)
    weights = [MIX[k] for k in kinds]

    def client_loop(i):
        c = Client(i, target, random.Random(args.seed * 1000 + i), args.max_tokens)
        while time.monotonic() < t_end and not stop.is_set():
            kind = c.rng.choices(kinds, weights)[0]
            r = c.run(kind)
            with lock:
                results.append(r)

    # RSS every 5 s (the per-minute figures and the warm-up mark come from these).
    rss_samples = []  # (t_s, kb)
    health = {"polls": 0, "bad": [], "max_queue_depth": 0}

    def monitor():
        n = 0
        while not stop.wait(0 if n == 0 else 5.0):
            n += 1
            kb = rss_kb(daemon.pid)
            if kb is not None:
                rss_samples.append((time.monotonic() - t0, kb))
            if daemon.poll() is not None:
                break
            if n % 2 == 0:
                try:
                    st, body = http_get(target, "unix", "/health", 10)
                    health["polls"] += 1
                    h = json.loads(body)
                    health["max_queue_depth"] = max(health["max_queue_depth"], h.get("queue_depth", 0))
                    if st != 200 or h.get("status") != "ok":
                        health["bad"].append({"t_s": round(time.monotonic() - t0, 1), "status": st, "body": body[:300].decode("utf-8", "replace")})
                except (OSError, ValueError, http.client.HTTPException) as e:
                    health["bad"].append({"t_s": round(time.monotonic() - t0, 1), "error": str(e)})

    mon = threading.Thread(target=monitor, daemon=True)
    mon.start()
    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(args.clients)]
    for th in threads:
        th.start()
    print("soak: %d clients for %.1f minutes (TTFT windows %.0f s, warm-up %.0f s)" % (args.clients, args.minutes, window, window), flush=True)
    last_print = t0
    try:
        while any(th.is_alive() for th in threads):
            time.sleep(1.0)
            now = time.monotonic()
            if daemon.poll() is not None:
                print("soak: the daemon exited (%s) during the run" % daemon.poll(), flush=True)
                stop.set()
            if now - last_print >= 60:
                last_print = now
                with lock:
                    n = len(results)
                    bad = sum(1 for r in results if r.cls not in EXPECTED)
                kb = rss_kb(daemon.pid)
                print("soak: %5.1f min  %5d requests  %3d unexpected  RSS %s MB" % ((now - t0) / 60, n, bad, fmt(kb, 1 / 1024, 1)), flush=True)
            if now > t_end + args.timeout * 3:
                print("soak: clients still busy long after the end; giving up on them", flush=True)
                break
    except KeyboardInterrupt:
        print("soak: interrupted; reporting what ran", flush=True)
    stop.set()
    clients_done = time.monotonic()
    mon.join(10)
    final_rss = rss_kb(daemon.pid)
    if final_rss is not None:
        rss_samples.append((clients_done - t0, final_rss))
    hwm = rss_kb(daemon.pid, "VmHWM")

    # Runs must settle: none `running` once the clients are gone.
    run_rows, runs_rc, runs_err, running = [], None, "", []
    settle_deadline = time.monotonic() + args.settle
    time.sleep(min(3.0, args.settle))
    while True:
        try:
            runs_rc, run_rows, runs_err = runs_list(args.agentd, env)
        except subprocess.TimeoutExpired:
            runs_rc, run_rows, runs_err = None, [], "agentd runs list timed out"
        running = [r for r in run_rows if r.get("status") == "running"]
        if (not running and runs_rc == 0) or time.monotonic() >= settle_deadline:
            break
        time.sleep(1.0)
    settled_after = time.monotonic() - clients_done
    stuck_records = []
    for r in running[:10]:
        try:
            st, body = http_get(target, "unix", "/v1/runs/%s" % r.get("run_id"), 10)
            rec = json.loads(body)
            stuck_records.append({k: rec.get(k) for k in ("run_id", "status", "outcome", "stop", "error", "question", "created", "updated")})
        except (OSError, ValueError, http.client.HTTPException) as e:
            stuck_records.append({"run_id": r.get("run_id"), "error": str(e)})

    metrics = {}
    try:
        st, body = http_get(target, "unix", "/metrics", 10)
        for line in body.decode("utf-8", "replace").splitlines():
            if line.startswith(("agentd_errors_total", "agentd_research_runs_total", "agentd_generated_tokens_total", "agentd_http_requests_total")):
                name, _, val = line.rpartition(" ")
                metrics[name] = float(val)
    except (OSError, http.client.HTTPException):
        pass

    stop_daemon()
    exit_code = daemon.returncode
    with open(stderr_path, "rb") as f:
        stderr_text = f.read().decode("utf-8", "replace")
    stderr_lines = stderr_text.splitlines()
    panics = [l for l in stderr_lines if "panick" in l]

    # -- the report
    res = sorted(results, key=lambda r: r.start)
    per_kind = {}
    classes = {}
    for r in res:
        k = per_kind.setdefault(r.kind, {"total": 0, "classes": {}, "dur": []})
        k["total"] += 1
        k["classes"][r.cls] = k["classes"].get(r.cls, 0) + 1
        if r.end:
            k["dur"].append(r.end - r.start)
        classes[r.cls] = classes.get(r.cls, 0) + 1
    for r in preflight:
        if r.cls not in EXPECTED:
            classes[r.cls] = classes.get(r.cls, 0) + 1
    elapsed = clients_done - t0

    def ttft_in(lo, hi):
        xs = [r.ttft for r in res if r.kind in TTFT_KINDS and r.ttft is not None and lo <= r.start - t0 < hi]
        return {"n": len(xs), "p50_s": pct(xs, 50), "p95_s": pct(xs, 95)}

    ttft = {
        "window_s": window,
        "kinds": list(TTFT_KINDS),
        "start": ttft_in(0, window),
        "end": ttft_in(duration - window, duration + 1e9),
        "all": ttft_in(0, 1e9),
    }
    research_ttft = [r.ttft for r in res if r.kind == "research" and r.ttft is not None]

    # RSS per minute: the sample nearest each whole minute.
    per_minute = []
    if rss_samples:
        for m in range(0, int(elapsed // 60) + 1):
            t, kb = min(rss_samples, key=lambda s: abs(s[0] - m * 60))
            if abs(t - m * 60) <= 10:
                per_minute.append({"minute": m, "t_s": round(t, 1), "rss_kb": kb})
    base = min(rss_samples, key=lambda s: abs(s[0] - window)) if rss_samples else None
    after = [kb for t, kb in rss_samples if base and t >= base[0]]
    growth = None
    if base and after:
        growth = (max(after) - base[1]) * 100.0 / base[1]

    unexpected = {c: n for c, n in classes.items() if c not in EXPECTED}
    lost = {c: n for c, n in classes.items() if c in NOT_LOST}
    verdicts = [
        {"name": "nothing lost", "ok": not lost and exit_code is not None,
         "detail": "every request ended with a reply or a clear error" if not lost else "lost/connection/timeout: %s" % lost},
        {"name": "no unexpected errors", "ok": not unexpected,
         "detail": "none" if not unexpected else json.dumps(unexpected)},
        {"name": "RSS growth after warm-up <= %g%%" % args.rss_growth,
         "ok": growth is not None and growth <= args.rss_growth,
         "detail": "no RSS samples" if growth is None else "%.1f%% (%.1f MB at %.0f s, max %.1f MB after)" % (growth, base[1] / 1024, base[0], max(after) / 1024)},
        {"name": "no stuck runs", "ok": not running and runs_rc == 0,
         "detail": ("%d runs listed, none running (settled within %.0f s)" % (len(run_rows), settled_after)) if not running and runs_rc == 0
         else "runs list rc=%s %s; running: %s" % (runs_rc, runs_err[:200], [r.get("run_id") for r in running])},
    ]
    if panics:
        verdicts.append({"name": "no panics in the daemon's log", "ok": False, "detail": panics[0][:300]})
    if exit_code not in (0, None):
        verdicts.append({"name": "daemon exits 0 on SIGTERM", "ok": False, "detail": "exit %s" % exit_code})

    examples = [r.as_dict(t0) for r in pre_bad + res if r.cls not in EXPECTED][:30]
    report = {
        "config": {
            "agentd": args.agentd, "model": args.model, "corpus": args.corpus, "minutes": args.minutes,
            "clients": args.clients, "threads": args.threads, "max_tokens": args.max_tokens,
            "timeout_s": args.timeout, "seed": args.seed, "mix": MIX, "home": home,
        },
        "elapsed_s": round(elapsed, 1),
        "requests_total": len(res),
        "requests": {k: {"total": v["total"], "classes": v["classes"], "p50_s": pct(v["dur"], 50), "p95_s": pct(v["dur"], 95)}
                     for k, v in sorted(per_kind.items())},
        "malformed_variants": {},
        "preflight": [r.as_dict(t0) for r in preflight],
        "errors": {"expected": {c: n for c, n in classes.items() if c in EXPECTED and c != "ok"}, "unexpected": unexpected},
        "unexpected_examples": examples,
        "ttft": ttft,
        "research_first_content": {"n": len(research_ttft), "p50_s": pct(research_ttft, 50), "p95_s": pct(research_ttft, 95)},
        "rss": {"per_minute": per_minute, "warmup_s": window, "baseline_kb": base[1] if base else None,
                "max_after_kb": max(after) if after else None, "growth_pct": growth, "hwm_kb": hwm, "final_kb": final_rss},
        "health": health,
        "runs": {"listed": len(run_rows), "by_status": {}, "running": running, "stuck_records": stuck_records,
                 "settled_after_s": round(settled_after, 1)},
        "metrics": metrics,
        "daemon": {"exit_code": exit_code, "stderr_lines": len(stderr_lines), "panics": panics[:10],
                   "stderr_tail": stderr_lines[-40:]},
        "verdicts": verdicts,
    }
    for r in preflight + res:
        if r.kind == "malformed":
            v = report["malformed_variants"].setdefault(r.variant, {})
            key = "%s %s" % (r.cls, r.status)
            v[key] = v.get(key, 0) + 1
    for r in run_rows:
        s = r.get("status")
        report["runs"]["by_status"][s] = report["runs"]["by_status"].get(s, 0) + 1

    # -- print
    print()
    print("preflight: %d requests (every malformed variant and every kind once), %d unexpected" % (len(preflight), len(pre_bad)))
    print("requests (%d in %.1f min, %d clients)" % (len(res), elapsed / 60, args.clients))
    print("  %-22s %6s %6s %8s %8s %8s  %s" % ("kind", "total", "ok", "4xx-exp", "cancel", "unexp", "p50/p95 s"))
    for k, v in sorted(per_kind.items()):
        c = v["classes"]
        unexp = sum(n for cl, n in c.items() if cl not in EXPECTED)
        print("  %-22s %6d %6d %8d %8d %8d  %s/%s" % (k, v["total"], c.get("ok", 0), c.get("expected_4xx", 0),
              c.get("cancelled_by_client", 0), unexp, fmt(pct(v["dur"], 50)), fmt(pct(v["dur"], 95))))
    print("errors by class")
    for c, n in sorted(classes.items()):
        if c != "ok":
            print("  %-22s %6d  %s" % (c, n, "expected" if c in EXPECTED else "UNEXPECTED"))
    for e in examples[:10]:
        print("    %s %s at %.0fs via %s: %s" % (e["class"], e["kind"], e["t_s"], e["via"], e["detail"][:200]))
    print("TTFT of streamed chat (%s), windows of %.0f s" % (", ".join(TTFT_KINDS), window))
    for name in ("start", "end", "all"):
        t = ttft[name]
        print("  %-6s n=%-5d p50 %s ms  p95 %s ms" % (name, t["n"], fmt(t["p50_s"], 1000, 0), fmt(t["p95_s"], 1000, 0)))
    print("  research first content: n=%d p50 %s s p95 %s s" % (len(research_ttft), fmt(pct(research_ttft, 50)), fmt(pct(research_ttft, 95))))
    print("RSS (MB) per minute: " + "  ".join("%d:%.1f" % (p["minute"], p["rss_kb"] / 1024) for p in per_minute))
    print("  VmHWM %s MB; at the warm-up mark %s MB" % (fmt(hwm, 1 / 1024, 1), fmt(base[1] if base else None, 1 / 1024, 1)))
    print("health: %d polls, %d not ok, max queue depth %d" % (health["polls"], len(health["bad"]), health["max_queue_depth"]))
    print("runs: %d listed %s" % (len(run_rows), json.dumps(report["runs"]["by_status"])))
    print("daemon: exit %s, %d stderr lines, %d panics (log %s)" % (exit_code, len(stderr_lines), len(panics), stderr_path))
    print("verdicts")
    for v in verdicts:
        print("  %-4s %s: %s" % ("PASS" if v["ok"] else "FAIL", v["name"], v["detail"]))

    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print("soak: wrote %s" % args.json)
    if not args.keep:
        # Keep the home when something failed: its database and log are the evidence.
        if all(v["ok"] for v in verdicts):
            shutil.rmtree(home, ignore_errors=True)
        else:
            print("soak: kept %s (database and serve.stderr) for the failures" % home)
    if args.check and not all(v["ok"] for v in verdicts):
        sys.exit(1)


if __name__ == "__main__":
    main()
