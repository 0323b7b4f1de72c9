//! Every malformed GGUF under `tests/data/gguf/` (hand-made cases and the
//! fuzzers' finds, `fuzz/run.sh`) is refused with a typed error that names
//! what is wrong: no panic, no allocation sized by the file's claims.

use inference::{Engine, EngineOptions, ErrorKind};
use std::path::PathBuf;

#[test]
fn malformed_files_are_typed_errors() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/data/gguf exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "the malformed-file corpus is missing");
    let opts = EngineOptions { threads: Some(1), ..Default::default() };
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let err = match Engine::load(&f, &opts) {
            Ok(_) => panic!("{name}: a malformed file loaded"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::Model, "{name}: {err}");
        let msg = err.to_string();
        assert!(msg.len() > 10 && !msg.contains("panicked"), "{name}: {msg}");
        eprintln!("{name}: {msg}");
    }
}
