//! Streaming parse throughput per format: every recorded output of the
//! family, pushed one token-sized delta (4 bytes) at a time through a fresh
//! parser, as a local model's stream arrives.
//!
//! `cargo bench -p agentd-benches --bench toolparse_stream` prints MB/s per
//! family. At 200 tokens/s (~800 B/s) parsing must stay under 0.5% of decode
//! time, i.e. above ~0.16 MB/s.

use agentd_benches::recorded_by_family;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use toolparse::Parser;

fn stream(c: &mut Criterion) {
    let mut group = c.benchmark_group("toolparse_stream");
    for (family, items) in recorded_by_family() {
        let bytes: usize = items.iter().flat_map(|r| &r.deltas).map(String::len).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(family, |b| {
            b.iter(|| {
                let mut n = 0;
                for r in &items {
                    let mut p = Parser::new(r.format, r.options.clone());
                    for d in &r.deltas {
                        n += p.push(black_box(d)).len();
                    }
                    n += p.finish(r.reason).len();
                }
                n
            })
        });
    }
    group.finish();
}

criterion_group!(benches, stream);
criterion_main!(benches);
