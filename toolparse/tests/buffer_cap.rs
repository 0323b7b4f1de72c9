//! The buffer cap ([`Options::buffer_cap`]) is a function of the text: a
//! call whose held markup is exactly `cap` bytes is accepted, one byte more
//! and exactly its first `cap` bytes are malformed (content in tools mode,
//! stripped in suppress mode), whatever the deltas.

use toolparse::{Accumulator, FinishReason, Format, Mode, Options, Parser};

/// A format, its generation prompt, and text around one call whose held
/// region (from its opening marker, gpt-oss: from the body) is `region`.
struct Case {
    format: Format,
    prompt: Option<&'static str>,
    before: &'static str,
    region: &'static str,
    after: &'static str,
}

const CASES: &[Case] = &[
    Case {
        format: Format::Hermes,
        prompt: None,
        before: "Let me check. ",
        region: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        after: "",
    },
    Case {
        format: Format::Qwen3Xml,
        prompt: None,
        before: "Let me check.\n",
        region: "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        after: "",
    },
    Case {
        format: Format::Glm47,
        prompt: None,
        before: "Let me check.",
        region: "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
        after: "",
    },
    Case {
        format: Format::Llama3Json,
        prompt: None,
        before: "",
        region: "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        after: "",
    },
    Case {
        format: Format::Llama4Pythonic,
        prompt: None,
        before: "",
        region: "[get_weather(city=\"Paris\")]",
        after: "",
    },
    Case {
        format: Format::Mistral,
        prompt: None,
        before: "",
        region: "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
        after: "",
    },
    Case {
        format: Format::DeepSeekV31,
        prompt: Some("<｜Assistant｜></think>"),
        before: "Let me check.",
        region: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>",
        after: "<｜tool▁calls▁end｜>",
    },
    Case {
        format: Format::DeepSeekV32,
        prompt: Some("<｜Assistant｜></think>"),
        before: "Let me check.\n\n",
        region: "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>",
        after: "\n</｜DSML｜function_calls>",
    },
    Case {
        format: Format::GptOss,
        prompt: Some("<|start|>assistant"),
        before: " to=functions.get_weather<|channel|>commentary json<|message|>",
        region: "{\"city\": \"Paris\"}<|call|>",
        after: "",
    },
    Case {
        format: Format::KimiK2,
        prompt: None,
        before: "Let me check.<|tool_calls_section_begin|>",
        region: "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>",
        after: "<|tool_calls_section_end|>",
    },
    Case {
        format: Format::KimiK3,
        prompt: Some("<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"),
        before: "Let me check.<|close|>response<|sep|><|open|>tools<|sep|>",
        region: "<|open|>call tool=\"get_weather\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|>",
        after: "<|close|>tools<|sep|>",
    },
    Case {
        format: Format::Gemma4,
        prompt: None,
        before: "Let me check.",
        region: "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>",
        after: "",
    },
];

fn run(case: &Case, cap: usize, mode: Mode, deltas: &[String]) -> Accumulator {
    let opts = Options {
        generation_prompt: case.prompt.map(str::to_owned),
        mode,
        buffer_cap: cap,
        ..Options::default()
    };
    let mut p = Parser::new(case.format, opts);
    let mut acc = Accumulator::default();
    for d in deltas {
        acc.extend(p.push(d));
    }
    acc.extend(p.finish(FinishReason::Stop));
    acc
}

/// Parses whole, char by char and in 5-char pieces; all must agree.
fn parse(case: &Case, cap: usize, mode: Mode) -> Accumulator {
    let text = format!("{}{}{}", case.before, case.region, case.after);
    let whole = run(case, cap, mode, std::slice::from_ref(&text));
    let chars: Vec<char> = text.chars().collect();
    for k in [1, 5] {
        let deltas: Vec<String> = chars.chunks(k).map(|c| c.iter().collect()).collect();
        let split = run(case, cap, mode, &deltas);
        assert_eq!(split, whole, "{:?} cap {cap} {mode:?}: {k}-char split differs", case.format);
    }
    whole
}

#[test]
fn a_call_of_exactly_cap_bytes_is_accepted() {
    for case in CASES {
        let cap = case.region.len();
        let acc = parse(case, cap, Mode::Tools);
        assert_eq!(acc.calls.len(), 1, "{:?}: {acc:?}", case.format);
        assert_eq!(acc.calls[0].name, "get_weather");
        let args: serde_json::Value = serde_json::from_str(&acc.calls[0].arguments).unwrap();
        assert_eq!(args, serde_json::json!({"city": "Paris"}), "{:?}", case.format);
        let acc = parse(case, cap, Mode::Suppress);
        assert_eq!(acc.discarded.len(), 1, "{:?}: {acc:?}", case.format);
    }
}

#[test]
fn a_call_longer_than_cap_is_malformed_and_its_first_cap_bytes_are_content() {
    for case in CASES {
        for cap in [case.region.len() - 1, case.region.len() / 2, 8] {
            let acc = parse(case, cap, Mode::Tools);
            assert!(acc.calls.is_empty(), "{:?} cap {cap}: {acc:?}", case.format);
            let mut head = cap;
            while !case.region.is_char_boundary(head) {
                head -= 1;
            }
            assert!(
                acc.content.contains(&case.region[..head]),
                "{:?} cap {cap}: {:?} lacks {:?}",
                case.format,
                acc.content,
                &case.region[..head]
            );
            let acc = parse(case, cap, Mode::Suppress);
            assert!(acc.calls.is_empty() && acc.discarded.is_empty(), "{:?}: {acc:?}", case.format);
        }
    }
}

#[test]
fn the_malformed_region_is_exactly_the_first_cap_bytes() {
    let case = &CASES[0];
    let cap = 40;
    let acc = parse(case, cap, Mode::Tools);
    // The region's first 40 bytes, then the rest read as content again (the
    // text before the region is kept as it is, its space included).
    let rest = &case.region[cap..];
    assert_eq!(acc.content, format!("Let me check. {}{}", &case.region[..cap], rest.trim_end()));
    let acc = parse(case, cap, Mode::Suppress);
    assert_eq!(acc.content, format!("Let me check. {}", rest.trim_end()));
}

#[test]
fn calls_after_an_overflow_still_parse() {
    let huge = format!(
        "<tool_call>\n{{\"name\": \"x\", \"arguments\": {{\"a\": \"{}\"}}}}\n</tool_call>",
        "y".repeat(500)
    );
    let ok = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let text = format!("{huge}\n{ok}");
    let opts = Options { buffer_cap: 200, ..Options::default() };
    let acc = toolparse::parse(Format::Hermes, opts, &text, FinishReason::Stop);
    assert_eq!(acc.calls.len(), 1);
    assert_eq!(acc.calls[0].name, "get_weather");
    assert!(acc.content.starts_with(&huge[..200]));
}
