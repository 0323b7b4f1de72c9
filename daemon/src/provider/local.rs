//! The `local` provider: the inference engine, the model's own chat
//! template (prompts) and its native tool-call format (toolparse), with a KV
//! session kept per conversation so a turn that extends the last prefills
//! only the new part.

use crate::engine_cmd::{EngineArgs, Resolved};
use anyhow::{Context, Result};
use inference::{Engine, Finish, GenParams, Sampling, Session};
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
}

/// What one turn produced.
#[derive(Debug)]
pub(crate) struct TurnOutput {
    pub(crate) finish: Finish,
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
}

impl Local {
    pub(crate) fn load(args: &EngineArgs, tool_format: Option<&str>) -> Result<Local> {
        let (resolved, engine) = args.load()?;
        let info = engine.info();
        let source = info
            .chat_template
            .clone()
            .with_context(|| format!("{} has no chat template in its metadata", resolved.path.display()))?;
        let template = ChatTemplate::new(&source, info.bos.as_deref(), info.eos.as_deref(), ToolStyle::Hermes)
            .with_context(|| format!("the chat template of {}", resolved.path.display()))?;
        let format = match tool_format.or(resolved.entry.as_ref().and_then(|e| e.tool_format.as_deref())) {
            Some(f) => Format::from_name(f)?,
            None => Format::Hermes,
        };
        let stop_strings = resolved.entry.as_ref().map(|e| e.stop.clone()).unwrap_or_default();
        let session = engine.session();
        Ok(Local { engine, template, format, resolved, session, stop_strings })
    }

    /// One model turn over `messages`: renders the template, generates with
    /// streaming, and feeds the text through the tool-call parser. With
    /// `tools` empty the parser runs in suppress mode and the format's
    /// call-start token is forbidden.
    pub(crate) fn turn(
        &mut self,
        messages: &[Message],
        tools: &[ToolDef],
        max_tokens: usize,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<TurnOutput> {
        let prompt_text = self.template.render(messages, tools, true)?;
        let prompt = self.engine.tokenize(&prompt_text, true)?;
        let gen_prompt_tail: String = prompt_text.chars().rev().take(64).collect::<Vec<_>>().into_iter().rev().collect();
        let mode = if tools.is_empty() { Mode::Suppress } else { Mode::Tools };
        let specs = Tools(tools.iter().map(|t| ToolSpec::from_json_schema(&t.name, &t.parameters)).collect());
        let mut parser = Parser::new(
            self.format,
            Options { generation_prompt: Some(gen_prompt_tail), tools: specs, mode, ..Options::default() },
        );
        let mut forbid = Vec::new();
        if mode == Mode::Suppress {
            if let Some(id) = self.engine.tokenizer().id_of(call_token(self.format)) {
                forbid.push(id);
            }
        }
        let params = GenParams {
            max_tokens,
            sampling: Sampling::default(),
            stop_strings: self.stop_strings.clone(),
            forbid,
            ..GenParams::default()
        };
        let out = self.engine.generate(&mut self.session, &prompt, &params, cancel, &mut |delta| {
            for e in parser.push(delta) {
                on_event(e);
            }
        })?;
        let reason = if out.finish == Finish::Length { FinishReason::Length } else { FinishReason::Stop };
        for e in parser.finish(reason) {
            on_event(e);
        }
        Ok(TurnOutput { finish: out.finish, prompt_tokens: out.prompt_tokens, completion_tokens: out.ids.len() })
    }
}

/// The token (when the vocabulary has it as one) that opens a call.
fn call_token(f: Format) -> &'static str {
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
