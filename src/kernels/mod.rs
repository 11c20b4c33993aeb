//! WGSL kernels and their typed launchers, one file per kernel (`shaders/<name>.wgsl`, entry
//! point `<name>`). Launchers validate their arguments, fill the kernel's uniform `Params`
//! (a `#[repr(C)]` mirror of the WGSL struct, checked by a test) and record a dispatch
//! into a [`Batch`](crate::gpu::Batch). They never submit or wait. Where an operation has
//! several kernels, the launcher takes the one to run from the [`KernelPlan`], chosen once
//! per adapter and model.

pub mod add;
pub mod choice;
pub mod copy_blocks;
pub mod embedding;
pub mod logits;
pub mod matmul;
pub mod moe;
pub mod paged_attention;
pub mod plan;
pub mod reshape_and_cache;
pub mod rms_norm;
pub mod rope;
pub mod rotate;
pub mod silu_mul;
pub mod softcap;
pub mod weight;

pub use plan::{Formats, KernelPlan, ModelDims};
pub use weight::{Weight, WeightDtype};

use crate::gpu::KernelSource;

macro_rules! kernel {
    ($const_name:ident, $name:literal) => {
        pub const $const_name: KernelSource = KernelSource {
            name: $name,
            body: include_str!(concat!("../../shaders/", $name, ".wgsl")),
        };
    };
    // A kernel compiled with shared WGSL pieces in front of its own file (module-scope
    // declarations may come in any order).
    ($const_name:ident, $name:literal, [$($part:literal),+]) => {
        pub const $const_name: KernelSource = KernelSource {
            name: $name,
            body: concat!(
                $(include_str!(concat!("../../shaders/", $part, ".wgsl")), "\n",)+
                include_str!(concat!("../../shaders/", $name, ".wgsl"))
            ),
        };
    };
}

kernel!(EMBEDDING, "embedding", ["weight_blocks"]);
kernel!(RMS_NORM, "rms_norm");
kernel!(RMS_NORM_LANES, "rms_norm_lanes");
kernel!(
    MATMUL,
    "matmul",
    ["matmul_store", "matmul_x", "weight_blocks"]
);
kernel!(
    MATMUL_SKINNY,
    "matmul_skinny",
    [
        "matmul_store",
        "matmul_columns",
        "matmul_x",
        "weight_blocks"
    ]
);
kernel!(
    MATMUL_SKINNY_VEC,
    "matmul_skinny_vec",
    [
        "matmul_store",
        "matmul_columns",
        "matmul_columns_vec",
        "weights8",
        "weight_blocks"
    ]
);
kernel!(
    MATMUL_SKINNY_SG,
    "matmul_skinny_sg",
    [
        "matmul_store",
        "matmul_columns",
        "matmul_columns_vec",
        "broadcast8",
        "weights8",
        "weight_blocks"
    ]
);
kernel!(
    MATMUL_SKINNY_VEC_WIDE,
    "matmul_skinny_vec_wide",
    [
        "matmul_store",
        "matmul_columns",
        "matmul_columns_vec",
        "weights8",
        "weight_blocks",
        "matmul_skinny_vec"
    ]
);
kernel!(
    MATMUL_SKINNY_SG_WIDE,
    "matmul_skinny_sg_wide",
    [
        "matmul_store",
        "matmul_columns",
        "matmul_columns_vec",
        "broadcast8",
        "weights8",
        "weight_blocks",
        "matmul_skinny_sg"
    ]
);
kernel!(MOE_ROUTE, "moe_route");
kernel!(
    MOE_MATMUL,
    "moe_matmul",
    ["moe_matmul_body", "weights8", "weight_blocks"]
);
kernel!(
    MOE_MATMUL_SG,
    "moe_matmul_sg",
    ["moe_matmul_body", "broadcast8", "weights8", "weight_blocks"]
);
kernel!(MOE_COMBINE, "moe_combine");
kernel!(ROPE, "rope");
kernel!(SILU_MUL, "silu_mul");
kernel!(ADD, "add");
kernel!(SOFTCAP, "softcap");
kernel!(RESHAPE_AND_CACHE, "reshape_and_cache", ["reshape_common"]);
kernel!(
    RESHAPE_AND_CACHE_Q,
    "reshape_and_cache_q",
    ["reshape_common"]
);
kernel!(
    PAGED_ATTENTION,
    "paged_attention",
    ["paged_attention_kv", "paged_attention_common"]
);
kernel!(
    PAGED_ATTENTION_SG,
    "paged_attention_sg",
    ["paged_attention_kv", "paged_attention_common"]
);
kernel!(
    PAGED_ATTENTION_LANES,
    "paged_attention_lanes",
    ["paged_attention_kv"]
);
kernel!(
    PAGED_ATTENTION_TILES,
    "paged_attention_tiles",
    ["paged_attention_kv", "paged_attention_lanes"]
);
kernel!(PAGED_ATTENTION_REDUCE, "paged_attention_reduce");
kernel!(COPY_BLOCKS, "copy_blocks");
kernel!(GATHER_ROWS, "gather_rows");
kernel!(ARGMAX, "argmax", ["argmax_common", "argmax_tree"]);
kernel!(ARGMAX_LANES, "argmax_lanes", ["argmax_common"]);
kernel!(
    ARGMAX_SLICES,
    "argmax_slices",
    ["argmax_common", "argmax_tree"]
);
kernel!(ARGMAX_MERGE, "argmax_merge", ["argmax_common"]);
kernel!(ROTATE_ROWS, "rotate_rows", ["rotate_common"]);
kernel!(ROTATE_QK, "rotate_qk", ["rotate_common"]);

/// Every kernel, for tests that check all shaders (translation, uniform layouts).
pub const ALL: &[KernelSource] = &[
    EMBEDDING,
    RMS_NORM,
    RMS_NORM_LANES,
    MATMUL,
    MATMUL_SKINNY,
    MATMUL_SKINNY_VEC,
    MATMUL_SKINNY_SG,
    MATMUL_SKINNY_VEC_WIDE,
    MATMUL_SKINNY_SG_WIDE,
    ROPE,
    SILU_MUL,
    ADD,
    SOFTCAP,
    RESHAPE_AND_CACHE,
    RESHAPE_AND_CACHE_Q,
    PAGED_ATTENTION,
    PAGED_ATTENTION_SG,
    PAGED_ATTENTION_LANES,
    PAGED_ATTENTION_TILES,
    PAGED_ATTENTION_REDUCE,
    COPY_BLOCKS,
    GATHER_ROWS,
    ARGMAX,
    ARGMAX_LANES,
    ARGMAX_SLICES,
    ARGMAX_MERGE,
    ROTATE_ROWS,
    ROTATE_QK,
    MOE_ROUTE,
    MOE_MATMUL,
    MOE_MATMUL_SG,
    MOE_COMBINE,
];

/// A uniform parameter block shared with a WGSL kernel: the Rust mirror of its `Params`.
pub trait KernelParams: bytemuck::Pod {
    const KERNEL: KernelSource;
    /// (field name, byte offset) of every field, in declaration order.
    fn fields() -> Vec<(&'static str, usize)>;
}

/// Declares a `#[repr(C)]` params struct of u32/f32 fields and its [`KernelParams`] impl.
macro_rules! params {
    ($(#[$meta:meta])* $name:ident for $kernel:path { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name { $(pub $field: $ty),* }

        impl $crate::kernels::KernelParams for $name {
            const KERNEL: $crate::gpu::KernelSource = $kernel;
            fn fields() -> Vec<(&'static str, usize)> {
                vec![$((stringify!($field), std::mem::offset_of!($name, $field))),*]
            }
        }
    };
}
pub(crate) use params;

/// Workgroups needed to cover `n` items with `per_group` per workgroup.
pub(crate) fn groups(n: usize, per_group: usize) -> u32 {
    n.div_ceil(per_group) as u32
}

/// Checks that `buffer` holds at least `elems` 4-byte elements.
pub(crate) fn check_len<'b>(
    kernel: &'static str,
    what: &str,
    buffer: impl Into<crate::gpu::Bind<'b>>,
    elems: usize,
) -> crate::error::Result<()> {
    let need = elems as u64 * 4;
    let size = buffer.into().size();
    if size < need {
        return Err(crate::error::GpuError::invalid(
            kernel,
            format!("{what} holds {size} bytes but {need} are needed"),
        ));
    }
    Ok(())
}
