//! The context layer: a host application's device can be adopted, wgpu errors become typed
//! errors instead of panics, limits are the adapter's own, and a lost device is reported.

mod common;
use common::*;
use pagellm::gpu::{AdapterRequest, Batch, GpuContext};
use pagellm::kernels::{add::add, Weight, WeightDtype};
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
        let x = shared.upload("x", &[1.0f32, 2.0, 3.0]).unwrap();
        let y = shared.upload("y", &[10.0f32, 20.0, 30.0]).unwrap();
        let mut b = Batch::new(&shared, "on the app's device");
        add(&mut b, &x, &y, 3).unwrap();
        b.submit().unwrap();
        assert_eq!(read_f32(&shared, &x, 3), vec![11.0, 22.0, 33.0]);
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
            (ctx.info.backend == wgpu::Backend::Gl).then_some(pagellm::gpu::SHARED_GL_WAIT_SLICE),
            "an adopted GL device waits in slices"
        );
        // Work and read-back on the adopted device (a sliced wait on GL).
        let x = shared.upload("x", &[1.0f32, 2.0, 3.0]).unwrap();
        let y = shared.upload("y", &[10.0f32, 20.0, 30.0]).unwrap();
        let mut b = Batch::new(&shared, "on the adopted device");
        add(&mut b, &x, &y, 3).unwrap();
        b.submit().unwrap();
        assert_eq!(read_f32(&shared, &x, 3), vec![11.0, 22.0, 33.0]);
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
