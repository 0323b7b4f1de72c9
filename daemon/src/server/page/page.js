// agentd's chat page. No dependencies, no network but this origin. Model
// text never reaches innerHTML: every node is built with createElement and
// textContent, links only for http(s) and mailto, and no image is loaded.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const log = $("log");
  const question = $("question");
  const sendBtn = $("send");
  const stopBtn = $("stop");
  let chatId = null;     // the chat the next question goes to
  let running = null;    // {runId, controller, stopping}
  let replySeq = 0;
  const welcome = $("welcome");

  // ---- DOM helpers -------------------------------------------------------
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") e.textContent = String(v);
      else if (k === "class") e.className = v;
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids) {
      if (kid === null || kid === undefined || kid === false) continue;
      e.append(typeof kid === "string" ? document.createTextNode(kid) : kid);
    }
    return e;
  }

  function pretty(text) {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return String(text); }
  }
  function parse(text) {
    try { return JSON.parse(text); } catch (_) { return null; }
  }
  function argsLine(args) {
    if (!args || typeof args !== "object") return "";
    return Object.entries(args).map(([k, v]) => k + ": " + JSON.stringify(v)).join(", ");
  }

  // ---- Markdown, built as DOM nodes -------------------------------------
  const SAFE_URL = /^(https?:|mailto:)/i;
  const INLINE = new RegExp([
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)",           // 1,2 code
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",               // 3 strong
    "__(?=\\S)([\\s\\S]*?\\S)__",                        // 4 strong
    "\\*(?=[^\\s*])([^*]*?[^\\s*]|[^\\s*])\\*",          // 5 em
    "(?<![\\w])_(?=[^\\s_])([^_]*?[^\\s_]|[^\\s_])_(?![\\w])", // 6 em
    "!\\[([^\\]]*)\\]\\(([^)\\s]*)\\)",                  // 7,8 image: never loaded
    "\\[(S\\d+)\\]",                                     // 9 citation
    "\\[([^\\]]+)\\]\\(([^)\\s]+)\\)",                   // 10,11 link
  ].join("|"));

  function inline(text, parent, ctx) {
    // A regex of its own: the nested calls below must not move this one's lastIndex.
    const re = new RegExp(INLINE.source, "g");
    let last = 0;
    for (let m; (m = re.exec(text)) !== null;) {
      if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
      last = re.lastIndex;
      if (m[2] !== undefined) parent.append(el("code", { text: m[2] }));
      else if (m[3] !== undefined || m[4] !== undefined) {
        const s = el("strong"); inline(m[3] !== undefined ? m[3] : m[4], s, ctx); parent.append(s);
      } else if (m[5] !== undefined || m[6] !== undefined) {
        const s = el("em"); inline(m[5] !== undefined ? m[5] : m[6], s, ctx); parent.append(s);
      } else if (m[7] !== undefined) {
        const label = "image: " + (m[7] || m[8]);
        parent.append(SAFE_URL.test(m[8])
          ? el("a", { href: m[8], rel: "noopener noreferrer", target: "_blank", text: label })
          : el("span", { class: "muted", text: "[" + label + "]" }));
      } else if (m[9] !== undefined) {
        parent.append(el("a", { class: "cite", href: "#" + ctx.prefix + m[9], title: ctx.title(m[9]), text: m[9] }));
      } else if (m[10] !== undefined) {
        if (SAFE_URL.test(m[11])) {
          const a = el("a", { href: m[11], rel: "noopener noreferrer", target: "_blank" });
          inline(m[10], a, ctx); parent.append(a);
        } else parent.append(document.createTextNode(m[0]));
      }
    }
    if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
  }

  function lines(parent, textLines, ctx) {
    textLines.forEach((l, i) => {
      if (i > 0) parent.append(el("br"));
      inline(l, parent, ctx);
    });
  }

  const LIST = /^\s{0,3}([-*+]|\d{1,9}[.)])\s+(.*)$/;
  function markdown(text, ctx) {
    const frag = document.createDocumentFragment();
    const src = String(text).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < src.length) {
      const line = src[i];
      let m;
      if (/^\s*$/.test(line)) { i++; continue; }
      if ((m = /^\s{0,3}(```+|~~~+)\s*([\w+-]*)/.exec(line))) {
        const fence = m[1];
        const body = [];
        i++;
        while (i < src.length && !src[i].trimStart().startsWith(fence)) body.push(src[i++]);
        i++;
        const code = el("code", { text: body.join("\n") });
        if (m[2]) code.dataset.lang = m[2];
        frag.append(el("pre", {}, code));
        continue;
      }
      if ((m = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line))) {
        const h = el("h" + Math.min(m[1].length + 2, 6));
        inline(m[2], h, ctx); frag.append(h); i++;
        continue;
      }
      if (/^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) { frag.append(el("hr")); i++; continue; }
      if (/^\s{0,3}>/.test(line)) {
        const body = [];
        while (i < src.length && /^\s{0,3}>/.test(src[i])) body.push(src[i++].replace(/^\s{0,3}>\s?/, ""));
        const q = el("blockquote"); q.append(markdown(body.join("\n"), ctx)); frag.append(q);
        continue;
      }
      if ((m = LIST.exec(line))) {
        const ordered = /\d/.test(m[1]);
        const list = el(ordered ? "ol" : "ul");
        if (ordered && parseInt(m[1], 10) !== 1) list.setAttribute("start", String(parseInt(m[1], 10)));
        while (i < src.length && (m = LIST.exec(src[i])) && /\d/.test(m[1]) === ordered) {
          const item = [m[2]];
          i++;
          while (i < src.length && /^\s{2,}\S/.test(src[i]) && !LIST.exec(src[i])) item.push(src[i++].trim());
          const li = el("li"); lines(li, item, ctx); list.append(li);
        }
        frag.append(list);
        continue;
      }
      const para = [];
      while (i < src.length && !/^\s*$/.test(src[i]) && !/^\s{0,3}(```|~~~|#{1,6}\s|>)/.test(src[i]) && !(para.length && LIST.exec(src[i]))) {
        para.push(src[i++]);
      }
      const p = el("p"); lines(p, para, ctx); frag.append(p);
    }
    return frag;
  }

  // ---- API ---------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }
  async function api(method, path, body) {
    const init = { method, credentials: "same-origin", headers: {} };
    if (body !== undefined) {
      init.headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    if (r.status === 401) signedOut();
    const data = await r.json().catch(() => null);
    if (!r.ok) {
      const msg = data && data.error && data.error.message ? data.error.message : "HTTP " + r.status;
      throw new ApiError(r.status, msg);
    }
    return data;
  }
  function banner(text) {
    const b = $("banner");
    b.textContent = text;
    b.hidden = !text;
  }
  function signedOut() {
    banner("This browser is not signed in to this agentd (or the daemon's token changed). Open the link that `agentd serve` printed when it started: http://HOST:PORT/?token=…");
  }

  // ---- One reply: the research as it streams ------------------------------
  class Reply {
    constructor(parent) {
      this.id = "r" + (++replySeq);
      this.text = "";
      this.sources = new Map();
      this.calls = new Map();
      this.root = el("article", { class: "turn reply", "aria-label": "Reply", "aria-busy": "true" });
      this.status = el("p", { class: "status-line", role: "status", text: "Waiting for the model…" });
      this.reasoningBox = null;
      this.flow = el("div", { class: "flow" });
      this.label = el("p", { class: "label excerpt", hidden: true });
      this.answer = el("div", { class: "answer", "data-role": "answer", "aria-label": "Answer" });
      this.sourceList = el("ul");
      this.sourceBox = el("section", { class: "sources", "aria-label": "Sources", hidden: true },
        el("h3", { text: "Sources" }), this.sourceList);
      this.root.append(this.status, this.flow, this.label, this.answer, this.sourceBox);
      parent.append(this.root);
      this.pending = false;
    }
    ctx() {
      return {
        prefix: this.id + "-",
        title: (h) => { const s = this.sources.get(h); return s ? s.title || s.path || h : "not a source of this reply"; },
      };
    }
    render() {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => {
        this.pending = false;
        this.answer.replaceChildren(markdown(this.text, this.ctx()));
        scrollDown();
      });
    }
    reasoning(delta) {
      if (!this.reasoningBox) {
        this.reasoningText = el("div", { class: "body" });
        this.reasoningBox = el("details", { class: "reasoning" }, el("summary", { text: "Reasoning" }), this.reasoningText);
        this.root.insertBefore(this.reasoningBox, this.flow);
      }
      this.reasoningText.textContent += delta;
    }
    toolCall(e) {
      const state = el("span", { class: "state", text: "running…" });
      const result = el("pre", { text: "(waiting for the result)" });
      const row = el("details", { class: "call", "data-role": "tool-call", "data-name": e.name },
        el("summary", {},
          el("span", { class: "round", text: e.round ? "Round " + e.round : "Call" }),
          el("code", { text: e.name }), " ",
          el("span", { class: "args", text: argsLine(e.arguments) }), state),
        el("div", { class: "body" },
          el("h4", { text: "Arguments" }), el("pre", { text: JSON.stringify(e.arguments, null, 2) }),
          el("h4", { text: "Result" }), result));
      this.calls.set(e.id, { state, result });
      this.flow.append(row);
    }
    toolResult(e) {
      const c = this.calls.get(e.id);
      if (c) {
        c.state.textContent = e.ok ? "ok" : "failed";
        c.state.className = "state " + (e.ok ? "ok" : "failed");
        c.result.textContent = pretty(e.content);
      }
      const v = parse(e.content);
      if (!e.ok || !v || typeof v !== "object") return;
      if (e.name === "search_sources" && Array.isArray(v.results)) {
        for (const r of v.results) this.source(r.handle, { title: r.title, path: r.path, segment: r.segment });
        if (v.coverage === "partial") this.notice({ kind: "partial_coverage", text: "Search coverage is partial: some results could not be registered" });
      } else if (e.name === "read_source" && v.handle) {
        this.source(v.handle, { title: v.title, read: v.segment, segments: v.segments });
      } else if (e.name === "analyze_source" && v.handle) {
        this.source(v.handle, { analyzed: v.analyzed, sections: v.sections, coverage: v.coverage });
      }
    }
    source(handle, info) {
      if (typeof handle !== "string" || !handle) return;
      const s = this.sources.get(handle) || { handle };
      for (const [k, val] of Object.entries(info)) if (val !== undefined && val !== null) s[k] = val;
      this.sources.set(handle, s);
      const parts = [];
      if (s.read !== undefined) parts.push("segment " + s.read + (s.segments ? " of " + s.segments : "") + " read");
      if (s.analyzed !== undefined) parts.push("analyzed " + s.analyzed + (s.sections ? " of " + s.sections : "") + " sections" + (s.coverage === "partial" ? " (partial)" : ""));
      if (!parts.length) parts.push((s.segment !== undefined ? "segment " + s.segment + " " : "") + "found, not read");
      const li = el("li", { id: this.id + "-" + handle, "data-role": "source", "data-handle": handle },
        el("span", { class: "handle", text: handle }),
        el("span", { class: "title", text: s.title || "(untitled)" }),
        s.path ? el("span", { class: "path", text: s.path }) : null,
        el("span", { class: "seg", text: "· " + parts.join(", ") }));
      const old = this.sourceList.querySelector('[data-handle="' + CSS.escape(handle) + '"]');
      if (old) old.replaceWith(li); else this.sourceList.append(li);
      this.sourceBox.hidden = false;
    }
    notice(e) {
      this.flow.append(el("p", { class: "notice", "data-role": "notice", "data-kind": e.kind || "", role: "note", text: e.text || e.kind }));
    }
    discarded(e) {
      this.flow.append(el("div", { class: "discarded", "data-role": "discarded-call", role: "note" },
        "Discarded call, not run (proposed where no tool may run): ",
        el("code", { text: e.name + "(" + argsLine(e.arguments) + ")" })));
    }
    content(delta) { this.text += delta; this.render(); }
    setAnswer(text) { this.text = text; this.render(); }
    markStatus(status) {
      const names = { streaming: "partial: still arriving", interrupted: "interrupted: its process went away", cancelled: "cancelled", error: "ended in an error" };
      if (!names[status]) return;
      this.answer.dataset.status = status;
      this.answer.before(el("p", { class: "status-line" }, "Answer", el("span", { class: "badge", "data-status": status, text: names[status] })));
    }
    outcome(kind) {
      if (kind === "excerpt") {
        this.label.textContent = "Excerpt of the evidence, not a verified answer: the model gave no answer, so this is what research retrieved.";
        this.label.hidden = false;
      } else if (kind === "spoken_fallback") {
        this.label.textContent = "Spoken fallback: a short reply for a voice front-end.";
        this.label.hidden = false;
      }
    }
    done(d) {
      this.root.setAttribute("aria-busy", "false");
      if (typeof d.answer === "string" && (d.answer || !this.text)) this.setAnswer(d.answer);
      this.outcome(d.outcome);
      if (d.outcome === "cancelled" && this.text) this.markStatus("cancelled");
      this.status.textContent = d.outcome === "answered" ? "Answered" : "Finished: " + d.outcome;
      const item = (k, v) => el("div", {}, el("dt", { text: k }), el("dd", { text: String(v) }));
      const dl = el("dl", {},
        item("Outcome", d.outcome), item("Stop", d.stop), item("Rounds", d.rounds),
        item("Model requests", d.model_requests),
        typeof d.grounded === "boolean" ? item("Grounded", d.grounded ? "yes" : "no") : null,
        Array.isArray(d.invalid_citations) && d.invalid_citations.length ? item("Invalid citations", d.invalid_citations.join(", ")) : null);
      const foot = el("footer", { class: "done", "data-role": "done", "data-outcome": d.outcome || "", "aria-label": "Summary" }, dl);
      if (d.error && d.error.message) foot.append(el("p", { class: "error", text: "Error (" + (d.error.code || "error") + "): " + d.error.message }));
      this.root.append(foot);
      scrollDown();
    }
    event(e) {
      switch (e.type) {
        case "run":
          this.runId = e.run_id;
          this.status.textContent = "Researching (up to " + e.max_tool_iters + " rounds)…";
          break;
        case "request":
          this.status.textContent = "Model request " + e.n + " (" + e.phase + ")…";
          break;
        case "reasoning": this.reasoning(e.delta || ""); break;
        case "content": this.content(e.delta || ""); break;
        case "tool_call": this.toolCall(e); break;
        case "tool_result": this.toolResult(e); break;
        case "notice": this.notice(e); break;
        case "discarded_call": this.discarded(e); break;
        case "done": this.done(e); break;
        default: break;
      }
    }
  }

  function scrollDown() {
    const nearBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 160;
    if (nearBottom || running) log.scrollTop = log.scrollHeight;
  }
  function userTurn(text) {
    log.append(el("div", { class: "turn user", role: "article", "aria-label": "Question", text }));
  }
  function clearLog() {
    log.replaceChildren();
  }

  // ---- Asking: POST /v1/research as SSE ----------------------------------
  async function ask(text) {
    if (running) return;
    welcome.remove();
    banner("");
    userTurn(text);
    const reply = new Reply(log);
    const controller = new AbortController();
    running = { reply, controller, stopping: false };
    setRunning(true);
    log.setAttribute("aria-busy", "true");
    let finished = false;
    try {
      const body = { question: text, stream: true };
      if (chatId) body.chat_id = chatId;
      const model = $("model").value;
      if (model) body.model = model;
      const r = await fetch("/v1/research", {
        method: "POST", credentials: "same-origin", signal: controller.signal,
        headers: { "content-type": "application/json", accept: "text/event-stream" },
        body: JSON.stringify(body),
      });
      if (!r.ok) {
        if (r.status === 401) signedOut();
        const data = await r.json().catch(() => null);
        throw new ApiError(r.status, data && data.error ? data.error.message : "HTTP " + r.status);
      }
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
          if (!data) continue;
          const e = parse(data);
          if (!e) continue;
          if (e.type === "run") {
            running.runId = e.run_id;
            if (e.chat_id && e.chat_id !== chatId) { chatId = e.chat_id; loadChats(); }
          }
          reply.event(e);
          if (e.type === "done") finished = true;
        }
      }
      if (!finished) reply.status.textContent = "The stream ended before the run's summary arrived";
    } catch (err) {
      if (!(err && err.name === "AbortError")) {
        reply.root.setAttribute("aria-busy", "false");
        reply.status.textContent = "";
        reply.status.append(el("span", { class: "error", text: "The request failed: " + (err && err.message ? err.message : String(err)) }));
      } else if (!finished) {
        reply.status.textContent = "Stopped";
      }
    } finally {
      running = null;
      setRunning(false);
      log.setAttribute("aria-busy", "false");
      loadChats();
    }
  }

  async function stop() {
    if (!running || running.stopping) return;
    running.stopping = true;
    stopBtn.disabled = true;
    const r = running;
    r.reply.status.textContent = "Stopping…";
    if (r.runId) {
      try {
        await api("POST", "/v1/runs/" + encodeURIComponent(r.runId) + "/cancel");
        return; // the stream ends with the cancelled `done`
      } catch (_) { /* fall through: drop the stream, which cancels the run */ }
    }
    r.controller.abort();
  }

  function setRunning(on) {
    sendBtn.disabled = on;
    stopBtn.disabled = !on;
  }

  // ---- Chats ------------------------------------------------------------
  async function loadChats() {
    let data;
    try { data = await api("GET", "/v1/chats"); } catch (_) { return; }
    const ul = $("chats");
    const rows = (data && Array.isArray(data.data)) ? data.data : [];
    ul.replaceChildren(...rows.map((c) => {
      const b = el("button", { type: "button", "data-role": "chat", "data-chat-id": c.id, "aria-current": c.id === chatId ? "true" : "false", title: c.title },
        c.title || c.id, el("span", { class: "when", text: (c.updated || "").replace("T", " ").replace(/\.\d+.*$/, "") }));
      b.addEventListener("click", () => openChat(c.id));
      return el("li", {}, b);
    }));
    $("chats-empty").hidden = rows.length > 0;
  }

  function busy() {
    banner("A reply is still streaming: stop it (Stop, or Esc in the question box) or let it finish first");
    return true;
  }

  async function openChat(id) {
    if (running && busy()) return;
    closeSide();
    let chat;
    try { chat = await api("GET", "/v1/chats/" + encodeURIComponent(id)); } catch (err) {
      banner("Cannot open the chat: " + err.message);
      return;
    }
    banner("");
    chatId = id;
    clearLog();
    const runs = [];
    let cur = null;
    for (const m of chat.messages || []) {
      if (m.role === "user") {
        userTurn(m.content || "");
        cur = { runId: m.run_id, reply: null, round: 0 };
        runs.push(cur);
        continue;
      }
      if (!cur) { cur = { runId: m.run_id, reply: null, round: 0 }; runs.push(cur); }
      if (!cur.reply) {
        cur.reply = new Reply(log);
        cur.reply.status.textContent = "";
        cur.runId = cur.runId || m.run_id;
      }
      const rep = cur.reply;
      if (m.role === "assistant" && Array.isArray(m.tool_calls) && m.tool_calls.length) {
        cur.round++;
        if (m.content) rep.flow.append(el("p", { class: "muted", text: m.content }));
        for (const c of m.tool_calls) rep.toolCall({ round: cur.round, id: c.id, name: c.name, arguments: c.arguments });
      } else if (m.role === "tool") {
        rep.toolResult({ id: m.tool_call_id, name: m.name, ok: m.status !== "error", content: m.content || "" });
      } else if (m.role === "assistant") {
        rep.setAnswer((rep.text ? rep.text + "\n\n" : "") + (m.content || ""));
        rep.markStatus(m.status);
      }
    }
    await Promise.all(runs.filter((r) => r.reply && r.runId).map(async (r) => {
      r.reply.root.setAttribute("aria-busy", "false");
      let run;
      try { run = await api("GET", "/v1/runs/" + encodeURIComponent(r.runId)); } catch (_) { return; }
      const ledger = Array.isArray(run.ledger) ? run.ledger : [];
      if (run.status === "finished" || run.status === "cancelled") {
        r.reply.done({
          outcome: run.outcome || run.status, stop: run.stop || "-", rounds: r.round,
          model_requests: ledger.filter((l) => l.outcome !== "refused").length, error: run.error,
        });
      } else {
        r.reply.status.textContent = "Run " + run.status;
      }
    }));
    for (const r of runs) if (r.reply) r.reply.root.setAttribute("aria-busy", "false");
    markCurrent();
    log.scrollTop = log.scrollHeight;
    question.focus();
  }

  function markCurrent() {
    for (const b of document.querySelectorAll('[data-role="chat"]')) b.setAttribute("aria-current", b.dataset.chatId === chatId ? "true" : "false");
  }

  function newChat() {
    if (running && busy()) return;
    chatId = null;
    clearLog();
    log.append(welcome);
    banner("");
    markCurrent();
    closeSide();
    question.focus();
  }

  // ---- Side panel on narrow screens ------------------------------------
  function closeSide() {
    $("side").classList.remove("open");
    $("toggle-side").setAttribute("aria-expanded", "false");
  }
  $("toggle-side").addEventListener("click", () => {
    const open = $("side").classList.toggle("open");
    $("toggle-side").setAttribute("aria-expanded", open ? "true" : "false");
    if (open) { const first = document.querySelector('[data-role="chat"]'); if (first) first.focus(); }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && $("side").classList.contains("open")) { closeSide(); $("toggle-side").focus(); }
  });

  // ---- Settings -----------------------------------------------------------
  const dialog = $("settings");
  async function openSettings() {
    const fields = $("settings-fields");
    $("settings-error").hidden = true;
    $("settings-saved").textContent = "";
    let data;
    try { data = await api("GET", "/v1/settings"); } catch (err) { banner("Cannot read the settings: " + err.message); return; }
    fields.replaceChildren(...(data.data || []).map((s) => {
      const id = "setting-" + s.key.replace(/[^\w-]/g, "-");
      const input = el("input", { id, name: s.key, type: s.type === "integer" ? "number" : "text", value: s.value, min: s.min, max: s.max, step: s.type === "integer" ? 1 : null, inputmode: s.type === "integer" ? "numeric" : null });
      const reset = el("button", { type: "button", class: "ghost", text: "Reset" });
      reset.addEventListener("click", () => saveSetting(s.key, null, input));
      const hint = "From " + s.min + " to " + s.max + "; default " + s.default + "; now from " + s.source +
        (s.source === "env" ? " (an environment variable overrides what is stored here)" : "");
      return el("div", { class: "field" },
        el("label", { for: id, text: s.label || s.key }),
        el("div", { class: "row" }, input, reset),
        el("span", { class: "hint", id: id + "-hint", text: hint }));
    }));
    for (const i of fields.querySelectorAll("input")) i.setAttribute("aria-describedby", i.id + "-hint");
    dialog.showModal();
    const first = fields.querySelector("input");
    if (first) first.focus();
  }
  async function saveSetting(key, value, input) {
    const err = $("settings-error");
    err.hidden = true;
    $("settings-saved").textContent = "";
    try {
      const path = "/v1/settings/" + encodeURIComponent(key);
      const s = value === null ? await api("DELETE", path)
        : await api("PUT", path, { value: /^-?\d+$/.test(value.trim()) ? Number(value) : value });
      input.value = s.value;
      input.removeAttribute("aria-invalid");
      $("settings-saved").textContent = (s.label || key) + ": " + s.value + " (" + s.source + ")";
      return true;
    } catch (e) {
      err.textContent = e.message;
      err.hidden = false;
      input.setAttribute("aria-invalid", "true");
      input.focus();
      return false;
    }
  }
  $("settings-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    for (const input of $("settings-fields").querySelectorAll("input")) {
      if (!(await saveSetting(input.name, input.value, input))) return;
    }
  });
  $("settings-close").addEventListener("click", () => dialog.close());
  $("open-settings").addEventListener("click", openSettings);

  // ---- The composer -------------------------------------------------------
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = question.value.trim();
    if (!text || running) return;
    question.value = "";
    ask(text);
  });
  question.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    } else if (e.key === "Escape" && running) {
      e.preventDefault();
      stop();
    }
  });
  stopBtn.addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);

  // The model picker: every model the daemon serves (GET /v1/models), the
  // default (GET /health) chosen; a question goes to the one picked.
  Promise.all([api("GET", "/health"), api("GET", "/v1/models")]).then(([h, list]) => {
    const pick = $("model");
    const ids = (list && Array.isArray(list.data) ? list.data : []).map((m) => String(m.id));
    if (h && h.model && !ids.includes(String(h.model))) ids.unshift(String(h.model));
    pick.replaceChildren(...ids.map((id) => {
      const o = document.createElement("option");
      o.value = id;
      o.textContent = id.split("/").pop();
      o.selected = id === String(h && h.model);
      return o;
    }));
  }).catch(() => {});
  loadChats();
  question.focus();
})();
