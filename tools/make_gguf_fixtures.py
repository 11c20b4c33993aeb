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

Run from the repository root:

    python3 -m venv venv && venv/bin/pip install gguf==0.19.0 numpy
    venv/bin/python tools/make_gguf_fixtures.py

Tests read the committed files; they never need Python.
"""

import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

OUT = os.path.join("tests", "fixtures", "gguf")


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


def main():
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
