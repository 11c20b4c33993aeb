"""Writes a GGUF file of random f16 weights in a Llama shape, for comparing pagellm with
llama.cpp on the same file (docs/BENCHMARKS.md, issue 48's section).

The shapes are the engine bench's presets (benches/engine.rs): `tiny15m` (stories15M's
layers with a 32,000-token vocabulary) and `m110` (stories110M's). Weights are drawn from
N(0, 0.02), norm weights are 1.0, embeddings are tied (no output.weight, as in those models);
speed does not depend on the values. The vocabulary is the shipped model's byte-level BPE
tokenizer (models/fortunes-llama/tokenizer.json) padded with unused tokens to 32,000, so
both tools tokenize prompts and neither needs the network.

Quantize the result with llama.cpp's own tool to get its format mixes:

    python3 -m venv venv && venv/bin/pip install gguf numpy
    venv/bin/python tools/make_bench_gguf.py --shape m110 --out m110-f16.gguf
    llama-quantize m110-f16.gguf m110-q4_k_m.gguf Q4_K_M

Nothing it writes is committed.
"""

import argparse
import json
import os

import numpy as np
import gguf

SHAPES = {
    # hidden, intermediate, heads, kv heads, head size, layers, vocabulary
    "tiny15m": (288, 768, 6, 6, 48, 6, 32000),
    "m110": (768, 2048, 12, 12, 64, 12, 32000),
}
TOKENIZER = os.path.join("models", "fortunes-llama", "tokenizer.json")


def vocab(size):
    """The shipped tokenizer's tokens, merges and special ids, padded to `size` tokens."""
    with open(TOKENIZER, encoding="utf-8") as f:
        tok = json.load(f)
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    for a in tok["added_tokens"]:
        by_id[a["id"]] = a["content"]
    tokens, types = [], []
    for i in range(size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tokens, types, merges


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    hidden, inter, heads, kv_heads, head_dim, layers, n_vocab = SHAPES[a.shape]
    rng = np.random.default_rng(a.seed)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"random-{a.shape}")
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, types, merges = vocab(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)

    ones = np.ones(hidden, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(n_vocab, hidden))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "attn_q.weight", mat(heads * head_dim, hidden))
        w.add_tensor(b + "attn_k.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(b + "attn_v.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(b + "attn_output.weight", mat(hidden, heads * head_dim))
        w.add_tensor(b + "ffn_norm.weight", ones)
        w.add_tensor(b + "ffn_gate.weight", mat(inter, hidden))
        w.add_tensor(b + "ffn_up.weight", mat(inter, hidden))
        w.add_tensor(b + "ffn_down.weight", mat(hidden, inter))
    w.add_tensor("output_norm.weight", ones)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out} ({os.path.getsize(a.out) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
