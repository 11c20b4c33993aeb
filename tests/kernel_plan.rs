//! The kernel plan: the defaults each adapter type gets, and plans that cannot run a model
//! refused by name before any buffer is allocated.

mod common;
use common::*;
use pagellm::internals::kernels::logits::ArgmaxKernel;
use pagellm::internals::kernels::matmul::MatmulKernel;
use pagellm::internals::kernels::paged_attention::AttentionKernel;
use pagellm::internals::kernels::plan::{KernelPlan, MatmulPlan, NormFusion, SKINNY_MAX_M};
use pagellm::internals::kernels::rms_norm::RmsNormKernel;
use pagellm::internals::kernels::ModelDims;

const DIMS: ModelDims = ModelDims {
    hidden: 64,
    head_dim: 16,
    q_width: 64,
    intermediate: 96,
};

/// Widths off a multiple of 8 everywhere.
const ODD: ModelDims = ModelDims {
    hidden: 36,
    head_dim: 18,
    q_width: 36,
    intermediate: 52,
};

#[test]
fn each_adapter_type_gets_its_measured_defaults() {
    for ctx in contexts() {
        let plan = KernelPlan::choose(ctx, &DIMS);
        let what = backend(ctx);
        plan.check(ctx, &DIMS).unwrap();
        let cpu = ctx.info.device_type == wgpu::DeviceType::Cpu;
        let m = plan.matmul;
        // Column kernels for decode-sized steps everywhere; tiles for larger steps on GPUs.
        assert_ne!(m.kernel(1), MatmulKernel::Tiled, "{what}");
        assert_eq!(m.kernel(SKINNY_MAX_M), m.kernel(1), "{what}");
        let subgroups = ctx.caps.subgroups && ctx.info.subgroup_min_size >= 8;
        let want_columns = match subgroups {
            true => MatmulKernel::ColumnsSubgroup,
            false => MatmulKernel::ColumnsVec,
        };
        assert_eq!(m.kernel(1), want_columns, "{what}");
        if cpu {
            assert_eq!(m.kernel(SKINNY_MAX_M + 1), want_columns, "{what}");
            assert_eq!(m.kernel(4096), want_columns, "{what}");
            assert!(m.wide_from.is_some() && m.wide_passes, "{what}");
            assert_eq!(plan.rms_norm, RmsNormKernel::Lanes, "{what}");
            assert_eq!(plan.argmax, ArgmaxKernel::Lanes, "{what}");
            assert_eq!(plan.norm_fusion, NormFusion::WhereFaster, "{what}");
            assert!(!plan.fused_activation, "{what}");
            let want = match subgroups {
                true => AttentionKernel::Tiles,
                false => AttentionKernel::Lanes,
            };
            assert_eq!(plan.attention, want, "{what}");
        } else {
            assert_eq!(m.kernel(SKINNY_MAX_M + 1), MatmulKernel::Tiled, "{what}");
            assert_eq!(m.wide_from, None, "{what}");
            assert!(!m.wide_passes, "{what}");
            assert_eq!(plan.rms_norm, RmsNormKernel::Workgroup, "{what}");
            assert_eq!(plan.argmax, ArgmaxKernel::Split, "{what}");
            assert_eq!(plan.norm_fusion, NormFusion::Always, "{what}");
            assert!(plan.fused_activation, "{what}");
        }
        // The per-call norm fusion: one-row steps of small weights only.
        let where_faster = KernelPlan {
            norm_fusion: NormFusion::WhereFaster,
            ..plan
        };
        assert!(where_faster.fuse_norm(1, 1 << 19));
        assert!(!where_faster.fuse_norm(1, (1 << 19) + 1));
        assert!(!where_faster.fuse_norm(2, 64));
    }
}

#[test]
fn widths_the_fast_kernels_cannot_read_get_the_general_ones() {
    for ctx in contexts() {
        // One projection's inner dimension off a multiple of 8 gives the whole model the
        // scalar column kernel; a hidden size off 8 keeps the norms unfused and per row
        // in the workgroup kernel; a head size off 8 runs the plain attention kernel.
        let plan = KernelPlan::choose(ctx, &ODD);
        plan.check(ctx, &ODD).unwrap();
        assert_eq!(plan.matmul.kernel(1), MatmulKernel::Columns);
        assert_eq!(plan.norm_fusion, NormFusion::Never);
        assert_eq!(plan.rms_norm, RmsNormKernel::Workgroup);
        assert_eq!(plan.qk_norm, RmsNormKernel::Workgroup);
        assert_eq!(plan.attention, AttentionKernel::Plain);
        let one_odd = ModelDims {
            intermediate: 100,
            ..DIMS
        };
        let m = MatmulPlan::choose(ctx, &one_odd.inner_dims());
        assert_eq!(m.kernel(1), MatmulKernel::Columns, "{}", backend(ctx));
    }
}

#[test]
fn a_plan_that_cannot_run_the_model_is_refused_by_name() {
    for ctx in contexts() {
        let base = KernelPlan::choose(ctx, &ODD);
        // (plan, what the error names)
        let cases = [
            (
                KernelPlan {
                    matmul: base.matmul.only(MatmulKernel::ColumnsVec),
                    ..base
                },
                "ColumnsVec cannot compute k = 36",
            ),
            (
                KernelPlan {
                    attention: AttentionKernel::Lanes,
                    ..base
                },
                "Lanes cannot run head_dim 18",
            ),
            (
                KernelPlan {
                    rms_norm: RmsNormKernel::Lanes,
                    ..base
                },
                "Lanes cannot normalise rows of 36",
            ),
            (
                KernelPlan {
                    norm_fusion: NormFusion::Always,
                    ..base
                },
                "norms of 36 elements cannot be fused",
            ),
        ];
        for (plan, names) in cases {
            let e = plan.check(ctx, &ODD).unwrap_err().to_string();
            assert!(e.contains(names), "{e}");
        }
        // Fusing per call is only sound where fused and separate norms give the same bits.
        let plan = KernelPlan {
            rms_norm: RmsNormKernel::Workgroup,
            norm_fusion: NormFusion::WhereFaster,
            ..KernelPlan::choose(ctx, &DIMS)
        };
        let e = plan.check(ctx, &DIMS).unwrap_err().to_string();
        assert!(e.contains("round differently"), "{e}");
    }
}

#[test]
fn the_plan_for_a_model_reads_every_weight_and_kv_format() {
    use pagellm::internals::formats::{GgmlType, KvDtype};
    use pagellm::internals::kernels::Formats;
    for ctx in contexts() {
        // Every format the crate stores, at once: the plan is the adapter's usual one.
        for kv in KvDtype::ALL {
            let formats = Formats {
                weights: GgmlType::ALL.to_vec(),
                kv,
            };
            let plan = KernelPlan::for_model(ctx, &DIMS, &formats).unwrap();
            assert_eq!(plan, KernelPlan::choose(ctx, &DIMS), "{kv}");
            assert!(plan.check_formats(&formats).is_ok());
        }
    }
}
