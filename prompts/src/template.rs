//! Chat templates: a model's Jinja template rendered with minijinja.

use minijinja::{context, Environment, Error as MjError, ErrorKind as MjKind, Value};
use serde::Serialize;
use std::fmt;

/// A chat message as templates see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// Calls an assistant message made.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallMsg>,
    /// For `tool` messages: the call this answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For `tool` messages: the tool's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message with a role and text.
    pub fn new(role: &str, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A call inside an assistant message (OpenAI shape).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallMsg {
    /// The call id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Name and arguments.
    pub function: FunctionCall,
}

/// The function part of a [`ToolCallMsg`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON value (templates call `tojson` on it).
    pub arguments: serde_json::Value,
}

impl ToolCallMsg {
    /// A call with JSON `arguments` text (invalid JSON becomes `{}`).
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: &str) -> ToolCallMsg {
        ToolCallMsg {
            id: id.into(),
            kind: "function",
            function: FunctionCall {
                name: name.into(),
                arguments: serde_json::from_str(arguments).unwrap_or(serde_json::json!({})),
            },
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    /// Function name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: serde_json::Value,
}

impl ToolDef {
    fn openai(&self) -> serde_json::Value {
        serde_json::json!({"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}})
    }
}

/// How a model family is told about tools when its template cannot show
/// them, and how its calls and results are written back into the history.
#[derive(Clone)]
pub enum ToolStyle {
    /// NousResearch Hermes: signatures in `<tools></tools>`, calls as
    /// `<tool_call>{json}</tool_call>`, results in `<tool_response>`.
    Hermes,
    /// Another native call format: signatures in `<tools></tools>` as for
    /// Hermes, calls as the model writes them (`write`: the caller's writer
    /// of the format, given each call's name and arguments; `example`: one
    /// call in that markup, for the instructions), results in
    /// `<tool_response>`.
    Native {
        /// Writes an assistant message's calls in the model's markup.
        write: CallWriter,
        /// One call in the model's markup.
        example: String,
    },
}

/// Writes calls (name, arguments) as a model writes them.
pub type CallWriter = std::sync::Arc<dyn Fn(&[(&str, &serde_json::Value)]) -> String + Send + Sync>;

impl fmt::Debug for ToolStyle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolStyle::Hermes => f.write_str("Hermes"),
            ToolStyle::Native { example, .. } => write!(f, "Native({example:?})"),
        }
    }
}

/// Why a template could not be used.
#[derive(Debug)]
pub struct TemplateError(String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateError {}

/// A model's chat template, ready to render.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    shows_tools: bool,
    shows_calls: bool,
    style: ToolStyle,
}

fn raise_exception(msg: String) -> Result<Value, MjError> {
    Err(MjError::new(MjKind::InvalidOperation, format!("the chat template raised: {msg}")))
}

fn strftime_now(fmt: String) -> String {
    // UTC; templates use it for "Today Date" lines.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    fmt.replace("%Y", &format!("{y:04}"))
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", month)
        .replace("%b", &month[..3])
}

const PROBE: &str = "zz_probe_tool_4711";

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the model's token texts.
    pub fn new(
        source: &str,
        bos: Option<&str>,
        eos: Option<&str>,
        style: ToolStyle,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| TemplateError(format!("the chat template does not compile: {e}")))?;
        let mut t = ChatTemplate {
            env,
            bos: bos.unwrap_or_default().to_owned(),
            eos: eos.unwrap_or_default().to_owned(),
            shows_tools: false,
            shows_calls: false,
            style,
        };
        let probe = ToolDef {
            name: PROBE.into(),
            description: String::new(),
            parameters: serde_json::json!({}),
        };
        t.shows_tools =
            t.raw(&[Message::new("user", "x")], &[probe], true).is_ok_and(|s| s.contains(PROBE));
        let mut m = Message::new("assistant", "");
        m.tool_calls.push(ToolCallMsg::new("c1", PROBE, "{}"));
        t.shows_calls =
            t.raw(&[Message::new("user", "x"), m], &[], false).is_ok_and(|s| s.contains(PROBE));
        Ok(t)
    }

    /// Whether the template itself renders the tool list.
    pub fn shows_tools(&self) -> bool {
        self.shows_tools
    }

    fn raw(
        &self,
        messages: &[Message],
        tools: &[ToolDef],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let tmpl = self.env.get_template("chat").map_err(|e| TemplateError(e.to_string()))?;
        let tools_v: Vec<serde_json::Value> = tools.iter().map(ToolDef::openai).collect();
        let ctx = context! {
            messages => Value::from_serialize(messages),
            tools => if tools.is_empty() { Value::from(()) } else { Value::from_serialize(&tools_v) },
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        };
        tmpl.render(ctx).map_err(|e| {
            let mut msg = format!("cannot render the chat template: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            TemplateError(msg)
        })
    }

    /// Renders a conversation. When the template cannot show the tools or
    /// the calls, the family's tool instructions go into the system message
    /// and calls/results are written in the family's markup.
    pub fn render(
        &self,
        messages: &[Message],
        tools: &[ToolDef],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        if self.shows_tools && self.shows_calls {
            return self.raw(messages, tools, add_generation_prompt);
        }
        let mut msgs: Vec<Message> = Vec::with_capacity(messages.len() + 1);
        if !tools.is_empty() && !self.shows_tools {
            let instructions = self.tool_instructions(tools);
            match messages.first() {
                Some(m) if m.role == "system" => {
                    let mut m = m.clone();
                    m.content = format!("{}\n\n{}", m.content.trim_end(), instructions);
                    msgs.push(m);
                }
                _ => msgs.push(Message::new("system", instructions)),
            }
        } else if let Some(m) = messages.first().filter(|m| m.role == "system") {
            msgs.push(m.clone());
        }
        let skip = usize::from(messages.first().is_some_and(|m| m.role == "system"));
        for m in &messages[skip..] {
            let mut m = m.clone();
            if !self.shows_calls {
                match (m.role.as_str(), &self.style) {
                    ("assistant", ToolStyle::Hermes) if !m.tool_calls.is_empty() => {
                        let mut text = m.content.trim_end().to_owned();
                        for c in std::mem::take(&mut m.tool_calls) {
                            let call = serde_json::json!({"name": c.function.name, "arguments": c.function.arguments});
                            if !text.is_empty() {
                                text.push('\n');
                            }
                            text.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
                        }
                        m.content = text;
                    }
                    ("assistant", ToolStyle::Native { write, .. }) if !m.tool_calls.is_empty() => {
                        let calls = std::mem::take(&mut m.tool_calls);
                        let list: Vec<(&str, &serde_json::Value)> = calls
                            .iter()
                            .map(|c| (c.function.name.as_str(), &c.function.arguments))
                            .collect();
                        let mut text = m.content.trim_end().to_owned();
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&write(&list));
                        m.content = text;
                    }
                    ("tool", ToolStyle::Hermes | ToolStyle::Native { .. }) => {
                        m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
                    }
                    _ => {}
                }
            }
            msgs.push(m);
        }
        self.raw(&msgs, if self.shows_tools { tools } else { &[] }, add_generation_prompt)
    }

    /// The family's instructions listing `tools`.
    pub fn tool_instructions(&self, tools: &[ToolDef]) -> String {
        match &self.style {
            ToolStyle::Hermes => {
                let sigs: Vec<String> = tools.iter().map(|t| t.openai().to_string()).collect();
                format!(
                    "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML tags. \
You may call one or more functions to assist with the user query. Don't make assumptions about what values to plug into functions. \
Here are the available tools: <tools>\n{}\n</tools>\n\
For each function call return a json object with function name and arguments within <tool_call></tool_call> XML tags as follows:\n\
<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-dict>}}\n</tool_call>",
                    sigs.join("\n")
                )
            }
            ToolStyle::Native { example, .. } => {
                let sigs: Vec<String> = tools.iter().map(|t| t.openai().to_string()).collect();
                format!(
                    "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML tags. \
You may call one or more functions to assist with the user query. Don't make assumptions about what values to plug into functions. \
Here are the available tools: <tools>\n{}\n</tools>\n\
Write each function call exactly in this form, with the function's name and its arguments:\n{example}",
                    sigs.join("\n")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_renders_like_llama_cpp() {
        let t = ChatTemplate::new(SMOLLM2, None, None, ToolStyle::Hermes).unwrap();
        let s =
            t.render(&[Message::new("user", "What is the capital of France?")], &[], true).unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!t.shows_tools());
    }

    #[test]
    fn tools_go_into_the_system_message_when_the_template_cannot_show_them() {
        let t = ChatTemplate::new(SMOLLM2, None, None, ToolStyle::Hermes).unwrap();
        let tool = ToolDef {
            name: "search_sources".into(),
            description: "Search".into(),
            parameters: serde_json::json!({"type": "object"}),
        };
        let mut call = Message::new("assistant", "");
        call.tool_calls.push(ToolCallMsg::new("c1", "search_sources", r#"{"query": "x"}"#));
        let mut result = Message::new("tool", r#"{"results": []}"#);
        result.tool_call_id = Some("c1".into());
        let s = t
            .render(
                &[Message::new("system", "Be brief."), Message::new("user", "q"), call, result],
                &[tool],
                true,
            )
            .unwrap();
        assert!(
            s.starts_with("<|im_start|>system\nBe brief.\n\nYou are a function calling AI model."),
            "{s}"
        );
        assert!(s.contains("<tools>\n{\"type\":\"function\""), "{s}");
        assert!(s.contains("<|im_start|>assistant\n<tool_call>\n{\"name\":\"search_sources\",\"arguments\":{\"query\":\"x\"}}\n</tool_call><|im_end|>"), "{s}");
        assert!(
            s.contains(
                "<|im_start|>tool\n<tool_response>\n{\"results\": []}\n</tool_response><|im_end|>"
            ),
            "{s}"
        );
    }

    #[test]
    fn hugging_face_extensions_work() {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{{ m.content.strip() | upper }}{% endfor %}{{ ns.n }}{{ tools | tojson if tools else '' }}{{ strftime_now('%Y')[:2] }}";
        let t = ChatTemplate::new(src, None, None, ToolStyle::Hermes).unwrap();
        let out = t
            .raw(
                &[
                    Message::new("user", " a "),
                    Message::new("skip", "b"),
                    Message::new("user", "c"),
                ],
                &[],
                false,
            )
            .unwrap();
        assert_eq!(out, "AC220");
        let bad = ChatTemplate::new(
            "{{ raise_exception('no system role') }}",
            None,
            None,
            ToolStyle::Hermes,
        )
        .unwrap();
        let e = bad.raw(&[], &[], false).unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
    }
}
