//! Weights on the GPU in their on-disk precision, split into row chunks when one tensor is
//! larger than a storage binding (a big embedding table or LM head).

use crate::error::{GpuError, Result};
use crate::gpu::GpuContext;

/// Storage format of a weight. 16-bit formats are packed two per `u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    F32,
    F16,
    BF16,
}

impl WeightDtype {
    /// The value of the kernels' `WEIGHT_DTYPE` override (see shaders/common.wgsl).
    pub fn code(self) -> f64 {
        match self {
            WeightDtype::F32 => 0.0,
            WeightDtype::F16 => 1.0,
            WeightDtype::BF16 => 2.0,
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::F16 | WeightDtype::BF16 => 2,
        }
    }
}

/// One row range of a weight, in its own buffer.
#[derive(Debug)]
pub struct WeightChunk {
    pub buffer: wgpu::Buffer,
    pub first_row: usize,
    pub rows: usize,
}

/// A 2-D weight `[rows, cols]` (a Hugging Face Linear weight is `[out, in]`).
#[derive(Debug)]
pub struct Weight {
    pub rows: usize,
    pub cols: usize,
    pub dtype: WeightDtype,
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

    /// [`Self::upload_parts`] with an explicit per-chunk byte limit.
    pub fn upload_parts_with_limit(
        ctx: &GpuContext,
        name: &str,
        parts: &[&[u8]],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
        max_chunk_bytes: u64,
    ) -> Result<Self> {
        let row_bytes = cols * dtype.bytes();
        let given: usize = parts.iter().map(|p| p.len()).sum();
        if given != rows * row_bytes || parts.iter().any(|p| p.len() % row_bytes.max(1) != 0) {
            return Err(GpuError::invalid(
                "weight upload",
                format!(
                    "{name}: {given} bytes given for [{rows}, {cols}] {dtype:?} ({} expected, each of the {} parts whole rows)",
                    rows * row_bytes,
                    parts.len()
                ),
            ));
        }
        if rows == 0 || cols == 0 {
            return Err(GpuError::invalid(
                "weight upload",
                format!("{name}: empty shape [{rows}, {cols}]"),
            ));
        }
        if dtype != WeightDtype::F32 && !cols.is_multiple_of(2) {
            return Err(GpuError::invalid(
                "weight upload",
                format!("{name}: 16-bit weights need an even row length, got {cols}"),
            ));
        }
        let rows_per_chunk = (max_chunk_bytes / row_bytes.max(1) as u64) as usize;
        if rows_per_chunk == 0 {
            return Err(GpuError::TooLarge {
                what: format!("one row of {name}"),
                needed: row_bytes as u64,
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
            let buffer = ctx.upload_parts(name, &pieces)?;
            chunks.push(WeightChunk {
                buffer,
                first_row,
                rows: n,
            });
            first_row += n;
        }
        Ok(Weight {
            rows,
            cols,
            dtype,
            chunks,
        })
    }

    /// Convenience for tests and references: uploads f32 values converted to `dtype`.
    pub fn from_f32(
        ctx: &GpuContext,
        name: &str,
        values: &[f32],
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
    ) -> Result<Self> {
        Self::upload(ctx, name, &encode(values, dtype), rows, cols, dtype)
    }
}

/// Encodes f32 values as little-endian bytes of `dtype` (round to nearest even).
pub fn encode(values: &[f32], dtype: WeightDtype) -> Vec<u8> {
    match dtype {
        WeightDtype::F32 => bytemuck::cast_slice(values).to_vec(),
        WeightDtype::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        WeightDtype::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}
