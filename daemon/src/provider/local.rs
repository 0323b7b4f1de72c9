//! The `local` provider: the inference engine, the model's own chat
//! template (prompts) and its native tool-call format (toolparse), with a KV
//! session kept across turns so a turn that extends the last prefills only
//! the new part. In a turn without tools the parser runs in suppress mode
//! and the format's call-start token is forbidden.

use super::{Call, Provider, ProviderError, TurnEvent, TurnFinish, TurnReply, TurnRequest};
use crate::engine_cmd::{EngineArgs, Resolved};
use anyhow::{Context, Result};
use inference::{Engine, ErrorKind, Finish, GenParams, Sampling, Session};
use prompts::{ChatTemplate, Message, ToolDef, ToolStyle};
use std::sync::atomic::AtomicBool;
use toolparse::{Event, FinishReason, Format, Mode, Options, Parser, ToolSpec, Tools};

/// A loaded local model ready for chat turns.
#[derive(Debug)]
pub(crate) struct Local {
    pub(crate) engine: Engine,
    pub(crate) template: ChatTemplate,
    pub(crate) format: Format,
    pub(crate) resolved: Resolved,
    session: Session,
    stop_strings: Vec<String>,
    /// Sampling for every turn (greedy with a mild repetition penalty).
    pub(crate) sampling: Sampling,
}

impl Local {
    pub(crate) fn load(
        args: &EngineArgs,
        tool_format: Option<&str>,
        context_cap: Option<usize>,
    ) -> Result<Local> {
        let (resolved, engine) = args.load_with(context_cap)?;
        let info = engine.info();
        let entry = resolved.entry.as_ref();
        if let Some(want) = entry.and_then(|e| e.architecture.as_deref()) {
            if want != info.config.arch_name {
                anyhow::bail!(
                    "models.toml says {} is `{want}` but the file says `{}`; fix the registry entry",
                    resolved.name,
                    info.config.arch_name
                );
            }
        }
        let source = match entry.and_then(|e| e.chat_template.as_deref()).filter(|t| *t != "gguf") {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read chat template {path}"))?,
            None => info.chat_template.clone().with_context(|| {
                format!("{} has no chat template in its metadata", resolved.path.display())
            })?,
        };
        let template =
            ChatTemplate::new(&source, info.bos.as_deref(), info.eos.as_deref(), ToolStyle::Hermes)
                .with_context(|| format!("the chat template of {}", resolved.path.display()))?;
        let format =
            match tool_format.or(resolved.entry.as_ref().and_then(|e| e.tool_format.as_deref())) {
                Some(f) => Format::from_name(f)?,
                None => Format::Hermes,
            };
        let stop_strings = resolved.entry.as_ref().map(|e| e.stop.clone()).unwrap_or_default();
        let session = engine.session();
        let sampling = Sampling {
            temperature: 0.0,
            repeat_penalty: 1.1,
            repeat_last_n: 64,
            ..Sampling::default()
        };
        Ok(Local { engine, template, format, resolved, session, stop_strings, sampling })
    }

    fn prompt(
        &self,
        messages: &[Message],
        tools: &[ToolDef],
    ) -> Result<(String, Vec<u32>), ProviderError> {
        let text = self
            .template
            .render(messages, tools, true)
            .map_err(|e| ProviderError::Failed(e.to_string()))?;
        let ids =
            self.engine.tokenize(&text, true).map_err(|e| ProviderError::Failed(e.to_string()))?;
        Ok((text, ids))
    }
}

impl Provider for Local {
    fn turn(
        &mut self,
        req: &TurnRequest<'_>,
        cancel: &AtomicBool,
        attempt: &mut dyn FnMut(u32) -> bool,
        on: &mut dyn FnMut(TurnEvent),
    ) -> Result<TurnReply, ProviderError> {
        let (text, prompt) = self.prompt(req.messages, req.tools)?;
        let limit = self.engine.info().context;
        if prompt.len() + 1 >= limit {
            return Err(ProviderError::Context { need: prompt.len() + 1, limit });
        }
        if !attempt(1) {
            return Err(ProviderError::Failed("the request was not admitted".into()));
        }
        let tail: String =
            text.chars().rev().take(64).collect::<Vec<_>>().into_iter().rev().collect();
        let mode = if req.tools.is_empty() { Mode::Suppress } else { Mode::Tools };
        let specs = Tools(
            req.tools.iter().map(|t| ToolSpec::from_json_schema(&t.name, &t.parameters)).collect(),
        );
        let mut parser = Parser::new(
            self.format,
            Options { generation_prompt: Some(tail), tools: specs, mode, ..Options::default() },
        );
        let mut forbid = Vec::new();
        if mode == Mode::Suppress {
            if let Some(id) = self.engine.tokenizer().id_of(call_token(self.format)) {
                forbid.push(id);
            }
        }
        let params = GenParams {
            max_tokens: req.max_tokens.min(limit - prompt.len() - 1),
            sampling: self.sampling.clone(),
            stop_strings: self.stop_strings.clone(),
            forbid,
            ..GenParams::default()
        };
        let mut reply = TurnReply {
            content: String::new(),
            calls: Vec::new(),
            discarded: Vec::new(),
            finish: TurnFinish::Stop,
        };
        let mut n = 0usize;
        let mut handle = |e: Event, reply: &mut TurnReply| match e {
            Event::Content(s) => {
                reply.content.push_str(&s);
                on(TurnEvent::Content(s));
            }
            Event::Reasoning(s) => on(TurnEvent::Reasoning(s)),
            Event::CallEnd { call, .. } => {
                n += 1;
                reply.calls.push(Call {
                    id: call.id.unwrap_or_else(|| crate::store::new_id("call")),
                    name: call.name,
                    arguments: call.arguments,
                });
            }
            Event::Discarded(call) => {
                let c = Call {
                    id: call.id.unwrap_or_else(|| crate::store::new_id("call")),
                    name: call.name,
                    arguments: call.arguments,
                };
                reply.discarded.push(c.clone());
                on(TurnEvent::Discarded(c));
            }
            Event::CallStart { .. } | Event::CallArgs { .. } | Event::CallDropped { .. } => {}
        };
        let out = self
            .engine
            .generate(&mut self.session, &prompt, &params, cancel, &mut |delta| {
                for e in parser.push(delta) {
                    handle(e, &mut reply);
                }
            })
            .map_err(|e| match e.kind() {
                ErrorKind::Input => ProviderError::Context { need: prompt.len() + 1, limit },
                _ => ProviderError::Failed(e.to_string()),
            })?;
        let reason =
            if out.finish == Finish::Length { FinishReason::Length } else { FinishReason::Stop };
        for e in parser.finish(reason) {
            handle(e, &mut reply);
        }
        reply.finish = match out.finish {
            Finish::Stop => TurnFinish::Stop,
            Finish::Length => TurnFinish::Length,
            Finish::Cancelled => TurnFinish::Cancelled,
        };
        Ok(reply)
    }

    fn count(&mut self, messages: &[Message], tools: &[ToolDef]) -> Option<usize> {
        self.prompt(messages, tools).ok().map(|(_, ids)| ids.len())
    }

    fn context(&self) -> Option<usize> {
        Some(self.engine.info().context)
    }

    fn describe(&self) -> String {
        format!("local:{}", self.resolved.name)
    }
}

/// The token (when the vocabulary has it as one) that opens a call.
pub(crate) fn call_token(f: Format) -> &'static str {
    match f {
        Format::Hermes | Format::Qwen3Xml => "<tool_call>",
        Format::Mistral => "[TOOL_CALLS]",
        Format::Llama3Json => "<|python_tag|>",
        Format::Gemma4 => "<|tool_call>",
        Format::KimiK2 => "<|tool_calls_section_begin|>",
        Format::DeepSeekV3 | Format::DeepSeekV31 => "<｜tool▁calls▁begin｜>",
        _ => "",
    }
}
