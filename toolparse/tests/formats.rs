//! Format behaviour as data, in the manner of rust-analyzer's
//! `check(input, expect![[…]])`: every case in `tests/data/formats/*.txt` is
//! an input text with its options and the parse it must give; one `check`
//! runs it whole, one char per delta and cut in two at every char (short
//! texts), demands the same result from all, and compares it with the
//! expectation. Suppress mode is checked on every case too: it returns no
//! call and discards exactly the calls tools mode returns.
//!
//! `UPDATE_EXPECT=1 cargo test -p toolparse --test formats` rewrites the
//! expectations from what the parser does (then read the diff);
//! `CASE=substring` narrows the run.
//!
//! A case:
//!
//! ```text
//! === a name
//! format: mistral              (a Format::NAMES name)
//! reason: length               (optional: stop by default)
//! prompt: "[/INST][THINK]"     (optional: the generation prompt, a JSON string)
//! mode: suppress               (optional)
//! tools: f a:integer b:string,null | g   (optional: tools and declared types)
//! --- text
//! the text, verbatim (a final newline belongs to it only when a blank line
//! stands before the expectation)
//! --- expect
//! content "…"   reasoning "…"   (JSON strings, one line each, when not empty)
//! call NAME ARGUMENTS           (call [ID] NAME … when the format writes ids)
//! discarded NAME ARGUMENTS
//! dropped INDEX truncated|malformed
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use toolparse::{
    Accumulator, DropReason, Event, FinishReason, Format, JsonType, Mode, Options, Parser,
    ToolCall, ToolSpec, Tools,
};

struct Case {
    name: String,
    format: Format,
    reason: FinishReason,
    prompt: Option<String>,
    mode: Mode,
    tools: Tools,
    text: String,
    expect: String,
}

/// What a parse gave, as the expectation writes it: what a client
/// accumulates, and the calls that were started and dropped.
#[derive(Debug, Default, PartialEq, Eq)]
struct Outcome {
    acc: Accumulator,
    dropped: Vec<(usize, DropReason)>,
}

impl Outcome {
    fn add(&mut self, events: Vec<Event>) {
        for e in &events {
            if let Event::CallDropped { index, reason } = e {
                self.dropped.push((*index, *reason));
            }
        }
        self.acc.extend(events);
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let call = |out: &mut String, kind: &str, c: &ToolCall| {
            let id = c.id.as_deref().map(|id| format!("[{id}] ")).unwrap_or_default();
            let _ = writeln!(out, "{kind} {id}{} {}", c.name, c.arguments);
        };
        let acc = &self.acc;
        if !acc.content.is_empty() {
            let _ = writeln!(out, "content {}", serde_json::Value::from(acc.content.as_str()));
        }
        if !acc.reasoning.is_empty() {
            let _ = writeln!(out, "reasoning {}", serde_json::Value::from(acc.reasoning.as_str()));
        }
        for c in &acc.calls {
            call(&mut out, "call", c);
        }
        for c in &acc.discarded {
            call(&mut out, "discarded", c);
        }
        for (index, reason) in &self.dropped {
            let why = match reason {
                DropReason::Truncated => "truncated",
                DropReason::Malformed => "malformed",
            };
            let _ = writeln!(out, "dropped {index} {why}");
        }
        out
    }
}

impl Case {
    fn options(&self, mode: Mode) -> Options {
        Options {
            generation_prompt: self.prompt.clone(),
            tools: self.tools.clone(),
            mode,
            ..Options::default()
        }
    }

    fn run(&self, mode: Mode, deltas: &[&str]) -> Outcome {
        let mut p = Parser::new(self.format, self.options(mode));
        let mut out = Outcome::default();
        for d in deltas {
            out.add(p.push(d));
        }
        out.add(p.finish(self.reason));
        out
    }

    /// Parses the case every way; the outcome, or why the ways disagree.
    fn check(&self, mode: Mode) -> Result<Outcome, String> {
        let whole = self.run(mode, &[&self.text]);
        let chars: Vec<String> = self.text.chars().map(String::from).collect();
        let by_char: Vec<&str> = chars.iter().map(String::as_str).collect();
        if self.run(mode, &by_char) != whole {
            return Err(format!("one char per delta: {:?}", self.run(mode, &by_char)));
        }
        if self.text.len() <= 400 {
            for (cut, _) in self.text.char_indices().skip(1) {
                let split = self.run(mode, &[&self.text[..cut], &self.text[cut..]]);
                if split != whole {
                    return Err(format!("cut at {cut}: {split:?}"));
                }
            }
        }
        Ok(whole)
    }
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/formats")
}

fn parse_tools(spec: &str) -> Tools {
    let tools = spec.split('|').map(str::trim).filter(|t| !t.is_empty()).map(|t| {
        let mut words = t.split_whitespace();
        let mut tool = ToolSpec::new(words.next().unwrap_or_default());
        for p in words {
            let (name, types) = p.split_once(':').unwrap_or((p, ""));
            let types: Vec<JsonType> = types.split(',').filter_map(JsonType::from_name).collect();
            tool = tool.param(name, &types);
        }
        tool
    });
    Tools(tools.collect())
}

/// The cases of one file, and each one's byte range of expectation text.
fn parse_file(path: &Path) -> Vec<(Case, std::ops::Range<usize>)> {
    let src = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(start) = src[pos..].find("=== ").map(|i| pos + i) {
        let head_end = src[start..].find("\n--- text\n").map(|i| start + i).expect("--- text");
        let text_start = head_end + "\n--- text\n".len();
        let text_end = src[text_start..].find("\n--- expect\n").map(|i| text_start + i);
        let text_end = text_end.unwrap_or_else(|| panic!("{}: --- expect", path.display()));
        let exp_start = text_end + "\n--- expect\n".len();
        let exp_end = src[exp_start..].find("\n=== ").map_or(src.len(), |i| exp_start + i + 1);
        let head = &src[start + 4..head_end];
        let mut lines = head.lines();
        let name = lines.next().unwrap_or_default().trim().to_owned();
        let mut case = Case {
            name,
            format: Format::Hermes,
            reason: FinishReason::Stop,
            prompt: None,
            mode: Mode::Tools,
            tools: Tools::default(),
            text: src[text_start..text_end].to_owned(),
            expect: src[exp_start..exp_end].to_owned(),
        };
        for line in lines {
            let (key, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.trim();
            match key.trim() {
                "format" => {
                    case.format =
                        Format::from_name(value).unwrap_or_else(|e| panic!("{}: {e}", case.name))
                }
                "reason" => {
                    case.reason = match value {
                        "length" => FinishReason::Length,
                        _ => FinishReason::Stop,
                    }
                }
                "prompt" => case.prompt = Some(serde_json::from_str(value).expect("a JSON string")),
                "mode" => {
                    case.mode = if value == "suppress" { Mode::Suppress } else { Mode::Tools }
                }
                "tools" => case.tools = parse_tools(value),
                other => panic!("{}: unknown key {other:?}", case.name),
            }
        }
        out.push((case, exp_start..exp_end));
        pos = exp_end;
    }
    out
}

#[test]
fn every_case_parses_as_expected_however_it_is_split() {
    let update = std::env::var_os("UPDATE_EXPECT").is_some();
    let filter = std::env::var("CASE").unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .expect("tests/data/formats")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    let mut failures = Vec::new();
    let mut count = 0;
    for path in &files {
        let cases = parse_file(path);
        let mut src = std::fs::read_to_string(path).unwrap();
        // Rewritten from the end, so earlier ranges stay valid.
        for (case, range) in cases.iter().rev() {
            if !case.name.contains(&filter) {
                continue;
            }
            count += 1;
            let file = path.file_name().unwrap().to_string_lossy();
            let got = match case.check(case.mode) {
                Ok(got) => got,
                Err(why) => {
                    failures.push(format!(
                        "{file}: {}: the split changes the result: {why}",
                        case.name
                    ));
                    continue;
                }
            };
            if case.mode == Mode::Tools {
                match case.check(Mode::Suppress) {
                    Ok(sup) if sup.acc.calls.is_empty() && sup.acc.discarded == got.acc.calls => {}
                    Ok(sup) => failures.push(format!(
                        "{file}: {}: suppress mode discarded {:?} for calls {:?}",
                        case.name, sup.acc.discarded, got.acc.calls
                    )),
                    Err(why) => {
                        failures.push(format!("{file}: {}: suppress mode: {why}", case.name))
                    }
                }
            }
            let rendered = got.render();
            if rendered.trim_end() != case.expect.trim_end() {
                if update {
                    let sep = if range.end < src.len() { "\n" } else { "" };
                    src.replace_range(range.clone(), &format!("{rendered}{sep}"));
                } else {
                    failures.push(format!(
                        "{file}: {}:\n--- want\n{}--- got\n{rendered}",
                        case.name, case.expect
                    ));
                }
            }
        }
        if update {
            std::fs::write(path, src).unwrap();
        }
    }
    assert!(count > 0, "no case selected");
    assert!(
        failures.is_empty(),
        "{} of {count} cases fail (UPDATE_EXPECT=1 rewrites expectations):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
