//! Loading a model from arbitrary bytes (tokenizer and config read from the
//! metadata, tensors checked against the file) gives an engine or a typed
//! error, never a panic or an allocation sized by the file's claims.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("agentd-fuzz-{}.gguf", std::process::id()));
    let Ok(mut f) = std::fs::File::create(&path) else { return };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    let opts = inference::EngineOptions { threads: Some(1), ..Default::default() };
    if let Err(e) = inference::Engine::load(&path, &opts) {
        // Every error names what failed; none is empty.
        assert!(!e.to_string().is_empty());
    }
});
