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
        let row_bytes = cols * dtype.bytes();
        if bytes.len() != rows * row_bytes {
            return Err(GpuError::invalid(
                "weight upload",
                format!(
                    "{name}: {} bytes given for [{rows}, {cols}] {dtype:?} ({} expected)",
                    bytes.len(),
                    rows * row_bytes
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
            let slice = &bytes[first_row * row_bytes..(first_row + n) * row_bytes];
            let buffer = ctx.upload(name, slice)?;
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
