#!/usr/bin/env python3
"""Writes tiny GGUF files of the embedding families the way llama.cpp's converter writes them
(conversion/bert.py: tensor names, shapes, metadata keys, the WordPiece vocabulary turned into
llama.cpp's "phantom space" form), with seeded random weights, for the engine's tests against
llama.cpp (`llama-server --embedding`; scripts/embed_reference.py records its vectors).

    python3 scripts/synth_embed.py --family bert --out /tmp/bert.gguf
    python3 scripts/synth_embed.py --family nomic-bert --out /tmp/nomic.gguf
    python3 scripts/synth_embed.py --family bert-rerank --out /tmp/rerank.gguf
    python3 scripts/synth_embed.py --family bert --shape bench --out /tmp/bert-bench.gguf

`--shape bench` writes the real models' sizes for throughput benchmarks (benches/embed.rs):
bert as all-MiniLM-L6 (384 wide, 6 layers, 12 heads, feed-forward 1536), nomic-bert as
nomic-embed-text (768 wide, 12 layers, 12 heads, feed-forward 3072), F16 weights.

Families:
  bert         all-MiniLM / bge layout: token, token-type and absolute position embeddings, an
               embedding LayerNorm, per layer q/k/v/output with biases, post-attention and
               post-feed-forward LayerNorms, a GELU feed-forward with biases; CLS pooling
               (bge's), non-causal attention
  nomic-bert   nomic-embed-text layout: fused attn_qkv, NeoX RoPE (base 1000), no position
               embeddings, SwiGLU feed-forward without biases; mean pooling
  bert-rerank  bge-reranker layout: bert with the classification head (cls, cls.output) and
               rank pooling

The vocabulary: [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4), then WordPiece word starts (stored
with the phantom-space prefix U+2581, as the converter writes them) and continuations (the
`##` prefix removed), from the words of WORDS and single characters, so that any ASCII text
tokenizes without [UNK]. Needs numpy and gguf (pinned in tests/deps/requirements.txt).
"""

from __future__ import annotations

import argparse
import math

import gguf
import numpy as np

WORDS = (
    "the a an of to in and is was for on with as by at from that this it be are were or "
    "research answer budget limit owner source model token daemon engine embed vector search "
    "question file read write run runs final round tool call text sky blue rust language "
    "printing press history century book books idea ideas europe fast slow memory context "
    "retrieval rank query document documents score scores"
).split()
PIECES = ["s", "ed", "ing", "er", "ly", "es", "tion", "al"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

SHAPES = {
    "bert": dict(d=64, heads=4, ff=128, layers=2, ctx=512),
    "nomic-bert": dict(d=64, heads=4, ff=128, layers=2, ctx=2048),
    "bert-rerank": dict(d=64, heads=4, ff=128, layers=2, ctx=512),
}
BENCH_SHAPES = {
    "bert": dict(d=384, heads=12, ff=1536, layers=6, ctx=512),
    "nomic-bert": dict(d=768, heads=12, ff=3072, layers=12, ctx=2048),
    "bert-rerank": dict(d=384, heads=12, ff=1536, layers=6, ctx=512),
}
SEEDS = {"bert": 4001, "nomic-bert": 4002, "bert-rerank": 4003}


def vocabulary() -> tuple[list[str], list[int]]:
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    chars += list(".,;:!?'\"()-[]{}/\\@#$%&*+=<>_~`^|")
    starts = list(dict.fromkeys(WORDS + chars))
    conts = list(dict.fromkeys(PIECES + chars))
    tokens = SPECIALS + ["\u2581" + w for w in starts] + conts
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIALS) + [int(gguf.TokenType.NORMAL)] * (
        len(tokens) - len(SPECIALS)
    )
    assert len(set(tokens)) == len(tokens)
    return tokens, types


class Writer:
    def __init__(self, path: str, arch: str, seed: int):
        self.w = gguf.GGUFWriter(path, arch)
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, std, mean=0.0):
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)

    def f16(self, name, shape, std):
        self.w.add_tensor(name, self.normal(shape, std).astype(np.float16))

    def f32(self, name, shape, std, mean=0.0):
        self.w.add_tensor(name, self.normal(shape, std, mean).astype(np.float32))


def write(family: str, out: str, shape: str = "test") -> None:
    p = (BENCH_SHAPES if shape == "bench" else SHAPES)[family]
    d, heads, ff, layers, ctx = p["d"], p["heads"], p["ff"], p["layers"], p["ctx"]
    hd = d // heads
    arch = "nomic-bert" if family == "nomic-bert" else "bert"
    s = Writer(out, arch, SEEDS[family])
    w = s.w
    w.add_type("model")
    w.add_name(f"synthetic {family}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(ctx)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    pooling = {
        "bert": gguf.PoolingType.CLS,
        "nomic-bert": gguf.PoolingType.MEAN,
        "bert-rerank": gguf.PoolingType.RANK,
    }[family]
    w.add_pooling_type(pooling)
    if arch == "nomic-bert":
        w.add_rope_freq_base(1000.0)
    tokens, types = vocabulary()
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_pad_token_id(0)
    w.add_unk_token_id(1)
    w.add_bos_token_id(2)  # [CLS]
    w.add_sep_token_id(3)
    w.add_mask_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)
    vocab = len(tokens)
    # Embeddings of RMS 1 before the embedding norm; blocks scaled so attention and the
    # feed-forward move the states (the vectors depend on the whole input).
    s.f16("token_embd.weight", (vocab, d), 1.0)
    # conversion/bert.py keeps the token-type embeddings in F32 (ggml adds a row of them).
    s.f32("token_types.weight", (2, d), 0.5)
    if arch == "bert":
        s.f16("position_embd.weight", (ctx, d), 0.5)
    s.f32("token_embd_norm.weight", (d,), 0.1, 1.0)
    s.f32("token_embd_norm.bias", (d,), 0.1)
    wstd = 1.0 / math.sqrt(d)
    for i in range(layers):
        b = f"blk.{i}."
        if arch == "nomic-bert":
            s.f16(b + "attn_qkv.weight", (3 * d, d), 2.0 * wstd)
        else:
            for t in ("q", "k", "v"):
                s.f16(b + f"attn_{t}.weight", (d, d), 2.0 * wstd)
                s.f32(b + f"attn_{t}.bias", (d,), 0.1)
        s.f16(b + "attn_output.weight", (d, d), wstd)
        if arch == "bert":
            s.f32(b + "attn_output.bias", (d,), 0.1)
        s.f32(b + "attn_output_norm.weight", (d,), 0.1, 1.0)
        s.f32(b + "attn_output_norm.bias", (d,), 0.1)
        if arch == "nomic-bert":
            s.f16(b + "ffn_up.weight", (ff, d), wstd)
            s.f16(b + "ffn_gate.weight", (ff, d), wstd)
            s.f16(b + "ffn_down.weight", (d, ff), 1.0 / math.sqrt(ff))
        else:
            s.f16(b + "ffn_up.weight", (ff, d), wstd)
            s.f32(b + "ffn_up.bias", (ff,), 0.1)
            s.f16(b + "ffn_down.weight", (d, ff), 1.0 / math.sqrt(ff))
            s.f32(b + "ffn_down.bias", (d,), 0.1)
        s.f32(b + "layer_output_norm.weight", (d,), 0.1, 1.0)
        s.f32(b + "layer_output_norm.bias", (d,), 0.1)
    if family == "bert-rerank":
        s.f16("cls.weight", (d, d), wstd)
        s.f32("cls.bias", (d,), 0.1)
        s.f16("cls.output.weight", (1, d), wstd)
        s.f32("cls.output.bias", (1,), 0.1)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=["test", "bench"], default="test")
    a = ap.parse_args()
    write(a.family, a.out, a.shape)


if __name__ == "__main__":
    main()
