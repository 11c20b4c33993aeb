//! The context layer: a host application's device can be adopted, wgpu errors become typed
//! errors instead of panics, limits are the adapter's own, and a lost device is reported.

mod common;
use common::*;
use pagellm::internals::gpu::{AdapterRequest, Batch, GpuContext};
use pagellm::internals::kernels::{add::add, Weight, WeightDtype};
use pagellm::GpuError;

#[test]
fn device_uses_the_adapters_real_limits() {
    for ctx in contexts() {
        let adapter = ctx.adapter.limits();
        assert_eq!(
            ctx.limits.max_storage_buffer_binding_size,
            adapter.max_storage_buffer_binding_size
        );
        assert_eq!(ctx.limits.max_buffer_size, adapter.max_buffer_size);
        // wgpu's default is 128 MiB binding / 256 MiB buffer; the software adapters offer 2 GiB
        // buffers, so a default-limits device would show 256 MiB here.
        assert!(
            ctx.limits.max_buffer_size > 256 << 20,
            "{:?}",
            ctx.limits.max_buffer_size
        );
    }
}

#[test]
fn wgpu_validation_errors_are_typed_errors() {
    for ctx in contexts() {
        // A buffer without STORAGE usage bound as storage: wgpu validation, not a panic.
        let not_storage = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("uniform only"),
            size: 64,
            usage: wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: false,
        });
        let x = ctx.storage_buffer("x", 64).unwrap();
        let mut b = Batch::new(ctx, "bad binding");
        let e = add(&mut b, &x, &not_storage, 16).unwrap_err();
        assert!(matches!(e, GpuError::Validation { .. }), "{e:?}");
        assert!(e.to_string().contains("add"), "{e}");
        // The context stays usable afterwards.
        ctx.check_health().unwrap();
        let y = ctx.upload("y", &[1.0f32; 16]).unwrap();
        let mut b = Batch::new(ctx, "good");
        add(&mut b, &x, &y, 16).unwrap();
        b.submit().unwrap();
        assert_eq!(read_f32(ctx, &x, 16), vec![1.0; 16]);
    }
}

#[test]
fn oversized_buffers_are_refused_with_the_limit() {
    for ctx in contexts() {
        let e = ctx
            .storage_buffer("huge", ctx.limits.max_buffer_size + 4)
            .unwrap_err();
        assert!(matches!(e, GpuError::TooLarge { .. }), "{e:?}");
        // A weight row wider than the chunk limit cannot be split by rows.
        let e = Weight::upload_with_limit(ctx, "w", &[0u8; 64], 2, 8, WeightDtype::F32, 16)
            .unwrap_err();
        assert!(e.to_string().contains("one row of w"), "{e}");
        let e = Weight::upload(ctx, "w", &[0u8; 60], 2, 8, WeightDtype::F32).unwrap_err();
        assert!(e.to_string().contains("60 bytes given"), "{e}");
    }
}

/// A kernel and a read-back on `ctx`, checked.
fn adds_and_reads_back(ctx: &GpuContext) {
    let x = ctx.upload("x", &[1.0f32, 2.0, 3.0]).unwrap();
    let y = ctx.upload("y", &[10.0f32, 20.0, 30.0]).unwrap();
    let mut b = Batch::new(ctx, "on an adopted device");
    add(&mut b, &x, &y, 3).unwrap();
    b.submit().unwrap();
    assert_eq!(read_f32(ctx, &x, 3), vec![11.0, 22.0, 33.0]);
}

#[test]
fn an_application_device_can_be_adopted() {
    // What a desktop app that already renders with wgpu does: it owns instance, adapter,
    // device and queue, and hands clones to pagellm.
    for ctx in contexts() {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::from(ctx.info.backend);
        let instance = wgpu::Instance::new(desc);
        let adapter =
            pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
                .expect("adapter");
        let (device, queue) =
            pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default()))
                .expect("device");
        let shared = GpuContext::from_existing(adapter, device.clone(), queue.clone());
        assert_eq!(
            shared.limits,
            device.limits(),
            "the app's limits are respected"
        );
        adds_and_reads_back(&shared);
    }
}

#[test]
fn an_application_device_opened_with_pagellms_descriptor_gets_what_pagellm_would_open() {
    // An app that creates its device itself (a windowing toolkit's device hook) asks for
    // GpuContext::device_descriptor and ends up with the same limits and features as a
    // context pagellm opened on its own.
    for ctx in contexts() {
        let desc = GpuContext::device_descriptor(&ctx.adapter);
        assert_eq!(desc.required_limits, ctx.adapter.limits());
        let (device, queue) =
            pollster::block_on(ctx.adapter.request_device(&desc)).expect("device");
        let shared = GpuContext::from_existing(ctx.adapter.clone(), device, queue);
        assert_eq!(shared.limits, ctx.limits, "{}", ctx.describe());
        // Every optional feature the kernels use that the adapter has, and no other.
        let adapter = ctx.adapter.features();
        for f in [
            wgpu::Features::SHADER_F16,
            wgpu::Features::SUBGROUP,
            wgpu::Features::TIMESTAMP_QUERY,
        ] {
            assert_eq!(
                shared.device.features().contains(f),
                adapter.contains(f),
                "{f:?} on {}",
                ctx.describe()
            );
        }
        assert_eq!(shared.caps, ctx.caps, "{}", ctx.describe());
        assert_eq!(
            shared.wait_slice(),
            (ctx.info.backend == wgpu::Backend::Gl)
                .then_some(pagellm::internals::gpu::SHARED_GL_WAIT_SLICE),
            "an adopted GL device waits in slices"
        );
        // Work and read-back on the adopted device (a sliced wait on GL).
        adds_and_reads_back(&shared);
    }
}

#[test]
fn an_applications_adapter_list_is_chosen_from_by_pagellms_rules() {
    for ctx in contexts() {
        let backends = wgpu::Backends::from(ctx.info.backend);
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        let adapters = pollster::block_on(wgpu::Instance::new(desc).enumerate_adapters(backends));
        assert!(!adapters.is_empty());
        // By name, as WGPU_ADAPTER_NAME asks.
        let by_name = AdapterRequest {
            backends,
            name_contains: Some(ctx.info.name.to_uppercase()),
            ..Default::default()
        };
        let i = by_name
            .choose(&adapters)
            .expect("the context's own adapter");
        assert_eq!(adapters[i].get_info().name, ctx.info.name);
        // A name no adapter has: an error that lists what there is.
        let missing = AdapterRequest {
            backends,
            name_contains: Some("no such adapter".into()),
            ..Default::default()
        };
        let e = missing.choose(&adapters).unwrap_err().to_string();
        assert!(
            e.contains("WGPU_ADAPTER_NAME") && e.contains(&ctx.info.name),
            "{e}"
        );
        // No adapters at all (an app whose window no adapter can present to).
        let any = AdapterRequest {
            backends,
            ..Default::default()
        };
        let e = any.choose(&[]).unwrap_err();
        assert!(matches!(e, GpuError::NoAdapter { .. }), "{e:?}");
    }
}

#[test]
fn a_lost_device_is_reported() {
    if contexts().is_empty() {
        return;
    }
    let ctx = GpuContext::new(&AdapterRequest::default()).unwrap();
    ctx.device.destroy();
    let _ = ctx.wait();
    let e = ctx.storage_buffer("after loss", 16).unwrap_err();
    assert!(matches!(e, GpuError::DeviceLost(_)), "{e:?}");
}

#[test]
fn sections_of_one_upload_sit_at_aligned_offsets_with_their_data() {
    // The engine's step metadata is one upload bound in sections; each section must start
    // at an offset the adapter accepts for a storage binding and hold its part intact.
    for ctx in contexts() {
        let a: Vec<u32> = vec![1, 2, 3];
        let c: Vec<u32> = (10..80).collect();
        let parts: [&[u8]; 3] = [bytemuck::cast_slice(&a), &[], bytemuck::cast_slice(&c)];
        let (buffer, sections) = ctx.upload_sections("sections", &parts).unwrap();
        let align = ctx.limits.min_storage_buffer_offset_alignment as u64;
        assert_eq!(sections.len(), 3);
        assert_eq!(sections[0], (0, 12));
        assert_eq!(sections[1], (align.max(12).next_multiple_of(align), 4));
        for &(offset, size) in &sections {
            assert_eq!(offset % align, 0, "offset {offset} on {}", backend(ctx));
            assert!(offset + size <= buffer.size());
        }
        let all: Vec<u32> = ctx.read(&buffer).unwrap();
        let words = |i: usize| {
            let (offset, size) = sections[i];
            all[offset as usize / 4..(offset + size) as usize / 4].to_vec()
        };
        assert_eq!(words(0), a);
        assert_eq!(words(1), vec![0]);
        assert_eq!(words(2), c);
    }
}

#[test]
fn every_dispatch_of_a_long_batch_sees_its_own_parameters() {
    // A batch packs its dispatches' parameter blocks into shared 64 KiB buffers; 700
    // dispatches overflow several of them at 256-byte alignment. Dispatch i adds y to x
    // over its first i + 1 elements, so x[j] gains (700 - j) * y[j] only if every dispatch
    // read its own `len`.
    const N: usize = 700;
    for ctx in contexts() {
        let x0: Vec<f32> = (0..N).map(|j| j as f32).collect();
        let y: Vec<f32> = (0..N).map(|j| (j % 3) as f32).collect();
        let xb = ctx.upload("x", &x0).unwrap();
        let yb = ctx.upload("y", &y).unwrap();
        let mut b = Batch::new(ctx, "long batch");
        for i in 0..N {
            add(&mut b, &xb, &yb, i + 1).unwrap();
        }
        b.submit().unwrap();
        let got: Vec<f32> = ctx.read(&xb).unwrap();
        for j in 0..N {
            let want = x0[j] + (N - j) as f32 * y[j];
            assert_eq!(got[j], want, "element {j} on {}", backend(ctx));
        }
    }
}

#[test]
fn profiling_counts_every_dispatch_by_kernel_and_phase_with_either_timing_method() {
    use pagellm::internals::gpu::TimingMethod;
    use pagellm::internals::kernels::rms_norm::{rms_norm, RmsNormKernel};
    for ctx in contexts() {
        // The profile names a kernel by its shader file.
        let kernel = RmsNormKernel::choose(ctx, 4);
        let norm = match kernel {
            RmsNormKernel::Workgroup => "rms_norm",
            RmsNormKernel::Lanes => "rms_norm_lanes",
        };
        for method in [TimingMethod::Timestamps, TimingMethod::SubmitPerDispatch] {
            // A context of its own, so the shared one of the other tests stays unprofiled.
            let p = arc(ctx);
            assert!(p.profiler().is_none(), "profiling is off unless asked for");
            let profiler = p.enable_profiling_with(method);
            let stamps = ctx
                .device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY);
            let want = if stamps {
                method
            } else {
                TimingMethod::SubmitPerDispatch
            };
            assert_eq!(profiler.method(), want);

            // A prefill-like step: three adds and two norms in one batch, whose results
            // must be right even when the fallback submits each dispatch on its own.
            profiler.begin_step("prefill");
            let x = p.upload("x", &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
            let y = p.upload("y", &[1.0f32; 4]).unwrap();
            let w = Weight::from_f32(&p, "w", &[1.0; 4], 1, 4, WeightDtype::F32).unwrap();
            let normed = p.storage_buffer("normed", 16).unwrap();
            let mut b = Batch::new(&p, "profiled");
            for _ in 0..3 {
                add(&mut b, &x, &y, 4).unwrap();
            }
            rms_norm(&mut b, kernel, &x, &w, &normed, 1, 1e-6).unwrap();
            rms_norm(&mut b, kernel, &x, &w, &normed, 1, 1e-6).unwrap();
            b.submit().unwrap();
            assert_eq!(read_f32(&p, &x, 4), vec![4.0, 5.0, 6.0, 7.0]);
            let want_norm =
                pagellm::internals::reference::rms_norm(&[4.0, 5.0, 6.0, 7.0], &[1.0; 4], 1e-6);
            assert_close(
                "rms_norm",
                &read_f32(&p, &normed, 4),
                &want_norm,
                1e-5,
                1e-5,
            );
            // Two decode-like steps of one add each.
            for _ in 0..2 {
                profiler.begin_step("decode");
                let mut b = Batch::new(&p, "profiled decode");
                add(&mut b, &x, &y, 4).unwrap();
                b.submit().unwrap();
                p.wait().unwrap();
            }

            let phases = profiler.take();
            let what = format!("{method:?} on {}", ctx.describe());
            let prefill = &phases["prefill"];
            assert_eq!(prefill.steps, 1, "{what}");
            assert_eq!(prefill.kernels["add"].calls, 3, "{what}");
            assert_eq!(prefill.kernels[norm].calls, 2, "{what}");
            assert_eq!(prefill.kernels.len(), 2, "{what}: {:?}", prefill.kernels);
            let decode = &phases["decode"];
            assert_eq!((decode.steps, decode.calls()), (2, 2), "{what}");
            for (name, ph) in [("prefill", prefill), ("decode", decode)] {
                assert!(!ph.gpu_total().is_zero(), "{what}: no GPU time in {name}");
                assert!(
                    !ph.record.is_zero() && !ph.submit.is_zero(),
                    "{what}: {ph:?}"
                );
                assert!(
                    !ph.wait.is_zero(),
                    "{what}: {name} waited for its read-back"
                );
            }
            // This context compiled add and the norm in the prefill step and nothing after.
            assert!(!prefill.compile.is_zero(), "{what}: {prefill:?}");
            assert!(prefill.compile <= prefill.record, "{what}: {prefill:?}");
            assert!(decode.compile.is_zero(), "{what}: {decode:?}");
            // The first step's wall time ends where the next step begins, so it holds all
            // of its kernels' time.
            assert!(prefill.wall >= prefill.gpu_total(), "{what}: {prefill:?}");
            // Taking the profile empties it.
            assert!(profiler.take().is_empty());

            // More dispatches than one query set times (2048): the second set is used and
            // read back too, and its query block returns to the pool for the next batch.
            if profiler.method() == TimingMethod::Timestamps {
                for _ in 0..2 {
                    let mut b = Batch::new(&p, "many");
                    for _ in 0..2100 {
                        add(&mut b, &x, &y, 4).unwrap();
                    }
                    b.submit().unwrap();
                }
                assert_eq!(read_f32(&p, &x, 4), vec![4206.0, 4207.0, 4208.0, 4209.0]);
                let many = profiler.take();
                let other = &many["other"];
                assert_eq!(other.kernels["add"].calls, 4200, "{what}");
                assert!(!other.kernels["add"].gpu.is_zero(), "{what}");
            }

            let report = pagellm::internals::gpu::profile::report(method, "test", &phases);
            assert!(
                report.contains("prefill: 1 steps, 5 dispatches"),
                "{report}"
            );
            assert!(report.contains("decode: 2 steps, 2 dispatches"), "{report}");
            let add_row = report
                .lines()
                .find(|l| l.trim_start().starts_with("add "))
                .unwrap();
            assert!(
                add_row.contains(" 3 ") && add_row.ends_with('%'),
                "{report}"
            );
        }
    }
}
