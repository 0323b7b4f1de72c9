//! The built-in tools never panic on a model's arguments: regressions of
//! panics found so far, the fuzz target's kept inputs
//! (`daemon/tests/data/tool_args/`, see `daemon/fuzz/`), and property tests
//! with arbitrary JSON arguments — any unicode, sizes, types and numbers.

use super::*;
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// A corpus, a notes folder and a state folder shared by the tests of this
/// process (the index of a corpus lives under the state folder).
struct World {
    _dir: tempfile::TempDir,
    corpus: PathBuf,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary folder");
        // Before any corpus is indexed; every test of this binary that
        // reads it goes through here first.
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
        World { _dir: dir, corpus }
    })
}

/// The shared corpus (tests open it at once: they take turns at its index).
pub(crate) fn open_corpus() -> Corpus {
    Corpus::open(std::slice::from_ref(&world().corpus), 300).expect("the corpus")
}

fn limits() -> Limits {
    Limits {
        results_per_search: 5,
        searches: 1000,
        reads: 1000,
        handle_capacity: 16,
        handle_lifetime: 3600,
    }
}

fn host(notes: &Path) -> Host {
    Host::new(Some(open_corpus()), Some(notes.to_owned()), limits())
}

/// Every call returns a result that becomes JSON.
fn call(h: &mut Host, name: &str, args: &str) -> ToolOutput {
    let out = h.call(name, args);
    let _ = out.to_json().to_string();
    out
}

// See: issue 12. The slug was cut at byte 60, inside an `é`.
#[test]
fn a_long_unicode_title_is_cut_at_a_char_boundary() {
    let notes = tempfile::tempdir().unwrap();
    let mut h = Host::new(None, Some(notes.path().to_owned()), limits());
    let title = format!("a{}", "é".repeat(40));
    let out = call(&mut h, NOTE, &json!({"title": title, "text": "x"}).to_string());
    let ToolOutput::Saved(name) = out else { panic!("not saved: {:?}", out.to_json()) };
    assert!(name.len() <= 60 + ".md".len(), "{name}");
    assert!(name.starts_with("aéé"), "{name}");
    let text = std::fs::read_to_string(notes.path().join(&name)).unwrap();
    assert!(text.starts_with(&format!("# {title}\n")));
}

/// A link in the notes folder where the note would go (a dangling one
/// pointing out of the folder): the note is written beside it, under a new
/// name, and nothing is written where the link points.
#[test]
fn a_note_never_follows_a_link_out_of_the_notes_folder() {
    let notes = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("pwned.md");
    std::os::unix::fs::symlink(&target, notes.path().join("budget.md")).unwrap();
    let mut h = Host::new(None, Some(notes.path().to_owned()), limits());
    let out = call(&mut h, NOTE, &json!({"title": "Budget", "text": "two"}).to_string());
    let ToolOutput::Saved(name) = out else { panic!("not saved: {:?}", out.to_json()) };
    assert_eq!(name, "budget-2.md");
    assert!(!target.exists(), "the note followed the link");
    let text = std::fs::read_to_string(notes.path().join(&name)).unwrap();
    assert!(text.starts_with("# Budget\n"));
}

/// Two `--corpus` folders with the same name (`a/docs`, `b/docs`), each
/// holding a file of the same name: their sources get distinct paths, and
/// reading the handle a search gave reads the file that search found — not
/// the other folder's (issue 31, item 7).
#[test]
fn folders_of_the_same_name_keep_their_own_sources() {
    world();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a/docs"), dir.path().join("b/docs"));
    for (root, word) in [(&a, "aardvark"), (&b, "bumblebee")] {
        std::fs::create_dir_all(root).unwrap();
        std::fs::write(root.join("guide.md"), format!("# Guide\n\nThe {word} lives here.\n"))
            .unwrap();
    }
    let corpus = Corpus::open(&[a.clone(), b.clone()], 300).expect("the corpus");
    let mut h = Host::new(Some(corpus), None, limits());
    for (word, path) in [("aardvark", "docs/guide.md"), ("bumblebee", "docs-2/guide.md")] {
        let found = call(&mut h, SEARCH, &json!({"query": word}).to_string()).to_json();
        let hits = found["results"].as_array().expect("results");
        assert_eq!(hits.len(), 1, "{found}");
        assert_eq!(hits[0]["path"], path, "{found}");
        let handle = hits[0]["handle"].as_str().unwrap();
        let read = call(&mut h, READ, &json!({"handle": handle}).to_string()).to_json();
        let text = read["text"].as_str().unwrap_or_default();
        assert!(text.contains(word), "{handle} ({path}) read the other folder's file: {read}");
    }
    // The same folder given twice is one folder, not `docs` and `docs-2`.
    let once = Corpus::open(&[a.clone(), a], 300).expect("the corpus");
    assert_eq!(once.search("aardvark", 5).unwrap().len(), 1);
}

/// Twelve threads open a corpus together right after one of its files
/// changed (issue 31, item 5): one rebuilds the index while the others
/// wait for it, none fails on tantivy's writer lock, and every one
/// searches the new text.
#[test]
fn threads_opening_a_changed_corpus_together_share_one_rebuild() {
    world();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("shared");
    std::fs::create_dir_all(&root).unwrap();
    for i in 0..20 {
        std::fs::write(root.join(format!("page{i}.md")), format!("# Page {i}\n\nplain words\n"))
            .unwrap();
    }
    Corpus::open(std::slice::from_ref(&root), 300).expect("the first build");
    std::fs::write(root.join("page7.md"), "# Page 7\n\nThe wombat burrows.\n").unwrap();
    let start = std::sync::Barrier::new(12);
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..12)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let c = Corpus::open(std::slice::from_ref(&root), 300)?;
                    c.search("wombat", 5)
                })
            })
            .collect();
        for (i, r) in runs.into_iter().enumerate() {
            let hits = r.join().expect("no panic").unwrap_or_else(|e| panic!("run {i}: {e:#}"));
            assert_eq!(hits.len(), 1, "run {i}");
            assert_eq!(hits[0].path, "shared/page7.md", "run {i}");
        }
    });
}

#[test]
fn the_slug_cut_never_splits_a_character() {
    for s in ["", "a", "é", "日本語", "🎉🎉", "aé"] {
        for at in 0..8 {
            let cut = floor_char_boundary(s, at);
            assert!(cut <= at.min(s.len()) && s.is_char_boundary(cut), "{s:?} {at}");
        }
    }
}

/// The inputs the fuzz target kept (one file each: the tool-picking byte,
/// then the argument text), replayed through the same calls it makes.
#[test]
fn fuzz_regressions_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tool_args");
    let notes = tempfile::tempdir().unwrap();
    let mut h = host(notes.path());
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("daemon/tests/data/tool_args") {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        let Some((&pick, rest)) = data.split_first() else { continue };
        let name = [SEARCH, READ, NOTE, "no_such_tool", ""][usize::from(pick % 5)];
        let text = String::from_utf8_lossy(rest);
        call(&mut h, name, &text);
        let v = json!({"query": text, "handle": text, "title": text, "text": text});
        call(&mut h, name, &v.to_string());
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir.display());
}

/// Any JSON value: strings of any unicode and size, any number.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
        "\\PC{0,200}".prop_map(Value::String),
        // Long titles of multi-byte characters (the slug's cut).
        ("[a-zé日🎉 -]{0,3}", "[é日🎉]{20,80}").prop_map(|(a, b)| Value::String(a + &b)),
        Just(json!("S1")),
        Just(json!(" [S2] ")),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Arguments as a model writes them: the keys the tools read, with any
/// values, other keys, or any text at all.
fn any_arguments() -> impl Strategy<Value = String> {
    let keys = prop::sample::select(vec![
        "query", "limit", "handle", "segment", "title", "text", "", "Query",
    ]);
    prop_oneof![
        prop::collection::vec((keys, any_json()), 0..5).prop_map(|kv| {
            Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()).to_string()
        }),
        any_json().prop_map(|v| v.to_string()),
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Every built-in tool (and an unknown name) takes any arguments and
    /// returns a result; a search first, so reads meet real handles.
    #[test]
    fn every_tool_takes_any_arguments(
        calls in prop::collection::vec(
            (prop::sample::select(vec![SEARCH, READ, NOTE, "no_such_tool"]), any_arguments()),
            1..6,
        )
    ) {
        let notes = tempfile::tempdir().unwrap();
        let mut h = host(notes.path());
        call(&mut h, SEARCH, r#"{"query": "budget unicode word"}"#);
        for (name, args) in &calls {
            call(&mut h, name, args);
        }
    }
}
