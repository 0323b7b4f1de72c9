use inference::*;
use std::sync::atomic::AtomicBool;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let which: usize = std::env::args().nth(2).unwrap().parse().unwrap();
    let e = Engine::load(path.as_ref(), &EngineOptions{threads: Some(1), ..Default::default()}).unwrap();
    let line = std::fs::read_to_string("inference/tests/data/reference/smollm2-greedy.jsonl").unwrap().lines().nth(which).unwrap().to_owned();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let prompt: Vec<u32> = v["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let want: Vec<u32> = v["greedy_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let mut s = e.session();
    let mut ctx = prompt.clone();
    for (step, &w) in want.iter().enumerate() {
        let out = e.generate(&mut s, &ctx, &GenParams{max_tokens:1, ..Default::default()}, &AtomicBool::new(false), &mut |_|{}).unwrap();
        let l = s.logits();
        let mut idx: Vec<usize> = (0..l.len()).collect();
        idx.sort_by(|a,b| l[*b].total_cmp(&l[*a]));
        println!("step {step}: got {} want {w} top: {:?}", out.ids[0], idx[..3].iter().map(|&i| (i, l[i])).collect::<Vec<_>>());
        ctx.push(w);
    }
}
