#!/usr/bin/env python3
"""Write the GGML block-format fixtures under tests/fixtures/quant/.

The Rust reference (de)quantizers in src/gguf/quant.rs are checked against these files by
tests/quant_reference.rs, bit for bit. Every number in them comes from the `gguf` Python
package (llama.cpp's own Python library), pinned below, so the tests compare the Rust code
with an independent implementation and need no Python when they run.

How to run it, from the repository root, in a fresh virtualenv:

    python3 -m venv <venv>
    <venv>/bin/pip install gguf==0.19.0 numpy
    <venv>/bin/python tools/make_quant_fixtures.py

The output is deterministic (seeded), so rerunning it rewrites the same bytes.

Two kinds of case per type:

- `<type>_quant.bin`: values given to `gguf.quants.quantize`, the bytes it returned and
  `gguf.quants.dequantize` of those bytes. Only for the types the package can quantize:
  F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0. Seeded normal values at several scales,
  plus edge blocks: all zeros (of both signs), all negative (a negative min), all positive,
  one outlier, values on rounding ties, values halfway between two codes of a random step,
  equal-magnitude maxima of both signs, and a block whose scale is near the largest finite
  f16.
- `<type>_raw.bin`: blocks built directly from seeded random bytes, with random finite f16
  scales, plus all-zero, largest-scale (both signs), negative-min, subnormal-scale and
  negative-zero-scale blocks (MXFP4: every exponent byte at random, and the edge exponents
  of MXFP4_EDGES), and `gguf.quants.dequantize` of them. For every block type
  (the package has no quantizer for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL or IQ4_XS, and pagellm's own
  for IQ4_NL and MXFP4 are not the package's, so this is their only case) and for
  F32/F16/BF16 (random bit patterns and special values: infinities, NaNs, subnormals).

File format (all little-endian):

    offset 0   4 bytes  magic b"GQF1"
    offset 4   u32      GGML type id (as in GGUF tensor infos)
    offset 8   u32      n, the element count (a multiple of the type's block size)
    offset 12  u32      flags: bit 0 set when the input section is present
    then       n x f32  input values given to quantize (only when flag bit 0 is set)
    then       bytes    the quantized data, n / block_elems * block_bytes bytes
    then       n x f32  the package's dequantize of those bytes, in its element order
"""

from __future__ import annotations

import importlib.metadata
import struct
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

PINNED = "0.19.0"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant"
MAGIC = b"GQF1"
F16_MAX = 65504.0

# Types `gguf.quants.quantize` implements among those pagellm reads.
QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# New types go at the end: each type's seed is its place in the list.
BLOCK_TYPES = [
    T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.MXFP4,
    T.IQ4_XS, T.Q2_K, T.Q3_K,
]

# Byte offsets of the f16 fields of one block: the scale d and, where the type has one, the
# min/dmin field. Facts of the GGML layouts.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
}

# MXFP4's scale byte (an E8M0 exponent, 2^(e - 127)) for its edge blocks: the subnormal f32
# scales ggml makes of 0 and 1, one, and the largest (whose top codes overflow to infinity).
MXFP4_EDGES = [0, 1, 2, 126, 127, 128, 253, 254, 255]


def write_case(path: Path, qtype: T, data: np.ndarray, inputs: np.ndarray | None) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    data = np.ascontiguousarray(data, dtype=np.uint8)
    n = data.size // size * block
    out = quants.dequantize(data, qtype).astype(np.float32, copy=False).reshape(-1)
    assert out.size == n, (qtype.name, out.size, n)
    header = MAGIC + struct.pack("<III", int(qtype), n, 1 if inputs is not None else 0)
    parts = [header]
    if inputs is not None:
        assert inputs.dtype == np.float32 and inputs.size == n
        parts.append(inputs.astype("<f4").tobytes())
    parts.append(data.tobytes())
    parts.append(out.astype("<f4").tobytes())
    blob = b"".join(parts)
    path.write_bytes(blob)
    return len(blob)


# ---------------------------------------------------------------- quantize inputs


def max_scale_block(qtype: T, rng: np.random.Generator, block: int) -> np.ndarray:
    """A block whose f16 scale lands near the largest finite f16 (but stays finite)."""
    target = 64000.0
    if qtype in (T.Q4_1, T.Q5_1):
        levels = 15 if qtype == T.Q4_1 else 31
        lo = -60000.0  # the min is stored as f16 too, so it must stay in range
        hi = lo + target * levels
        v = rng.uniform(lo, hi, block)
        v[rng.integers(block)] = lo
        v[rng.integers(block)] = hi
        return v
    divisor = {T.Q4_0: 8, T.Q5_0: 16, T.Q8_0: 127}.get(qtype)
    if divisor is None:  # F32/F16/BF16: values around the f16 limit, both sides of it
        return rng.choice([F16_MAX, 65519.0, 65520.0, -70000.0, 1e30, -3e38], block)
    v = rng.normal(size=block)
    v *= target * divisor / np.abs(v).max()
    return v


def tie_block(qtype: T, block: int) -> np.ndarray:
    """Values that land on rounding ties of the type's quantizer."""
    if qtype == T.Q8_0:  # max |x| = 127 makes the scale 1: x.5 ties round away from zero
        v = (np.arange(block) - block / 2 + 0.5) * 3.0
        v[0] = 127.0
        return v
    if qtype in (T.Q4_0, T.Q5_0):  # max -8 or -16 makes the scale 1: halves go up
        top = 8.0 if qtype == T.Q4_0 else 16.0
        v = np.linspace(-top, top - 1, block)
        v = np.round(v * 2) / 2
        v[0] = -top
        return v
    if qtype in (T.Q4_1, T.Q5_1):  # range 15 or 31 makes the scale 1
        levels = 15.0 if qtype == T.Q4_1 else 31.0
        v = np.round(np.linspace(0, levels, block) * 2) / 2 - 3.0
        return v
    if qtype == T.F16:  # halfway between neighbouring f16 values, both parities
        one = 1.0
        return np.array([one + k * 2.0**-11 for k in range(block)])
    if qtype == T.BF16:
        return np.array([1.0 + k * 2.0**-8 for k in range(block)]) * (-1.0) ** np.arange(block)
    return np.arange(block) * 0.5


def midpoint_block(qtype: T, rng: np.random.Generator, block: int) -> np.ndarray | None:
    """Values halfway between two codes of a random, non-f16 step: which code each one gets
    depends on the last bits of the f32 arithmetic (and on using the f32 step, not the f16
    one that is stored)."""
    step = np.float32(rng.uniform(0.01, 2.0))
    if qtype in (T.Q4_1, T.Q5_1):
        levels = 15 if qtype == T.Q4_1 else 31
        lo = np.float32(rng.uniform(-3, 3))
        v = lo + (rng.integers(0, levels, block) + np.float32(0.5)) * step
        v[0], v[1] = lo, lo + levels * step
        return v
    half = {T.Q4_0: 8, T.Q5_0: 16, T.Q8_0: 127}.get(qtype)
    if half is None:
        return None
    v = (rng.integers(-half, half - 1, block) + np.float32(0.5)) * step
    v[0] = (half if qtype == T.Q8_0 else -half) * step  # the extreme that sets the step
    return v


def special_values(qtype: T, block: int) -> list[np.ndarray]:
    if qtype not in (T.F32, T.F16, T.BF16):
        return []
    nan = np.float32(np.nan)
    sub = [6e-8, 3e-8, 2.9e-8, 1e-7, 6.1e-5, -6.1e-5, 1e-40, -1e-45]
    vals = [0.0, -0.0, np.inf, -np.inf, nan, -nan, F16_MAX, -F16_MAX, *sub]
    vals += [float(np.float32(3.4e38)), 1.0, -1.0, 0.1, -0.1, 1.0 / 3.0]
    vals = (vals * block)[:block]
    return [np.array(vals)]


def quantize_inputs(qtype: T, rng: np.random.Generator) -> np.ndarray:
    block = 32  # F32/F16/BF16 have no blocks; groups of 32 values keep the cases alike
    blocks: list[np.ndarray] = []
    per_scale = 2 if qtype in (T.F32, T.F16, T.BF16) else 5
    for scale in (1e-4, 1e-2, 1.0, 30.0, 1000.0):
        for _ in range(per_scale):
            blocks.append(rng.normal(size=block) * scale)
    blocks.append(rng.uniform(-5, 5, block))
    blocks.append(np.zeros(block))
    blocks.append(np.full(block, -0.0))  # negative zeros: the sign of a zero scale shows
    blocks.append(-np.abs(rng.normal(size=block)) * 4 - 0.5)  # all negative: min < 0
    blocks.append(-np.abs(rng.normal(size=block)) * 1e3 - 2e3)  # far from zero
    blocks.append(np.abs(rng.normal(size=block)) * 2 + 0.25)  # all positive
    for sign in (1.0, -1.0):  # one outlier among small values
        v = rng.normal(size=block) * 0.01
        v[rng.integers(block)] = 50.0 * sign
        blocks.append(v)
    for first in (1.0, -1.0):  # equal |max| with both signs: the first one wins
        v = rng.uniform(-1, 1, block)
        v[3], v[20] = 2.0 * first, -2.0 * first
        blocks.append(v)
    blocks.append(np.full(block, 0.75))  # constant block: zero range for Q4_1/Q5_1
    blocks.append(tie_block(qtype, block))
    blocks.append(max_scale_block(qtype, rng, block))
    for _ in range(3):
        v = midpoint_block(qtype, rng, block)
        if v is not None:
            blocks.append(v)
    blocks.extend(special_values(qtype, block))
    return np.concatenate(blocks).astype(np.float32)


def quantize_case(qtype: T, rng: np.random.Generator) -> int:
    values = quantize_inputs(qtype, rng)
    data = quants.quantize(values, qtype)
    data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    return write_case(OUT / f"{qtype.name.lower()}_quant.bin", qtype, data, values)


# ---------------------------------------------------------------- raw blocks


def random_finite_f16(rng: np.random.Generator, count: int) -> np.ndarray:
    sign = rng.integers(0, 2, count, dtype=np.uint16) << 15
    exp = rng.integers(0, 31, count, dtype=np.uint16) << 10  # 31 would be inf/NaN
    man = rng.integers(0, 1024, count, dtype=np.uint16)
    return sign | exp | man


def set_f16(blk: np.ndarray, offset: int, bits: int) -> None:
    blk[offset : offset + 2] = np.frombuffer(struct.pack("<H", bits), dtype=np.uint8)


def raw_blocks(qtype: T, rng: np.random.Generator, n_random: int) -> np.ndarray:
    _, size = GGML_QUANT_SIZES[qtype]
    fields = F16_FIELDS[qtype]
    blocks = []
    for _ in range(n_random):
        blk = rng.integers(0, 256, size, dtype=np.uint8)
        for off, bits in zip(fields, random_finite_f16(rng, len(fields))):
            set_f16(blk, off, int(bits))
        blocks.append(blk)
    # (d, min/dmin) bit patterns for the edge blocks, each over random and extreme payloads.
    edges = [
        (0x7BFF, 0x7BFF),  # largest finite f16 scale and min
        (0xFBFF, 0x7BFF),  # negative largest scale
        (0x7BFF, 0xFBFF),  # negative min: the min term is added, not subtracted
        (0x3C00, 0xBC00),  # d = 1, dmin = -1
        (0x0001, 0x8001),  # smallest subnormal scales
        (0x8000, 0x0000),  # negative zero scale
    ]
    for d_bits, m_bits in edges:
        for payload in ("random", "ones"):
            if payload == "random":
                blk = rng.integers(0, 256, size, dtype=np.uint8)
            else:
                blk = np.full(size, 0xFF, dtype=np.uint8)
            for off, bits in zip(fields, (d_bits, m_bits)):
                set_f16(blk, off, bits)
            blocks.append(blk)
    blocks.append(np.zeros(size, dtype=np.uint8))
    return np.concatenate(blocks)


def raw_float_bits(qtype: T, rng: np.random.Generator, n: int) -> np.ndarray:
    if qtype == T.F32:
        bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
        special = [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x00000001, 0x80000000]
        bits[: len(special)] = special
        return bits.view(np.uint8)
    if qtype == T.F16:
        bits = random_finite_f16(rng, n)
        special = [0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7D55, 0xFFFF, 0x0001, 0x8001,
                   0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x8000, 0x0000]
        bits[: len(special)] = special
        return bits.view(np.uint8)
    # BF16: every bit pattern is meaningful, NaN payloads included
    bits = rng.integers(0, 2**16, n, dtype=np.uint32).astype(np.uint16)
    bits[:6] = [0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x0001, 0x8000]
    return bits.view(np.uint8)


def raw_mxfp4(rng: np.random.Generator, n_random: int) -> np.ndarray:
    _, size = GGML_QUANT_SIZES[T.MXFP4]
    blocks = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n_random)]
    for e in MXFP4_EDGES:
        for payload in ("random", "ones"):
            if payload == "random":
                blk = rng.integers(0, 256, size, dtype=np.uint8)
            else:
                blk = np.full(size, 0xFF, dtype=np.uint8)
            blk[0] = e
            blocks.append(blk)
    blocks.append(np.zeros(size, dtype=np.uint8))
    return np.concatenate(blocks)


def raw_case(qtype: T, rng: np.random.Generator) -> int:
    if qtype in (T.F32, T.F16, T.BF16):
        data = raw_float_bits(qtype, rng, 256)
    elif qtype == T.MXFP4:
        data = raw_mxfp4(rng, 10)
    else:
        block, _ = GGML_QUANT_SIZES[qtype]
        data = raw_blocks(qtype, rng, 10 if block == 32 else 4)
    return write_case(OUT / f"{qtype.name.lower()}_raw.bin", qtype, data, None)


def main() -> None:
    version = importlib.metadata.version("gguf")
    if version != PINNED:
        raise SystemExit(f"gguf {version} is installed; these fixtures are made with {PINNED}")
    OUT.mkdir(parents=True, exist_ok=True)
    total = 0
    for i, qtype in enumerate(QUANTIZABLE):
        total += quantize_case(qtype, np.random.default_rng(1000 + i))
    for i, qtype in enumerate([T.F32, T.F16, T.BF16, *BLOCK_TYPES]):
        total += raw_case(qtype, np.random.default_rng(2000 + i))
    print(f"wrote {total} bytes of fixtures to {OUT}")


if __name__ == "__main__":
    with np.errstate(over="ignore", invalid="ignore"):
        main()
