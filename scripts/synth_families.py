#!/usr/bin/env python3
"""Writes tiny GGUF files of the model families the engine runs (or must refuse), each with the
tensor names, shapes, types and metadata keys that llama.cpp's converter writes for the real
models, and seeded random weights: files to compare the engine with llama.cpp on, family by
family, without downloading a model.

    python3 scripts/synth_families.py --family qwen2 --out /tmp/qwen2.gguf
    python3 scripts/synth_families.py --list
    python3 scripts/synth_families.py --family qwen3moe --shape bench --out /tmp/moe.gguf

Needs numpy and the `gguf` package (llama.cpp's gguf-py), pinned in tests/deps/requirements.txt
(the test venv, scripts/test-deps.sh). The same arguments give the same bytes on every run and
machine (numpy's default_rng with a seed per family; F16 rounding is exact): the fixture
inference/tests/data/reference/families.jsonl holds each file's sha256, and the test
inference/tests/families.rs checks it before it compares greedy ids with llama.cpp's
(scripts/family_reference.py makes that fixture; the reference README says how).

Families (what each mirrors; "converter" is llama.cpp's convert_hf_to_gguf.py, whose
per-architecture code is in conversion/*.py of the llama.cpp that scripts/build-llamacpp.sh
builds):

  llama3      Llama 3.2: llama arch, rope base 500000, `rope_freqs.weight` computed as the
              converter computes the "llama3" factors (factor 8, low_freq_factor 1,
              high_freq_factor 4, original context 8192), head_dim keys
  qwen2       Qwen2.5: q/k/v biases, NeoX RoPE (base 1e6)
  qwen2-yarn  the same with the converter's YaRN keys: rope.scaling.type yarn, factor 4,
              original_context_length 512, context_length = factor x original
  qwen3       Qwen3: per-head q/k RMS norms, head_dim x heads != n_embd
  gemma2      Gemma 2: (1 + w) norms as the converter stores them, post-attention and
              post-feed-forward norms, attention and final soft-capping, tied embeddings,
              sliding window (128) on every other layer
  phi3        Phi-4-mini: fused attn_qkv, gate and up fused in ffn_up (gate first), partial
              rotary (0.75), longrope: rope_factors_long/short, rope.scaling.attn_factor and
              rope.scaling.original_context_length (512; context_length 32 x that), sliding
              window key (262144), tied embeddings; no rope.scaling.type key (the converter
              writes none for phi3: the factor tensors are the longrope)
  phi3-twin   a llama file of phi3's sizes (separate q/k/v and gate/up): the speed twin
  qwen3moe    Qwen3-30B-A3B: ffn_gate_inp (F32), ffn_{gate,up,down}_exps, expert_count,
              expert_used_count, expert_feed_forward_length, q/k norms
  qwen3moe-twin  a dense qwen3 with qwen3moe's attention and a feed-forward of the active
              experts' size (expert_used_count x expert_feed_forward_length): the speed twin
  unknown     a dense deepseek2 (MLA attention: q_a/q_b, kv_a_mqa, k_b/v_b), an architecture
              llama.cpp runs and the engine must refuse, naming it
  bad-scaling a llama file whose rope.scaling.type is `dynamic`, a scaling the engine does not
              implement and must refuse, naming it

Shapes: `test` (default: n_embd 128, 3 or 4 layers, 512-token vocabulary, for the tests),
`bench` (n_embd 1024: qwen3moe with 16 experts, 4 active, and its twin; phi3 and its twin;
gemma2 with eight of Gemma-2-2B's layers: n_embd 2304, heads of 256, window 4096), `mini`
(phi3 only: four of Phi-3-mini's layers — n_embd 3072, 32 heads of 96, no grouping, feed-forward
8192 — a head size that is not a multiple of 64) and
`8b` (llama3 only: Llama-3.1-8B's layers — n_embd 4096, 32 layers, 32 heads, 8 KV heads, head
size 128, feed-forward 14336, context 131072 with `rope_freqs` — and this script's vocabulary;
about 15 GB of F16, held in memory while written).

Every file has the same small byte-level BPE vocabulary (`gpt2` model, 256 byte tokens, 253
merges learnt from the text below, `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`; no BOS
added): the tests feed token ids, so only llama.cpp's and the engine's acceptance of it
matter. Matrices are F16 and norms, biases, rope factors and the MoE router F32, as the
converter writes an F16 conversion. The scales make every block matter and greedy choices
clear: attention scores of a few units (so positions and RoPE matter), block outputs that
outweigh the token's own embedding, logits with a spread of about 16 (the output matrix);
the output rows of the special tokens and of the bytes 0x80-0xFF are zero (never chosen:
generation never stops early, and every generated token is text), and each family's seed
keeps llama.cpp's greedy choices at least 0.25 nats from a tie (SEEDS).

--mutate NAME (or AGENTD_FAMILIES_MUTATE=NAME) writes the file without one thing that changes
the numbers, every random draw still made so the rest is identical: drop-rope-freqs (llama3),
drop-bias (qwen2, qwen2-yarn: the q/k/v biases), drop-yarn (qwen2-yarn: the scaling keys),
drop-rope-factors (phi3), drop-qk-norm (qwen3, qwen3moe). The families test accepts the
changed sha256 under that variable and must then fail on the greedy ids.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import Counter

import numpy as np
import gguf

VOCAB = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
N_ORDINARY = VOCAB - len(SPECIALS)
# Token ids never generated (zero output rows, so a logit of 0 far below the best) and never
# in a prompt: the bytes 0x80-0xFF, no character alone (llama-server reports no probabilities
# for a token that ends inside a character), and the special tokens (so generation never
# stops early at an end-of-turn token).
SILENT = list(range(128, 256)) + list(range(N_ORDINARY, VOCAB))
# The ids a prompt is drawn from.
PROMPT_IDS = [i for i in range(VOCAB) if i not in set(SILENT)]

# The text the vocabulary's merges are learnt from (any text would do; this one says what the
# files are for).
MERGE_TEXT = """
These files are small models written for tests. Each one has the names, shapes and keys of a
real model family, as the converter of llama.cpp writes them, and weights drawn from a seeded
random generator, so the same script gives the same bytes on every machine. Two engines that
compute the same thing choose the same token at every step of a greedy run: the logits are
spread wide, so that no choice is a near tie, and a long prompt of more than a thousand tokens
reaches the positions where rotary scaling changes the numbers. When an engine ignores a
tensor or a key that changes the numbers, the tokens part, and the test names the family.
The vocabulary is a byte level encoding with a few hundred merges; the prompts are token ids,
so the text does not matter. Attention with grouped heads, norms before and after each block,
mixtures of experts with a router that picks the best four of sixteen, fused projections of
queries, keys and values, biases, soft caps on the scores and the logits, sliding windows on
every other layer: each family brings its own, and each is checked against the reference.
"""

FAMILIES = [
    "llama3",
    "qwen2",
    "qwen2-yarn",
    "qwen3",
    "gemma2",
    "phi3",
    "phi3-twin",
    "qwen3moe",
    "qwen3moe-twin",
    "unknown",
    "bad-scaling",
]

MUTATIONS = {
    "drop-rope-freqs": {"llama3"},
    "drop-bias": {"qwen2", "qwen2-yarn"},
    "drop-yarn": {"qwen2-yarn"},
    "drop-rope-factors": {"phi3"},
    "drop-qk-norm": {"qwen3", "qwen3moe"},
}

# general.name: the model each family mirrors.
NAMES = {
    "llama3": "Llama 3.2",
    "qwen2": "Qwen2.5",
    "qwen2-yarn": "Qwen2.5 YaRN",
    "qwen3": "Qwen3",
    "gemma2": "Gemma 2",
    "phi3": "Phi 4 Mini",
    "phi3-twin": "Phi 4 Mini llama twin",
    "qwen3moe": "Qwen3 30B A3B",
    "qwen3moe-twin": "Qwen3 30B A3B dense twin",
    "unknown": "DeepSeek V2 dense",
    "bad-scaling": "Llama dynamic NTK",
}

# One seed per family (changing one changes that family's bytes and fixture only). For the
# families compared with llama.cpp, each is the first seed, counting up from a start of the
# author's choice, whose file keeps every greedy choice of both prompts at least 0.25 nats
# from a tie in llama.cpp (scripts/family_reference.py --search-seed counts up from the seed
# here); the twins share their family's.
SEEDS = {
    "llama3": 3002,
    "qwen2": 3002,
    "qwen2-yarn": 3103,
    "qwen3": 3005,
    "gemma2": 3135,
    "phi3": 3015,
    "phi3-twin": 3015,
    "qwen3moe": 3009,
    "qwen3moe-twin": 3009,
    "unknown": 3007,
    "bad-scaling": 3008,
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges: 256 byte tokens, merges learnt greedily from
    MERGE_TEXT (most frequent pair first, ties by the pair's text), then the specials."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    known = set(tokens)
    words = Counter(
        tuple(b2u[b] for b in w.encode("utf-8"))
        for w in re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", MERGE_TEXT)
    )
    merges: list[str] = []
    while len(tokens) < N_ORDINARY:
        pairs: Counter = Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            raise SystemExit("MERGE_TEXT is too short for the vocabulary")
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append(f"{a} {b}")
        if a + b not in known:
            known.add(a + b)
            tokens.append(a + b)
        merged: Counter = Counter()
        for w, n in words.items():
            out: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    types = [int(gguf.TokenType.NORMAL)] * len(tokens) + [int(gguf.TokenType.CONTROL)] * len(
        SPECIALS
    )
    return tokens + SPECIALS, types, merges


class Synth:
    """A GGUF being written: metadata through `w`, tensors through the helpers, which draw from
    one generator in call order (a dropped tensor is still drawn)."""

    def __init__(self, path: str, arch: str, family: str, seed: int, mutate: str | None):
        self.w = gguf.GGUFWriter(path, arch)
        self.rng = np.random.default_rng(seed)
        self.mutate = mutate
        self.family = family
        w = self.w
        w.add_type("model")
        # Not the family's name: llama.cpp's vocabulary loader treats a model whose name holds
        # "phi3" as Phi-3 (SentencePiece special tokens this vocabulary lacks).
        w.add_name(f"synthetic {NAMES[family]}")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def normal(self, shape: tuple[int, ...], std: float, mean: float = 0.0) -> np.ndarray:
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)) + np.float32(
            mean
        )

    def mat(self, name: str, shape: tuple[int, ...], std: float, keep: bool = True) -> np.ndarray:
        """An F16 matrix (or stack of matrices) of the given numpy shape (GGUF reverses it)."""
        m = self.normal(shape, std).astype(np.float16)
        if keep:
            self.w.add_tensor(name, m)
        return m

    def f32(self, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0,
            keep: bool = True) -> np.ndarray:
        v = self.normal(shape, std, mean).astype(np.float32)
        if keep:
            self.w.add_tensor(name, v)
        return v

    def norm(self, name: str, n: int, mean: float = 1.0, keep: bool = True) -> None:
        self.f32(name, (n,), 0.1 * abs(mean), mean, keep)

    def vocab(self, pre: str) -> None:
        tokens, types, merges = vocabulary()
        w = self.w
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(VOCAB - 3)
        w.add_eos_token_id(VOCAB - 1)
        w.add_pad_token_id(VOCAB - 3)
        w.add_add_bos_token(False)

    def embeddings(self, d: int, std: float, name: str = "token_embd.weight") -> None:
        e = self.normal((VOCAB, d), std)
        e[SILENT] = 0  # never chosen when tied; never in a prompt
        self.w.add_tensor(name, e.astype(np.float16))

    def finish(self) -> None:
        w = self.w
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=False)
        w.close()


# Hyper-parameters per shape. d: n_embd; heads/kv: query and key-value heads; hd: head size;
# ff: feed-forward size; layers.
SHAPES = {
    "test": {
        "llama3": dict(d=128, heads=4, kv=2, hd=32, ff=256, layers=3),
        "qwen2": dict(d=128, heads=4, kv=2, hd=32, ff=256, layers=3),
        "qwen3": dict(d=128, heads=4, kv=2, hd=64, ff=256, layers=3),
        "gemma2": dict(d=128, heads=4, kv=2, hd=64, ff=256, layers=4),
        "phi3": dict(d=128, heads=4, kv=2, hd=32, ff=256, layers=3),
        "qwen3moe": dict(d=128, heads=4, kv=2, hd=64, ff=384, layers=3, experts=16, used=4,
                         ff_exp=64),
        "deepseek2": dict(d=128, heads=4, layers=2, ff=256, q_lora=64, kv_lora=64, rope=16,
                          nope=32, v=32),
    },
    "bench": {
        "phi3": dict(d=1024, heads=8, kv=4, hd=128, ff=2752, layers=8),
        # Llama-3.1-8B's layers (the vocabulary stays this script's): `--shape 8b`.
        "llama3-8b": dict(d=4096, heads=32, kv=8, hd=128, ff=14336, layers=32),
        "qwen3moe": dict(d=1024, heads=16, kv=4, hd=128, ff=3072, layers=4, experts=16, used=4,
                         ff_exp=768),
        # Phi-3-mini's layers (heads of 96, no grouping): `--shape mini`, four of its 32.
        "phi3-mini": dict(d=3072, heads=32, kv=32, hd=96, ff=8192, layers=4),
        # Gemma-2-2B's layers (heads of 256, soft-capped scores, a window of 4096 on every other
        # layer), eight of its 26.
        "gemma2": dict(d=2304, heads=8, kv=4, hd=256, ff=9216, layers=8, window=4096),
    },
}

# Attention scores of about this spread (in units of the score before softmax), and logits of
# about LOGIT_STD: far from ties, and positions matter.
SCORE_STD = 4.0
LOGIT_STD = 16.0
# Output scales of the attention and feed-forward blocks against token embeddings of RMS 1:
# the context, not the last token alone, decides the next token.
ATTN_GAIN = 3.0
FFN_GAIN = 2.0
# The same with tied embeddings (phi3 and its twin), whose rows have RMS LOGIT_STD/sqrt(d).
TIED_GAIN = 12.0
# gemma2's post-attention and post-feed-forward norms (its blocks' output scale) against
# embeddings scaled by sqrt(d).
GEMMA_POST_NORM = 25.0


def llama_like(s: Synth, p: dict, *, bias: bool = False, qk_norm: bool = False,
               tied: bool = False, fused: bool = False, moe: bool = False,
               drop_bias: bool = False, drop_qk_norm: bool = False) -> None:
    """The tensors of the llama family (llama, qwen2, qwen3, qwen3moe, phi3): embeddings,
    per layer attention and feed-forward, output norm and matrix."""
    d, heads, kv, hd, ff = p["d"], p["heads"], p["kv"], p["hd"], p["ff"]
    qd, kd = heads * hd, kv * hd
    out_std = LOGIT_STD / math.sqrt(d)
    s.embeddings(d, out_std if tied else 1.0)
    # Tied embeddings are the output matrix: a residual stream led by the token's own row
    # would make every token's best next token itself. The blocks' outputs outweigh it.
    ga, gf = (TIED_GAIN, TIED_GAIN) if tied else (ATTN_GAIN, FFN_GAIN)
    # q·k/sqrt(hd) has a spread of qk_std^2 · d; with q/k norms the norms' weights set it.
    qk_std = math.sqrt(SCORE_STD / d) if not qk_norm else 1.0 / math.sqrt(d)
    for i in range(p["layers"]):
        t = f"blk.{i}."
        s.norm(t + "attn_norm.weight", d)
        if fused:
            q = s.normal((qd, d), qk_std)
            k = s.normal((kd, d), qk_std)
            v = s.normal((kd, d), 1.0 / math.sqrt(d))
            s.w.add_tensor(t + "attn_qkv.weight", np.concatenate([q, k, v]).astype(np.float16))
        else:
            s.mat(t + "attn_q.weight", (qd, d), qk_std)
            s.mat(t + "attn_k.weight", (kd, d), qk_std)
            s.mat(t + "attn_v.weight", (kd, d), 1.0 / math.sqrt(d))
        if bias:
            keep = not drop_bias
            s.f32(t + "attn_q.bias", (qd,), 1.0, keep=keep)
            s.f32(t + "attn_k.bias", (kd,), 1.0, keep=keep)
            s.f32(t + "attn_v.bias", (kd,), 0.5, keep=keep)
        s.mat(t + "attn_output.weight", (d, qd), ga / math.sqrt(qd))
        if qk_norm:
            # q and k of RMS 1 times these weights: scores spread about SCORE_STD.
            g = math.sqrt(SCORE_STD)
            s.norm(t + "attn_q_norm.weight", hd, g, keep=not drop_qk_norm)
            s.norm(t + "attn_k_norm.weight", hd, g, keep=not drop_qk_norm)
        s.norm(t + "ffn_norm.weight", d)
        if moe:
            e, fe = p["experts"], p["ff_exp"]
            s.f32(t + "ffn_gate_inp.weight", (e, d), 2.0 / math.sqrt(d))
            s.mat(t + "ffn_gate_exps.weight", (e, fe, d), 1.0 / math.sqrt(d))
            s.mat(t + "ffn_up_exps.weight", (e, fe, d), 1.0 / math.sqrt(d))
            s.mat(t + "ffn_down_exps.weight", (e, d, fe), gf / math.sqrt(fe))
        elif fused:
            gate = s.normal((ff, d), 1.0 / math.sqrt(d))
            up = s.normal((ff, d), 1.0 / math.sqrt(d))
            s.w.add_tensor(t + "ffn_up.weight", np.concatenate([gate, up]).astype(np.float16))
            s.mat(t + "ffn_down.weight", (d, ff), gf / math.sqrt(ff))
        else:
            s.mat(t + "ffn_gate.weight", (ff, d), 1.0 / math.sqrt(d))
            s.mat(t + "ffn_up.weight", (ff, d), 1.0 / math.sqrt(d))
            s.mat(t + "ffn_down.weight", (d, ff), gf / math.sqrt(ff))
    s.norm("output_norm.weight", d)
    if not tied:
        out = s.normal((VOCAB, d), out_std)
        out[SILENT] = 0
        s.w.add_tensor("output.weight", out.astype(np.float16))


def common_keys(s: Synth, p: dict, ctx: int, base: float, eps: float) -> None:
    """The keys TextModel.set_gguf_parameters writes (conversion/base.py)."""
    w = s.w
    w.add_block_count(p["layers"])
    w.add_context_length(ctx)
    w.add_embedding_length(p["d"])
    w.add_feed_forward_length(p["ff"])
    w.add_head_count(p["heads"])
    w.add_head_count_kv(p["kv"])
    w.add_rope_freq_base(base)
    w.add_layer_norm_rms_eps(eps)


def llama3_factors(hd: int, base: float) -> np.ndarray:
    """LlamaModel.generate_extra_tensors (conversion/llama.py), rope_type llama3."""
    factor, low, high, old = 8.0, 1.0, 4.0, 8192
    freqs = 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_llama3(s: Synth, p: dict) -> None:
    base = 500000.0
    common_keys(s, p, 131072, base, 1e-5)
    s.w.add_key_length(p["hd"])
    s.w.add_value_length(p["hd"])
    s.w.add_vocab_size(VOCAB)
    s.w.add_rope_dimension_count(p["hd"])
    s.vocab("llama-bpe")
    if s.mutate != "drop-rope-freqs":
        s.w.add_tensor("rope_freqs.weight", llama3_factors(p["hd"], base))
    llama_like(s, p)


def write_bad_scaling(s: Synth, p: dict) -> None:
    common_keys(s, p, 8192, 10000.0, 1e-5)
    s.w.add_vocab_size(VOCAB)
    s.w.add_rope_dimension_count(p["hd"])
    # The key is a string; `dynamic` (Hugging Face's dynamic NTK) is no scaling llama.cpp has.
    s.w.add_string(gguf.Keys.Rope.SCALING_TYPE.format(arch=s.w.arch), "dynamic")
    s.w.add_rope_scaling_factor(2.0)
    s.vocab("llama-bpe")
    llama_like(s, p)


def write_qwen2(s: Synth, p: dict, yarn: bool) -> None:
    factor, orig = 4.0, 512
    common_keys(s, p, int(factor * orig) if yarn else 32768, 1000000.0, 1e-6)
    if yarn and s.mutate != "drop-yarn":
        s.w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        s.w.add_rope_scaling_factor(factor)
        s.w.add_rope_scaling_orig_ctx_len(orig)
    s.vocab("qwen2")
    llama_like(s, p, bias=True, drop_bias=s.mutate == "drop-bias")


def write_qwen3(s: Synth, p: dict) -> None:
    common_keys(s, p, 40960, 1000000.0, 1e-6)
    s.w.add_key_length(p["hd"])
    s.w.add_value_length(p["hd"])
    s.vocab("qwen2")
    llama_like(s, p, qk_norm=True, drop_qk_norm=s.mutate == "drop-qk-norm")


def write_qwen3moe(s: Synth, p: dict) -> None:
    common_keys(s, p, 40960, 1000000.0, 1e-6)
    s.w.add_expert_count(p["experts"])
    s.w.add_expert_used_count(p["used"])
    s.w.add_key_length(p["hd"])
    s.w.add_value_length(p["hd"])
    s.w.add_expert_feed_forward_length(p["ff_exp"])
    s.vocab("qwen2")
    llama_like(s, p, qk_norm=True, moe=True, drop_qk_norm=s.mutate == "drop-qk-norm")


def write_qwen3moe_twin(s: Synth, p: dict) -> None:
    dense = dict(p, ff=p["used"] * p["ff_exp"])
    write_qwen3(s, dense)


def write_gemma2(s: Synth, p: dict) -> None:
    """Gemma2Model (conversion/gemma.py): no rope keys (base 10000), norms stored as 1 + w."""
    d, heads, kv, hd, ff = p["d"], p["heads"], p["kv"], p["hd"], p["ff"]
    qd, kd = heads * hd, kv * hd
    w = s.w
    w.add_context_length(8192)
    w.add_embedding_length(d)
    w.add_block_count(p["layers"])
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)
    w.add_sliding_window(p.get("window", 128))
    s.vocab("default")
    # Tied: the embeddings are scaled by sqrt(d) on input and are the output matrix. Logits
    # spread ~8 before the final cap of 30; the post norms (GEMMA_POST_NORM) make the blocks
    # outweigh the token's own scaled row.
    s.embeddings(d, 8.0 / math.sqrt(d))
    qk_std = math.sqrt(SCORE_STD / d)
    for i in range(p["layers"]):
        t = f"blk.{i}."
        s.norm(t + "attn_norm.weight", d)
        s.mat(t + "attn_q.weight", (qd, d), qk_std)
        s.mat(t + "attn_k.weight", (kd, d), qk_std)
        s.mat(t + "attn_v.weight", (kd, d), 1.0 / math.sqrt(d))
        s.mat(t + "attn_output.weight", (d, qd), 1.0 / math.sqrt(qd))
        s.norm(t + "post_attention_norm.weight", d, GEMMA_POST_NORM)
        s.norm(t + "ffn_norm.weight", d)
        s.mat(t + "ffn_gate.weight", (ff, d), 1.0 / math.sqrt(d))
        s.mat(t + "ffn_up.weight", (ff, d), 1.0 / math.sqrt(d))
        s.mat(t + "ffn_down.weight", (d, ff), 1.0 / math.sqrt(ff))
        s.norm(t + "post_ffw_norm.weight", d, GEMMA_POST_NORM)
    s.norm("output_norm.weight", d)


def write_phi3(s: Synth, p: dict) -> None:
    """Phi3MiniModel (conversion/phi.py) on a Phi-4-mini-like config: partial_rotary_factor
    0.75, longrope with long/short factors, tied embeddings, GPT-2 tokenizer."""
    d, heads, hd = p["d"], p["heads"], p["hd"]
    assert heads * hd == d, "phi3's attn_output is n_embd x n_embd in llama.cpp"
    orig, ctx = 512, 512 * 32
    rope_dims = int(0.75 * d) // heads
    w = s.w
    w.add_context_length(ctx)
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_embedding_length(d)
    w.add_feed_forward_length(p["ff"])
    w.add_block_count(p["layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(p["kv"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(262144)
    scale = ctx / orig
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
    s.vocab("gpt-4o")
    n = rope_dims // 2
    # Shaped like Phi-4-mini's: short factors near 1, long ones growing to tens.
    long = np.geomspace(1.0, 40.0, n).astype(np.float32)
    short = np.linspace(1.0, 1.3, n).astype(np.float32)
    if s.mutate != "drop-rope-factors":
        w.add_tensor("rope_factors_long.weight", long)
        w.add_tensor("rope_factors_short.weight", short)
    llama_like(s, p, tied=True, fused=True)


def write_phi3_twin(s: Synth, p: dict) -> None:
    common_keys(s, p, 16384, 10000.0, 1e-5)
    s.w.add_vocab_size(VOCAB)
    s.w.add_rope_dimension_count(p["hd"])
    s.vocab("gpt-4o")
    llama_like(s, p, tied=True)


def write_deepseek2(s: Synth, p: dict) -> None:
    """DeepseekV2Model (conversion/deepseek.py) without routed experts (every layer dense,
    as it converts such a config): MLA attention as MQA with k_b/v_b split from kv_b."""
    d, heads, ff = p["d"], p["heads"], p["ff"]
    ql, kvl, rope, nope, v = p["q_lora"], p["kv_lora"], p["rope"], p["nope"], p["v"]
    w = s.w
    w.add_block_count(p["layers"])
    w.add_context_length(4096)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_leading_dense_block_count(p["layers"])
    w.add_vocab_size(VOCAB)
    w.add_q_lora_rank(ql)
    w.add_kv_lora_rank(kvl)
    w.add_key_length(kvl + rope)
    w.add_value_length(kvl)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v)
    w.add_expert_feed_forward_length(ff)
    w.add_expert_shared_count(0)
    w.add_rope_dimension_count(rope)
    s.vocab("qwen2")
    s.embeddings(d, 1.0)
    for i in range(p["layers"]):
        t = f"blk.{i}."
        s.norm(t + "attn_norm.weight", d)
        s.mat(t + "attn_q_a.weight", (ql, d), 1.0 / math.sqrt(d))
        s.norm(t + "attn_q_a_norm.weight", ql)
        s.mat(t + "attn_q_b.weight", (heads * (nope + rope), ql), 1.0 / math.sqrt(ql))
        s.mat(t + "attn_kv_a_mqa.weight", (kvl + rope, d), 1.0 / math.sqrt(d))
        s.norm(t + "attn_kv_a_norm.weight", kvl)
        s.mat(t + "attn_k_b.weight", (heads, kvl, nope), 1.0 / math.sqrt(kvl))
        s.mat(t + "attn_v_b.weight", (heads, v, kvl), 1.0 / math.sqrt(kvl))
        s.mat(t + "attn_output.weight", (d, heads * v), 1.0 / math.sqrt(heads * v))
        s.norm(t + "ffn_norm.weight", d)
        s.mat(t + "ffn_gate.weight", (ff, d), 1.0 / math.sqrt(d))
        s.mat(t + "ffn_up.weight", (ff, d), 1.0 / math.sqrt(d))
        s.mat(t + "ffn_down.weight", (d, ff), 1.0 / math.sqrt(ff))
    s.norm("output_norm.weight", d)
    out = s.normal((VOCAB, d), LOGIT_STD / math.sqrt(d))
    out[SILENT] = 0
    s.w.add_tensor("output.weight", out.astype(np.float16))


# family -> (GGUF architecture, shape entry, writer)
WRITERS = {
    "llama3": ("llama", "llama3", write_llama3),
    "qwen2": ("qwen2", "qwen2", lambda s, p: write_qwen2(s, p, yarn=False)),
    "qwen2-yarn": ("qwen2", "qwen2", lambda s, p: write_qwen2(s, p, yarn=True)),
    "qwen3": ("qwen3", "qwen3", write_qwen3),
    "gemma2": ("gemma2", "gemma2", write_gemma2),
    "phi3": ("phi3", "phi3", write_phi3),
    "phi3-twin": ("llama", "phi3", write_phi3_twin),
    "qwen3moe": ("qwen3moe", "qwen3moe", write_qwen3moe),
    "qwen3moe-twin": ("qwen3", "qwen3moe", write_qwen3moe_twin),
    "unknown": ("deepseek2", "deepseek2", write_deepseek2),
    "bad-scaling": ("llama", "llama3", write_bad_scaling),
}


def write(family: str, out: str, shape: str = "test", mutate: str | None = None,
          seed: int | None = None) -> None:
    """Writes FAMILY's file at OUT (replacing it); SEED replaces the family's (to search
    for one, scripts/family_reference.py --search-seed)."""
    arch, entry, fn = WRITERS[family]
    if shape in ("8b", "mini"):
        shape, entry = "bench", f"{entry}-{shape}"
    shapes = SHAPES[shape]
    if entry not in shapes:
        raise SystemExit(f"family {family} has no {shape} shape (bench: {', '.join(SHAPES['bench'])} and their twins)")
    if mutate is not None and family not in MUTATIONS[mutate]:
        raise SystemExit(f"mutation {mutate} applies to {', '.join(sorted(MUTATIONS[mutate]))}, not {family}")
    tmp = out + ".part"
    s = Synth(tmp, arch, family, SEEDS[family] if seed is None else seed, mutate)
    fn(s, shapes[entry])
    s.finish()
    os.replace(tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=FAMILIES)
    ap.add_argument("--shape", choices=[*SHAPES, "8b", "mini"], default="test")
    ap.add_argument("--mutate", choices=list(MUTATIONS),
                    default=os.environ.get("AGENTD_FAMILIES_MUTATE") or None)
    ap.add_argument("--out", help="the GGUF to write")
    ap.add_argument("--list", action="store_true", help="print the family names")
    a = ap.parse_args()
    if a.list:
        print("\n".join(FAMILIES))
        return
    if not a.family or not a.out:
        ap.error("--family and --out are needed")
    if a.mutate is not None and a.family not in MUTATIONS[a.mutate]:
        # The variable is set for a whole test run: families it does not touch stay as they are.
        if "AGENTD_FAMILIES_MUTATE" in os.environ and not any(
            x.startswith("--mutate") for x in sys.argv
        ):
            a.mutate = None
    write(a.family, a.out, a.shape, a.mutate)


if __name__ == "__main__":
    main()
