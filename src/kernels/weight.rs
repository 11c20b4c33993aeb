//! Weights on the GPU in their on-disk precision, split into row chunks when one tensor is
//! larger than a storage binding (a big embedding table or LM head).

use crate::error::{GpuError, Result};
use crate::formats::ggml as quant;
use crate::gpu::GpuContext;
use std::borrow::Cow;

/// Storage format of a weight: a float format (16-bit ones packed two per `u32`), or one
/// of GGML's block formats, kept packed and decoded by the kernels that read the weight
/// (`shaders/weight_blocks.wgsl`). A block-format row is a whole number of blocks; on the
/// GPU each block takes whole 4-byte words ([`WeightDtype::gpu_row_bytes`]). The weight
/// formats are exactly the GGML types pagellm reads, so this is [`quant::GgmlType`] under the name
/// the kernels use.
pub use crate::formats::WeightDtype;

impl WeightDtype {
    /// Every block format.
    pub const BLOCKS: [WeightDtype; 13] = [
        WeightDtype::Q4_0,
        WeightDtype::Q4_1,
        WeightDtype::Q5_0,
        WeightDtype::Q5_1,
        WeightDtype::Q8_0,
        WeightDtype::Q4_K,
        WeightDtype::Q5_K,
        WeightDtype::Q6_K,
        WeightDtype::IQ4_NL,
        WeightDtype::MXFP4,
        WeightDtype::IQ4_XS,
        WeightDtype::Q2_K,
        WeightDtype::Q3_K,
    ];

    /// The value of the kernels' `WEIGHT_DTYPE` override (shaders/common.wgsl has the float
    /// codes, shaders/weight_blocks.wgsl the block ones).
    pub fn code(self) -> f64 {
        match self {
            WeightDtype::F32 => 0.0,
            WeightDtype::F16 => 1.0,
            WeightDtype::BF16 => 2.0,
            WeightDtype::Q4_0 => 10.0,
            WeightDtype::Q4_1 => 11.0,
            WeightDtype::Q5_0 => 12.0,
            WeightDtype::Q5_1 => 13.0,
            WeightDtype::Q8_0 => 14.0,
            WeightDtype::Q4_K => 15.0,
            WeightDtype::Q5_K => 16.0,
            WeightDtype::Q6_K => 17.0,
            WeightDtype::IQ4_NL => 18.0,
            WeightDtype::MXFP4 => 19.0,
            WeightDtype::IQ4_XS => 20.0,
            WeightDtype::Q2_K => 21.0,
            WeightDtype::Q3_K => 22.0,
        }
    }

    /// Whether this is a block format (not f32, f16 or bf16).
    pub fn is_block(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of a row of `cols` elements as a file stores it; `None` unless `cols` is a
    /// whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        self.bytes_for(cols).ok()
    }

    /// Bytes of one block on the GPU ([`gpu_block`] writes them; for the formats of 32-element
    /// blocks that go in groups of four, a quarter of a group).
    fn gpu_block_bytes(self) -> usize {
        match self {
            WeightDtype::Q4_0 | WeightDtype::Q4_1 | WeightDtype::IQ4_NL | WeightDtype::MXFP4 => 20,
            WeightDtype::Q5_0 | WeightDtype::Q5_1 => 24,
            WeightDtype::Q8_0 => 36,
            // 14 bytes of padding: 56 words, a multiple of 16 bytes.
            WeightDtype::Q6_K => 224,
            // The 16 six-bit scales unpacked to bytes, then d and two bytes of padding.
            WeightDtype::Q3_K => 116,
            other => other.block_bytes(),
        }
    }

    /// For the formats of 32-element blocks that go on the GPU in groups of four
    /// ([`grouped_row`]): the bytes of a group's header (the blocks' scales and mins, then
    /// for Q5_0 and Q5_1 their high bits) and of one block's codes.
    fn grouped(self) -> Option<(usize, usize)> {
        match self {
            WeightDtype::Q4_0 | WeightDtype::Q4_1 | WeightDtype::IQ4_NL | WeightDtype::MXFP4 => {
                Some((16, 16))
            }
            WeightDtype::Q5_0 | WeightDtype::Q5_1 => Some((32, 16)),
            WeightDtype::Q8_0 => Some((16, 32)),
            _ => None,
        }
    }

    /// Bytes of a row of `cols` elements on the GPU (`cols` a whole number of blocks). Per
    /// element (in a file): Q4_0 5 bits (4.5), Q4_1 5 (5), Q5_0 6 (5.5), Q5_1 6 (6), Q8_0
    /// 9 (8.5), Q4_K 4.5 (4.5), Q5_K 5.5 (5.5), Q6_K 7 (6.5625), IQ4_NL 5 (4.5),
    /// MXFP4 5 (4.25), IQ4_XS 4.25 (4.25), Q2_K 2.625 (2.625), Q3_K 3.625 (3.4375); rows of
    /// the grouped formats whose blocks are not a multiple of four take a little more.
    pub fn gpu_row_bytes(self, cols: usize) -> usize {
        if let Some((header, codes)) = self.grouped() {
            // Groups of four blocks and a shorter last one ([`grouped_row`]).
            let (groups, rest) = (cols / 128, cols % 128 / 32);
            return groups * (header + 4 * codes)
                + if rest > 0 { header + codes * rest } else { 0 };
        }
        cols / self.block_elems() * self.gpu_block_bytes()
    }
}

impl std::str::FromStr for WeightDtype {
    type Err = String;

    /// A format by its GGML name, in any case: `f16`, `bf16`, `q8_0`, `Q4_K`, ...
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let all = [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16]
            .into_iter()
            .chain(WeightDtype::BLOCKS);
        all.clone()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<String> = all.map(|d| d.name().to_lowercase()).collect();
                format!("unknown weight format {s:?}; known: {}", names.join(", "))
            })
    }
}

/// One row range of a weight, in its own buffer and format.
#[derive(Debug)]
pub struct WeightChunk {
    pub buffer: wgpu::Buffer,
    pub first_row: usize,
    pub rows: usize,
    pub dtype: WeightDtype,
}

/// A 2-D weight `[rows, cols]` (a Hugging Face Linear weight is `[out, in]`), in row
/// chunks. Every chunk has the same format, except in a weight stacked from parts of
/// different formats ([`Weight::upload_stack`]: a Q4_K_M file's Q4_K q and k projections
/// and Q6_K v projection), whose chunks never straddle a change of format.
#[derive(Debug)]
pub struct Weight {
    pub rows: usize,
    pub cols: usize,
    pub chunks: Vec<WeightChunk>,
}

impl Weight {
    /// Uploads `bytes` (little-endian, row-major, `dtype`) as a `[rows, cols]` weight.
    pub fn upload(
        ctx: &GpuContext,
        name: &str,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
    ) -> Result<Self> {
        Self::upload_with_limit(ctx, name, bytes, rows, cols, dtype, ctx.max_binding_bytes())
    }

    /// Like [`Self::upload`] with an explicit per-chunk byte limit (tests force splitting).
    pub fn upload_with_limit(
        ctx: &GpuContext,
        name: &str,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
        max_chunk_bytes: u64,
    ) -> Result<Self> {
        Self::upload_parts_with_limit(ctx, name, &[bytes], rows, cols, dtype, max_chunk_bytes)
    }

    /// One weight of `rows` rows from `parts` taken one after the other, each a whole number
    /// of rows (two projections stacked), without joining them on the host.
    pub fn upload_parts(
        ctx: &GpuContext,
        name: &str,
        parts: &[&[u8]],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
    ) -> Result<Self> {
        let limit = ctx.max_binding_bytes();
        Self::upload_parts_with_limit(ctx, name, parts, rows, cols, dtype, limit)
    }

    /// [`Self::upload_parts`] with an explicit per-chunk byte limit (on the GPU's bytes).
    pub fn upload_parts_with_limit(
        ctx: &GpuContext,
        name: &str,
        parts: &[&[u8]],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
        max_chunk_bytes: u64,
    ) -> Result<Self> {
        let row_bytes = check_shape(name, parts, rows, cols, dtype)?;
        let gpu_row = dtype.gpu_row_bytes(cols);
        // Block formats' chunks end padded to 16 bytes (gpu_layout).
        let usable = max_chunk_bytes.saturating_sub(if dtype.is_block() { 16 } else { 0 });
        let rows_per_chunk = (usable / gpu_row as u64) as usize;
        if rows_per_chunk == 0 {
            return Err(GpuError::TooLarge {
                what: format!("one row of {name}"),
                needed: gpu_row as u64,
                limit: max_chunk_bytes,
            });
        }
        let mut chunks = Vec::new();
        let mut first_row = 0;
        while first_row < rows {
            let n = rows_per_chunk.min(rows - first_row);
            // The pieces of the parts that bytes [start, end) of the stack cover.
            let (start, end) = (first_row * row_bytes, (first_row + n) * row_bytes);
            let mut pieces = Vec::with_capacity(parts.len());
            let mut at = 0;
            for part in parts {
                let (a, b) = (start.max(at), end.min(at + part.len()));
                if a < b {
                    pieces.push(&part[a - at..b - at]);
                }
                at += part.len();
            }
            let buffer = if dtype.is_block() {
                let gpu = gpu_layout(dtype, &pieces, cols);
                ctx.upload_parts(name, &[&gpu])?
            } else {
                ctx.upload_parts(name, &pieces)?
            };
            chunks.push(WeightChunk {
                buffer,
                first_row,
                rows: n,
                dtype,
            });
            first_row += n;
        }
        Ok(Weight { rows, cols, chunks })
    }

    /// The weights of `parts.len()` experts of `[rows, cols]` each as one `[experts * rows,
    /// cols]` weight, in buffers that each hold whole experts (as many as fit a binding).
    pub fn upload_experts(
        ctx: &GpuContext,
        name: &str,
        parts: &[&[u8]],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
    ) -> Result<Self> {
        let limit = ctx.max_binding_bytes();
        Self::upload_experts_with_limit(ctx, name, parts, rows, cols, dtype, limit)
    }

    /// [`Self::upload_experts`] with an explicit per-buffer byte limit (tests force
    /// splitting).
    pub fn upload_experts_with_limit(
        ctx: &GpuContext,
        name: &str,
        parts: &[&[u8]],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
        max_chunk_bytes: u64,
    ) -> Result<Self> {
        let expert = (rows * dtype.gpu_row_bytes(cols)) as u64;
        let pad = if dtype.is_block() { 16 } else { 0 };
        let fit = max_chunk_bytes.saturating_sub(pad) / expert.max(1);
        if fit == 0 {
            return Err(GpuError::TooLarge {
                what: format!("one expert of {name}"),
                needed: expert + pad,
                limit: max_chunk_bytes,
            });
        }
        let limit = fit * expert + pad;
        let total = rows * parts.len();
        Self::upload_parts_with_limit(ctx, name, parts, total, cols, dtype, limit)
    }

    /// One weight stacked from `parts` of `cols`-element rows, each `(format, rows,
    /// bytes)`, one after the other: consecutive parts of one format share chunks, and a
    /// change of format starts a new chunk.
    pub fn upload_stack(
        ctx: &GpuContext,
        name: &str,
        parts: &[(WeightDtype, usize, &[u8])],
        cols: usize,
    ) -> Result<Self> {
        let mut chunks = Vec::new();
        let mut first_row = 0;
        let mut rest = parts;
        while let Some(&(dtype, _, _)) = rest.first() {
            let run = rest.iter().take_while(|p| p.0 == dtype).count();
            let (same, next) = rest.split_at(run);
            let rows: usize = same.iter().map(|p| p.1).sum();
            let bytes: Vec<&[u8]> = same.iter().map(|p| p.2).collect();
            let w = Self::upload_parts(ctx, name, &bytes, rows, cols, dtype)?;
            chunks.extend(w.chunks.into_iter().map(|c| WeightChunk {
                first_row: c.first_row + first_row,
                ..c
            }));
            first_row += rows;
            rest = next;
        }
        if chunks.is_empty() {
            return Err(GpuError::invalid(
                "weight upload",
                format!("{name}: no parts"),
            ));
        }
        Ok(Weight {
            rows: first_row,
            cols,
            chunks,
        })
    }

    /// The format of the weight's rows (of its first chunk, where a stack mixes formats).
    pub fn dtype(&self) -> WeightDtype {
        self.chunks[0].dtype
    }

    /// Convenience for tests and references: uploads f32 values converted (or quantized)
    /// to `dtype`.
    pub fn from_f32(
        ctx: &GpuContext,
        name: &str,
        values: &[f32],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
    ) -> Result<Self> {
        let bytes = encode(values, dtype)
            .map_err(|e| GpuError::invalid("weight upload", format!("{name}: {e}")))?;
        Self::upload(ctx, name, &bytes, rows, cols, dtype)
    }

    /// Bytes the weight takes on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.buffer.size()).sum()
    }
}

/// The bytes of one row of a `[rows, cols]` weight of `dtype` given as `parts`, after
/// checking that the parts are whole rows adding up to the shape, that the shape is not
/// empty, and that a row is a whole number of the format's words or blocks.
fn check_shape(
    name: &str,
    parts: &[&[u8]],
    rows: usize,
    cols: usize,
    dtype: WeightDtype,
) -> Result<usize> {
    let bad = |why: String| Err(GpuError::invalid("weight upload", format!("{name}: {why}")));
    if rows == 0 || cols == 0 {
        return bad(format!("empty shape [{rows}, {cols}]"));
    }
    if dtype.is_block() && !cols.is_multiple_of(dtype.block_elems()) {
        return bad(format!(
            "{} rows are blocks of {} elements, not {cols}",
            dtype.name(),
            dtype.block_elems()
        ));
    }
    if matches!(dtype, WeightDtype::F16 | WeightDtype::BF16) && !cols.is_multiple_of(2) {
        return bad(format!(
            "16-bit weights need an even row length, got {cols}"
        ));
    }
    let row_bytes = dtype.row_bytes(cols).unwrap_or(0);
    let given: usize = parts.iter().map(|p| p.len()).sum();
    if Some(given) != rows.checked_mul(row_bytes)
        || parts.iter().any(|p| p.len() % row_bytes.max(1) != 0)
    {
        return bad(format!(
            "{given} bytes given for [{rows}, {cols}] {} ({} rows of {row_bytes} expected, each of the {} parts whole rows)",
            dtype.name(),
            rows,
            parts.len()
        ));
    }
    Ok(row_bytes)
}

/// File blocks of a block format (whole rows of `cols` elements, in `pieces` one after the
/// other) in the GPU's layout ([`gpu_block`], [`grouped_row`]), the whole padded to 16 bytes for
/// the kernels that read the weights 16 bytes at a time.
fn gpu_layout(dtype: WeightDtype, pieces: &[&[u8]], cols: usize) -> Vec<u8> {
    let block = dtype.block_bytes();
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut out =
        Vec::with_capacity((total / block * dtype.gpu_block_bytes()).next_multiple_of(16));
    let joined: Cow<[u8]> = match pieces {
        [one] => Cow::Borrowed(one),
        many => Cow::Owned(many.concat()),
    };
    if dtype.grouped().is_some() {
        let row = dtype.row_bytes(cols).unwrap_or(block).max(block);
        for r in joined.chunks_exact(row) {
            grouped_row(dtype, r, &mut out);
        }
    } else {
        for b in joined.chunks_exact(block) {
            gpu_block(dtype, b, &mut out);
        }
    }
    out.resize(out.len().next_multiple_of(16), 0);
    out
}

/// Appends one row of a format of 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
/// MXFP4) as shaders/weight_blocks.wgsl reads it: groups of four blocks, each a 16-byte
/// header of the blocks' constants (f16 scales two to a word; Q4_1's and Q5_1's scale and min
/// a word each; MXFP4's exponents a byte each), for Q5_0 and Q5_1 the blocks' four words of
/// high bits, then the blocks' codes as the file has them (16 bytes, Q8_0's 32), so that
/// every block's codes start on a 16-byte word, which the column kernels load whole. A last
/// group of fewer blocks has zeros for the missing ones' constants and only its own codes.
/// Four blocks take as many bytes as four file blocks padded to whole words did.
fn grouped_row(dtype: WeightDtype, row: &[u8], out: &mut Vec<u8>) {
    let block = dtype.block_bytes();
    // Bytes of a block's constants, then of its high bits, in the file block.
    let (consts, high) = match dtype {
        WeightDtype::Q4_1 => (4, 0),
        WeightDtype::Q5_0 => (2, 4),
        WeightDtype::Q5_1 => (4, 4),
        WeightDtype::MXFP4 => (1, 0),
        _ => (2, 0),
    };
    for group in row.chunks(4 * block) {
        let blocks: Vec<&[u8]> = group.chunks_exact(block).collect();
        let mut header = [0u8; 16];
        for (i, b) in blocks.iter().enumerate() {
            header[consts * i..consts * (i + 1)].copy_from_slice(&b[..consts]);
        }
        out.extend_from_slice(&header);
        if high > 0 {
            let mut bits = [0u8; 16];
            for (i, b) in blocks.iter().enumerate() {
                bits[4 * i..4 * i + 4].copy_from_slice(&b[consts..consts + 4]);
            }
            out.extend_from_slice(&bits);
        }
        for b in &blocks {
            out.extend_from_slice(&b[consts + high..]);
        }
    }
}

/// Appends file block `b` of `dtype` as shaders/weight_blocks.wgsl reads it: a whole number
/// of words with the codes on word boundaries (the formats of 32-element blocks go through
/// [`grouped_row`] instead). Q6_K gets fourteen zero bytes at the end (56 words). Q4_K (36
/// words) and Q5_K (44) stay as they are, so rows of Q4_K, Q5_K and Q6_K start every block on
/// a 16-byte word, which the column kernels load whole (their packed 6-bit scales are decoded
/// once per sub-block there, from registers). Q3_K keeps its high bits and codes, then its 16
/// six-bit scales unpacked to a byte each, then `d` and two zero bytes.
fn gpu_block(dtype: WeightDtype, b: &[u8], out: &mut Vec<u8>) {
    match dtype {
        WeightDtype::Q6_K => {
            out.extend_from_slice(b);
            out.extend_from_slice(&[0; 14]);
        }
        WeightDtype::Q3_K => {
            out.extend_from_slice(&b[..96]);
            for s in 0..16 {
                out.push(quant::q3_k_scale(&b[96..108], s));
            }
            out.extend_from_slice(&b[108..110]);
            out.extend_from_slice(&[0, 0]);
        }
        _ => out.extend_from_slice(b),
    }
}

/// Encodes f32 values as little-endian bytes of `dtype`: float formats round to nearest
/// even, block formats are quantized by [`quant::quantize`] (an error for values it cannot
/// quantize, such as non-finite ones, or a length that is not whole blocks).
pub fn encode(
    values: &[f32],
    dtype: WeightDtype,
) -> std::result::Result<Vec<u8>, quant::QuantError> {
    Ok(match dtype {
        WeightDtype::F32 => bytemuck::cast_slice(values).to_vec(),
        WeightDtype::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        WeightDtype::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        block => quant::quantize(block, values)?,
    })
}
