//! `agentd serve --provider openai`: what the daemon needs of an upstream
//! OpenAI-compatible engine (llama-server, vLLM) beside the research turns
//! of [`OpenAi`]: a client's chat completion forwarded and streamed back
//! through toolparse (`forward`, with the client's sampling: temperature,
//! top-p, seed, and the penalties it set), whether the upstream answers and what it
//! serves (`probe`), and the bound on requests in flight to it (`Gate`),
//! which the server owns (policy `server/upstream-concurrency`).
//!
//! Guarantees kept on the way back, whatever the upstream does: call markup
//! left in `content` is parsed (tools offered) or stripped (none offered,
//! `tool_choice: none`) by the model's format; structured `tool_calls` are
//! handed over only when tools were offered and only whole (a call cut off
//! by `length` or by the stream breaking is dropped); a stream that stops
//! without finishing is an error, never a reply.

use super::chat::{ChatOutput, ChatParams};
use super::openai::{merge_tool_call_deltas, wire_message, wire_tool, Attempt, CallSlots, OpenAi};
use super::sse;
use super::TurnFinish;
use super::{tool_specs, ProviderError};
use prompts::{Message, ToolDef};
use serde_json::{json, Value};
use std::io::BufReader;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use toolparse::{Event, FinishReason, Mode, Options, Parser, ToolCall};

/// A bound on requests in flight to the upstream.
pub(crate) struct Gate {
    max: usize,
    used: Mutex<usize>,
    freed: Condvar,
    /// Called whenever a place frees (the dispatcher's doorbell).
    on_free: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Places held now (for `/metrics`).
    pub(crate) in_flight: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("max", &self.max).field("used", &self.used).finish()
    }
}

/// A place in the gate, given back when dropped.
#[derive(Debug)]
pub(crate) struct Place(Arc<Gate>);

impl Drop for Place {
    fn drop(&mut self) {
        if let Ok(mut n) = self.0.used.lock() {
            *n = n.saturating_sub(1);
            self.0.in_flight.store(*n, Ordering::Relaxed);
        }
        // Every waiter looks again (a research turn's `acquire`, the
        // dispatcher's `wait_free`): one woken for nothing is harmless, one
        // left asleep beside a free place is not.
        self.0.freed.notify_all();
        if let Ok(hook) = self.0.on_free.lock() {
            if let Some(f) = hook.as_ref() {
                f();
            }
        }
    }
}

impl Gate {
    pub(crate) fn new(max: usize) -> Arc<Gate> {
        Arc::new(Gate {
            max: max.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
            on_free: Mutex::new(None),
            in_flight: Arc::default(),
        })
    }

    /// Calls `f` whenever a place frees.
    pub(crate) fn on_free(&self, f: Box<dyn Fn() + Send>) {
        if let Ok(mut hook) = self.on_free.lock() {
            *hook = Some(f);
        }
    }

    /// A place now, or `None` when all are taken.
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<Place> {
        let mut n = self.used.lock().ok()?;
        if *n >= self.max {
            return None;
        }
        *n += 1;
        self.in_flight.store(*n, Ordering::Relaxed);
        Some(Place(Arc::clone(self)))
    }

    /// A place, waiting for one (an admitted research run's turn).
    pub(crate) fn acquire(self: &Arc<Self>) -> Place {
        let mut n = self.free_place();
        *n += 1;
        self.in_flight.store(*n, Ordering::Relaxed);
        Place(Arc::clone(self))
    }

    /// Waits until a place is free (without taking it).
    pub(crate) fn wait_free(&self) {
        drop(self.free_place());
    }

    /// The count of places taken, once one is free (its lock held).
    fn free_place(&self) -> std::sync::MutexGuard<'_, usize> {
        let mut n = match self.used.lock() {
            Ok(n) => n,
            Err(p) => p.into_inner(),
        };
        while *n >= self.max {
            n = match self.freed.wait(n) {
                Ok(n) => n,
                Err(p) => p.into_inner(),
            };
        }
        n
    }
}

/// What a probe of the upstream found.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    /// The model ids `GET /models` lists.
    pub(crate) models: Vec<String>,
}

impl OpenAi {
    /// Asks the upstream what it serves (`GET {base}/models`), within
    /// `timeout`. An error says why it is not usable.
    pub(crate) fn probe(&self, timeout: Duration) -> Result<Probe, String> {
        let url = format!("{}/models", self.base);
        let mut r = self.agent.get(&url).timeout(timeout);
        if let Some(k) = &self.api_key {
            r = r.set("Authorization", &format!("Bearer {k}"));
        }
        match r.call() {
            Ok(resp) => {
                let v: Value =
                    resp.into_json().map_err(|e| format!("GET {url} did not answer JSON: {e}"))?;
                let models = v["data"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect();
                Ok(Probe { models })
            }
            Err(ureq::Error::Status(code, _)) => Err(format!("GET {url} answered HTTP {code}")),
            Err(ureq::Error::Transport(t)) => Err(format!("GET {url}: {t}")),
        }
    }

    fn chat_body(&self, messages: &[Message], tools: &[ToolDef], p: &ChatParams) -> Value {
        let messages: Vec<Value> = messages.iter().map(wire_message).collect();
        let mut b = json!({"model": self.model, "messages": messages, "stream": true,
            "stream_options": {"include_usage": true}, "max_tokens": p.max_tokens,
            "temperature": p.sampling.temperature, "top_p": p.sampling.top_p, "seed": p.sampling.seed});
        // The penalties only when the client turned them on, so a plain
        // request's body is what it always was (llama-server reads
        // `repeat_penalty`; an engine that does not know it answers 400).
        let s = &p.sampling;
        if s.frequency_penalty != 0.0 {
            b["frequency_penalty"] = json!(s.frequency_penalty);
        }
        if s.presence_penalty != 0.0 {
            b["presence_penalty"] = json!(s.presence_penalty);
        }
        if s.repeat_penalty != 1.0 {
            b["repeat_penalty"] = json!(s.repeat_penalty);
            b["repeat_last_n"] = json!(s.repeat_last_n);
        }
        if !p.stop.is_empty() {
            b["stop"] = json!(p.stop);
        }
        if p.mode == Mode::Tools && !tools.is_empty() {
            b["tools"] = Value::Array(tools.iter().map(wire_tool).collect());
        }
        b
    }

    /// Forwards a client's chat completion and streams the upstream's reply
    /// back as toolparse events through `on`, as the local engine would.
    /// Transient failures before anything streamed are retried (bounded
    /// backoff); `cancel` (the client went away) closes the upstream stream.
    pub(crate) fn forward(
        &self,
        messages: &[Message],
        tools: &[ToolDef],
        params: &ChatParams,
        cancel: &AtomicBool,
        on: &mut dyn FnMut(Event),
    ) -> Result<ChatOutput, ProviderError> {
        let body = self.chat_body(messages, tools, params).to_string();
        let mut last = String::new();
        for k in 0..=self.retry.retries {
            if cancel.load(Ordering::Relaxed) {
                return Ok(ChatOutput::cancelled());
            }
            let mut streamed = false;
            let got = self.forward_once(&body, tools, params, cancel, &mut |e| {
                streamed = true;
                on(e)
            });
            match got {
                Ok(o) => return Ok(o),
                Err(a) => {
                    last = a.settle(streamed, || {
                        ProviderError::Failed(
                            "the upstream says the prompt does not fit its context; shorten the messages"
                                .into(),
                        )
                    })?;
                    self.retry.pause(k);
                }
            }
        }
        Err(ProviderError::Transient(last))
    }

    fn forward_once(
        &self,
        body: &str,
        tools: &[ToolDef],
        params: &ChatParams,
        cancel: &AtomicBool,
        on: &mut dyn FnMut(Event),
    ) -> Result<ChatOutput, Attempt> {
        let resp = self.post(body)?;
        let mode = if tools.is_empty() { Mode::Suppress } else { params.mode };
        let mut parser = Parser::new(
            self.format,
            Options { tools: tool_specs(tools), mode, ..Options::default() },
        );
        let mut structured = CallSlots::new();
        let (mut finish_reason, mut ended, mut cancelled) = (String::new(), false, false);
        let (mut prompt_tokens, mut completion_tokens, mut chunks) = (0usize, None, 0usize);
        let mut index = 0usize;
        for message in sse::Reader::new(BufReader::new(resp.into_reader())) {
            if cancel.load(Ordering::Relaxed) {
                // Dropping the reader closes the connection: the upstream
                // stops generating.
                cancelled = true;
                break;
            }
            let message = message
                .map_err(|e| Attempt::Transient(format!("the upstream stream broke: {e}")))?;
            if message.is_done() {
                ended = true;
                break;
            }
            let Ok(v) = serde_json::from_str::<Value>(&message.data) else { continue };
            if let Some(err) = v.get("error") {
                return Err(Attempt::Failed(format!(
                    "the upstream reported an error mid-stream: {err}"
                )));
            }
            if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0) as usize;
                completion_tokens = u["completion_tokens"].as_u64().map(|n| n as usize);
            }
            let Some(choice) = v["choices"].get(0) else { continue };
            let delta = &choice["delta"];
            if let Some(r) = delta
                .get("reasoning_content")
                .or_else(|| delta.get("reasoning"))
                .and_then(Value::as_str)
                .filter(|r| !r.is_empty())
            {
                on(Event::Reasoning(r.to_owned()));
            }
            if let Some(c) = delta["content"].as_str().filter(|c| !c.is_empty()) {
                chunks += 1;
                for e in parser.push(c) {
                    index = index.max(event_index(&e) + 1);
                    on(e);
                }
            }
            merge_tool_call_deltas(delta, &mut structured);
            if let Some(f) = choice["finish_reason"].as_str() {
                finish_reason = f.to_owned();
                ended = true;
            }
        }
        if cancelled {
            return Ok(ChatOutput {
                finish: TurnFinish::Cancelled,
                ..out(prompt_tokens, chunks, None)
            });
        }
        if !ended {
            // Whatever call was under way is never handed over.
            return Err(Attempt::Transient(
                "the upstream closed the stream before the reply finished".into(),
            ));
        }
        let length = finish_reason == "length";
        for e in parser.finish(if length { FinishReason::Length } else { FinishReason::Stop }) {
            index = index.max(event_index(&e) + 1);
            on(e);
        }
        for (_, (id, name, args)) in structured {
            if name.is_empty() {
                continue;
            }
            let args = if args.trim().is_empty() { "{}".to_owned() } else { args };
            let arguments = match serde_json::from_str::<Value>(&args) {
                Ok(v @ Value::Object(_)) => v.to_string(),
                // Cut off (or not an object): never handed over.
                _ => continue,
            };
            let call = ToolCall { id: (!id.is_empty()).then_some(id), name, arguments };
            if mode == Mode::Tools {
                on(Event::CallEnd { index, call });
                index += 1;
            } else {
                on(Event::Discarded(call));
            }
        }
        let mut o = out(prompt_tokens, chunks, completion_tokens);
        o.finish = if length { TurnFinish::Length } else { TurnFinish::Stop };
        Ok(o)
    }
}

fn out(prompt_tokens: usize, chunks: usize, completion: Option<usize>) -> ChatOutput {
    ChatOutput {
        finish: TurnFinish::Stop,
        prompt_tokens,
        completion_tokens: completion.unwrap_or(chunks),
        reused_tokens: 0,
        stop: None,
        decode: Default::default(),
    }
}

fn event_index(e: &Event) -> usize {
    match e {
        Event::CallStart { index, .. }
        | Event::CallArgs { index, .. }
        | Event::CallEnd { index, .. } => *index,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_holds_at_most_its_size_and_a_dropped_place_frees_one() {
        let g = Gate::new(2);
        let a = g.try_acquire().expect("first place");
        let _b = g.try_acquire().expect("second place");
        assert!(g.try_acquire().is_none(), "a third is over the bound");
        assert_eq!(g.in_flight.load(Ordering::Relaxed), 2);
        drop(a);
        assert_eq!(g.in_flight.load(Ordering::Relaxed), 1);
        let _c = g.acquire();
        assert!(g.try_acquire().is_none());
    }

    #[test]
    fn the_forwarded_body_carries_the_penalties_a_client_set_and_only_those() {
        use super::super::openai::Retry;
        use inference::Sampling;
        let retry = Retry { retries: 0, backoff: Duration::ZERO, timeout: Duration::from_secs(1) };
        let up = OpenAi::new("http://127.0.0.1:1/v1", None, "m", toolparse::Format::Hermes, retry);
        let params = |sampling: Sampling| ChatParams {
            max_tokens: 8,
            sampling,
            stop: Vec::new(),
            mode: Mode::Suppress,
            constraint: super::super::constrain::Constraint::None,
            lenient: false,
            raw: None,
            reasoning_budget: None,
        };
        let msgs = [Message::new("user", "hi")];
        let plain = up.chat_body(&msgs, &[], &params(Sampling::default()));
        for k in ["frequency_penalty", "presence_penalty", "repeat_penalty", "repeat_last_n"] {
            assert!(plain.get(k).is_none(), "{k} in {plain}");
        }
        let set = Sampling {
            frequency_penalty: 0.5,
            presence_penalty: -1.0,
            repeat_penalty: 1.25,
            repeat_last_n: 128,
            ..Sampling::default()
        };
        let b = up.chat_body(&msgs, &[], &params(set));
        assert_eq!(b["frequency_penalty"], 0.5);
        assert_eq!(b["presence_penalty"], -1.0);
        assert_eq!(b["repeat_penalty"], 1.25);
        assert_eq!(b["repeat_last_n"], 128);
    }
}
