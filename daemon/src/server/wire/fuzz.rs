//! The request-body fuzz target's entry (`daemon/fuzz/fuzz_targets/request_body.rs`,
//! through `agentd::fuzzing`): a body goes the way a route takes it —
//! decoded as its dialect, mapped to the one chat request, checked — and
//! then to what the decoder would enforce for it: the output schema's
//! checks and every call format's grammar for its tools. Any input must end
//! in a value or an error message, never a panic.

use super::{anthropic, decode, ollama, openai, responses, ChatRequest, Served};
use crate::provider::constrain::{check_schema, Constraint, ToolChoice};
use crate::state::policy::SamplingLimits;
use crate::state::registry::SamplingKnobs;
use serde_json::Value;
use toolparse::{Format, GrammarTool};

/// One body of the dialect `dialect` picks (its low three bits); bit 7
/// says the daemon is in front of an upstream.
pub(crate) fn fuzz_request(dialect: u8, body: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(body) else { return };
    let chat: Result<ChatRequest, String> = match dialect & 7 {
        0 | 5 => decode::<openai::Request>(value).and_then(openai::Request::into_chat).map(|c| c.0),
        1 | 6 => decode::<anthropic::Request>(value).and_then(|r| r.into_chat(false)).map(|c| c.0),
        2 | 7 => decode::<ollama::Body>(value).and_then(|b| b.into_chat(4096)).map(|c| c.0),
        3 => {
            let fim = ["<fim_prefix>".to_owned(), "<fim_suffix>".into(), "<fim_middle>".into()];
            match decode::<ollama::Body>(value).and_then(|b| b.into_generate(4096, Some(&fim), "m"))
            {
                Ok(ollama::Generate::Reply(c, _)) => Ok(*c),
                Ok(ollama::Generate::Load) => return,
                Err(e) => Err(e),
            }
        }
        _ => decode::<responses::Create>(value)
            .and_then(|c| c.conversation(Vec::new()).and_then(|conv| c.chat(&conv))),
    };
    let Ok(chat) = chat else { return };
    let knobs = SamplingKnobs::default();
    let served = Served {
        sampling: &knobs,
        limits: SamplingLimits::declared(),
        upstream: dialect & 0x80 != 0,
    };
    let Ok(parsed) = chat.check_for(&served) else { return };
    let budget = parsed.params.max_tokens;
    match &parsed.params.constraint {
        Constraint::JsonSchema(schema) if check_schema(schema, "response_format").is_ok() => {
            let _ = toolparse::bounded(schema.clone());
        }
        Constraint::ToolCalls(choice) => {
            let forced = *choice != ToolChoice::Auto;
            let tools: Vec<GrammarTool<'_>> = parsed
                .tools
                .iter()
                .filter(|t| check_schema(&t.parameters, "tools").is_ok())
                .map(|t| GrammarTool {
                    name: &t.name,
                    parameters: &t.parameters,
                    text_bytes: (forced && budget / 2 <= 256).then(|| (budget / 2).max(8)),
                })
                .collect();
            for f in Format::all() {
                let _ = f.call_grammar(&tools, &|t: &str| toolparse::lit(t));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::fuzz_request;

    /// Every request body of the wire fixtures under every dialect byte,
    /// and the fuzzer's regression inputs (`daemon/tests/data/request_body/`,
    /// first byte the dialect), end without a panic.
    #[test]
    fn the_fixtures_and_fuzz_regressions_end_without_a_panic() {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let text = std::fs::read_to_string(data.join("wire.jsonl")).unwrap();
        let mut n = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let body = serde_json::to_vec(&v["body"]).unwrap();
            for dialect in [0u8, 1, 2, 3, 4, 0x80, 0x84] {
                fuzz_request(dialect, &body);
                n += 1;
            }
        }
        assert!(n > 0);
        if let Ok(dir) = std::fs::read_dir(data.join("request_body")) {
            for f in dir.flatten() {
                let bytes = std::fs::read(f.path()).unwrap();
                if let Some((&d, body)) = bytes.split_first() {
                    fuzz_request(d, body);
                }
            }
        }
    }
}
