//! The native side of the browser build's comparison: runs the cases of
//! `web/tests/cases.json` on the native engine and prints their outputs as JSON, in the
//! shape `web/tests/run_cases.ts` writes for the wasm build under WebGPU. The two must be
//! equal bit for bit on the same adapter (`tools/check_web.sh` compares them).
//!
//! `--kv-cache-dir DIR` gives every case a disk tier in DIR (its records are compared with
//! the ones the browser build keeps). `--like WASM_OUT.json` opens the device with the optional features and the limits the
//! browser's device had (the wasm run's `info` records them), so that both builds split
//! their buffers alike and pick the same kernels. Run: `cargo run -p pagellm-web --example
//! reference -- web/tests/cases.json models/fortunes-llama --like wasm_out.json`.

use pagellm::wgpu;
use pagellm::{Engine, GpuContext, JsonRequest, SamplingParams};
use pagellm_web::{events, Options};
use serde_json::{json, Value};
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cases, model, rest @ ..] = args.as_slice() else {
        return Err("usage: reference CASES.json MODEL_DIR [--features f16,subgroups]".into());
    };
    let (mut like, mut kv_dir) = (None, None);
    for pair in rest.chunks(2) {
        match pair {
            [flag, path] if flag == "--like" => {
                let run: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
                like = Some(run["cases"][0]["info"].clone());
            }
            [flag, dir] if flag == "--kv-cache-dir" => kv_dir = Some(dir.into()),
            _ => return Err(format!("unexpected arguments {rest:?}").into()),
        }
    }
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(cases)?)?;
    let ctx = Arc::new(open_device(like.as_ref())?);
    let mut results = Vec::new();
    for case in cases["cases"]
        .as_array()
        .ok_or("cases.json: no \"cases\" array")?
    {
        results.push(run_case(&ctx, model, case, kv_dir.as_ref())?);
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({ "cases": results }))?
    );
    Ok(())
}

/// A device on the environment's adapter; with `like` (a wasm run's `info`), with only the
/// optional features and within the limits that device had.
fn open_device(like: Option<&Value>) -> Result<GpuContext, Box<dyn std::error::Error>> {
    let req = pagellm::AdapterRequest::from_env()?;
    let mut instance = wgpu::InstanceDescriptor::new_without_display_handle();
    instance.backends = req.backends;
    let instance = wgpu::Instance::new(instance);
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))?;
    let mut desc = GpuContext::device_descriptor(&adapter);
    if let Some(info) = like {
        let mut keep = wgpu::Features::TIMESTAMP_QUERY;
        if info["shader_f16"] == true {
            keep |= wgpu::Features::SHADER_F16;
        }
        if info["subgroups"] == true {
            keep |= wgpu::Features::SUBGROUP;
        }
        desc.required_features &= keep;
        let l = &mut desc.required_limits;
        let get = |name: &str| {
            info["limits"][name]
                .as_u64()
                .ok_or(format!("no limit {name}"))
        };
        let small = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        l.max_storage_buffer_binding_size = get("max_storage_buffer_binding_size")?;
        l.max_buffer_size = get("max_buffer_size")?;
        l.max_storage_buffers_per_shader_stage =
            small(get("max_storage_buffers_per_shader_stage")?);
        l.max_compute_workgroup_storage_size = small(get("max_compute_workgroup_storage_size")?);
        l.max_compute_invocations_per_workgroup =
            small(get("max_compute_invocations_per_workgroup")?);
        l.max_compute_workgroup_size_x = small(get("max_compute_workgroup_size_x")?);
        l.max_compute_workgroups_per_dimension =
            small(get("max_compute_workgroups_per_dimension")?);
        l.max_compute_workgroup_size_y = small(get("max_compute_workgroup_size_y")?);
        l.max_compute_workgroup_size_z = small(get("max_compute_workgroup_size_z")?);
        l.max_bind_groups = small(get("max_bind_groups")?);
        l.min_storage_buffer_offset_alignment = small(get("min_storage_buffer_offset_alignment")?);
        l.min_uniform_buffer_offset_alignment = small(get("min_uniform_buffer_offset_alignment")?);
    }
    let (device, queue) = pollster::block_on(adapter.request_device(&desc))?;
    Ok(GpuContext::from_existing(adapter, device, queue))
}

/// One case: every request added at once, then steps until all have finished; the abort
/// rule applied as the tokens stream.
fn run_case(
    ctx: &Arc<GpuContext>,
    model: &str,
    case: &Value,
    kv_dir: Option<&std::path::PathBuf>,
) -> Result<Value, Box<dyn std::error::Error>> {
    let options = Options::parse(&case["options"].to_string())?;
    let mut config = options.engine_config()?;
    config.kv_cache_dir = kv_dir.cloned();
    let mut engine = Engine::with_context(ctx.clone(), model, config, |_, _| {})?;
    if let Some(w) = case.get("warmup") {
        let r = JsonRequest::parse(&w.to_string())?.into_request(&SamplingParams::default())?;
        let h = engine.add(r)?;
        engine.run_to_completion()?;
        h.wait()?;
    }
    let t0 = std::time::Instant::now();
    let requests = case["requests"]
        .as_array()
        .ok_or("a case without requests")?;
    let mut outputs = vec![Value::Null; requests.len()];
    let mut handles = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let added = JsonRequest::parse(&r.to_string())
            .and_then(|r| r.into_request(&SamplingParams::default()))
            .and_then(|r| engine.add(r));
        match added {
            Ok(h) => handles.push((i, h)),
            Err(e) => outputs[i] = json!({ "error": e.to_string() }),
        }
    }
    let abort = case.get("abort");
    let abort_index = abort.map(|a| a["request"].as_u64().unwrap_or(0) as usize);
    let abort_after = abort.map_or(0, |a| a["after_tokens"].as_u64().unwrap_or(0));
    let mut streamed = vec![0u64; requests.len()];
    while engine.has_unfinished() {
        engine.step()?;
        for (i, h) in &handles {
            while let Ok(event) = h.events.try_recv() {
                let record = events::to_json(h.id, &event);
                match record["type"].as_str() {
                    Some("token") => streamed[*i] += 1,
                    Some("finished") => outputs[*i] = record["output"].clone(),
                    _ => outputs[*i] = json!({ "error": record["error"] }),
                }
                if Some(*i) == abort_index && streamed[*i] == abort_after {
                    engine.abort(h.id);
                }
            }
        }
    }
    for (i, h) in &handles {
        while let Ok(event) = h.events.try_recv() {
            if let pagellm::Event::Finished(o) = event {
                outputs[*i] = serde_json::to_value(o)?;
            }
        }
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let tokens: usize = outputs
        .iter()
        .filter_map(|o| o["outputs"].as_array())
        .flatten()
        .map(|x| x["token_ids"].as_array().map_or(0, Vec::len))
        .sum();
    eprintln!(
        "{}: {tokens} tokens in {ms:.0} ms ({:.1} tokens/s)",
        case["name"].as_str().unwrap_or("?"),
        tokens as f64 / ms * 1e3
    );
    Ok(json!({ "name": case["name"], "outputs": outputs, "ms": ms, "tokens": tokens }))
}
