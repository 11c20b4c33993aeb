//! The JSON records JavaScript reads: a request's events, the engine's figures, what was
//! loaded. One record per event:
//!
//! - `{"request": id, "type": "token", "index": sample, "token_id": t, "text": "...",
//!   "logprob": null | {"token_id", "logprob", "top": [[id, logprob], ...]}}`
//! - `{"request": id, "type": "finished", "output": {"request_id", "prompt_token_ids",
//!   "outputs": [{"index", "text", "token_ids", "finish_reason", "logprobs",
//!   "cumulative_logprob"}]}}`
//! - `{"request": id, "type": "failed", "error": "..."}`
//!
//! The native reference run (`examples/reference.rs`) writes the same records, so the two
//! builds' outputs compare as text.

use pagellm::{Engine, EngineStats, Event};
use serde_json::{json, Value};

/// Whether `event` is the request's last.
pub fn is_last(event: &Event) -> bool {
    matches!(event, Event::Finished(_) | Event::Failed(_))
}

/// `event` of request `id` as its JSON record.
pub fn to_json(id: u64, event: &Event) -> Value {
    match event {
        Event::Token {
            index,
            token_id,
            text,
            logprob,
        } => json!({
            "request": id,
            "type": "token",
            "index": index,
            "token_id": token_id,
            "text": text,
            "logprob": logprob,
        }),
        Event::Finished(output) => json!({
            "request": id,
            "type": "finished",
            "output": output,
        }),
        Event::Failed(error) => json!({
            "request": id,
            "type": "failed",
            "error": error,
        }),
    }
}

/// What was loaded: the model's context length, the adapter, the KV pool.
pub fn info(engine: &Engine) -> Value {
    let stats = engine.stats();
    let ctx = engine.context();
    json!({
        "adapter": ctx.describe(),
        "max_model_len": engine.max_model_len(),
        "vocab_size": engine.tokenizer().vocab_size(),
        "kv_blocks": stats.kv_blocks,
        "kv_block_size": stats.cache.block_size,
        "kv_pool_bytes": stats.kv_pool_bytes,
        "kv_dtype": stats.kv_layout.dtype.to_string(),
        "shader_f16": ctx.caps.shader_f16,
        "subgroups": ctx.caps.subgroups,
        "limits": limits(&ctx.limits),
    })
}

/// The device limits that decide how pagellm splits its buffers and which kernels fit.
pub fn limits(l: &pagellm::wgpu::Limits) -> Value {
    json!({
        "max_storage_buffer_binding_size": l.max_storage_buffer_binding_size,
        "max_buffer_size": l.max_buffer_size,
        "max_storage_buffers_per_shader_stage": l.max_storage_buffers_per_shader_stage,
        "max_compute_workgroup_storage_size": l.max_compute_workgroup_storage_size,
        "max_compute_invocations_per_workgroup": l.max_compute_invocations_per_workgroup,
        "max_compute_workgroup_size_x": l.max_compute_workgroup_size_x,
        "max_compute_workgroups_per_dimension": l.max_compute_workgroups_per_dimension,
        "max_compute_workgroup_size_y": l.max_compute_workgroup_size_y,
        "max_compute_workgroup_size_z": l.max_compute_workgroup_size_z,
        "max_bind_groups": l.max_bind_groups,
        "min_storage_buffer_offset_alignment": l.min_storage_buffer_offset_alignment,
        "min_uniform_buffer_offset_alignment": l.min_uniform_buffer_offset_alignment,
    })
}

/// The KV cache's and the scheduler's figures: blocks in use, prefix hits, tier traffic,
/// preemptions, queues.
pub fn stats(s: &EngineStats) -> Value {
    let c = &s.cache;
    json!({
        "kv_blocks_total": c.device.total,
        "kv_blocks_used": c.device.used,
        "kv_blocks_cached": c.device.cached,
        "kv_blocks_free": c.device.free,
        "host_blocks_total": c.host.total,
        "host_blocks_used": c.host.used,
        "prefix_hits": c.prefix_hits,
        "prefix_misses": c.prefix_misses,
        "evictions": c.evictions,
        "host_tier_blocks": c.host_tier.blocks,
        "host_tier_hits": c.host_tier.hits,
        "cow_copies": c.cow_copies,
        "swapped_out_blocks": c.swapped_out_blocks,
        "swapped_in_blocks": c.swapped_in_blocks,
        "preemptions": s.scheduler.preemptions,
        "preempted_by_swap": s.scheduler.preempted_by_swap,
        "preempted_by_recompute": s.scheduler.preempted_by_recompute,
        "steps": s.scheduler.steps,
        "pending_requests": s.pending_requests,
        "num_waiting": s.num_waiting,
        "num_running": s.num_running,
        "num_swapped": s.num_swapped,
        "disk_records": s.disk.map_or(0, |d| d.records),
        "disk_bytes": s.disk.map_or(0, |d| d.bytes),
        "disk_hits": s.disk.map_or(0, |d| d.hits),
        "disk_misses": s.disk.map_or(0, |d| d.misses),
        "disk_corrupt": s.disk.map_or(0, |d| d.corrupt),
        "disk_writes": s.disk.map_or(0, |d| d.writes),
    })
}
