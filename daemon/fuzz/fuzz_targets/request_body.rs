//! Fuzzes the request bodies of the HTTP dialects — chat completions,
//! Anthropic Messages, Ollama chat and generate, Responses — the way a
//! route takes them: decoded, mapped to the daemon's one chat request,
//! checked, and turned into what the decoder would enforce (schema checks,
//! every call format's grammar for the request's tools). The first byte
//! picks the dialect (and whether the daemon fronts an upstream); the rest
//! is the body. Every input must end in a value or an error message, never
//! a panic. Crashes are kept as regression inputs in
//! `daemon/tests/data/request_body/` (first byte: the dialect) and
//! replayed by `cargo test -p agentd`.
//!
//! ```text
//! cd daemon/fuzz && ./run.sh 600
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&dialect, body)) = data.split_first() else { return };
    agentd::fuzzing::request_body(dialect, body);
});
