//! `pagellm devices`: every adapter with the facts that matter for choosing one.

use anyhow::Result;
use pagellm::{enumerate_adapters, AdapterReport, AdapterRequest};

pub fn run() -> Result<()> {
    let req = AdapterRequest::from_env()?;
    let adapters = enumerate_adapters(req.backends);
    if adapters.is_empty() {
        anyhow::bail!(
            "no GPU adapter found for backends {:?}; on Linux without a GPU install Mesa's \
             software drivers (Debian: apt-get install mesa-vulkan-drivers libegl-mesa0)",
            req.backends
        );
    }
    let chosen = match pagellm::GpuContext::new(&req) {
        Ok(c) => Some(c.info),
        Err(e) => {
            eprintln!("note: {e}");
            None
        }
    };
    for (i, a) in adapters.iter().enumerate() {
        print_adapter(i, a, chosen.as_ref());
    }
    Ok(())
}

fn print_adapter(i: usize, a: &AdapterReport, chosen: Option<&pagellm::wgpu::AdapterInfo>) {
    let mib = |b: u64| format!("{} MiB", b / (1024 * 1024));
    let is_chosen = chosen.is_some_and(|c| c.name == a.info.name && c.backend == a.info.backend);
    println!(
        "[{i}] {}{}",
        a.info.name,
        if is_chosen { "  (default choice)" } else { "" }
    );
    println!("    backend:            {:?}", a.info.backend);
    println!("    type:               {:?}", a.info.device_type);
    println!(
        "    driver:             {} {}",
        a.info.driver, a.info.driver_info
    );
    match &a.memory {
        Some(m) => println!("    memory:             {m}"),
        None => println!(
            "    memory:             not reported (Vulkan reports it with VK_EXT_memory_budget)"
        ),
    }
    println!("    max buffer size:    {}", mib(a.limits.max_buffer_size));
    println!(
        "    max storage binding: {}",
        mib(a.limits.max_storage_buffer_binding_size)
    );
    println!(
        "    storage buffers per stage: {}, workgroup memory: {} KiB, invocations per workgroup: {}",
        a.limits.max_storage_buffers_per_shader_stage,
        a.limits.max_compute_workgroup_storage_size / 1024,
        a.limits.max_compute_invocations_per_workgroup
    );
    println!(
        "    features:           shader-f16 {}, subgroups {}, timestamp queries {}",
        yes(a.caps.shader_f16),
        yes(a.caps.subgroups),
        yes(a.caps.timestamp_query)
    );
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
