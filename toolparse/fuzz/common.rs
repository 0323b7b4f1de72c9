//! The property every fuzz target checks, for one format: parsing never
//! panics, the streamed result equals the one-delta result for an arbitrary
//! split, suppress mode never returns calls, and every call's arguments are
//! a JSON object.
//!
//! Also included by `../tests/fuzz_regressions.rs`, which replays the saved
//! crash inputs in `../tests/data/fuzz/` (named `TARGET-crash-HASH`, TARGET
//! being the fuzz target without `parse_`) through the same checks.

use toolparse::{
    Accumulator, FinishReason, Format, JsonType, Mode, Options, Parser, ToolSpec, Tools,
};

const PROMPTS: [Option<&str>; 8] = [
    None,
    Some("<|im_start|>assistant\n<think>\n"),
    Some("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    Some("<｜Assistant｜><think>"),
    Some("<|start|>assistant"),
    Some("<|turn>model\n"),
    Some("<|assistant|><think>"),
    Some("<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"),
];

/// The fuzz targets (`parse_NAME`) and the formats they check.
#[allow(dead_code)] // used by the regression test, not by the targets
pub const TARGETS: [(&str, Format); 16] = [
    ("hermes", Format::Hermes),
    ("qwen3_xml", Format::Qwen3Xml),
    ("llama3_json", Format::Llama3Json),
    ("llama4_pythonic", Format::Llama4Pythonic),
    ("mistral", Format::Mistral),
    ("deepseek_v3", Format::DeepSeekV3),
    ("deepseek_v31", Format::DeepSeekV31),
    ("deepseek_v32", Format::DeepSeekV32),
    ("deepseek_v4", Format::DeepSeekV4),
    ("deepseek_v41", Format::DeepSeekV41),
    ("gpt_oss", Format::GptOss),
    ("glm45", Format::Glm45),
    ("glm47", Format::Glm47),
    ("kimi_k2", Format::KimiK2),
    ("kimi_k3", Format::KimiK3),
    ("gemma4", Format::Gemma4),
];

/// The format of fuzz target `parse_NAME`, by NAME.
#[allow(dead_code)] // used by the regression test, not by the targets
pub fn target_format(name: &str) -> Option<Format> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// Panics when `data` (a fuzz input: a flags byte, two seed bytes, text)
/// breaks a property for `format`.
pub fn check(format: Format, data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let flags = data[0];
    let seed = u64::from(data[1]) | (u64::from(data[2]) << 8);
    let text = String::from_utf8_lossy(&data[3..]);
    let opts = Options {
        generation_prompt: PROMPTS[(flags & 7) as usize].map(str::to_owned),
        thinking: None,
        tools: Tools(vec![
            ToolSpec::new("get_weather")
                .param("city", &[JsonType::String])
                .param("days", &[JsonType::Integer]),
            ToolSpec::new("search")
                .param("query", &[JsonType::String])
                .param("filters", &[JsonType::Object]),
        ]),
        mode: if flags & 8 != 0 { Mode::Suppress } else { Mode::Tools },
        buffer_cap: if flags & 32 != 0 { 64 } else { toolparse::DEFAULT_BUFFER_CAP },
    };
    let reason = if flags & 16 != 0 { FinishReason::Length } else { FinishReason::Stop };
    let whole = toolparse::parse(format, opts.clone(), &text, reason);

    let mut rng = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1;
    let mut p = Parser::new(format, opts.clone());
    let mut acc = Accumulator::default();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = 1 + (rng % 9) as usize;
        let end = (i + k).min(chars.len());
        let delta: String = chars[i..end].iter().collect();
        acc.extend(p.push(&delta));
        i = end;
    }
    acc.extend(p.finish(reason));
    assert_eq!(acc, whole, "stream differs from one delta for {text:?}");

    if opts.mode == Mode::Suppress {
        assert!(whole.calls.is_empty(), "suppress mode returned calls");
    }
    for c in whole.calls.iter().chain(&whole.discarded) {
        let v: serde_json::Value = serde_json::from_str(&c.arguments).expect("arguments are JSON");
        assert!(v.is_object(), "arguments are not an object: {}", c.arguments);
    }
}
