//! The tool-call parser on the command line: `agentd toolparse replay`, the
//! conformance wire of `tests/conformance/REPLAY.md` (JSON lines in,
//! one JSON line out per request; logs go to stderr), and `agentd toolparse
//! parse`, what a client receives from one raw model output.

use serde_json::{json, Value};
use std::io::{BufRead, Read, Write};
use toolparse::{Accumulator, FinishReason, Format, Options, Parser, ToolSpec, Tools};

/// `toolparse parse`: the content, reasoning, calls and discarded calls of
/// the raw output in `file` (`-`: stdin), printed as JSON.
pub(crate) fn parse(
    format: &str,
    generation_prompt: Option<String>,
    truncated: bool,
    suppress: bool,
    file: &str,
) -> anyhow::Result<()> {
    let format = Format::from_name(format)?;
    let mut text = String::new();
    if file == "-" {
        std::io::stdin().read_to_string(&mut text)?;
    } else {
        text = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("cannot read {file}: {e}"))?;
    }
    let opts = Options {
        generation_prompt,
        mode: if suppress { toolparse::Mode::Suppress } else { toolparse::Mode::Tools },
        ..Options::default()
    };
    let reason = if truncated { FinishReason::Length } else { FinishReason::Stop };
    let acc = toolparse::parse(format, opts, &text, reason);
    let calls = |cs: &[toolparse::ToolCall]| {
        cs.iter()
            .map(|c| {
                json!({"id": c.id, "name": c.name,
                    "arguments": serde_json::from_str::<Value>(&c.arguments)
                        .unwrap_or(Value::Null)})
            })
            .collect::<Vec<_>>()
    };
    let out = json!({
        "format": format.name(),
        "content": acc.content,
        "reasoning": acc.reasoning,
        "tool_calls": calls(&acc.calls),
        "discarded_calls": calls(&acc.discarded),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// `toolparse replay`: reads requests from `input` until it ends, writing
/// one reply line each.
pub(crate) fn replay(input: impl BufRead, mut output: impl Write) -> anyhow::Result<()> {
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => reply_to(&req),
            Err(e) => {
                eprintln!("agentd toolparse replay: line {} is not JSON: {e}", n + 1);
                json!({"fixture_id": null, "supported": false,
                       "reason": format!("request line {} is not JSON: {e}", n + 1)})
            }
        };
        serde_json::to_writer(&mut output, &reply)?;
        output.write_all(b"\n")?;
    }
    output.flush()?;
    Ok(())
}

fn reply_to(req: &Value) -> Value {
    let id = req.get("fixture_id").cloned().unwrap_or(Value::Null);
    let family = req.get("family").and_then(Value::as_str).unwrap_or("");
    let model = req.get("model").and_then(Value::as_str).unwrap_or("");
    let Some(format) = Format::for_family(family, model) else {
        return json!({"fixture_id": id, "supported": false,
                      "reason": format!("unknown family {family:?} (model {model:?})")});
    };
    let text = req.get("text").and_then(Value::as_str).unwrap_or("");
    let reason = if req.get("truncated").and_then(Value::as_bool).unwrap_or(false) {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let tools = req
        .get("tools")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(ToolSpec::from_openai).collect())
        .unwrap_or_default();
    let opts = Options {
        generation_prompt: req.get("generation_prompt").and_then(Value::as_str).map(str::to_owned),
        thinking: req.get("thinking").and_then(Value::as_bool),
        tools: Tools(tools),
        ..Options::default()
    };
    let nonstream = render(&toolparse::parse(format, opts.clone(), text, reason));
    let mut streams = serde_json::Map::new();
    if let Some(Value::Object(strategies)) = req.get("streams") {
        for (name, deltas) in strategies {
            let mut p = Parser::new(format, opts.clone());
            let mut acc = Accumulator::default();
            for d in deltas.as_array().into_iter().flatten() {
                acc.extend(p.push(d.as_str().unwrap_or("")));
            }
            acc.extend(p.finish(reason));
            streams.insert(name.clone(), render(&acc));
        }
    }
    json!({"fixture_id": id, "supported": true, "reason": null, "format": format.name(),
           "nonstream": nonstream, "streams": streams})
}

fn render(acc: &Accumulator) -> Value {
    let opt = |s: &str| if s.is_empty() { Value::Null } else { Value::from(s) };
    json!({
        "content": opt(&acc.content),
        "reasoning_content": opt(&acc.reasoning),
        "tool_calls": acc.calls.iter().map(|c| json!({
            "id": c.id, "name": c.name, "arguments_raw": c.arguments,
        })).collect::<Vec<_>>(),
        "exception": null,
    })
}
