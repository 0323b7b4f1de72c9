//! Data-driven checks over the recorded model outputs in
//! `tests/data/toolcalls/` (a copy of the shared conformance fixtures) and
//! the regression cases in `tests/data/regressions/` (same format):
//! the expected parse, no marker leakage, strict JSON arguments, and the
//! same result for every way of splitting the text into deltas, including
//! random splits (a property test) and suppress mode.
//!
//! `FIXTURE=substring cargo test -p toolparse --test fixtures` narrows the
//! run; failures list every case at once.

mod common;

use common::{load_fixtures, split_units, Fixture};
use proptest::prelude::*;
use toolparse::{Accumulator, Mode, Parser};

fn run_stream(fx: &Fixture, deltas: &[String], mode: Mode) -> Accumulator {
    let mut p = Parser::new(fx.format, fx.options(mode));
    let mut acc = Accumulator::default();
    for d in deltas {
        acc.extend(p.push(d));
    }
    acc.extend(p.finish(fx.reason()));
    acc
}

fn selected() -> Vec<Fixture> {
    let filter = std::env::var("FIXTURE").unwrap_or_default();
    load_fixtures().into_iter().filter(|f| f.id.contains(&filter)).collect()
}

#[test]
fn every_fixture_parses_as_expected_under_every_split() {
    let mut failures = Vec::new();
    let fixtures = selected();
    assert!(!fixtures.is_empty(), "no fixtures selected");
    for fx in &fixtures {
        let whole = run_stream(fx, std::slice::from_ref(&fx.text), Mode::Tools);
        if let Err(why) = fx.judge(&whole) {
            failures.push(format!("{} [one]: {why}", fx.id));
            continue;
        }
        let strategies: Vec<(&str, Vec<String>)> = vec![
            ("token", split_units(&fx.text, &fx.markers, false, &mut |_| 1)),
            ("char:0", split_units(&fx.text, &fx.markers, true, &mut |_| 1)),
            ("special", common::split_special(&fx.text, &fx.markers)),
        ];
        for (name, deltas) in strategies {
            let got = run_stream(fx, &deltas, Mode::Tools);
            if got != whole {
                failures.push(format!("{} [{name}]: {got:?} != {whole:?}", fx.id));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures fail:\n{}",
        failures.len(),
        fixtures.len(),
        failures.join("\n")
    );
}

#[test]
fn suppress_mode_strips_markup_and_discards_every_call() {
    let mut failures = Vec::new();
    for fx in selected() {
        let tools = run_stream(&fx, std::slice::from_ref(&fx.text), Mode::Tools);
        let sup = run_stream(&fx, std::slice::from_ref(&fx.text), Mode::Suppress);
        let by_char = split_units(&fx.text, &fx.markers, true, &mut |_| 1);
        let sup_chars = run_stream(&fx, &by_char, Mode::Suppress);
        if sup != sup_chars {
            failures.push(format!("{}: suppress differs by split", fx.id));
        }
        if !sup.calls.is_empty() {
            failures.push(format!("{}: suppress mode returned calls", fx.id));
        }
        if sup.discarded != tools.calls {
            failures.push(format!(
                "{}: discarded {:?} != calls {:?}",
                fx.id, sup.discarded, tools.calls
            ));
        }
        if fx.expected.is_some() {
            // The visible text is the same as with tools on, and holds no markup.
            if sup.content != tools.content || sup.reasoning != tools.reasoning {
                failures.push(format!("{}: visible text changed in suppress mode", fx.id));
            }
            if let Some(m) = fx.leaked_marker(&sup.content, &sup.reasoning) {
                failures.push(format!("{}: marker {m:?} left in suppress mode", fx.id));
            }
        } else {
            // Malformed or cut-off markup is stripped, never shown.
            if let Some(m) = fx.markers.iter().find(|m| sup.content.contains(m.as_str())) {
                if !fx.text.starts_with(sup.content.trim()) || sup.content.contains(m.as_str()) {
                    failures.push(format!("{}: marker {m:?} shown in suppress mode", fx.id));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Random splits of every fixture, markers cut anywhere, give the same
    /// result as one delta.
    #[test]
    fn random_splits_of_every_fixture(seed in any::<u64>(), chars in any::<bool>()) {
        let mut rng = seed;
        let mut next = move |hi: usize| {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            1 + (rng % hi as u64) as usize
        };
        for fx in selected() {
            let whole = run_stream(&fx, std::slice::from_ref(&fx.text), Mode::Tools);
            let deltas = split_units(&fx.text, &fx.markers, chars, &mut |_| next(8));
            let got = run_stream(&fx, &deltas, Mode::Tools);
            prop_assert_eq!(&got, &whole, "{} split {:?}", fx.id, deltas);
        }
    }
}
