//! Replays every saved fuzz crash input in `tests/data/fuzz/` through the
//! checks the fuzz targets make (`../fuzz/common.rs`, shared as it is): no
//! panic, the streamed result equals the one-delta result, no calls in
//! suppress mode, arguments are JSON objects. A file is named
//! `TARGET-crash-HASH`, TARGET being the fuzz target without `parse_`; it is
//! also checked against every other format, since any input must hold for
//! all of them.

#[allow(dead_code, unreachable_pub)]
#[path = "../fuzz/common.rs"]
mod fuzz_common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

#[test]
fn saved_fuzz_inputs_pass_the_fuzz_checks() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/data/fuzz")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no saved fuzz inputs in {}", dir.display());
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let target = name.split_once("-crash-").map(|(t, _)| t).unwrap_or_default();
        let format = fuzz_common::target_format(target)
            .unwrap_or_else(|| panic!("{name}: not named TARGET-crash-HASH"));
        let data = std::fs::read(path).unwrap();
        let mut formats = vec![format];
        formats.extend(fuzz_common::TARGETS.iter().map(|(_, f)| *f).filter(|f| *f != format));
        for f in formats {
            let run = catch_unwind(AssertUnwindSafe(|| fuzz_common::check(f, &data)));
            if let Err(e) = run {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                failures.push(format!("{name} as {}: {why}", f.name()));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
