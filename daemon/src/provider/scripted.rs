//! The `scripted` provider, for tests: model turns read from a JSON-lines
//! file. Each line is one turn:
//!
//! ```text
//! {"content": "text", "reasoning": "…", "tool_calls": [{"name": "search_sources", "arguments": {"query": "x"}}]}
//! {"raw": "<tool_call>\n{…}\n</tool_call>"}      native markup, parsed like a local model's text
//! {"error": "transient" | "quota" | "unavailable" | "context" | "failed"}
//! {"when": "final", …}                            used only for final/correction turns ("research": only research)
//! {"when": "section", "content": "finding"}       used only for section workers (which take no other line)
//! {"delay_ms": 50, …}                             pause before the turn and each streamed piece
//! {"panic": "why"}                                the turn panics (a bug inside agentd, for tests)
//! {"when": "final", "choose": 0}                  writes the request's first choice (a composed answer)
//! ```
//!
//! A turn takes the next line whose `when` fits its phase; when none is
//! left, the last fitting line repeats. A first line may set the context
//! (`{"context": N}`, tokens ≈ chars / 4) and a file that gets every
//! request as one JSON line (`{"log": "PATH"}`: phase and messages); with
//! `{"section_model": true}` section workers run on the local model that
//! `--model` names, batched in its engine, while the script plays the
//! coordinator (a real-model test of section analysis).

use super::{
    tool_specs, whole_call, Call, Failure, Provider, ProviderError, Tried, Try, TurnFinish,
    TurnRequest,
};
use crate::events::Phase;
use anyhow::{Context, Result};
use prompts::{Message, ToolDef};
use serde_json::Value;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use toolparse::{Event, FinishReason, Format, Mode, Options, Parser};

#[derive(Debug)]
pub(crate) struct Scripted {
    lines: Vec<Value>,
    used: Vec<bool>,
    format: Format,
    context: Option<usize>,
    log: Option<std::path::PathBuf>,
    section_model: bool,
    /// The local model section workers run on (`section_model`).
    workers: Option<Box<super::local::Local>>,
    /// The line each request of the current turns took, by its position
    /// (a retry plays the same line).
    held: std::collections::HashMap<usize, Value>,
}

impl Scripted {
    pub(crate) fn load(path: &Path, format: Format) -> Result<Scripted> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read script {}", path.display()))?;
        let mut lines = Vec::new();
        for (i, l) in text.lines().enumerate() {
            if l.trim().is_empty() || l.trim_start().starts_with("//") {
                continue;
            }
            let v: Value = serde_json::from_str(l)
                .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
            lines.push(v);
        }
        if lines.is_empty() {
            anyhow::bail!("script {} has no turns", path.display());
        }
        // A `{"context": N}` first line sets the context size (tokens ≈ chars / 4).
        let context = lines[0].get("context").and_then(Value::as_u64).map(|n| n as usize);
        let log = lines[0].get("log").and_then(Value::as_str).map(std::path::PathBuf::from);
        let section_model = lines[0].get("section_model").and_then(Value::as_bool) == Some(true);
        if context.is_some() || log.is_some() || section_model {
            lines.remove(0);
        }
        if lines.is_empty() {
            anyhow::bail!("script {} has no turns", path.display());
        }
        let used = vec![false; lines.len()];
        Ok(Scripted {
            lines,
            used,
            format,
            context,
            log,
            section_model,
            workers: None,
            held: Default::default(),
        })
    }

    /// The script asks for section workers on a local model.
    pub(crate) fn wants_section_model(&self) -> bool {
        self.section_model
    }

    /// Runs section workers on `local`.
    pub(crate) fn set_workers(&mut self, local: super::local::Local) {
        self.workers = Some(Box::new(local));
    }

    fn pick(&mut self, phase: Phase) -> Value {
        let fits = |v: &Value| match v.get("when").and_then(Value::as_str) {
            Some("final") => matches!(phase, Phase::Final | Phase::Correction),
            Some("research") => phase == Phase::Research,
            Some("section") => phase == Phase::Section,
            _ => phase != Phase::Section,
        };
        if let Some(i) = (0..self.lines.len()).find(|&i| !self.used[i] && fits(&self.lines[i])) {
            self.used[i] = true;
            return self.lines[i].clone();
        }
        self.lines.iter().rev().find(|v| fits(v)).cloned().unwrap_or(Value::Null)
    }
}

fn pause(ms: u64, cancel: &AtomicBool) -> bool {
    // Sleep to a deadline (not in fixed steps) so scripted model time is
    // accurate; cancellation is checked every 10 ms.
    let until = std::time::Instant::now() + Duration::from_millis(ms);
    loop {
        if cancel.load(Ordering::Relaxed) {
            return false;
        }
        let now = std::time::Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(10)));
    }
}

impl Scripted {
    /// Writes the request to the log file, when the script names one.
    fn log(&self, req: &TurnRequest<'_>) {
        let Some(path) = &self.log else { return };
        use std::io::Write;
        let msgs: Vec<Value> = req
            .messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        let entry = serde_json::json!({"phase": req.phase.as_str(), "messages": msgs, "choices": req.choices});
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{entry}");
        }
    }

    /// One attempt at `t` by the script: the line its request took (on its
    /// first attempt), played as a model would stream it.
    fn play(&mut self, t: &mut Try<'_, '_>, cancel: &AtomicBool) -> Tried {
        let req = t.req;
        let line = if t.k == 1 {
            self.log(req);
            let line = self.pick(req.phase);
            self.held.insert(t.id, line.clone());
            line
        } else {
            self.held.get(&t.id).cloned().unwrap_or(Value::Null)
        };
        if line.is_null() && req.phase == Phase::Section {
            return Err(Failure::Final(ProviderError::Failed(format!(
                "the script has no line for a {} turn",
                req.phase.as_str()
            ))));
        }
        // Errors named `transient` are retried `retries` times, like the
        // openai provider's.
        let retries = line.get("retries").and_then(Value::as_u64).unwrap_or(0) as u32;
        if let Some(why) = line.get("panic").and_then(Value::as_str) {
            panic!("scripted panic: {why}");
        }
        let fail = |e| Err(Failure::Final(e));
        match line.get("error").and_then(Value::as_str) {
            Some("transient") if t.k <= retries => {
                return Err(Failure::Retry("scripted transient failure".into()))
            }
            Some("transient") => {
                return fail(ProviderError::Transient("scripted transient failure".into()))
            }
            Some("quota") => {
                return fail(ProviderError::Quota("scripted: insufficient_quota".into()))
            }
            Some("unavailable") => {
                return fail(ProviderError::Unavailable("scripted: connection refused".into()))
            }
            Some("context") => return fail(ProviderError::Context { need: 0, limit: 0 }),
            Some(other) => {
                return fail(ProviderError::Failed(format!("scripted failure: {other}")))
            }
            None => {}
        }
        let delay = line.get("delay_ms").and_then(Value::as_u64).unwrap_or(0);
        // The turn itself takes `delay` before anything streams.
        if !pause(delay, cancel) {
            return Ok(TurnFinish::Cancelled);
        }
        if let Some(r) = line.get("reasoning").and_then(Value::as_str) {
            (t.sink)(Event::Reasoning(r.to_owned()));
        }
        let mode = if req.tools.is_empty() { Mode::Suppress } else { Mode::Tools };
        let mut parser = Parser::new(
            self.format,
            Options { tools: tool_specs(req.tools), mode, ..Options::default() },
        );
        // `choose: N` writes the request's N-th choice (a composed answer).
        let chosen = line
            .get("choose")
            .and_then(Value::as_u64)
            .and_then(|n| req.choices.get(n as usize))
            .map(String::as_str);
        let text = chosen
            .or_else(|| line.get("raw").or_else(|| line.get("content")).and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(8) {
            if !pause(delay, cancel) {
                return Ok(TurnFinish::Cancelled);
            }
            let s: String = piece.iter().collect();
            parser.push(&s).into_iter().for_each(&mut *t.sink);
        }
        parser.finish(FinishReason::Stop).into_iter().for_each(&mut *t.sink);
        for (index, c) in
            line.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate()
        {
            let call = Call {
                id: c
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| crate::state::store::new_id("call")),
                name: c.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                arguments: c
                    .get("arguments")
                    .cloned()
                    .unwrap_or(Value::Object(Default::default()))
                    .to_string(),
            };
            (t.sink)(whole_call(call, index, !req.tools.is_empty()));
        }
        Ok(TurnFinish::Stop)
    }
}

impl Provider for Scripted {
    /// Section workers on the local model (`section_model`), batched in
    /// its engine; every other try played from the script, one after
    /// another.
    fn attempt(&mut self, tries: &mut [Try<'_, '_>], cancel: &AtomicBool) -> Vec<Tried> {
        let on_model = |t: &Try<'_, '_>| t.req.phase == Phase::Section;
        let mut out: Vec<Option<Tried>> = tries.iter().map(|_| None).collect();
        if let Some(local) = self.workers.as_mut() {
            let (mut section, at): (Vec<&mut Try<'_, '_>>, Vec<usize>) = tries
                .iter_mut()
                .enumerate()
                .filter(|(_, t)| on_model(t))
                .map(|(i, t)| (t, i))
                .unzip();
            if !section.is_empty() {
                let mut batch: Vec<Try<'_, '_>> = section
                    .iter_mut()
                    .map(|t| Try { decode: t.decode, sink: &mut *t.sink, ..**t })
                    .collect();
                let results = local.attempt(&mut batch, cancel);
                let decodes: Vec<_> = batch.iter().map(|b| b.decode).collect();
                drop(batch);
                for (t, d) in section.iter_mut().zip(decodes) {
                    t.decode = d;
                }
                for (i, r) in at.into_iter().zip(results) {
                    out[i] = Some(r);
                }
            }
        }
        for (i, t) in tries.iter_mut().enumerate() {
            if out[i].is_none() {
                out[i] = Some(self.play(t, cancel));
            }
        }
        out.into_iter().flatten().collect()
    }

    fn tokens(
        &mut self,
        messages: &[Message],
        tools: &[ToolDef],
    ) -> Result<Option<usize>, ProviderError> {
        let chars: usize = messages.iter().map(|m| m.content.chars().count() + 8).sum::<usize>()
            + tools
                .iter()
                .map(|t| t.description.len() + t.parameters.to_string().len())
                .sum::<usize>();
        Ok(Some(chars / 4))
    }

    fn context(&self) -> Option<usize> {
        self.context
    }

    fn describe(&self) -> String {
        "scripted".into()
    }
}
