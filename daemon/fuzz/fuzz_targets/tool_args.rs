//! Fuzzes the built-in tools (`tools::Host::call`) with arbitrary tool names
//! and argument text, as a model may write them: every call must return a
//! result, never panic. The input's first byte picks the tool; the rest is
//! the argument text, tried as given and also as the string value of every
//! argument the tools read (so any unicode reaches the note slug, the
//! search query and the handle lookup). It drives the daemon's library
//! (`agentd::fuzzing::Tools`: the built-in tools under the default
//! policies). Crashes are kept as regression inputs in
//! `daemon/tests/data/tool_args/` and replayed by `cargo test`.
//!
//! ```text
//! cd daemon/fuzz && ./run.sh 600 tool_args
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

struct World {
    _dir: tempfile::TempDir,
    corpus: std::path::PathBuf,
    notes: std::path::PathBuf,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary folder");
        std::env::set_var("AGENTD_HOME", dir.path().join("home"));
        let corpus = dir.path().join("docs");
        std::fs::create_dir_all(&corpus).expect("the corpus folder");
        for (name, text) in [
            ("budget.md", "# Budget rules\n\nEvery request is admitted first. ".repeat(40)),
            ("ünïcode.md", "# Ünïcode\n\né 日本語 🎉 a\u{0301} ".repeat(60)),
            ("plain.txt", "word ".repeat(500)),
        ] {
            std::fs::write(corpus.join(name), text).expect("a corpus file");
        }
        let notes = dir.path().join("notes");
        World { _dir: dir, corpus, notes }
    })
}

fn host() -> agentd::fuzzing::Tools {
    let w = world();
    agentd::fuzzing::Tools::open(&w.corpus, &w.notes).expect("the corpus opens")
}

fn check(host: &mut agentd::fuzzing::Tools, name: &str, args: &str) {
    if let (_, Some(file)) = host.call(name, args) {
        // Keep the notes folder small (name collisions are probed in turn).
        let _ = std::fs::remove_file(world().notes.join(file));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let name = match pick % 5 {
        0 => "search_sources",
        1 => "read_source",
        2 => "save_note",
        3 => "no_such_tool",
        _ => "",
    };
    let text = String::from_utf8_lossy(rest);
    // One host for many inputs (opening the corpus is slow), renewed now
    // and then so quotas and the handle registry both fill and empty.
    thread_local! {
        static HOST: std::cell::RefCell<(u32, Option<agentd::fuzzing::Tools>)> =
            const { std::cell::RefCell::new((0, None)) };
    }
    HOST.with_borrow_mut(|(uses, slot)| {
        *uses += 1;
        if slot.is_none() || *uses % 2000 == 0 {
            *slot = Some(host());
        }
        let h = slot.as_mut().expect("a host");
        calls(h, name, rest, &text);
    });
});

fn calls(h: &mut agentd::fuzzing::Tools, name: &str, rest: &[u8], text: &str) {
    check(h, name, text);
    // Every argument the tools read, as this text (and as a number).
    let n = rest.iter().fold(0i64, |a, &b| a.wrapping_mul(31).wrapping_add(i64::from(b)));
    let obj = serde_json::json!({
        "query": text, "limit": n, "handle": text, "segment": n,
        "title": text, "text": text,
    });
    check(h, name, &obj.to_string());
    // A search first, so reads find real handles.
    check(h, "search_sources", &serde_json::json!({"query": "budget unicode word"}).to_string());
    check(h, "read_source", &serde_json::json!({"handle": format!("S{}", n.rem_euclid(4)), "segment": n}).to_string());
}
