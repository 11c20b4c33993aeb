//! The Rust `Params` structs must match the WGSL uniform blocks field for field: same names,
//! same byte offsets, same size. naga computes the WGSL layout.

use pagellm::internals::gpu::KernelSource;
use pagellm::internals::kernels::{
    add::AddParams,
    copy_blocks::CopyBlocksParams,
    embedding::EmbeddingParams,
    logits::{ArgmaxParams, GatherRowsParams},
    matmul::MatmulParams,
    moe::{MoeCombineParams, MoeMatmulParams, MoeRouteParams},
    paged_attention::{PagedAttentionParams, PagedAttentionReduceParams},
    reshape_and_cache::ReshapeAndCacheParams,
    rms_norm::RmsNormParams,
    rope::RopeParams,
    rotate::{RotateQkParams, RotateRowsParams},
    silu_mul::SiluMulParams,
    softcap::SoftcapParams,
    KernelParams, ALL, ARGMAX_LANES, ARGMAX_MERGE, ARGMAX_SLICES, MATMUL_SKINNY, MATMUL_SKINNY_SG,
    MATMUL_SKINNY_SG_WIDE, MATMUL_SKINNY_VEC, MATMUL_SKINNY_VEC_WIDE, MOE_MATMUL_SG,
    PAGED_ATTENTION_LANES, PAGED_ATTENTION_SG, PAGED_ATTENTION_TILES, RESHAPE_AND_CACHE_Q,
    RMS_NORM_LANES,
};

/// (kernel name, [(field, offset)], size) of the uniform at @group(0) @binding(0).
fn wgsl_layout(kernel: &pagellm::internals::gpu::KernelSource) -> (Vec<(String, u32)>, u32) {
    let src = kernel.full_source();
    let module = naga::front::wgsl::parse_str(&src).expect("parses");
    let var = module
        .global_variables
        .iter()
        .map(|(_, v)| v)
        .find(|v| {
            v.space == naga::AddressSpace::Uniform
                && v.binding
                    == Some(naga::ResourceBinding {
                        group: 0,
                        binding: 0,
                    })
        })
        .unwrap_or_else(|| panic!("{}: no uniform at group 0 binding 0", kernel.name));
    match &module.types[var.ty].inner {
        naga::TypeInner::Struct { members, span } => (
            members
                .iter()
                .map(|m| (m.name.clone().unwrap_or_default(), m.offset))
                .collect(),
            *span,
        ),
        other => panic!("{}: uniform is {other:?}, not a struct", kernel.name),
    }
}

fn check<P: KernelParams>() -> &'static str {
    check_kernel::<P>(P::KERNEL)
}

/// `P` against `kernel`, for a params block that several kernels share.
fn check_kernel<P: KernelParams>(kernel: KernelSource) -> &'static str {
    let (fields, span) = wgsl_layout(&kernel);
    let rust: Vec<(String, u32)> = P::fields()
        .into_iter()
        .map(|(n, o)| (n.to_string(), o as u32))
        .collect();
    assert_eq!(rust, fields, "{}: Rust fields vs WGSL members", kernel.name);
    assert_eq!(
        std::mem::size_of::<P>() as u32,
        span,
        "{}: Rust size vs WGSL struct size",
        kernel.name
    );
    kernel.name
}

#[test]
fn every_params_struct_matches_its_shader() {
    let covered = [
        check::<EmbeddingParams>(),
        check::<RmsNormParams>(),
        check_kernel::<RmsNormParams>(RMS_NORM_LANES),
        check::<MatmulParams>(),
        check_kernel::<MatmulParams>(MATMUL_SKINNY),
        check_kernel::<MatmulParams>(MATMUL_SKINNY_VEC),
        check_kernel::<MatmulParams>(MATMUL_SKINNY_SG),
        check_kernel::<MatmulParams>(MATMUL_SKINNY_VEC_WIDE),
        check_kernel::<MatmulParams>(MATMUL_SKINNY_SG_WIDE),
        check::<RopeParams>(),
        check::<SiluMulParams>(),
        check::<AddParams>(),
        check::<SoftcapParams>(),
        check::<ReshapeAndCacheParams>(),
        check_kernel::<ReshapeAndCacheParams>(RESHAPE_AND_CACHE_Q),
        check::<PagedAttentionParams>(),
        check_kernel::<PagedAttentionParams>(PAGED_ATTENTION_SG),
        check_kernel::<PagedAttentionParams>(PAGED_ATTENTION_LANES),
        check_kernel::<PagedAttentionParams>(PAGED_ATTENTION_TILES),
        check::<PagedAttentionReduceParams>(),
        check::<CopyBlocksParams>(),
        check::<GatherRowsParams>(),
        check::<ArgmaxParams>(),
        check_kernel::<ArgmaxParams>(ARGMAX_LANES),
        check_kernel::<ArgmaxParams>(ARGMAX_SLICES),
        check_kernel::<ArgmaxParams>(ARGMAX_MERGE),
        check::<RotateRowsParams>(),
        check::<RotateQkParams>(),
        check::<MoeRouteParams>(),
        check::<MoeMatmulParams>(),
        check_kernel::<MoeMatmulParams>(MOE_MATMUL_SG),
        check::<MoeCombineParams>(),
    ];
    for k in ALL {
        assert!(
            covered.contains(&k.name),
            "kernel {} has no params check",
            k.name
        );
    }
}
