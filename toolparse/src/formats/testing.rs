//! What the format machines' own tests share (test builds only): parsing a
//! text whole and one char per delta, the random-markup property, and
//! checking texts against a format's grammar.

use crate::{parse, Accumulator, FinishReason, Format, Mode, Options, Parser};

/// The default options with `gen` as the generation prompt.
pub(crate) fn prompted(gen: Option<&str>) -> Options {
    Options { generation_prompt: gen.map(str::to_owned), ..Options::default() }
}

/// Parses `text` whole and one char per delta; both must agree.
pub(crate) fn whole_and_by_char(
    format: Format,
    opts: &Options,
    text: &str,
    reason: FinishReason,
) -> Accumulator {
    let whole = parse(format, opts.clone(), text, reason);
    let mut p = Parser::new(format, opts.clone());
    let mut acc = Accumulator::default();
    for c in text.chars() {
        acc.extend(p.push(&c.to_string()));
    }
    acc.extend(p.finish(reason));
    assert_eq!(acc, whole, "one char per delta changes the result of {text:?}");
    whole
}

/// `rounds` random texts of up to `len` pieces of `pieces`, for each finish
/// reason and each of `prompts`: split into random deltas they give what they
/// give whole, every call is a strict JSON object, and suppress mode
/// discards exactly the calls tools mode returns.
pub(crate) fn random_markup(
    format: Format,
    pieces: &[&str],
    prompts: &[Option<&str>],
    opts: &dyn Fn(Option<&str>) -> Options,
    rounds: usize,
    len: usize,
) {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for _ in 0..rounds {
        let n = 1 + next(len);
        let text: String = (0..n).map(|_| pieces[next(pieces.len())]).collect();
        for reason in [FinishReason::Stop, FinishReason::Length] {
            for &gen in prompts {
                let whole = parse(format, opts(gen), &text, reason);
                let mut p = Parser::new(format, opts(gen));
                let mut acc = Accumulator::default();
                let mut rest = text.as_str();
                while !rest.is_empty() {
                    let mut cut = (1 + next(6)).min(rest.len());
                    while !rest.is_char_boundary(cut) {
                        cut += 1;
                    }
                    acc.extend(p.push(&rest[..cut]));
                    rest = &rest[cut..];
                }
                acc.extend(p.finish(reason));
                assert_eq!(acc, whole, "{format:?} {text:?} {reason:?} {gen:?}");
                for c in &whole.calls {
                    assert!(crate::json::strict_object(&c.arguments).is_ok(), "{c:?}");
                }
                let sup = Options { mode: Mode::Suppress, ..opts(gen) };
                let sup = parse(format, sup, &text, reason);
                assert!(sup.calls.is_empty(), "{format:?} {text:?}");
                assert_eq!(sup.discarded, whole.calls, "{format:?} {text:?} {reason:?} {gen:?}");
            }
        }
    }
}

/// The tokens of `text` over a one-byte vocabulary with control tokens:
/// each `(token, id, placeholder)` of `marks` has its placeholder (`{B}`, …)
/// stand for token `id`; every other byte is a token of its own.
pub(crate) fn tokens(text: &str, marks: &[(&str, u32, &str)]) -> Vec<u32> {
    let mut toks = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match marks.iter().find(|m| rest.starts_with(m.2)) {
            Some(m) => {
                toks.push(m.1);
                rest = &rest[m.2.len()..];
            }
            None => {
                toks.push(u32::from(rest.as_bytes()[0]));
                rest = &rest[1..];
            }
        }
    }
    toks
}

/// Whether `toks` is a whole sentence of `start: calls` of `lark`, compiled
/// by llguidance over a one-byte vocabulary (a format's grammar tests).
pub(crate) fn sentence(lark: &str, toks: &[u32]) -> bool {
    use llguidance::api::TopLevelGrammar;
    use llguidance::toktrie::{ApproximateTokEnv, InferenceCapabilities};
    let env = ApproximateTokEnv::single_byte_env();
    let caps = InferenceCapabilities::default();
    let slices = llguidance::earley::SlicedBiasComputer::general_slices();
    let mut f = llguidance::ParserFactory::new(&env, caps, &slices).expect("factory");
    f.quiet();
    let g = TopLevelGrammar::from_lark(format!("start: calls\n{lark}"));
    let mut m = llguidance::Matcher::new(Ok(f.create_parser(g).expect("compiles")));
    toks.iter().all(|&t| m.consume_token(t).is_ok()) && m.is_accepting().unwrap_or(false)
}
