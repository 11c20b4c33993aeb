#!/usr/bin/env python3
"""Write extra transformers reference checkpoints into tests/fixtures/.

Run with the Python environment of tools/README.md (`.venv-train`: torch 2.15, transformers 5.24,
safetensors 0.8); the paths are relative to the script, so any working directory will do:

    .venv-train/bin/python tools/make_fixtures.py            # every variant
    .venv-train/bin/python tools/make_fixtures.py --only llama-odd-heads

Each variant becomes a complete Hugging Face folder, laid out like the four hand-made
fixtures (see tests/fixtures/README.md): config.json, generation_config.json and the weights
written by `save_pretrained`, the 512-token byte-level BPE tokenizer copied from
tests/fixtures/llama-gqa, and expected.json with what transformers computes for the folder.

What each variant exercises:

- llama-bias-mha: LlamaForCausalLM with attention_bias (q/k/v/o biases) and mlp_bias
  (gate/up/down biases), full multi-head attention (4 KV heads for 4 heads), 3 layers, a
  config vocabulary of 520 padded beyond the tokenizer's 512, an intermediate size (136)
  that is no multiple of 16 (16-bit weights need even rows in pagellm), bfloat16 weights.
- qwen2-sharded-untied: Qwen2ForCausalLM with an untied LM head, linear rope scaling
  (factor 2) in transformers-5 spelling, grouped-query attention 4:2, float16 weights saved
  in three shards with model.safetensors.index.json.
- llama-odd-heads: head_dim 24 (no power of two, given explicitly), hidden size 72, 3 heads
  sharing one KV head (multi-query attention), an odd intermediate size (97, so the down
  projection's rows have odd length), tied embeddings, float32 weights.
- llama-tf4-config: a float32 Llama whose config.json is rewritten in transformers-4
  spelling: top-level "rope_theta": 500000.0 and "rope_scaling": {"type": "linear",
  "factor": 4.0}, "torch_dtype" instead of "dtype", no "head_dim" (derived from
  hidden_size / num_attention_heads). The expected outputs come from transformers loading
  that rewritten config; the script checks that it reads the rope settings as intended.
- qwen3-qknorm-window: Qwen3ForCausalLM with its per-head q/k RMSNorm, head_dim 32 against
  hidden 64 and 4 heads, tied embeddings, use_sliding_window with an 8-token window on the
  layers from max_window_layers = 1 on, bfloat16 weights.
- gemma2-softcap-window: Gemma2ForCausalLM: (1 + w) norms before and after attention and
  MLP, embeddings scaled by sqrt(hidden), GELU-tanh, query_pre_attn_scalar 24, attention
  soft-capping at 5 and final soft-capping at 30, layers sliding (window 8) / global /
  sliding, tied, float32 weights.
- gemma3-local-rope: Gemma3ForCausalLM (text): Gemma 2's graph plus (1 + w) q/k norms,
  layer_types sliding / sliding / global with window 8, a local rope (theta 1e4) and a
  global one (theta 1e6, linear factor 2), multi-query 4:1, tied, bfloat16 weights.
- llama-yarn: a float32 Llama with YaRN rope scaling (factor 4 over an original 64 of 256
  positions, beta_fast 16, beta_slow 1): head_dim 32, so the fastest frequencies are kept,
  the slowest divided by 4 and a ramp blends those between; cos and sin are multiplied by
  the attention factor 0.1 ln 4 + 1.
- mixtral-moe: MixtralForCausalLM, a mixture of 4 experts (intermediate 48), 2 per token, in
  both layers, tied, float32 weights.
- qwen3-moe-dense-layer: Qwen3MoeForCausalLM, 8 experts of intermediate 16, 3 per token,
  norm_topk_prob false (the chosen probabilities are not renormalised), a dense middle layer
  (mlp_only_layers [1]), q/k norms, tied, float32 weights.
- gpt-oss-sinks-moe: GptOssForCausalLM: attention biases and sinks (N(0, 1)), layers
  sliding (window 8) / full, YaRN, 4 biased experts (2 per token, top-k then softmax), a
  biased router, the clamped SwiGLU with a limit of 1.5 that gates and ups cross, tied,
  float32 weights stacked as transformers keeps them.
- gpt-oss-mxfp4: the same with its experts in MXFP4 as gpt-oss is released (blocks and
  scales written by this script, see mxfp4_pack; transformers dequantizes them to compute
  the expected outputs; needs the accelerate package).
- phi3-longrope-window: Phi3ForCausalLM with fused qkv_proj and gate_up_proj, LongRoPE
  (short and long factors; original 128 of 512 positions, so every greedy sequence stays in
  the short factors' range), an 8-token window on every layer, float16 weights.

The windowed variants' 8-token window is crossed several times by the long prompt and its
greedy continuation. Gemma multiplies its tied embedding by sqrt(hidden) = 8 on the way in,
so gemma2 keeps the embedding at x2 and scales its final norm by 32 instead.

How the numbers are made: weights start from transformers' own initialisation (seeded) and
are then scaled up so that next-token distributions are peaky, as in the original fixtures:
matrices x8; the untied LM heads (of the 16-bit variants) x64; tied embeddings stay at x8 and the
final norm's weights are multiplied by 8 instead (a large tied embedding dominates the
residual stream and greedy decoding just repeats its input); biases ~ N(0, 0.5) and norm
weights ~ U(0.6, 1.4) so that neither is a no-op. Padded vocabulary rows (beyond the
tokenizer's 512) get a quarter of the LM-head scale. Each variant tries seeds in a fixed
order and keeps the first whose greedy choices are clear at every step of every case: the
top-1 minus top-2 logprob gap must exceed 0.1 for float32 weights and 0.3 for
float16/bfloat16 weights (an f16 KV cache moves logprobs by a few hundredths), greedy
tokens must lie inside the tokenizer's vocabulary, and every case must produce at least 5
distinct greedy tokens. The script asserts all of this.

expected.json is computed by loading the written folder back with
AutoModelForCausalLM.from_pretrained(dtype=torch.float32, attn_implementation="eager"):
float32 compute from the on-disk weights, also for the 16-bit checkpoints (the original
16-bit fixtures, qwen2-bias-tied and mistral-f16, were computed in their own dtype instead);
expected.json says so in "note" and "compute_dtype": "float32", and also records the seed
and the smallest greedy gap. Greedy decoding
recomputes the whole sequence at each step (no KV cache). Logits are stored as the shortest
decimal that reads back as the same float32. For each variant the script also checks that
the feature it exercises matters: switching it off (zeroing a bias, dropping rope scaling)
must move the long prompt's logits.

The mixtures' routers are scaled up (x32 for mixtral-moe, x16 for the others) and
their seeds must also keep every token's choice of experts clear: the last chosen expert's
router logit above the first unchosen one's by ROUTER_GAP (0.01) at every token of every
case, prompts and greedy continuations; the script prints the smallest margin.

Everything is seeded and runs on one CPU thread, so reruns with the same package versions
give the same files. The whole run takes a few minutes (the Gemma 2 variant searches the most seeds).
"""

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
TOKENIZER_SOURCE = FIXTURES / "llama-gqa"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]
TOKENIZER_VOCAB = 512
GREEDY_STEPS = 16
# The GPU golden test allocates room for 64 prompt tokens; the long prompt must also cross
# several 16-token KV blocks (with its 16 greedy tokens it spans four).
PROMPTS = [
    "x",
    "Hello, world",
    'In 1887 the old keeper wrote: "Fog again; ships wait."\nShe lit the lamp.',
]
MIN_LONG_PROMPT = 40
MIN_DISTINCT = 5
MAX_PROMPT = 64

COMMON = dict(
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
    hidden_act="silu",
    initializer_range=0.02,
)


def rewrite_tf4(cfg: dict) -> dict:
    """config.json in the spelling of transformers 4 (Llama 3 era checkpoints)."""
    rope = cfg.pop("rope_parameters")
    out = {}
    for k, v in cfg.items():
        if k == "head_dim":
            continue
        if k == "dtype":
            k = "torch_dtype"
        out[k] = v
    out["rope_theta"] = rope["rope_theta"]
    out["rope_scaling"] = {"type": rope["rope_type"], "factor": rope["factor"]}
    out["transformers_version"] = "4.46.3"
    return dict(sorted(out.items()))


def check_tf4(model):
    p = model.config.rope_parameters
    assert p["rope_type"] == "linear" and p["factor"] == 4.0, p
    assert p["rope_theta"] == 500000.0, p
    assert model.config.head_dim == 16, model.config.head_dim
    # The attention really uses the scaled frequencies.
    inv = model.model.rotary_emb.inv_freq
    want = 1.0 / (500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)) / 4.0
    assert torch.allclose(inv, want), (inv, want)


def check_qwen2(model):
    p = model.config.rope_parameters
    assert p["rope_type"] == "linear" and p["factor"] == 2.0, p
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def check_bias_mha(model):
    a = model.model.layers[0].self_attn
    m = model.model.layers[0].mlp
    assert all(x.bias is not None for x in (a.q_proj, a.k_proj, a.v_proj, a.o_proj))
    assert all(x.bias is not None for x in (m.gate_proj, m.up_proj, m.down_proj))
    assert model.config.vocab_size == 520


def check_odd_heads(model):
    a = model.model.layers[0].self_attn
    assert a.head_dim == 24 and a.q_proj.out_features == 72 and a.k_proj.out_features == 24


# The windowed variants use an 8-token window: the long prompt (40+ tokens) and its greedy
# continuation cross it several times.
WINDOW = 8


def check_qwen3(model):
    c = model.config
    assert c.layer_types == ["full_attention", "sliding_attention", "sliding_attention"], c
    assert c.sliding_window == WINDOW and c.head_dim == 32 and c.hidden_size == 64
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (32,)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def check_gemma2(model):
    c = model.config
    assert c.layer_types == ["sliding_attention", "full_attention", "sliding_attention"], c
    assert c.attn_logit_softcapping == 5.0 and c.final_logit_softcapping == 30.0, c
    assert c.query_pre_attn_scalar == 24 and c.hidden_activation == "gelu_pytorch_tanh"


def check_gemma3(model):
    c = model.config
    assert c.layer_types == ["sliding_attention", "sliding_attention", "full_attention"], c
    p = c.rope_parameters
    assert p["full_attention"]["rope_type"] == "linear", p
    assert p["sliding_attention"]["rope_theta"] == 10000.0, p
    assert c.final_logit_softcapping is None


def check_phi3(model):
    c = model.config
    p = c.rope_parameters
    assert p["rope_type"] == "longrope" and len(p["short_factor"]) == 8, p
    assert c.sliding_window == WINDOW and c.original_max_position_embeddings == 128, c
    a = model.model.layers[0]
    assert a.self_attn.qkv_proj.out_features == 64 + 2 * 32
    assert a.mlp.gate_up_proj.out_features == 2 * 96
    # Every greedy sequence stays within the original context, where transformers uses the
    # short factors (pagellm caps the context there).
    rot = model.model.rotary_emb
    assert abs(rot.attention_scaling - (1 + np.log(4.0) / np.log(128.0)) ** 0.5) < 1e-6


def check_yarn(model):
    c = model.config
    p = c.rope_parameters
    assert p["rope_type"] == "yarn" and p["factor"] == 4.0, p
    assert p["original_max_position_embeddings"] == 64, p
    rot = model.model.rotary_emb
    # The paper's attention factor for a factor of 4, and frequencies of both kinds: the
    # fastest kept as they were (extrapolated), the slowest divided by the factor.
    assert abs(rot.attention_scaling - (0.1 * np.log(4.0) + 1.0)) < 1e-6
    head_dim = c.head_dim
    plain = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    assert torch.equal(rot.inv_freq[0], plain[0]), (rot.inv_freq, plain)
    assert torch.allclose(rot.inv_freq[-1], plain[-1] / 4.0), (rot.inv_freq, plain)


def zero(*suffixes):
    """An ablation that zeroes every tensor whose name ends with one of `suffixes`."""

    def f(cfg, sd):
        for k in sd:
            if k.endswith(suffixes):
                sd[k] = torch.zeros_like(sd[k])
        return cfg, sd

    return f


def setting(**kw):
    """An ablation that changes config fields."""

    def f(cfg, sd):
        for k, v in kw.items():
            setattr(cfg, k, v)
        return cfg, sd

    return f


def rope(params):
    def f(cfg, sd):
        cfg.rope_parameters = dict(params)
        return cfg, sd

    return f


VARIANTS = {
    "llama-bias-mha": dict(
        model=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            vocab_size=520,
            hidden_size=64,
            intermediate_size=136,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=False,
            **COMMON,
        ),
        dtype=torch.bfloat16,
        head_scale=64.0,
        first_seed=100,
        check=check_bias_mha,
        ablations={
            "o_proj bias zeroed": zero("o_proj.bias"),
            "k_proj bias zeroed": zero("k_proj.bias"),
            "down_proj bias zeroed": zero("down_proj.bias"),
            "gate_proj bias zeroed": zero("gate_proj.bias"),
        },
    ),
    "qwen2-sharded-untied": dict(
        model=Qwen2ForCausalLM,
        config=lambda: Qwen2Config(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            use_sliding_window=False,
            tie_word_embeddings=False,
            **COMMON,
        ),
        dtype=torch.float16,
        head_scale=64.0,
        shard="100KB",
        first_seed=200,
        check=check_qwen2,
        ablations={
            "no rope scaling": rope({"rope_type": "default", "rope_theta": 10000.0}),
        },
    ),
    "llama-odd-heads": dict(
        model=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            vocab_size=512,
            hidden_size=72,
            intermediate_size=97,
            num_hidden_layers=2,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=24,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
            **COMMON,
        ),
        dtype=torch.float32,
        # Tied: the embedding keeps the matrices' x8 (a larger one would dominate the
        # residual stream and make greedy decoding repeat the input token); the final
        # norm makes the logits peaky instead.
        head_scale=8.0,
        final_norm_scale=8.0,
        first_seed=300,
        check=check_odd_heads,
        ablations={},
    ),
    "llama-tf4-config": dict(
        model=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
            tie_word_embeddings=True,
            **COMMON,
        ),
        dtype=torch.float32,
        # Tied: the embedding keeps the matrices' x8 (a larger one would dominate the
        # residual stream and make greedy decoding repeat the input token); the final
        # norm makes the logits peaky instead.
        head_scale=8.0,
        final_norm_scale=8.0,
        rewrite_config=rewrite_tf4,
        first_seed=400,
        check=check_tf4,
        ablations={
            "no rope scaling": rope({"rope_type": "default", "rope_theta": 500000.0}),
            "default rope theta": rope(
                {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
            ),
        },
    ),
}

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 16.0,
    "beta_slow": 1.0,
    "rope_theta": 10000.0,
}

VARIANTS["llama-yarn"] = dict(
    model=LlamaForCausalLM,
    config=lambda: LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters=dict(YARN),
        tie_word_embeddings=True,
        **COMMON,
    ),
    dtype=torch.float32,
    head_scale=8.0,
    final_norm_scale=8.0,
    first_seed=900,
    check=check_yarn,
    ablations={
        "no rope scaling": rope({"rope_type": "default", "rope_theta": 10000.0}),
        "no attention factor": rope(dict(YARN, attention_factor=1.0)),
        "linear scaling instead": rope(
            {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
        ),
    },
)

def check_mixtral(model):
    c = model.config
    assert c.num_local_experts == 4 and c.num_experts_per_tok == 2, c
    moe = model.model.layers[0].mlp
    assert type(moe).__name__ == "MixtralSparseMoeBlock", type(moe)
    assert moe.experts.gate_up_proj.shape == (4, 2 * 48, 64), moe.experts.gate_up_proj.shape


def check_qwen3_moe(model):
    c = model.config
    assert c.num_experts == 8 and c.num_experts_per_tok == 3 and not c.norm_topk_prob, c
    kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
    assert kinds == ["Qwen3MoeSparseMoeBlock", "Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"], kinds
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (16,)


VARIANTS["mixtral-moe"] = dict(
    model=MixtralForCausalLM,
    config=lambda: MixtralConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        **COMMON,
    ),
    dtype=torch.float32,
    head_scale=8.0,
    final_norm_scale=8.0,
    router_scale=4.0,
    first_seed=1000,
    check=check_mixtral,
    ablations={
        "one expert per token": setting(num_experts_per_tok=1),
        "router weights zeroed": zero("mlp.gate.weight"),
    },
)

def check_gpt_oss(model):
    c = model.config
    assert c.layer_types == ["sliding_attention", "full_attention"], c.layer_types
    assert c.num_local_experts == 4 and c.num_experts_per_tok == 2 and c.sliding_window == WINDOW
    assert c.rope_parameters["rope_type"] == "yarn", c.rope_parameters
    layer = model.model.layers[0]
    assert layer.self_attn.sinks.shape == (4,)
    assert layer.mlp.experts.gate_up_proj.shape == (4, 64, 2 * 32)
    assert layer.mlp.router.bias is not None


def sinks_off(cfg, sd):
    """gpt-oss without its sinks: logits of -1e9 drop out of every softmax."""
    for k in sd:
        if k.endswith("self_attn.sinks"):
            sd[k] = torch.full_like(sd[k], -1e9)
    return cfg, sd


VARIANTS["gpt-oss-sinks-moe"] = dict(
    model=GptOssForCausalLM,
    config=lambda: GptOssConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=WINDOW,
        # A limit the gates and ups cross (7, gpt-oss's, they rarely reach here).
        swiglu_limit=1.5,
        tie_word_embeddings=True,
        **COMMON,
    ),
    dtype=torch.float32,
    head_scale=8.0,
    final_norm_scale=8.0,
    router_scale=2.0,
    first_seed=1200,
    check=check_gpt_oss,
    ablations={
        "sinks removed": sinks_off,
        "no clamping of the SwiGLU": setting(swiglu_limit=1e9),
        "router bias zeroed": zero("router.bias"),
        "sliding window off": setting(layer_types=["full_attention", "full_attention"]),
    },
)

# gpt-oss as released: its experts in MXFP4 (transformers reads them on a CPU by
# dequantizing).
VARIANTS["gpt-oss-mxfp4"] = dict(
    VARIANTS["gpt-oss-sinks-moe"],
    mxfp4=True,
    first_seed=1300,
    ablations={
        "sinks removed": sinks_off,
        "router bias zeroed": zero("router.bias"),
    },
)

VARIANTS["qwen3-moe-dense-layer"] = dict(
    model=Qwen3MoeForCausalLM,
    config=lambda: Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=False,
        mlp_only_layers=[1],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        **COMMON,
    ),
    dtype=torch.float32,
    head_scale=8.0,
    final_norm_scale=8.0,
    router_scale=2.0,
    first_seed=1100,
    check=check_qwen3_moe,
    ablations={
        "top-k renormalised": setting(norm_topk_prob=True),
        "dense layer's MLP zeroed": zero("layers.1.mlp.down_proj.weight"),
        "q_norm weights zeroed": zero("q_norm.weight"),
    },
)

GEMMA = dict(
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
    initializer_range=0.02,
    hidden_activation="gelu_pytorch_tanh",
)

VARIANTS.update(
    {
        "qwen3-qknorm-window": dict(
            model=Qwen3ForCausalLM,
            config=lambda: Qwen3Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                max_position_embeddings=256,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                use_sliding_window=True,
                sliding_window=WINDOW,
                max_window_layers=1,
                tie_word_embeddings=True,
                **COMMON,
            ),
            dtype=torch.bfloat16,
            head_scale=8.0,
            final_norm_scale=8.0,
            first_seed=500,
            check=check_qwen3,
            ablations={
                "q_norm weights zeroed": zero("q_norm.weight"),
                "no sliding window": setting(sliding_window=4096),
            },
        ),
        "gemma2-softcap-window": dict(
            model=Gemma2ForCausalLM,
            config=lambda: Gemma2Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=256,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                query_pre_attn_scalar=24,
                sliding_window=WINDOW,
                attn_logit_softcapping=5.0,
                final_logit_softcapping=30.0,
                tie_word_embeddings=True,
                **GEMMA,
            ),
            dtype=torch.float32,
            # Gemma multiplies the tied embedding by sqrt(hidden) = 8 on the way in; a
            # larger one would dominate the residual stream.
            head_scale=2.0,
            final_norm_scale=32.0,
            first_seed=600,
            check=check_gemma2,
            ablations={
                "no attention soft-capping": setting(attn_logit_softcapping=None),
                "no final soft-capping": setting(final_logit_softcapping=None),
                "no sliding window": setting(sliding_window=4096),
                "post-feedforward norm zeroed": zero("post_feedforward_layernorm.weight"),
            },
        ),
        "gemma3-local-rope": dict(
            model=Gemma3ForCausalLM,
            config=lambda: Gemma3TextConfig(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=32,
                max_position_embeddings=256,
                rms_norm_eps=1e-6,
                rope_parameters={
                    "full_attention": {
                        "rope_type": "linear",
                        "factor": 2.0,
                        "rope_theta": 1000000.0,
                    },
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                query_pre_attn_scalar=32,
                sliding_window=WINDOW,
                final_logit_softcapping=None,
                attn_logit_softcapping=None,
                tie_word_embeddings=True,
                **GEMMA,
            ),
            dtype=torch.bfloat16,
            head_scale=8.0,
            final_norm_scale=8.0,
            first_seed=700,
            check=check_gemma3,
            ablations={
                "k_norm weights zeroed": zero("k_norm.weight"),
                "no sliding window": setting(sliding_window=4096),
            },
        ),
        "phi3-longrope-window": dict(
            model=Phi3ForCausalLM,
            config=lambda: Phi3Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=512,
                original_max_position_embeddings=128,
                rms_norm_eps=1e-5,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0],
                    "long_factor": [1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0],
                },
                sliding_window=WINDOW,
                tie_word_embeddings=False,
                **COMMON,
            ),
            dtype=torch.float16,
            head_scale=64.0,
            first_seed=800,
            check=check_phi3,
            # A sequence longer than the original 128 positions, where transformers uses
            # the long factors.
            long_case=dict(length=150, steps=8),
            ablations={
                "default rope instead of longrope": rope(
                    {"rope_type": "default", "rope_theta": 10000.0}
                ),
                "no sliding window": setting(sliding_window=None),
            },
        ),
    }
)

SEEDS_TO_TRY = 400


def min_gap_for(dtype) -> float:
    return 0.1 if dtype == torch.float32 else 0.3


@torch.no_grad()
def scale_up(model, cfg, head_scale, final_norm_scale, router_scale=1.0):
    """Peaky distributions: matrices x8, LM head x`head_scale`, random biases and norm
    weights, the final norm's weights x`final_norm_scale`."""
    tied = cfg.tie_word_embeddings
    for name, p in model.named_parameters():
        if name == "lm_head.weight" or (tied and name == "model.embed_tokens.weight"):
            p.mul_(head_scale)
            # Padded vocabulary rows (beyond the tokenizer) stay small, as in real models
            # whose padding rows are never trained up: they must not win a greedy step.
            p[TOKENIZER_VOCAB:].mul_(0.25)
        elif name.endswith("self_attn.sinks"):
            # gpt-oss's per-head sink logits: of the scores' size, some above, some below.
            p.normal_(0.0, 1.0)
        elif name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight", "router.weight")):
            # Routers spread their logits wider, so that every token's choice of experts
            # is clear (see ROUTER_GAP).
            p.mul_(8.0 * router_scale)
        elif p.dim() in (2, 3):
            # 3-D: a mixture's experts, stacked (transformers 5 keeps them so in memory).
            p.mul_(8.0)
        elif name.endswith((".bias", "_bias")):
            p.normal_(0.0, 0.5)
        elif name.endswith("norm.weight"):
            p.uniform_(0.6, 1.4)
            if name == "model.norm.weight":
                p.mul_(final_norm_scale)
        else:
            raise AssertionError(f"unexpected parameter {name}")


@torch.no_grad()
def run_cases(model, prompt_ids):
    """Prompt logits, greedy ids, top-5 logprobs and top-1/top-2 gaps, recomputing the
    whole sequence at every step."""
    cases = []
    for ids in prompt_ids:
        seq = list(ids)
        prompt_logits = model(torch.tensor([seq])).logits[0].float()
        greedy, top5, gaps = [], [], []
        last = prompt_logits[-1]
        for step in range(GREEDY_STEPS):
            lp = torch.log_softmax(last.double(), dim=-1)
            v, i = torch.topk(lp, 5)
            top5.append([[int(a), float(b)] for a, b in zip(i, v)])
            gaps.append(float(v[0] - v[1]))
            tok = int(torch.argmax(last))
            assert tok == int(i[0])
            greedy.append(tok)
            seq.append(tok)
            if step + 1 < GREEDY_STEPS:
                last = model(torch.tensor([seq])).logits[0, -1].float()
        cases.append(
            dict(prompt_logits=prompt_logits, greedy_ids=greedy, top5=top5, gaps=gaps)
        )
    return cases


def build(variant, seed):
    torch.manual_seed(seed)
    cfg = variant["config"]()
    cfg._attn_implementation = "eager"
    model = variant["model"](cfg).eval()
    scale_up(
        model,
        cfg,
        variant.get("head_scale", 32.0),
        variant.get("final_norm_scale", 1.0),
        variant.get("router_scale", 1.0),
    )
    # The weights as they will be on disk, computed with in float32. Only the parameters:
    # model.to() would also round buffers such as the rotary inv_freq.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(variant["dtype"]).to(torch.float32))
        if "mxfp4" in variant:
            # The experts as MXFP4 holds them, so the model computed with is the file's.
            for name, p in model.named_parameters():
                if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                    p.copy_(mxfp4_pack(p.data)[2])
    return model


# MXFP4 (OCP microscaling): blocks of 32 values along a row's input dimension, each a 4-bit
# E2M1 code (sign bit 8, magnitudes below) times the block's power of two 2^(e - 127), e a
# byte. transformers' gpt-oss checkpoints keep `{proj}_blocks` [experts, out, in / 32, 16]
# (element 2k of a block in the low nibble of byte k, 2k + 1 in the high one) and
# `{proj}_scales` [experts, out, in / 32].
FP4_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def mxfp4_pack(w):
    """A stacked expert tensor [experts, in, out] (transformers' layout) as MXFP4: blocks,
    scales and the values they hold, in the layout of `w`. The scale is the smallest power of
    two that brings the block's largest magnitude to 6 or below; each value takes the nearest
    magnitude (the lower one on a tie)."""
    x = w.transpose(1, 2).contiguous().numpy().astype(np.float32)  # [experts, out, in]
    e, o, i = x.shape
    b = x.reshape(e, o, i // 32, 32)
    amax = np.abs(b).max(-1)
    exp = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), -127)
    exp = np.clip(exp, -127, 127).astype(np.int32)
    scale = np.ldexp(np.float32(1.0), exp)[..., None].astype(np.float32)
    idx = np.abs((np.abs(b) / scale)[..., None] - FP4_MAGNITUDES).argmin(-1)
    codes = (idx + 8 * (b < 0)).astype(np.uint8)
    held = np.where(b < 0, -1.0, 1.0) * FP4_MAGNITUDES[idx] * scale
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = (exp + 127).astype(np.uint8)
    held = torch.from_numpy(held.reshape(e, o, i).astype(np.float32)).transpose(1, 2)
    return torch.from_numpy(blocks), torch.from_numpy(scales), held.contiguous()


def write_mxfp4(out, model):
    """Rewrites the saved folder as a quantized gpt-oss checkpoint: every stacked expert
    projection as `_blocks` and `_scales`, config.json with its quantization_config."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(path)
    for name, p in model.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            del tensors[name]
            blocks, scales, held = mxfp4_pack(p.data)
            assert torch.equal(held, p.data), name
            tensors[f"{name}_blocks"] = blocks
            tensors[f"{name}_scales"] = scales
    save_file(tensors, path, metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# A mixture of experts' choice is a discontinuity: where a token's k-th and (k+1)-th router
# logits are nearly equal, rounding differences between implementations could pick other
# experts. Every token of every case must separate them by at least this much.
ROUTER_GAP = 0.01


@torch.no_grad()
def router_gap(model, prompt_ids, cases):
    """The smallest gap between the k-th and (k+1)-th router logit over every token of
    every case's prompt and greedy continuation (infinity for a dense model)."""
    gaps = []

    def hook(module, args, out):
        logits = out[0].float()
        top = torch.topk(logits, module.top_k + 1, dim=-1).values
        gaps.append(float((top[:, -2] - top[:, -1]).min()))

    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    handles = [m.register_forward_hook(hook) for m in routers]
    try:
        for ids, c in zip(prompt_ids, cases):
            model(torch.tensor([list(ids) + c["greedy_ids"]]))
    finally:
        for h in handles:
            h.remove()
    return min(gaps, default=float("inf"))


def acceptable(cases, dtype):
    worst = min(g for c in cases for g in c["gaps"])
    in_vocab = all(t < TOKENIZER_VOCAB for c in cases for t in c["greedy_ids"])
    # Not stuck repeating one token: decode steps should see varied inputs.
    varied = all(len(set(c["greedy_ids"])) >= MIN_DISTINCT for c in cases)
    return worst, in_vocab and varied and worst > min_gap_for(dtype)


def f32_text(x: float) -> str:
    # The shortest decimal that reads back as the same float32.
    text = str(np.float32(x))
    assert np.float32(float(text)) == np.float32(x), (x, text)
    return text


@torch.no_grad()
def run_long_case(model, length, steps, seed):
    """A random prompt of `length` tokens: its last position's logits and `steps` greedy
    tokens with their top-5 logprobs, recomputing the whole sequence at every step."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(3, TOKENIZER_VOCAB, (length,), generator=g).tolist()
    ids = list(seq)
    last = model(torch.tensor([seq])).logits[0, -1].float()
    out = dict(prompt_ids=ids, last_logits=last, greedy_ids=[], top5=[], gaps=[])
    for step in range(steps):
        lp = torch.log_softmax(last.double(), dim=-1)
        v, i = torch.topk(lp, 5)
        out["top5"].append([[int(a), float(b)] for a, b in zip(i, v)])
        out["gaps"].append(float(v[0] - v[1]))
        tok = int(torch.argmax(last))
        out["greedy_ids"].append(tok)
        seq.append(tok)
        if step + 1 < steps:
            last = model(torch.tensor([seq])).logits[0, -1].float()
    return out


def expected_json(prompts, prompt_ids, cases, dtype, seed, long_cases=()) -> str:
    head = {
        "generated_by": f"transformers {transformers.__version__}, torch {torch.__version__}"
        " (tools/make_fixtures.py)",
        "note": "greedy_ids: 16 greedy tokens; top5: per step [token_id, logprob]; "
        "prompt_logits: logits at every prompt position. Computed by transformers in "
        f"float32 (eager attention) from the on-disk {str(dtype).removeprefix('torch.')} "
        "weights, loading the folder itself; greedy steps recompute the whole sequence.",
        "compute_dtype": "float32",
        "seed": seed,
        "min_greedy_logprob_gap": round(min(g for c in cases for g in c["gaps"]), 4),
    }
    parts = []
    for prompt, ids, c in zip(prompts, prompt_ids, cases):
        rows = ", ".join(
            "[" + ", ".join(f32_text(x) for x in row.tolist()) + "]"
            for row in c["prompt_logits"]
        )
        parts.append(
            "{"
            + f'"prompt": {json.dumps(prompt)}, "prompt_ids": {json.dumps(ids)}, '
            + f'"greedy_ids": {json.dumps(c["greedy_ids"])}, "top5": {json.dumps(c["top5"])}, '
            + f'"prompt_logits": [{rows}]'
            + "}"
        )
    longs = []
    for c in long_cases:
        logits = "[" + ", ".join(f32_text(x) for x in c["last_logits"].tolist()) + "]"
        longs.append(
            "{"
            + f'"prompt_ids": {json.dumps(c["prompt_ids"])}, '
            + f'"greedy_ids": {json.dumps(c["greedy_ids"])}, "top5": {json.dumps(c["top5"])}, '
            + f'"last_logits": {logits}'
            + "}"
        )
    tail = f', "long_cases": [{", ".join(longs)}]' if longs else ""
    text = json.dumps(head)[:-1] + ', "cases": [' + ", ".join(parts) + "]" + tail + "}\n"
    json.loads(text)  # well-formed
    return text


def make(name, variant, prompts, prompt_ids):
    dtype = variant["dtype"]
    for seed in range(variant["first_seed"], variant["first_seed"] + SEEDS_TO_TRY):
        model = build(variant, seed)
        cases = run_cases(model, prompt_ids)
        worst, ok = acceptable(cases, dtype)
        if ok and router_gap(model, prompt_ids, cases) > ROUTER_GAP:
            break
    else:
        sys.exit(f"{name}: no seed in {SEEDS_TO_TRY} gives clear greedy choices")

    out = FIXTURES / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    disk = copy.deepcopy(model).to(dtype)
    disk.config.dtype = dtype
    kwargs = {"max_shard_size": variant["shard"]} if "shard" in variant else {}
    disk.save_pretrained(out, **kwargs)
    for f in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_SOURCE / f, out / f)
    if "rewrite_config" in variant:
        cfg = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(
            json.dumps(variant["rewrite_config"](cfg), indent=2) + "\n"
        )
    if "mxfp4" in variant:
        write_mxfp4(out, model)

    # What was written: the expected files, dtypes and shards.
    index = out / "model.safetensors.index.json"
    if "shard" in variant:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        assert 2 <= len(shards) <= 3, shards
        assert not (out / "model.safetensors").exists()
    else:
        shards = ["model.safetensors"]
        assert not index.exists()
    want_dtype = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[dtype]
    names = set()
    for s in shards:
        with safe_open(out / s, "pt") as f:
            for k in f.keys():
                names.add(k)
                got = f.get_slice(k).get_dtype()
                packed = k.endswith(("_blocks", "_scales")) and "mxfp4" in variant
                assert got == ("U8" if packed else want_dtype), (k, got)
    tied = model.config.tie_word_embeddings
    assert ("lm_head.weight" in names) != tied, names

    # Load the folder back the way a user would and compute the expected outputs from it.
    loaded = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(loaded) is variant["model"], type(loaded)
    variant["check"](loaded)
    mem = model.state_dict()
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, mem[k]), f"{name}: {k} differs after the round trip"
    expected = run_cases(loaded, prompt_ids)
    for a, b in zip(expected, cases):
        assert a["greedy_ids"] == b["greedy_ids"]
        assert torch.allclose(a["prompt_logits"], b["prompt_logits"], atol=1e-4)
    worst, ok = acceptable(expected, dtype)
    assert ok, f"{name}: smallest greedy gap {worst}"
    gap = router_gap(loaded, prompt_ids, expected)
    assert gap > ROUTER_GAP, f"{name}: smallest router gap {gap}"
    if gap != float("inf"):
        print(f"  smallest gap between a token's last chosen and first other expert: {gap:.3f}")

    # The feature the variant exists for must matter to the numbers.
    long_ids = torch.tensor([prompt_ids[-1]])
    base = expected[-1]["prompt_logits"]
    for what, ablate in variant["ablations"].items():
        cfg, sd = ablate(copy.deepcopy(loaded.config), copy.deepcopy(loaded.state_dict()))
        other = variant["model"](cfg).eval()
        other.load_state_dict(sd)
        with torch.no_grad():
            moved = (other(long_ids).logits[0] - base).abs().max().item()
        assert moved > 0.5, f"{name}: {what} moves logits by only {moved}"
        print(f"  {what}: moves the long prompt's logits by up to {moved:.2f}")

    long_cases = []
    if "long_case" in variant:
        lc = variant["long_case"]
        c = run_long_case(loaded, lc["length"], lc["steps"], seed)
        assert min(c["gaps"]) > min_gap_for(dtype), f"{name}: long case gaps {c['gaps']}"
        # The long factors matter: the same sequence with the short factors in their place
        # gives other logits.
        cfg = copy.deepcopy(loaded.config)
        cfg.rope_parameters["long_factor"] = list(cfg.rope_parameters["short_factor"])
        other = variant["model"](cfg).eval()
        other.load_state_dict(loaded.state_dict())
        with torch.no_grad():
            shorter = other(torch.tensor([c["prompt_ids"]])).logits[0, -1]
        moved = (shorter - c["last_logits"]).abs().max().item()
        assert moved > 0.5, f"{name}: the long factors move logits by only {moved}"
        print(f"  long factors: move the long case's logits by up to {moved:.2f}")
        long_cases.append(c)
    (out / "expected.json").write_text(
        expected_json(prompts, prompt_ids, expected, dtype, seed, long_cases)
    )
    for p in out.iterdir():
        p.chmod(0o644)  # save_pretrained writes the weights owner-only
    size = sum(p.stat().st_size for p in out.iterdir())
    assert size < 900_000, f"{name}: {size} bytes"
    files = ", ".join(sorted(p.name for p in out.iterdir() if "safetensors" in p.name))
    print(
        f"{name}: seed {seed}, smallest greedy logprob gap {worst:.3f}, "
        f"{size / 1000:.0f} kB ({files})"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--only", action="append", choices=sorted(VARIANTS), help="variant to write (repeatable)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER_SOURCE)
    assert len(tok) == TOKENIZER_VOCAB
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    assert tok(PROMPTS[0])["input_ids"] == prompt_ids[0], "the tokenizer must not add BOS"
    assert MIN_LONG_PROMPT <= len(prompt_ids[-1]) <= MAX_PROMPT, len(prompt_ids[-1])
    for p, ids in zip(PROMPTS, prompt_ids):
        assert tok.decode(ids) == p
    for name in args.only or VARIANTS:
        make(name, VARIANTS[name], PROMPTS, prompt_ids)


if __name__ == "__main__":
    main()
