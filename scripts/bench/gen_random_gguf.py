#!/usr/bin/env python3
"""Writes a random-weight GGUF with the exact tensor shapes and metadata of a named model, to
measure load time, memory and speed at real sizes without downloading the weights (issue 32).

Every 2-D weight is Q8_0 (gguf.quants.quantize of seeded random normals), every norm weight and
bias F32, in llama.cpp's tensor names and the order its converter writes them (token_embd,
blk.0 ... blk.N-1, output_norm, output). The tokenizer is real: every `tokenizer.*` key is
copied from llama.cpp's vocabulary file of the model's family (~/.cache/rknpu-rs/llama.cpp/vocab/,
from scripts/llama-cpp.sh), and when the embedding has more rows than the vocabulary has tokens
the token list is padded as llama.cpp's converter pads it ("[PAD{id}]", type UNUSED, score
-1000), so that the tokenizer's n_vocab equals the embedding's rows.

Weights: every linear is N(0, (gain / sqrt(fan_in))^2), gain 2 by default (each projection
doubles the RMS of its normalised input; with gain 1 the attention is nearly uniform, every
position's state collapses onto the same direction with depth, and greedy decoding repeats 1-3
tokens: 3-7 distinct of 16 on the Qwen and TinyLlama shapes, against 16 of 16 with gain 2); the
embedding is N(0, 0.02^2) (--embd-std; larger makes a tied model repeat its input token);
norm weights are 1.0; Q/K/V biases N(0, 0.02^2). Logits stay O(1) (std ~0.6-2) and finite.
Each tensor has its own seeded generator (seed, tensor index), so the bytes do not depend on
the chunking.

The file is written tensor by tensor, in chunks of rows (about 4M values each): peak memory is
one chunk plus the metadata, whatever the model's size (~95 MB; the 8B file is ~8.5 GB). It
writes ~50-60 MB/s on one core (numpy's normals and gguf.quants' Q8_0): TinyLlama in ~25 s,
Qwen2.5-1.5B in ~35 s, Llama-3-8B would take ~2.5-3 minutes.

Presets: tiny (llama, 256 wide, 2 layers, vocab padded 32000 -> 32064), tinyllama-1.1b,
qwen2-0.5b, qwen2.5-1.5b, llama-3-8b, olmoe-1b-7b (a mixture of experts: 64 per layer, top 8,
stacked as blk.N.ffn_{gate,up,down}_exps with the router blk.N.ffn_gate_inp in F32, as
llama.cpp's converter writes them; 7.36 GB) and olmoe-1b-7b-dense (its dense twin: the same
attention and head, one feed-forward as wide as the 8 active experts; 1.36 GB), lfm2-8b-a1b
(Liquid LFM2-8B-A1B, architecture lfm2moe: 18 short-convolution and 6 attention layers, the
first 2 dense, the other 22 a mixture of 32 experts, top 4, with the router, the stacked experts
and the selection bias blk.N.exp_probs_b.bias; the conv kernels F32 as the converter keeps them;
8.87 GB) and lfm2-8b-a1b-dense (its dense twin, architecture lfm2: the same conv and attention
layers, one feed-forward of 4 x 1792 = 7168 in every layer; 1.66 GB), gemma2-2b (Gemma 2's four
norms a block, soft-capping and sliding-window keys; 2.79 GB) and phi3-3.8b (Phi-3-mini's fused
attn_qkv and gate+up ffn_up; 4.06 GB), the shapes of rknn_emu::cost's GEMMA2_2B and PHI3_3_8B
(--list prints their shapes).

Usage: ~/.cache/rknpu-rs/py/bin/python scripts/bench/gen_random_gguf.py NAME [NAME ...]
         [--out DIR] [--force] [--dry-run] [--seed N] [--gain G] [--embd-std S] [--list]
  default DIR: ~/.cache/rknpu-rs/models/random/ (file NAME-q8_0.gguf); an existing file of the
  expected size is kept unless --force. --dry-run prints the tensor list and the total bytes and
  writes nothing. Needs gguf==0.19.0 and numpy (re-runs itself in the cache's venv, installing
  them there, when this Python lacks them).
"""
import argparse
import io
import os
import subprocess
import sys
import time

CACHE = os.environ.get("RKNPU_CACHE", os.path.expanduser("~/.cache/rknpu-rs"))
VOCAB_DIR = os.path.join(CACHE, "llama.cpp", "vocab")
DEFAULT_OUT = os.path.join(CACHE, "models", "random")


def ensure_python_deps():
    """Re-runs this script under the cache's private venv (the one scripts/llama-cpp.sh and
    scripts/bench/llm_vs_llama_cpp.py use) with gguf and numpy, unless this Python has them."""
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.path.join(CACHE, "py")
    py = os.path.join(venv, "bin", "python3")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        sys.exit("gguf/numpy still missing from " + venv)
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "gguf==0.19.0", "numpy"], check=True)
    os.execv(py, [py] + sys.argv)


# name: architecture, widths, vocabulary file and tokenizer overrides. n_vocab is the
# embedding's rows (the tokenizer is padded up to it).
PRESETS = {
    "tiny": dict(
        arch="llama", label="tiny random llama (quick checks)", n_embd=256, n_layer=2,
        n_head=8, n_head_kv=4, n_ff=512, n_vocab=32064, n_ctx=2048, rope_base=10000.0,
        rms_eps=1e-5, tied=False, qkv_bias=False, vocab="ggml-vocab-llama-spm.gguf"),
    "tinyllama-1.1b": dict(
        arch="llama", label="TinyLlama 1.1B", n_embd=2048, n_layer=22, n_head=32, n_head_kv=4,
        n_ff=5632, n_vocab=32000, n_ctx=2048, rope_base=10000.0, rms_eps=1e-5, tied=False,
        qkv_bias=False, vocab="ggml-vocab-llama-spm.gguf"),
    "qwen2-0.5b": dict(
        arch="qwen2", label="Qwen2 0.5B", n_embd=896, n_layer=24, n_head=14, n_head_kv=2,
        n_ff=4864, n_vocab=151936, n_ctx=32768, rope_base=1e6, rms_eps=1e-6, tied=True,
        qkv_bias=True, vocab="ggml-vocab-qwen2.gguf",
        tok_overrides={"tokenizer.ggml.add_bos_token": False}),
    "qwen2.5-1.5b": dict(
        arch="qwen2", label="Qwen2.5 1.5B", n_embd=1536, n_layer=28, n_head=12, n_head_kv=2,
        n_ff=8960, n_vocab=151936, n_ctx=32768, rope_base=1e6, rms_eps=1e-6, tied=True,
        qkv_bias=True, vocab="ggml-vocab-qwen2.gguf",
        tok_overrides={"tokenizer.ggml.add_bos_token": False}),
    # Qwen/Qwen3-0.6B's config.json: hidden 1024, 28 layers, 16 heads and 8 KV heads of
    # head_dim 128 (wider than 1024 / 16: the converter writes qwen3.attention.key_length and
    # value_length), intermediate 3072, vocab 151936, tied, rope_theta 1e6, rms eps 1e-6, max
    # positions 40960, no q/k/v biases, per-head q and k norms (attn_q_norm / attn_k_norm of
    # head_dim). The tokenizer is Qwen2's.
    "qwen3-0.6b": dict(
        arch="qwen3", label="Qwen3 0.6B", n_embd=1024, n_layer=28, n_head=16, n_head_kv=8,
        head_dim=128, n_ff=3072, n_vocab=151936, n_ctx=40960, rope_base=1e6, rms_eps=1e-6,
        tied=True, qkv_bias=False, qk_norm_head=True, vocab="ggml-vocab-qwen2.gguf",
        tok_overrides={"tokenizer.ggml.add_bos_token": False}),
    # allenai/OLMoE-1B-7B-0924's config.json: 16 layers, hidden 2048, 16 heads (16 KV) of 128,
    # 64 experts, top 8 (no renormalisation), experts' intermediate 1024, vocab 50304, untied,
    # rope_theta 10000, rms eps 1e-5, max positions 4096. llama.cpp's olmoe keeps the experts'
    # width in olmoe.feed_forward_length and normalises Q and K over the whole projection
    # (attn_q_norm / attn_k_norm of n_embd). Its tokenizer (GPT-NeoX-based, 50280 tokens) has no
    # vocabulary file in llama.cpp; GPT-2's (50257 tokens, the same byte-level BPE family) is
    # padded to 50304 under the pre-tokenizer name the converter gives OLMo ("olmo").
    "olmoe-1b-7b": dict(
        arch="olmoe", label="OLMoE 1B-7B (0924)", n_embd=2048, n_layer=16, n_head=16,
        n_head_kv=16, n_ff=1024, n_vocab=50304, n_ctx=4096, rope_base=10000.0, rms_eps=1e-5,
        tied=False, qkv_bias=False, n_expert=64, n_expert_used=8, qk_norm_whole=True,
        vocab="ggml-vocab-gpt-2.gguf", tok_overrides={"tokenizer.ggml.pre": "olmo"}),
    # The dense twin of olmoe-1b-7b: the same attention, embedding and head, and one feed-forward
    # as wide as the 8 active experts together (8 x 1024 = 8192), as llama (no Q/K norms): the
    # weights one decoded token reads are OLMoE's active ones (1.28 B parameters). These are
    # also OLMo-1B's widths (2048, 16 layers, 16 heads, MLP 8192, vocab 50304), the dense model
    # the OLMoE paper sets beside OLMoE-1B-7B.
    "olmoe-1b-7b-dense": dict(
        arch="llama", label="dense twin of OLMoE 1B-7B's active weights", n_embd=2048,
        n_layer=16, n_head=16, n_head_kv=16, n_ff=8192, n_vocab=50304, n_ctx=4096,
        rope_base=10000.0, rms_eps=1e-5, tied=False, qkv_bias=False,
        vocab="ggml-vocab-gpt-2.gguf", tok_overrides={"tokenizer.ggml.pre": "olmo"}),
    # The campaign's 9B (docs/npu-matmul-performance.md, rknn_emu::cost::CAMPAIGN_9B: 36 layers,
    # hidden 4096, MLP 15360, 32 heads and 8 KV heads of 128, vocab 151936), as llama: what
    # llama.cpp's CPU path runs here to set this machine beside the campaign's four Cortex-A76
    # cores on the same shapes (scripts/bench/host_cost.py).
    "campaign-9b": dict(
        arch="llama", label="the campaign's 9B stand-in", n_embd=4096, n_layer=36, n_head=32,
        n_head_kv=8, n_ff=15360, n_vocab=151936, n_ctx=4096, rope_base=1e6, rms_eps=1e-6,
        tied=False, qkv_bias=False, vocab="ggml-vocab-qwen2.gguf",
        tok_overrides={"tokenizer.ggml.add_bos_token": False}),
    # LiquidAI/LFM2-8B-A1B's config.json (model_type lfm2_moe): hidden 2048, 24 layers whose
    # layer_types put full attention at layers 2, 6, 10, 14, 18 and 21 and a short convolution
    # (conv_L_cache 3, no bias) at the other 18, 32 heads over 8 KV heads (of 64), the first 2
    # layers dense (intermediate_size 7168), the other 22 a mixture of 32 experts of 1792
    # (moe_intermediate_size), top 4, sigmoid gating with the expert bias (use_expert_bias, the
    # converter's blk.N.exp_probs_b.bias) and norm_topk_prob (llama.cpp always renormalises for
    # lfm2moe), vocab 65536, tied embeddings, rope_theta 1e6, norm_eps 1e-5, max positions
    # 128000. Parameters: embedding 134.2 M, 18 conv layers x 16.78 M (in_proj 3 x 2048 x 2048,
    # out_proj, 3 taps a channel) = 302.0 M, 6 attention layers x 10.49 M = 62.9 M, 2 dense
    # feed-forwards x 44.04 M = 88.1 M, 22 mixtures x (32 x 11.01 M + the router) = 7751.5 M:
    # 8.340 B in all with the norms and routers, 1.558 B active (4 experts of 32, the routers
    # whole), Liquid's "8.3 B total, 1.5 B active".
    # Q8_0: 8.86 GB. The converter writes attention.head_count_kv per layer (0 on a conv
    # layer), shortconv.l_cache, vocab_size, expert_feed_forward_length,
    # leading_dense_block_count and expert_gating_func 2 (sigmoid), and no rope.dimension_count
    # or key_length (the head is 2048 / 32). LFM2's own tokenizer (65536 tokens, byte-level BPE,
    # pre-tokenizer "lfm2") has no vocabulary file in llama.cpp: GPT-2's is padded to 65536 under
    # the name "lfm2" (llama.cpp's and rknn-llm's LLaMA-3 pre-tokenizer regex for it).
    "lfm2-8b-a1b": dict(
        arch="lfm2moe", label="LFM2 8B-A1B", n_embd=2048, n_layer=24, n_head=32, n_head_kv=8,
        n_ff=7168, n_vocab=65536, n_ctx=128000, rope_base=1e6, rms_eps=1e-5, tied=True,
        qkv_bias=False, attn_layers=(2, 6, 10, 14, 18, 21), l_cache=3, n_dense_lead=2,
        n_expert=32, n_expert_used=4, n_ff_exp=1792, gating_func=2,
        vocab="ggml-vocab-gpt-2.gguf", tok_overrides={"tokenizer.ggml.pre": "lfm2"}),
    # The dense twin of lfm2-8b-a1b: the same conv and attention layers, embedding and head, and
    # in every layer one feed-forward as wide as the 4 active experts together (4 x 1792 =
    # 7168, the leading dense layers' width), as llama.cpp's dense lfm2 architecture: the
    # weights a decoded token reads are LFM2-8B-A1B's active ones less its routers (1.556 B).
    "lfm2-8b-a1b-dense": dict(
        arch="lfm2", label="dense twin of LFM2 8B-A1B's active weights", n_embd=2048,
        n_layer=24, n_head=32, n_head_kv=8, n_ff=7168, n_vocab=65536, n_ctx=128000,
        rope_base=1e6, rms_eps=1e-5, tied=True, qkv_bias=False,
        attn_layers=(2, 6, 10, 14, 18, 21), l_cache=3,
        vocab="ggml-vocab-gpt-2.gguf", tok_overrides={"tokenizer.ggml.pre": "lfm2"}),
    # google/gemma-2-2b's config.json: hidden 2304, 26 layers, 8 heads and 4 KV heads of
    # head_dim 256 (wider than 2304 / 8: the converter writes key_length and value_length),
    # intermediate 9216 (GELU-gated), vocab 256000, tied, rms eps 1e-6, max positions 8192,
    # attn_logit_softcapping 50, final_logit_softcapping 30, sliding_window 4096 (every other
    # layer), rope_theta 10000 (the converter writes no rope key: llama.cpp's default). Four
    # norms a block: attn_norm (input_layernorm), post_attention_norm, ffn_norm
    # (pre_feedforward_layernorm), post_ffw_norm; the converter adds 1 to every norm weight
    # (written 1.0 here). Gemma's own SentencePiece vocabulary (256000 pieces) has no file in
    # llama.cpp: LLaMA's SentencePiece one (32000, the same tokenizer model) is padded to
    # 256000.
    "gemma2-2b": dict(
        arch="gemma2", label="Gemma 2 2B", n_embd=2304, n_layer=26, n_head=8, n_head_kv=4,
        head_dim=256, n_ff=9216, n_vocab=256000, n_ctx=8192, rope_base=None, rms_eps=1e-6,
        tied=True, qkv_bias=False, post_norms=True, attn_softcap=50.0, final_softcap=30.0,
        sliding_window=4096, vocab="ggml-vocab-llama-spm.gguf",
        tok_overrides={"tokenizer.ggml.add_space_prefix": False}),
    # microsoft/Phi-3-mini-4k-instruct's config.json: hidden 3072, 32 layers, 32 heads and 32 KV
    # heads of 96, intermediate 8192, vocab 32064, untied, rope_theta 10000, rms eps 1e-5, max
    # positions 4096 (original 4096: no LongRoPE factors), sliding_window 2047. The converter
    # keeps the checkpoint's fused tensors: blk.N.attn_qkv (q, k, v rows stacked: 3 x 3072) and
    # blk.N.ffn_up holding gate then up (2 x 8192 rows), and writes
    # rope.scaling.original_context_length and attention.sliding_window. The tokenizer is
    # llama.cpp's Phi-3 vocabulary file (32064 tokens).
    "phi3-3.8b": dict(
        arch="phi3", label="Phi-3 mini 3.8B (4k)", n_embd=3072, n_layer=32, n_head=32,
        n_head_kv=32, n_ff=8192, n_vocab=32064, n_ctx=4096, rope_base=10000.0, rms_eps=1e-5,
        tied=False, qkv_bias=False, fused_qkv=True, fused_gate_up=True, orig_ctx=4096,
        sliding_window=2047, vocab="ggml-vocab-phi-3.gguf"),
    "llama-3-8b": dict(
        arch="llama", label="Llama 3 8B", n_embd=4096, n_layer=32, n_head=32, n_head_kv=8,
        n_ff=14336, n_vocab=128256, n_ctx=8192, rope_base=500000.0, rms_eps=1e-5, tied=False,
        qkv_bias=False, vocab="ggml-vocab-llama-bpe.gguf"),
}

FILE_TYPE_Q8_0 = 7  # llama_ftype LLAMA_FTYPE_MOSTLY_Q8_0
TOKEN_TYPE_UNUSED = 5
CHUNK_VALUES = 1 << 22  # values generated and quantized at once
LFM2_ARCHS = ("lfm2", "lfm2moe")
F32_KINDS = ("router", "conv")  # matrices the converter keeps in F32


def head_dim(p):
    """The attention head's width: the preset's head_dim (Qwen3's 128 over 1024 / 16), else
    n_embd / n_head."""
    return p.get("head_dim", p["n_embd"] // p["n_head"])


def tensor_plan(p):
    """(name, numpy shape (outputs, inputs) or (n,), kind) in the converter's order; kind is
    'embd', 'linear', 'norm' or 'bias'."""
    e, hd = p["n_embd"], head_dim(p)
    q, kv, ff = p["n_head"] * hd, p["n_head_kv"] * hd, p["n_ff"]
    plan = [("token_embd.weight", (p["n_vocab"], e), "embd")]
    if p["arch"] in LFM2_ARCHS:
        return plan + lfm2_layers(p) + [("token_embd_norm.weight", (e,), "norm")]
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        plan.append((b + "attn_norm.weight", (e,), "norm"))
        if p.get("fused_qkv"):
            plan.append((b + "attn_qkv.weight", (q + 2 * kv, e), "linear"))
        else:
            plan += [
                (b + "attn_q.weight", (q, e), "linear"),
                (b + "attn_k.weight", (kv, e), "linear"),
                (b + "attn_v.weight", (kv, e), "linear"),
            ]
        if p["qkv_bias"]:
            plan += [(b + "attn_q.bias", (q,), "bias"), (b + "attn_k.bias", (kv,), "bias"),
                     (b + "attn_v.bias", (kv,), "bias")]
        plan.append((b + "attn_output.weight", (e, q), "linear"))
        if p.get("qk_norm_whole"):
            plan += [(b + "attn_q_norm.weight", (q,), "norm"),
                     (b + "attn_k_norm.weight", (kv,), "norm")]
        if p.get("qk_norm_head"):
            plan += [(b + "attn_q_norm.weight", (hd,), "norm"),
                     (b + "attn_k_norm.weight", (hd,), "norm")]
        if p.get("post_norms"):
            plan.append((b + "post_attention_norm.weight", (e,), "norm"))
        plan.append((b + "ffn_norm.weight", (e,), "norm"))
        if p.get("n_expert"):
            # The router (F32: llama.cpp's converter never quantises ffn_gate_inp), then the
            # experts stacked as the converter merges them (down, gate, up): numpy shape
            # (n_expert, rows, cols) is ggml's ne [cols, rows, n_expert].
            ne = p["n_expert"]
            plan += [
                (b + "ffn_gate_inp.weight", (ne, e), "router"),
                (b + "ffn_down_exps.weight", (ne, e, ff), "linear"),
                (b + "ffn_gate_exps.weight", (ne, ff, e), "linear"),
                (b + "ffn_up_exps.weight", (ne, ff, e), "linear"),
            ]
        elif p.get("fused_gate_up"):
            # Phi-3's gate_up_proj as the converter keeps it: gate's rows, then up's.
            plan += [
                (b + "ffn_up.weight", (2 * ff, e), "linear"),
                (b + "ffn_down.weight", (e, ff), "linear"),
            ]
        else:
            plan += [
                (b + "ffn_gate.weight", (ff, e), "linear"),
                (b + "ffn_up.weight", (ff, e), "linear"),
                (b + "ffn_down.weight", (e, ff), "linear"),
            ]
        if p.get("post_norms"):
            plan.append((b + "post_ffw_norm.weight", (e,), "norm"))
    plan.append(("output_norm.weight", (e,), "norm"))
    if not p["tied"]:
        plan.append(("output.weight", (p["n_vocab"], e), "linear"))
    return plan


def lfm2_layers(p):
    """The blocks of lfm2 / lfm2moe (llama.cpp's tensors for them, as gen_tiny_models.py writes
    tiny-lfm2moe): the operator norm, then a short convolution (in_proj rows [B | C | x], the
    depthwise kernel of l_cache taps a channel, F32 as the converter keeps it, out_proj) or
    attention with per-head q/k norms; the feed-forward norm, then a dense SiLU-gated
    feed-forward (n_ff; every layer of lfm2, the first n_dense_lead of lfm2moe) or the router,
    the experts stacked as the converter merges them (w1, w2, w3: gate, down, up; n_ff_exp
    each) and the selection bias exp_probs_b.bias (F32, n_expert)."""
    e, hd = p["n_embd"], p["n_embd"] // p["n_head"]
    q, kv, ff = p["n_head"] * hd, p["n_head_kv"] * hd, p["n_ff"]
    plan = []
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        plan.append((b + "attn_norm.weight", (e,), "norm"))
        if i in p["attn_layers"]:
            plan += [
                (b + "attn_q.weight", (q, e), "linear"),
                (b + "attn_k.weight", (kv, e), "linear"),
                (b + "attn_v.weight", (kv, e), "linear"),
                (b + "attn_q_norm.weight", (hd,), "norm"),
                (b + "attn_k_norm.weight", (hd,), "norm"),
                (b + "attn_output.weight", (e, q), "linear"),
            ]
        else:
            plan += [
                (b + "shortconv.in_proj.weight", (3 * e, e), "linear"),
                (b + "shortconv.conv.weight", (e, p["l_cache"]), "conv"),
                (b + "shortconv.out_proj.weight", (e, e), "linear"),
            ]
        plan.append((b + "ffn_norm.weight", (e,), "norm"))
        if p.get("n_expert") and i >= p["n_dense_lead"]:
            ne, fx = p["n_expert"], p["n_ff_exp"]
            plan += [
                (b + "ffn_gate_inp.weight", (ne, e), "router"),
                (b + "ffn_gate_exps.weight", (ne, fx, e), "linear"),
                (b + "ffn_down_exps.weight", (ne, e, fx), "linear"),
                (b + "ffn_up_exps.weight", (ne, fx, e), "linear"),
                (b + "exp_probs_b.bias", (ne,), "bias"),
            ]
        else:
            plan += [
                (b + "ffn_gate.weight", (ff, e), "linear"),
                (b + "ffn_up.weight", (ff, e), "linear"),
                (b + "ffn_down.weight", (e, ff), "linear"),
            ]
    return plan


def q8_0_bytes(shape):
    *outer, cols = shape
    assert cols % 32 == 0, f"Q8_0 needs rows of a multiple of 32 values, not {cols}"
    rows = 1
    for d in outer:
        rows *= d
    return rows * (cols // 32) * 34


def n_values(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def tensor_bytes(shape, kind="linear"):
    """Q8_0 for a matrix or a stack of them, F32 for a vector, the router and a conv kernel."""
    return q8_0_bytes(shape) if len(shape) >= 2 and kind not in F32_KINDS else 4 * n_values(shape)


# GGUF value types: struct format of the scalar ones (8 is a string, 9 an array).
SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_kv(path, prefix):
    """The metadata keys of a GGUF file that start with `prefix`: {key: (value, type,
    sub_type)}. A small reader of its own: gguf.GGUFReader takes ~10 s over the 150k-token
    Qwen vocabulary (a memmap view per string)."""
    import struct

    with open(path, "rb") as f:
        buf = f.read()
    if buf[:4] != b"GGUF":
        sys.exit(f"{path} is not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        sys.exit(f"{path}: GGUF version {version} is not supported")
    pos = 24

    def string(pos):
        (n,) = struct.unpack_from("<Q", buf, pos)
        return buf[pos + 8:pos + 8 + n].decode("utf-8"), pos + 8 + n

    def value(vt, pos):
        if vt == 8:
            return string(pos)
        fmt = SCALAR_FMT[vt]
        return struct.unpack_from("<" + fmt, buf, pos)[0], pos + struct.calcsize(fmt)

    out = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (vt,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if vt == 9:
            st, n = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if st == 8:
                items = []
                for _ in range(n):
                    item, pos = string(pos)
                    items.append(item)
            else:
                fmt = SCALAR_FMT[st]
                items = list(struct.unpack_from(f"<{n}{fmt}", buf, pos))
                pos += n * struct.calcsize(fmt)
            v, sub = items, st
        else:
            v, pos = value(vt, pos)
            sub = None
        if key.startswith(prefix):
            out[key] = (v, vt, sub)
    return out


def read_vocab(p):
    """The tokenizer.* fields of the preset's llama.cpp vocabulary file, padded to n_vocab:
    [(key, value, type, sub_type)]."""
    from gguf import GGUFValueType as V

    path = os.path.join(VOCAB_DIR, p["vocab"])
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run scripts/llama-cpp.sh (it clones llama.cpp into the cache)")
    fields = {}
    for key, (v, vt, st) in read_kv(path, "tokenizer.").items():
        fields[key] = [v, V(vt), None if st is None else V(st)]
    n_tok = len(fields["tokenizer.ggml.tokens"][0])
    n = p["n_vocab"]
    if n_tok > n:
        sys.exit(f"{p['vocab']} has {n_tok} tokens, more than the {n} embedding rows")
    if n_tok < n:
        # llama.cpp's convert_hf_to_gguf.py: "[PAD{id}]" tokens of type UNUSED (score -1000).
        fields["tokenizer.ggml.tokens"][0] += [f"[PAD{i}]" for i in range(n_tok, n)]
        if "tokenizer.ggml.token_type" in fields:
            fields["tokenizer.ggml.token_type"][0] += [TOKEN_TYPE_UNUSED] * (n - n_tok)
        if "tokenizer.ggml.scores" in fields:
            fields["tokenizer.ggml.scores"][0] += [-1000.0] * (n - n_tok)
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in fields and len(fields[key][0]) != n:
            sys.exit(f"{p['vocab']}: {key} has {len(fields[key][0])} entries, not {n}")
    for key, val in p.get("tok_overrides", {}).items():
        vt = V.BOOL if isinstance(val, bool) else V.UINT32 if isinstance(val, int) else V.STRING
        fields[key] = [val, vt, None]
    return [(k, v[0], v[1], v[2]) for k, v in fields.items()], n_tok


def build_header(name, p, plan):
    """The file's bytes before the tensor data (header, metadata, tensor infos), unpadded."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q, GGUFWriter
    from gguf.gguf_writer import WriterState

    arch = p["arch"]
    w = GGUFWriter(None, arch)
    w.add_name(f"random-weight {p['label']} (scripts/bench/gen_random_gguf.py {name})")
    w.add_uint32("general.file_type", FILE_TYPE_Q8_0)
    w.add_uint32("general.quantization_version", 2)
    hd = head_dim(p)
    w.add_uint32(f"{arch}.vocab_size", p["n_vocab"])
    w.add_uint32(f"{arch}.context_length", p["n_ctx"])
    w.add_uint32(f"{arch}.embedding_length", p["n_embd"])
    w.add_uint32(f"{arch}.block_count", p["n_layer"])
    w.add_uint32(f"{arch}.feed_forward_length", p["n_ff"])
    w.add_uint32(f"{arch}.attention.head_count", p["n_head"])
    if arch in LFM2_ARCHS:
        # One entry per layer, 0 marking a short-convolution layer, as the converter writes it.
        w.add_head_count_kv([p["n_head_kv"] if i in p["attn_layers"] else 0
                             for i in range(p["n_layer"])])
        w.add_shortconv_l_cache(p["l_cache"])
    else:
        w.add_uint32(f"{arch}.attention.head_count_kv", p["n_head_kv"])
    if p["rope_base"] is not None:  # gemma2's converter writes no rope key
        w.add_float32(f"{arch}.rope.freq_base", p["rope_base"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", p["rms_eps"])
    # lfm2's converter writes no dimension count (the whole head rotates), nor gemma2's.
    if arch not in LFM2_ARCHS and p["rope_base"] is not None:
        w.add_uint32(f"{arch}.rope.dimension_count", hd)
    if "orig_ctx" in p:
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", p["orig_ctx"])
    if "attn_softcap" in p:
        w.add_float32(f"{arch}.attn_logit_softcapping", p["attn_softcap"])
        w.add_float32(f"{arch}.final_logit_softcapping", p["final_softcap"])
    if "sliding_window" in p:
        w.add_uint32(f"{arch}.attention.sliding_window", p["sliding_window"])
    if "head_dim" in p:
        w.add_uint32(f"{arch}.attention.key_length", hd)
        w.add_uint32(f"{arch}.attention.value_length", hd)
    fields, n_tok = read_vocab(p)
    for key, val, vt, st in fields:
        w.add_key_value(key, val, vt, sub_type=st)
    if p.get("n_expert"):
        w.add_uint32(f"{arch}.expert_count", p["n_expert"])
        w.add_uint32(f"{arch}.expert_used_count", p["n_expert_used"])
    if arch == "lfm2moe":
        w.add_expert_feed_forward_length(p["n_ff_exp"])
        w.add_leading_dense_block_count(p["n_dense_lead"])
        w.add_uint32(f"{arch}.expert_gating_func", p["gating_func"])
    for tname, shape, kind in plan:
        if len(shape) >= 2 and kind not in F32_KINDS:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), q8_0_bytes(shape), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), tensor_bytes(shape, kind))
    buf = io.BytesIO()
    w.fout = [buf]
    w.state = WriterState.EMPTY
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return buf.getvalue(), w.data_alignment, n_tok


def pad(n, align):
    return (n + align - 1) // align * align


def expected_size(header_len, plan, align):
    return pad(header_len, align) + sum(pad(tensor_bytes(s, k), align) for _, s, k in plan)


def write_tensor(fout, index, shape, kind, seed, gain, embd_std=0.02):
    """Writes one tensor's data, CHUNK_VALUES at a time."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    rng = np.random.default_rng([seed, index])
    if kind == "norm":
        np.ones(shape, dtype=np.float32).tofile(fout)
        return
    if kind == "bias":
        (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).tofile(fout)
        return
    cols = shape[-1]
    rows = n_values(shape) // cols  # a stack of experts: its matrices' rows one after another
    # A conv kernel's taps N(0, 1 / taps): the channel's variance kept, no gain.
    std = np.float32(embd_std if kind == "embd" else (1.0 if kind == "conv" else gain) / np.sqrt(cols))
    step = max(1, CHUNK_VALUES // cols)
    for r0 in range(0, rows, step):
        x = rng.standard_normal((min(step, rows - r0), cols), dtype=np.float32)
        x *= std
        if kind in F32_KINDS:
            x.tofile(fout)
        else:
            quantize(x, Q.Q8_0).tofile(fout)


def fmt_bytes(n):
    return f"{n / 1e9:.3f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def generate(name, out_dir, force, dry_run, seed, gain, embd_std=0.02):
    p = PRESETS[name]
    plan = tensor_plan(p)
    header, align, n_tok = build_header(name, p, plan)
    total = expected_size(len(header), plan, align)
    n_params = sum(n_values(s) for _, s, _ in plan)
    # A mixture's decoded token reads k of each layer's n experts (and the whole router).
    used = p.get("n_expert_used", 1) / p.get("n_expert", 1)
    n_active = sum(n_values(s) * (used if t.endswith("_exps.weight") else 1) for t, s, _ in plan)
    active = f" ({n_active / 1e9:.3f} B active)" if n_active != n_params else ""
    weight_bytes = sum(tensor_bytes(s, k) for _, s, k in plan)
    path = os.path.join(out_dir, f"{name}-q8_0.gguf")
    pad_note = f", padded from {n_tok} tokens" if n_tok < p["n_vocab"] else ""
    summary = (f"{name}: {p['arch']}, {len(plan)} tensors, {n_params / 1e9:.3f} B parameters{active}, "
               f"vocab {p['n_vocab']}{pad_note}, metadata {fmt_bytes(len(header))}, "
               f"tensor data {fmt_bytes(weight_bytes)}, file {total} bytes ({fmt_bytes(total)})")
    if dry_run:
        print(f"# {path} (dry run: nothing written)")
        for tname, shape, kind in plan:
            ty = "Q8_0" if len(shape) >= 2 and kind not in F32_KINDS else "F32"
            ne = list(reversed(shape))
            print(f"{tname:32} {ty:5} ne={ne!s:16} {tensor_bytes(shape, kind):>12} bytes")
        print(summary)
        return path, total
    if not force and os.path.exists(path) and os.path.getsize(path) == total:
        print(f"{path}: exists with the expected size ({fmt_bytes(total)}), kept (--force rewrites)")
        return path, total
    os.makedirs(out_dir, exist_ok=True)
    tmp = path + ".part"
    t0 = time.monotonic()
    with open(tmp, "wb") as fout:
        fout.write(header)
        fout.write(b"\0" * (pad(len(header), align) - len(header)))
        for i, (tname, shape, kind) in enumerate(plan):
            n = tensor_bytes(shape, kind)
            start = fout.tell()
            write_tensor(fout, i, shape, kind, seed, gain, embd_std)
            assert fout.tell() - start == n, (tname, fout.tell() - start, n)
            fout.write(b"\0" * (pad(n, align) - n))
    size = os.path.getsize(tmp)
    if size != total:
        sys.exit(f"{tmp}: wrote {size} bytes, expected {total}")
    os.replace(tmp, path)
    dt = time.monotonic() - t0
    print(summary)
    print(f"{path}: wrote {fmt_bytes(size)} in {dt:.1f} s ({size / dt / 1e6:.0f} MB/s)")
    return path, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help="presets: " + ", ".join(PRESETS))
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default %(default)s)")
    ap.add_argument("--force", action="store_true", help="rewrite an existing file")
    ap.add_argument("--dry-run", action="store_true", help="print the tensor list, write nothing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gain", type=float, default=2.0, help="linear weights' std x sqrt(fan_in)")
    ap.add_argument("--embd-std", type=float, default=0.02, help="token_embd's std")
    ap.add_argument("--list", action="store_true", help="print the presets and exit")
    a = ap.parse_args()
    if a.list:
        for n, p in PRESETS.items():
            print(f"{n:15} {p}")
        return
    if not a.names:
        ap.error("name at least one preset (--list shows them)")
    for n in a.names:
        if n not in PRESETS:
            ap.error(f"unknown preset {n!r}: one of {', '.join(PRESETS)}")
    ensure_python_deps()
    for n in a.names:
        generate(n, a.out, a.force, a.dry_run, a.seed, a.gain, a.embd_std)


if __name__ == "__main__":
    main()
