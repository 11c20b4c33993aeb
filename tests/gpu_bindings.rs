//! What recording reuses across batches (`src/gpu/bindings.rs`): parameter arenas handed
//! from batch to batch while earlier batches still run, bind groups cached by what they
//! bind and dropped when stale or released, layouts reflected from WGSL, in-place writes
//! ordered with the batches around them, the engine's metadata rewritten in place, and
//! read-back buffers kept across reads.

mod common;
use common::*;
use pagellm::internals::gpu::{reflect_layout, Batch, Bind, GpuContext, Readback, STALE_AFTER};
use pagellm::internals::kernels::add::add;
use pagellm::internals::kernels::paged_attention::AttentionBuffers;
use pagellm::internals::model::step::{AttentionMetadata, SeqSlice};
use pagellm::GpuError;

/// A context of its own on `ctx`'s device, so that its cache counts only this test's work.
fn own(ctx: &GpuContext) -> GpuContext {
    GpuContext::from_existing(ctx.adapter.clone(), ctx.device.clone(), ctx.queue.clone())
}

#[test]
fn batches_submitted_back_to_back_each_see_their_own_parameters() {
    // Every batch takes the same parameter arena from the free list as soon as the one
    // before it is submitted, while that one may still be running. Batch i adds y to its
    // own x over the first i + 1 elements, so x_i is right only if batch i read its `len`.
    const N: usize = 48;
    for shared in contexts() {
        let ctx = &own(shared);
        let y: Vec<f32> = (0..N).map(|j| 1.0 + j as f32).collect();
        let yb = ctx.upload("y", &y).unwrap();
        let xs: Vec<wgpu::Buffer> = (0..N)
            .map(|_| ctx.upload("x", &[0f32; N]).unwrap())
            .collect();
        for (i, x) in xs.iter().enumerate() {
            let mut b = Batch::new(ctx, "back to back");
            add(&mut b, x, &yb, i + 1).unwrap();
            b.submit().unwrap();
        }
        for (i, x) in xs.iter().enumerate() {
            let got: Vec<f32> = ctx.read(x).unwrap();
            let want: Vec<f32> = (0..N).map(|j| if j <= i { y[j] } else { 0.0 }).collect();
            assert_eq!(got, want, "batch {i} on {}", backend(ctx));
        }
    }
}

#[test]
fn batches_recorded_on_many_threads_at_once_each_see_their_own_parameters() {
    // Threads share the context's free list of arenas. An arena must not serve another
    // batch before the copies that fill it for this one are submitted with it: thread t's
    // batch i adds y over the first (t * 7 + i) % N + 1 elements of its own x.
    const N: usize = 64;
    const THREADS: usize = 4;
    const BATCHES: usize = 40;
    for shared in contexts() {
        let ctx = &own(shared);
        let y: Vec<f32> = (0..N).map(|j| 1.0 + j as f32).collect();
        let yb = ctx.upload("y", &y).unwrap();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (yb, y) = (&yb, &y);
                s.spawn(move || {
                    let xs: Vec<(usize, wgpu::Buffer)> = (0..BATCHES)
                        .map(|i| {
                            let x = ctx.upload("x", &[0f32; N]).unwrap();
                            let len = (t * 7 + i) % N + 1;
                            let mut b = Batch::new(ctx, "threads");
                            add(&mut b, &x, yb, len).unwrap();
                            b.submit().unwrap();
                            (len, x)
                        })
                        .collect();
                    for (i, (len, x)) in xs.iter().enumerate() {
                        let got: Vec<f32> = ctx.read(x).unwrap();
                        let want: Vec<f32> =
                            (0..N).map(|j| if j < *len { y[j] } else { 0.0 }).collect();
                        assert_eq!(got, want, "thread {t} batch {i} on {}", backend(ctx));
                    }
                });
            }
        });
    }
}

#[test]
fn batches_of_different_kernels_with_reads_between_see_their_own_parameters() {
    // As above, with two kernels per batch and a read-back (a copy and a wait) after some
    // batches: an arena goes from a batch that has finished to the next, or from one still
    // running.
    use pagellm::internals::kernels::softcap::softcap;
    const N: usize = 24;
    for shared in contexts() {
        let ctx = &own(shared);
        let y: Vec<f32> = (0..N).map(|j| 1.0 + j as f32).collect();
        let yb = ctx.upload("y", &y).unwrap();
        let z: Vec<f32> = (0..N).map(|j| 10.0 * j as f32 - 50.0).collect();
        let mut checks = Vec::new();
        for i in 0..N {
            let x = ctx.upload("x", &[0f32; N]).unwrap();
            let zb = ctx.upload("z", &z).unwrap();
            let cap = 1.0 + i as f32;
            let mut b = Batch::new(ctx, "mixed");
            add(&mut b, &x, &yb, i + 1).unwrap();
            softcap(&mut b, &zb, N - i, cap).unwrap();
            b.submit().unwrap();
            if i % 3 == 0 {
                let _ = ctx.read::<f32>(&yb).unwrap();
            }
            checks.push((i, x, zb, cap));
        }
        for (i, x, zb, cap) in checks {
            let got: Vec<f32> = ctx.read(&x).unwrap();
            let want: Vec<f32> = (0..N).map(|j| if j <= i { y[j] } else { 0.0 }).collect();
            assert_eq!(got, want, "add of batch {i} on {}", backend(ctx));
            let got: Vec<f32> = ctx.read(&zb).unwrap();
            for j in 0..N {
                let want = if j < N - i {
                    cap * (z[j] / cap).tanh()
                } else {
                    z[j]
                };
                assert!(
                    (got[j] - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "softcap of batch {i} at {j}: {} vs {want} on {}",
                    got[j],
                    backend(ctx)
                );
            }
        }
    }
}

#[test]
fn bind_groups_are_reused_for_the_same_bindings_and_made_for_new_ones() {
    for shared in contexts() {
        let ctx = &own(shared);
        let what = backend(ctx);
        let x = ctx.upload("x", &[0f32; 64]).unwrap();
        let y = ctx.upload("y", &[1f32; 64]).unwrap();
        let other = ctx.upload("other", &[2f32; 64]).unwrap();
        let run = |a: &wgpu::Buffer, b: &wgpu::Buffer, len: usize| {
            let mut batch = Batch::new(ctx, "cache");
            add(&mut batch, a, b, len).unwrap();
            let created = batch.bind_groups_created();
            batch.submit().unwrap();
            created
        };
        assert_eq!(run(&x, &y, 64), 1, "first use on {what}");
        // Other parameters, same buffers: the parameter block is a dynamic offset.
        assert_eq!(run(&x, &y, 7), 0, "same bindings on {what}");
        assert_eq!(run(&x, &other, 64), 1, "another buffer on {what}");
        assert_eq!(run(&y, &x, 64), 1, "the buffers swapped on {what}");
        // Every add ran with its own parameters: 64 + 7 ones, then 64 twos, on x.
        let got: Vec<f32> = ctx.read(&x).unwrap();
        let want: Vec<f32> = (0..64).map(|j| if j < 7 { 4.0 } else { 3.0 }).collect();
        assert_eq!(got, want, "{what}");
        let stats = ctx.bind_group_stats();
        assert_eq!(
            (stats.hits, stats.misses, stats.cached),
            (1, 3, 3),
            "{what}"
        );
        ctx.release_bind_groups();
        assert_eq!(ctx.bind_group_stats().cached, 0, "{what}");
        assert_eq!(run(&x, &y, 64), 1, "after the release on {what}");
    }
}

#[test]
fn bind_groups_no_batch_uses_are_dropped_after_a_few_submits() {
    for shared in contexts() {
        let ctx = &own(shared);
        let what = backend(ctx);
        let (x, y) = (
            ctx.upload("x", &[0f32; 16]).unwrap(),
            ctx.upload("y", &[1f32; 16]).unwrap(),
        );
        let kept = ctx.upload("kept", &[0f32; 16]).unwrap();
        let use_pair = |a: &wgpu::Buffer| {
            let mut b = Batch::new(ctx, "stale");
            add(&mut b, a, &y, 16).unwrap();
            let created = b.bind_groups_created();
            b.submit().unwrap();
            created
        };
        assert_eq!(use_pair(&x), 1);
        // `kept` is used by every batch from now on, `x` by none.
        for i in 0..3 * STALE_AFTER {
            assert_eq!(use_pair(&kept), usize::from(i == 0), "{what}");
        }
        assert_eq!(ctx.bind_group_stats().cached, 1, "{what}");
        assert_eq!(use_pair(&x), 1, "the stale group was dropped on {what}");
    }
}

#[test]
fn layouts_are_reflected_from_the_bindings_the_entry_point_uses() {
    let src = "
        struct P { n: u32 }
        @group(0) @binding(0) var<uniform> p: P;
        @group(0) @binding(1) var<storage, read> a: array<f32>;
        @group(0) @binding(2) var<storage, read_write> b: array<f32>;
        @group(0) @binding(3) var<storage, read_write> unused: array<f32>;
        @compute @workgroup_size(1) fn k(@builtin(global_invocation_id) g: vec3<u32>) {
            if g.x < p.n { b[g.x] = a[g.x]; }
        }";
    let entries = reflect_layout("k", src, "k").unwrap();
    let types: Vec<_> = entries
        .iter()
        .map(|e| (e.binding, e.ty, e.visibility))
        .collect();
    let buffer = |ty, dynamic| wgpu::BindingType::Buffer {
        ty,
        has_dynamic_offset: dynamic,
        min_binding_size: None,
    };
    let c = wgpu::ShaderStages::COMPUTE;
    assert_eq!(
        types,
        vec![
            (0, buffer(wgpu::BufferBindingType::Uniform, true), c),
            (
                1,
                buffer(wgpu::BufferBindingType::Storage { read_only: true }, false),
                c
            ),
            (
                2,
                buffer(wgpu::BufferBindingType::Storage { read_only: false }, false),
                c
            ),
        ]
    );
    // A gap, a storage buffer at 0 and no parameter block are refused by name.
    let gap = src.replace("@binding(1)", "@binding(4)");
    let e = reflect_layout("k", &gap, "k").unwrap_err().to_string();
    assert!(e.contains("binding 2") && e.contains("gaps"), "{e}");
    let no_params = "
        @group(0) @binding(0) var<storage, read_write> b: array<f32>;
        @compute @workgroup_size(1) fn k() { b[0] = 1.0; }";
    let e = reflect_layout("k", no_params, "k").unwrap_err().to_string();
    assert!(e.contains("binding 0"), "{e}");
    let e = reflect_layout("k", src, "missing").unwrap_err().to_string();
    assert!(e.contains("no entry point named missing"), "{e}");
    // Every shipped kernel reflects to parameters plus storage buffers.
    for k in pagellm::internals::kernels::ALL {
        let entries = reflect_layout(k.name, &k.full_source(), k.name)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name));
        assert!(entries.len() >= 2, "{}: {entries:?}", k.name);
    }
}

#[test]
fn a_dispatch_with_the_wrong_number_of_buffers_is_a_clear_error() {
    for ctx in contexts() {
        let x = ctx.upload("x", &[0f32; 4]).unwrap();
        let mut b = Batch::new(ctx, "wrong count");
        let e = b
            .dispatch(
                pagellm::internals::kernels::ADD,
                &[],
                &[4u32, 0, 0, 0],
                &[(&x).into()],
                [1, 1, 1],
            )
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("1 storage buffers given, the kernel binds 2"),
            "{e}"
        );
    }
}

#[test]
fn writes_land_before_their_batch_and_after_earlier_ones() {
    for ctx in contexts() {
        let what = backend(ctx);
        let y = ctx.upload("y", &[0f32; 8]).unwrap();
        let (x1, x2) = (
            ctx.upload("x1", &[0f32; 8]).unwrap(),
            ctx.upload("x2", &[0f32; 8]).unwrap(),
        );
        // Two batches recorded, writes included, before either is submitted, then submitted
        // without a wait: the first adds y = 1s, the second rewrites y to 5s before its
        // add. Each write travels with its own batch (a queue write made when `b.write` is
        // called would land before `a`'s add too), so neither sees the other's y.
        let mut a = Batch::new(ctx, "first");
        a.write(&y, 0, bytemuck::cast_slice(&[1f32; 8])).unwrap();
        add(&mut a, &x1, &y, 8).unwrap();
        let mut b = Batch::new(ctx, "second");
        b.write(&y, 0, bytemuck::cast_slice(&[5f32; 8])).unwrap();
        add(&mut b, &x2, &y, 8).unwrap();
        a.submit().unwrap();
        b.submit().unwrap();
        assert_eq!(ctx.read::<f32>(&x1).unwrap(), vec![1.0; 8], "{what}");
        assert_eq!(ctx.read::<f32>(&x2).unwrap(), vec![5.0; 8], "{what}");
        // Refused: unaligned, out of bounds, a buffer without COPY_DST.
        let mut c = Batch::new(ctx, "bad writes");
        let four = [0u8; 4];
        assert!(c.write(&y, 2, &four).is_err());
        assert!(c.write(&y, 0, &[0u8; 3]).is_err());
        assert!(c.write(&y, 32, &four).is_err());
        let uniform = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("not writable"),
            size: 16,
            usage: wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: false,
        });
        let e = c.write(&uniform, 0, &four).unwrap_err();
        assert!(matches!(e, GpuError::InvalidArgument { .. }), "{e:?}");
        c.submit().unwrap();
    }
}

/// The first `len` words of a metadata section, read back.
fn section_words(ctx: &GpuContext, section: Bind, len: usize) -> Vec<u32> {
    let Bind::Range { buffer, offset, .. } = section else {
        panic!("metadata sections are ranges");
    };
    bytemuck::pod_collect_to_vec(&ctx.read_bytes(buffer, offset, (len * 4) as u64).unwrap())
}

fn section_buffer(section: Bind<'_>) -> &wgpu::Buffer {
    match section {
        Bind::Range { buffer, .. } | Bind::Whole(buffer) => buffer,
    }
}

#[test]
fn metadata_is_rewritten_in_place_until_it_outgrows_its_buffer() {
    for ctx in contexts() {
        let what = backend(ctx);
        let tables: Vec<Vec<u32>> = vec![vec![3, 1, 5, 6], vec![7, 2]];
        let slices = |lens: &[(usize, usize)]| -> Vec<(usize, usize)> { lens.to_vec() };
        let build = |lens: &[(usize, usize)]| {
            let s: Vec<SeqSlice> = lens
                .iter()
                .zip(&tables)
                .map(|(&(q, c), t)| SeqSlice {
                    query_len: q,
                    context_len: c,
                    block_table: t,
                })
                .collect();
            AttentionMetadata::build(&s, 16).unwrap()
        };
        let mut kept: Option<AttentionBuffers> = None;
        let mut buffers = Vec::new();
        for (step, lens) in [
            slices(&[(20, 20), (3, 3)]),
            slices(&[(1, 21), (1, 4)]),
            slices(&[(1, 22)]),
            slices(&[(64, 64), (20, 20)]),
        ]
        .iter()
        .enumerate()
        {
            let meta = build(lens);
            let tokens: Vec<u32> = (0..meta.num_tokens as u32).map(|t| 100 + t).collect();
            let rows: Vec<u32> = vec![step as u32; lens.len()];
            let mut b = Batch::new(ctx, "metadata");
            meta.write_into(&mut b, &mut kept, &[&tokens, &rows])
                .unwrap();
            b.submit().unwrap();
            let bufs = kept.as_ref().unwrap();
            assert_eq!(bufs.num_tokens, meta.num_tokens);
            let tp: Vec<u32> = meta.token_pos.iter().flatten().copied().collect();
            let sm: Vec<u32> = meta.slot_mapping.iter().map(|&s| s as u32).collect();
            let sections = [
                (bufs.token_pos(), tp),
                (bufs.block_tables(), meta.block_tables.clone()),
                (bufs.slot_mapping(), sm),
                (bufs.positions(), meta.positions.clone()),
                (bufs.extra(0).unwrap(), tokens),
                (bufs.extra(1).unwrap(), rows),
            ];
            for (i, (section, want)) in sections.into_iter().enumerate() {
                let got = section_words(ctx, section, want.len());
                assert_eq!(got, want, "section {i} at step {step} on {what}");
            }
            buffers.push(section_buffer(bufs.token_pos()).clone());
        }
        // The first step sized the buffer for twice its arrays; the decode steps fit and
        // kept it; the 84-token step outgrew it.
        assert!(
            buffers[0] == buffers[1] && buffers[1] == buffers[2],
            "{what}"
        );
        assert!(buffers[3] != buffers[2], "{what}");
    }
}

#[test]
fn a_kept_read_back_buffer_serves_reads_of_any_size_in_turn() {
    for ctx in contexts() {
        let what = backend(ctx);
        let data: Vec<u32> = (0..1000).collect();
        let src = ctx.upload("src", &data).unwrap();
        let mut rb = Readback::default();
        for (offset, len) in [(0usize, 10usize), (40, 3), (0, 1000), (996, 4), (0, 0)] {
            let mut b = Batch::new(ctx, "read back");
            let pending = rb
                .read_later(&mut b, &src, (offset * 4) as u64, (len * 4) as u64)
                .unwrap();
            b.submit().unwrap();
            let got: Vec<u32> = bytemuck::pod_collect_to_vec(&ctx.complete_read(pending).unwrap());
            assert_eq!(got, data[offset..offset + len], "{what} {offset}+{len}");
        }
        let mut b = Batch::new(ctx, "bad read");
        assert!(rb.read_later(&mut b, &src, 2, 4).is_err());
        assert!(rb.read_later(&mut b, &src, 0, 4004).is_err());
    }
}
