//! Prints the five largest logits after a prompt of token ids, then the
//! greedy continuation: for comparing the engine with llama.cpp by hand.
//!
//!     cargo run --release -p inference --example top -- MODEL 1,2,3 [N]
use inference::{Engine, EngineOptions, GenParams};
use std::sync::atomic::AtomicBool;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: top MODEL ID,ID,... [N]");
        std::process::exit(2);
    }
    let engine = Engine::load(
        std::path::Path::new(&args[1]),
        &EngineOptions { threads: Some(1), ..Default::default() },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<u32> = args[2].split(',').map(|t| t.trim().parse().expect("token id")).collect();
    let n = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(8);
    let mut s = engine.session();
    engine.eval(&mut s, &ids).unwrap_or_else(|e| panic!("{e}"));
    let lg = s.logits().to_vec();
    let mut idx: Vec<usize> = (0..lg.len()).collect();
    idx.sort_by(|&a, &b| lg[b].total_cmp(&lg[a]));
    for &i in &idx[..5] {
        println!("top {i} {:.6}", lg[i]);
    }
    let params = GenParams { max_tokens: n, ..GenParams::default() };
    let out = engine
        .generate(&mut engine.session(), &ids, &params, &AtomicBool::new(false), &mut |_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    println!("gen {:?}", out.ids);
}
