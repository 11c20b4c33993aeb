//! Running pagellm on a device the application already owns.
//!
//! A desktop program that renders with wgpu has one instance, adapter, device and queue; it
//! should not open a second device (doubling driver memory, splitting the GPU between two
//! contexts). `GpuContext::from_existing` adopts clones of the application's handles: pagellm
//! respects the device's limits and features, and reports its own errors through error
//! scopes instead of replacing the application's error handler.
//!
//! Run: `cargo run --example shared_device`

use pagellm::internals::gpu::{Batch, GpuContext};
use pagellm::internals::kernels::{matmul, rms_norm, Weight, WeightDtype};

fn main() -> anyhow::Result<()> {
    // --- what the application already has (normally created next to its window surface) ---
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter =
        pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("application device"),
        ..Default::default()
    }))?;

    // --- pagellm on the same device ---
    let ctx = GpuContext::from_existing(adapter, device.clone(), queue.clone());
    println!(
        "pagellm shares the application's device: {}",
        ctx.describe()
    );

    // A tiny projection: y = rms_norm(x) · Wᵀ with a bf16 weight.
    let (hidden, out_features) = (8, 3);
    let x: Vec<f32> = (0..hidden).map(|i| i as f32 - 3.5).collect();
    let w: Vec<f32> = (0..out_features * hidden)
        .map(|i| ((i % 5) as f32 - 2.0) * 0.25)
        .collect();
    let norm_w = Weight::from_f32(
        &ctx,
        "norm",
        &vec![1.0; hidden],
        1,
        hidden,
        WeightDtype::F32,
    )?;
    let proj = Weight::from_f32(&ctx, "proj", &w, out_features, hidden, WeightDtype::BF16)?;
    let xb = ctx.upload("x", &x)?;
    let normed = ctx.storage_buffer("normed", (hidden * 4) as u64)?;
    let y = ctx.storage_buffer("y", (out_features * 4) as u64)?;

    let mut batch = Batch::new(&ctx, "example");
    // The kernels this adapter runs for a model of these widths.
    let plan = pagellm::internals::kernels::KernelPlan::choose(
        &ctx,
        &pagellm::internals::kernels::ModelDims {
            hidden,
            head_dim: hidden,
            q_width: hidden,
            intermediate: hidden,
        },
    );
    rms_norm::rms_norm(&mut batch, plan.rms_norm, &xb, &norm_w, &normed, 1, 1e-6)?;
    let call = matmul::Matmul::new(&normed, &proj, &y, 1);
    matmul::matmul(&mut batch, &plan.matmul, &call)?;
    batch.submit()?;
    let got: Vec<f32> = ctx.read(&y)?;

    // The same computed on the CPU.
    let normed_cpu = pagellm::internals::reference::rms_norm(&x, &vec![1.0; hidden], 1e-6);
    let want =
        pagellm::internals::reference::matmul(&normed_cpu, &w, None, 1, out_features, hidden);
    println!("GPU: {got:?}\nCPU: {want:?}");

    // The application keeps using its device as before.
    queue.submit([device.create_command_encoder(&Default::default()).finish()]);
    Ok(())
}
