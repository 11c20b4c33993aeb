//! The KV cache's formats: what a value is stored as ([`KvDtype`]), whether keys are rotated
//! before they are stored ([`KvRotation`]), and what one block holds ([`KvLayout`]). The
//! quantized dtypes' block codec is in [`super::kv_blocks`].

/// A KV layout a pool cannot store: why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LayoutError(pub String);

/// Precision of the KV pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    /// Half precision (the default): what the model computes, at half the bytes of f32.
    #[default]
    F16,
    /// Single precision: the reference the others are measured against.
    F32,
    /// Symmetric 8-bit codes, one f16 scale per group of (up to) 64 values of a row.
    Int8,
    /// Symmetric 4-bit codes, one f16 scale per group of (up to) 32 values of a row.
    Int4,
}

impl KvDtype {
    /// Every dtype.
    pub const ALL: [KvDtype; 4] = [KvDtype::F16, KvDtype::F32, KvDtype::Int8, KvDtype::Int4];

    /// Value of the kernels' `KV_DTYPE` override (`DTYPE_*` in common.wgsl).
    pub fn code(self) -> f64 {
        match self {
            KvDtype::F32 => 0.0,
            KvDtype::F16 => 1.0,
            KvDtype::Int8 => 3.0,
            KvDtype::Int4 => 4.0,
        }
    }

    /// Bits of one stored value, scales not counted.
    pub fn bits(self) -> usize {
        match self {
            KvDtype::F32 => 32,
            KvDtype::F16 => 16,
            KvDtype::Int8 => 8,
            KvDtype::Int4 => 4,
        }
    }

    /// Whether values are stored as integer codes with scales.
    pub fn is_quantized(self) -> bool {
        matches!(self, KvDtype::Int8 | KvDtype::Int4)
    }

    /// The name the command line takes.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Int8 => "int8",
            KvDtype::Int4 => "int4",
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        KvDtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown KV dtype {s:?} (expected f16, f32, int8 or int4)"))
    }
}

/// Whether cached keys and values are rotated before they are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvRotation {
    /// Stored as computed.
    #[default]
    None,
    /// Each head's keys, and the queries that meet them, are rotated by a fixed
    /// random-signed Walsh-Hadamard transform (block-diagonal over the powers of two that
    /// sum to head_dim; `shaders/rotate_common.wgsl`) after RoPE. Values are stored as they
    /// are: rotating them does not lower their quantization error (docs/BENCHMARKS.md).
    Hadamard,
}

impl KvRotation {
    /// What an unspecified rotation means for `dtype`, chosen by measurement on the shipped
    /// model (docs/BENCHMARKS.md): Hadamard for quantized caches, where it lowers the mean
    /// KL divergence from an f32 cache (int8 by 40%, int4 by 17-27%) for 3-5% of a decode
    /// step on lavapipe; none for float caches, which it cannot help.
    pub fn default_for(dtype: KvDtype) -> Self {
        if dtype.is_quantized() {
            KvRotation::Hadamard
        } else {
            KvRotation::None
        }
    }

    /// The name the command line takes.
    pub fn name(self) -> &'static str {
        match self {
            KvRotation::None => "none",
            KvRotation::Hadamard => "hadamard",
        }
    }
}

impl std::fmt::Display for KvRotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Shape of the cache: what one block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers (slabs) one block holds.
    pub num_layers: usize,
    /// Key/value heads per layer.
    pub num_kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// How values are stored.
    pub dtype: KvDtype,
}

impl KvLayout {
    /// Bytes of one block of one layer's K (or V).
    pub fn block_bytes(&self) -> u64 {
        (self.num_kv_heads * self.tile_words() * 4) as u64
    }

    /// Bytes one block costs across all layers, K and V.
    pub fn block_bytes_all_layers(&self) -> u64 {
        self.block_bytes() * 2 * self.num_layers as u64
    }

    /// Bytes of cache one token takes across all layers, K and V, scales included.
    pub fn bytes_per_token(&self) -> f64 {
        self.block_bytes_all_layers() as f64 / self.block_size as f64
    }

    /// u32 words of one token row's values (one KV head), scales not counted.
    pub fn row_words(&self) -> usize {
        self.head_dim * self.dtype.bits() / 32
    }

    /// Values that share one scale (quantized pools), or 0 (float pools).
    pub fn group_size(&self) -> usize {
        group_size(self.dtype, self.head_dim).unwrap_or(0)
    }

    /// u32 words of one (block, KV head) tile: `block_size` rows of values, then (quantized
    /// pools) the rows' scales as f16, two per word, row after row.
    pub fn tile_words(&self) -> usize {
        let values = self.block_size * self.row_words();
        match self.group_size() {
            0 => values,
            g => values + (self.block_size * self.head_dim / g).div_ceil(2),
        }
    }

    /// Checks that a pool can store this layout; the error says why not.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.num_layers == 0 || self.num_kv_heads == 0 || self.block_size == 0 {
            return Err(LayoutError(format!("empty layout {self:?}")));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(LayoutError(format!(
                "head_dim {} must be even",
                self.head_dim
            )));
        }
        if self.dtype.is_quantized() && group_size(self.dtype, self.head_dim).is_none() {
            return Err(LayoutError(format!(
                "a {} KV cache needs a head_dim divisible by 8; this one is {}",
                self.dtype, self.head_dim
            )));
        }
        Ok(())
    }
}

/// Nominal values per scale for int8 rows.
pub const INT8_GROUP: usize = 64;
/// Nominal values per scale for int4 rows.
pub const INT4_GROUP: usize = 32;

/// Values per scale group of a `head_dim` row (the rule is in `super::kv_blocks`), or `None` for float dtypes and for head
/// dimensions a quantized row cannot hold.
pub fn group_size(dtype: KvDtype, head_dim: usize) -> Option<usize> {
    let nominal = match dtype {
        KvDtype::Int8 => INT8_GROUP,
        KvDtype::Int4 => INT4_GROUP,
        KvDtype::F16 | KvDtype::F32 => return None,
    };
    if head_dim == 0 || !head_dim.is_multiple_of(8) {
        return None;
    }
    (head_dim.div_ceil(nominal)..=head_dim / 8)
        .find(|n| head_dim.is_multiple_of(*n) && (head_dim / n).is_multiple_of(8))
        .map(|n| head_dim / n)
}
