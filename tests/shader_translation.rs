//! Every kernel, in every variant of its override constants, must pass naga's validator with
//! no optional capability beyond f16 packing in f32 (`unpack2x16float`, which wgpu grants on
//! every native backend and GLES 3.1) and translate to the four shading languages wgpu emits: MSL
//! (Metal), HLSL (DX12), SPIR-V (Vulkan) and GLSL ES 3.10 (GL). Kernels that use subgroup
//! operations (chosen only on devices that have them; GL never does) also get the subgroup
//! capability and skip GLSL ES. Metal and DX12 cannot run
//! here, so this is where a construct one of them rejects fails CI. When `spirv-val` and
//! `glslangValidator` are installed (CI installs them; set PAGELLM_REQUIRE_SHADER_TOOLS=1 to
//! make their absence an error) the SPIR-V and GLSL outputs are also checked by those
//! independent validators.

use naga::back::{glsl, hlsl, msl, spv, PipelineConstants};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
use pagellm::internals::kernels::ALL;
use std::io::Write;
use std::process::Command;

/// The values each override constant takes in practice.
fn override_values(name: &str) -> Vec<f64> {
    match name {
        "WEIGHT_DTYPE" => vec![0.0, 1.0, 2.0],
        "KV_DTYPE" => vec![0.0, 1.0, 3.0, 4.0],
        "KV_GROUP" => vec![1.0, 16.0, 64.0],
        "CONTIGUOUS" => vec![0.0, 1.0],
        "ROWS" => vec![1.0, 2.0, 4.0, 8.0],
        "ACTIVATION" => vec![0.0, 1.0],
        "GATED" => vec![0.0, 1.0, 2.0],
        "WIDE" => vec![0.0, 1.0],
        "NORM" => vec![0.0, 1.0],
        "NORM_DTYPE" => vec![0.0, 1.0, 2.0],
        // matmul_store.wgsl's bits: none, and all three (bias, accumulate, split), which
        // spells every path of the store.
        "STORE" => vec![0.0, 7.0],
        "BLOCK_SIZE" => vec![16.0, 24.0],
        "HD" => vec![48.0, 128.0],
        "RENORMALIZE" => vec![0.0, 1.0],
        "ROUTING" => vec![0.0, 1.0],
        other => panic!("test does not know the values of override {other}"),
    }
}

fn variants(module: &naga::Module) -> Vec<PipelineConstants> {
    let mut out = vec![PipelineConstants::default()];
    for (_, o) in module.overrides.iter() {
        let name = o.name.clone().expect("overrides are named");
        out = out
            .into_iter()
            .flat_map(|base| {
                override_values(&name).into_iter().map({
                    let name = name.clone();
                    move |v| {
                        let mut c = base.clone();
                        c.insert(name.clone(), v);
                        c
                    }
                })
            })
            .collect();
    }
    // Combinations the launchers never ask for: a normed and gated input, and a norm dtype
    // without a norm. And the store's paths with one weight dtype only: they do not meet
    // the weights' code, and every other combination would double the matmuls' variants.
    out.retain(|c| {
        let on = |name: &str| c.get(name).is_some_and(|&v| v != 0.0);
        let never = (on("NORM") && on("GATED"))
            || (!on("NORM") && on("NORM_DTYPE"))
            || (on("STORE") && on("WEIGHT_DTYPE"));
        !never
    });
    out
}

fn tool(name: &str) -> bool {
    let found = Command::new(name).arg("--version").output().is_ok();
    if !found {
        if std::env::var("PAGELLM_REQUIRE_SHADER_TOOLS").is_ok_and(|v| v == "1") {
            panic!("{name} is required (PAGELLM_REQUIRE_SHADER_TOOLS=1) but not installed");
        }
        eprintln!("note: {name} not installed; skipping its external check");
    }
    found
}

fn run_validator(cmd: &mut Command, what: &str) {
    let out = cmd.output().expect("run validator");
    assert!(
        out.status.success(),
        "{what}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn translate(
    kernel: &str,
    module: &naga::Module,
    info: &ModuleInfo,
    tmp: &std::path::Path,
    tools: (bool, bool),
    glsl_es: bool,
) {
    let stage = naga::ShaderStage::Compute;
    let ep = Some((stage, kernel.to_string()));

    let msl_opts = msl::Options {
        lang_version: (2, 0),
        ..Default::default()
    };
    let msl_pipe = msl::PipelineOptions {
        entry_point: ep.clone(),
        ..Default::default()
    };
    msl::write_string(module, info, &msl_opts, &msl_pipe)
        .unwrap_or_else(|e| panic!("{kernel}: MSL: {e:?}"));

    let mut hlsl_src = String::new();
    let hlsl_opts = hlsl::Options::default();
    let hlsl_pipe = hlsl::PipelineOptions { entry_point: ep };
    hlsl::Writer::new(&mut hlsl_src, &hlsl_opts, &hlsl_pipe)
        .write(module, info, None)
        .unwrap_or_else(|e| panic!("{kernel}: HLSL: {e:?}"));

    let spv_pipe = spv::PipelineOptions {
        shader_stage: stage,
        entry_point: kernel.to_string(),
    };
    // Subgroup operations need SPIR-V 1.3, which wgpu targets when the feature is on.
    let spv_opts = spv::Options {
        lang_version: if glsl_es { (1, 0) } else { (1, 3) },
        ..Default::default()
    };
    let words = spv::write_vec(module, info, &spv_opts, Some(&spv_pipe))
        .unwrap_or_else(|e| panic!("{kernel}: SPIR-V: {e:?}"));

    if tools.0 {
        let path = tmp.join(format!("{kernel}.spv"));
        std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(&words)).unwrap();
        run_validator(
            Command::new("spirv-val")
                .args(["--target-env", "vulkan1.1"])
                .arg(&path),
            &format!("{kernel}: spirv-val"),
        );
    }
    if glsl_es {
        let mut glsl_src = String::new();
        let glsl_opts = glsl::Options::default(); // GLSL ES 3.10, what wgpu's GL backend targets
        let glsl_pipe = glsl::PipelineOptions {
            shader_stage: stage,
            entry_point: kernel.to_string(),
            multiview: None,
        };
        glsl::Writer::new(
            &mut glsl_src,
            module,
            info,
            &glsl_opts,
            &glsl_pipe,
            naga::proc::BoundsCheckPolicies::default(),
        )
        .and_then(|mut w| w.write())
        .unwrap_or_else(|e| panic!("{kernel}: GLSL ES: {e:?}"));

        if tools.1 {
            let path = tmp.join(format!("{kernel}.comp"));
            std::fs::File::create(&path)
                .and_then(|mut f| f.write_all(glsl_src.as_bytes()))
                .unwrap();
            run_validator(
                Command::new("glslangValidator").arg(&path),
                &format!("{kernel}: glslangValidator"),
            );
        }
    }
}

#[test]
fn every_kernel_translates_to_msl_hlsl_spirv_and_glsl_es() {
    let tools = (tool("spirv-val"), tool("glslangValidator"));
    let tmp = std::env::temp_dir().join(format!("pagellm-shaders-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut checked = 0;
    for k in ALL {
        let src = k.full_source();
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&src)));
        assert!(
            module.entry_points.iter().any(|e| e.name == k.name),
            "{}: entry point must be named after the file",
            k.name
        );
        // Kernels that use subgroup operations run only where the device has them (never
        // on GL), so they get that capability and skip the GLSL ES translation.
        // (Their builtins, not the word: comments of plain kernels mention subgroups.)
        let subgroups = ["subgroupBroadcast", "subgroupMax", "subgroup_invocation_id"]
            .iter()
            .any(|b| src.contains(b));
        let mut caps = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        if subgroups {
            caps |= Capabilities::SUBGROUP;
        }
        let info = Validator::new(ValidationFlags::all(), caps)
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&src)));
        for constants in variants(&module) {
            let (m, i) =
                naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
                    .unwrap_or_else(|e| panic!("{} {constants:?}: {e:?}", k.name));
            translate(k.name, &m, &i, &tmp, tools, !subgroups);
            checked += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(checked >= ALL.len() + 5, "only {checked} variants checked");
}
