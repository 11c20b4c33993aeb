//! pagellm's C API: the engine on its own thread ([`pagellm::EngineHandle`]) behind opaque,
//! checked handles, for C, C++, C#, Swift and every language with a C FFI. The header,
//! `include/pagellm.h`, is generated from this file by cbindgen (`tests/header.rs` fails
//! when the committed one is stale).
//!
//! Conventions:
//! - Every function returns a [`pagellm_status`]; a negative one is an error, whose message
//!   [`pagellm_last_error`] returns on the same thread. No panic crosses the boundary (one
//!   is caught and reported as [`pagellm_status::PAGELLM_ERR_PANIC`]).
//! - Handles (`pagellm_engine *`, `pagellm_request *`) are keys into tables, never
//!   dereferenced: a null, freed or unknown handle is [`pagellm_status::PAGELLM_ERR_HANDLE`],
//!   not undefined behaviour. Null pointers and strings that are not UTF-8 are
//!   [`pagellm_status::PAGELLM_ERR_ARGUMENT`].
//! - Every function may be called from any thread. An engine's functions may run
//!   concurrently; a request's are serialized (the text an event points to stays valid until
//!   the next call on that request).
//! - What the library hands out is freed by the library: engines with
//!   [`pagellm_engine_free`], requests with [`pagellm_request_free`], strings with
//!   [`pagellm_string_free`].

#![allow(non_camel_case_types)]

use pagellm::{
    AdapterRequest, EngineBuilder, EngineConfig, EngineHandle, Event as RequestEvent, FinishReason,
    GpuContext, JsonRequest, KvDtype, Output as RequestOutput, Request, RequestStream,
    SamplingParams, WeightDtype,
};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// What a function did.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum pagellm_status {
    /// Done.
    PAGELLM_OK = 0,
    /// `pagellm_request_next`: no event within the timeout; ask again.
    PAGELLM_TIMEOUT = 1,
    /// `pagellm_request_next`: every event has been read.
    PAGELLM_END = 2,
    /// A null pointer, a string that is not UTF-8, or a value out of range.
    PAGELLM_ERR_ARGUMENT = -1,
    /// A null, freed or unknown handle.
    PAGELLM_ERR_HANDLE = -2,
    /// The model or the GPU could not be loaded.
    PAGELLM_ERR_LOAD = -3,
    /// The request was refused (bad parameters, a prompt longer than the context) or
    /// failed while running.
    PAGELLM_ERR_REQUEST = -4,
    /// The engine stopped (its GPU failed, or it was freed).
    PAGELLM_ERR_ENGINE = -5,
    /// pagellm panicked (a bug; please report it with the message).
    PAGELLM_ERR_PANIC = -6,
}

use pagellm_status::*;

/// An engine: the model loaded on a GPU, with its own thread (opaque).
pub struct pagellm_engine {
    _opaque: [u8; 0],
}

/// A submitted request and its events (opaque).
pub struct pagellm_request {
    _opaque: [u8; 0],
}

/// The engine's options. Start from [`pagellm_config_default`] and set what matters; a zero
/// or null field means the default.
#[repr(C)]
pub struct pagellm_config {
    /// The model: a Hugging Face folder or a `.gguf` file (UTF-8). Required.
    pub model_path: *const c_char,
    /// Tokens per KV block (0: 16).
    pub block_size: u32,
    /// Device KV blocks (0: as many as fit in `kv_cache_bytes`).
    pub num_gpu_blocks: u32,
    /// Bytes of GPU memory for the KV cache when `num_gpu_blocks` is 0 (0: fitted to the
    /// device's free memory; at most 256 MiB where it reports none).
    pub kv_cache_bytes: u64,
    /// Host blocks for swapping preempted requests (0: the default swap space).
    pub num_cpu_blocks: u32,
    /// Context length (0: the model's).
    pub max_model_len: u32,
    /// Most requests running at once (0: 256).
    pub max_num_seqs: u32,
    /// KV cache format: "f32", "f16", "int8" or "int4" (null: f32).
    pub kv_dtype: *const c_char,
    /// Weight format to convert to on load ("q8_0", "q4_k", "f16", ...; null: as stored).
    pub weight_dtype: *const c_char,
    /// GPU backends to look on, comma-separated: "vulkan", "metal", "dx12", "gl" (null:
    /// the `PAGELLM_BACKEND` environment variable, else all).
    pub backends: *const c_char,
    /// Reuse the KV blocks of prompt prefixes already computed (nonzero: on, the default).
    pub enable_prefix_caching: c_int,
    /// A folder that keeps computed prompt blocks across runs (null: none).
    pub kv_cache_dir: *const c_char,
}

/// How a request samples. Start from [`pagellm_sampling_default`]; stop strings, logit bias
/// and structured output are set through [`pagellm_submit_json`].
#[repr(C)]
pub struct pagellm_sampling {
    /// Samples to return (1).
    pub n: u32,
    /// 0 is greedy (1).
    pub temperature: f32,
    /// Nucleus sampling (1: off).
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (0: off).
    pub top_k: u32,
    /// Drop tokens below `min_p` times the most likely one's probability (0: off).
    pub min_p: f32,
    /// The random seed, used when `use_seed` is nonzero.
    pub seed: u64,
    /// Nonzero: sample with `seed` (reproducible).
    pub use_seed: c_int,
    /// Most tokens to generate (16).
    pub max_tokens: u32,
    /// Log-probabilities of this many top tokens with each token (-1: none).
    pub logprobs: i32,
    /// Nonzero: keep generating after the end-of-sequence token.
    pub ignore_eos: c_int,
    /// OpenAI's presence penalty (0).
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty (0).
    pub frequency_penalty: f32,
    /// vLLM's repetition penalty (1: off).
    pub repetition_penalty: f32,
}

/// What an event is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum pagellm_event_kind {
    /// A generated token of sample `index`.
    PAGELLM_EVENT_TOKEN = 0,
    /// Sample `index` finished: `text` is its whole text, `finish_reason` says why. One per
    /// sample (or beam, best first), after its tokens; then the request ends.
    PAGELLM_EVENT_FINISHED = 1,
}

/// One event of a request, filled by [`pagellm_request_next`]. Pointers stay valid until
/// the next call on the same request.
#[repr(C)]
pub struct pagellm_event {
    pub kind: pagellm_event_kind,
    /// The sample (0..n) or beam rank.
    pub index: u32,
    /// TOKEN: the token's id. FINISHED: how many tokens the sample generated.
    pub token_id: u32,
    /// TOKEN: its log-probability when the request asked for logprobs, else NaN.
    /// FINISHED: the sample's cumulative log-probability.
    pub logprob: f64,
    /// TOKEN: the text the token completes (possibly empty while a character or a possible
    /// stop string is incomplete). FINISHED: the sample's whole text. NUL-terminated; the
    /// text may itself hold NUL bytes, so `text_len` is its length.
    pub text: *const c_char,
    pub text_len: usize,
    /// FINISHED: "stop", "length" or "abort" (static). TOKEN: null.
    pub finish_reason: *const c_char,
}

// ---- errors -------------------------------------------------------------------------

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// An error on its way to the caller: a status and its message.
struct Fail(pagellm_status, String);

fn fail<T>(status: pagellm_status, msg: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(status, msg.into()))
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f`, turning its error or panic into a status and this thread's last error.
fn guard(f: impl FnOnce() -> Result<pagellm_status, Fail>) -> pagellm_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(status)) => status,
        Ok(Err(Fail(status, msg))) => {
            set_error(&msg);
            status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_error(&format!("pagellm panicked: {what}"));
            PAGELLM_ERR_PANIC
        }
    }
}

/// The message of the last error on this thread (empty if none): valid until the next
/// failing call on this thread. Never null.
///
/// Thread safety: each thread has its own last error.
#[no_mangle]
pub extern "C" fn pagellm_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

// ---- handles ------------------------------------------------------------------------

/// Handles are keys, shared by engines and requests so that one passed as the other is
/// unknown; never 0.
static NEXT_KEY: AtomicUsize = AtomicUsize::new(1);

type Table<T> = Mutex<HashMap<usize, Arc<T>>>;

fn engines() -> &'static Table<EngineHandle> {
    static T: OnceLock<Table<EngineHandle>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn requests() -> &'static Table<RequestEntry> {
    static T: OnceLock<Table<RequestEntry>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn insert<T>(table: &Table<T>, item: T) -> usize {
    let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    table
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, Arc::new(item));
    key
}

fn lookup<T>(table: &Table<T>, key: usize, what: &str) -> Result<Arc<T>, Fail> {
    let found = table
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .cloned();
    match found {
        Some(item) => Ok(item),
        None if key == 0 => fail(PAGELLM_ERR_HANDLE, format!("the {what} handle is null")),
        None => fail(
            PAGELLM_ERR_HANDLE,
            format!("no such {what} (freed, or not a {what} handle)"),
        ),
    }
}

fn count<T>(table: &Table<T>) -> usize {
    table.lock().unwrap_or_else(|p| p.into_inner()).len()
}

fn remove<T>(table: &Table<T>, key: usize) -> Option<Arc<T>> {
    table.lock().unwrap_or_else(|p| p.into_inner()).remove(&key)
}

fn out_ptr<T>(out: *mut T, what: &str) -> Result<*mut T, Fail> {
    if out.is_null() {
        return fail(PAGELLM_ERR_ARGUMENT, format!("{what} is null"));
    }
    Ok(out)
}

/// A required string argument.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    match opt_text(p, what)? {
        Some(s) => Ok(s),
        None => fail(PAGELLM_ERR_ARGUMENT, format!("{what} is null")),
    }
}

/// An optional string argument (null: none).
unsafe fn opt_text<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Fail> {
    if p.is_null() {
        return Ok(None);
    }
    match CStr::from_ptr(p).to_str() {
        Ok(s) => Ok(Some(s)),
        Err(e) => fail(PAGELLM_ERR_ARGUMENT, format!("{what} is not UTF-8: {e}")),
    }
}

/// How many engines and requests are alive (handed out and not freed), into `*engines`
/// and `*requests` (either may be null): a program can check at exit that it freed every
/// handle.
///
/// # Safety
/// Each pointer is null or writable.
///
/// Thread safety: any thread; counts taken while other threads create or free handles are
/// those of a moment.
#[no_mangle]
pub unsafe extern "C" fn pagellm_handles_alive(
    engines_alive: *mut usize,
    requests_alive: *mut usize,
) -> pagellm_status {
    guard(|| {
        if let Some(n) = engines_alive.as_mut() {
            *n = count(engines());
        }
        if let Some(n) = requests_alive.as_mut() {
            *n = count(requests());
        }
        Ok(PAGELLM_OK)
    })
}

// ---- engines ------------------------------------------------------------------------

/// The default options (every field its default; `model_path` null).
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn pagellm_config_default() -> pagellm_config {
    pagellm_config {
        model_path: std::ptr::null(),
        block_size: 0,
        num_gpu_blocks: 0,
        kv_cache_bytes: 0,
        num_cpu_blocks: 0,
        max_model_len: 0,
        max_num_seqs: 0,
        kv_dtype: std::ptr::null(),
        weight_dtype: std::ptr::null(),
        backends: std::ptr::null(),
        enable_prefix_caching: 1,
        kv_cache_dir: std::ptr::null(),
    }
}

unsafe fn engine_config(c: &pagellm_config) -> Result<EngineConfig, Fail> {
    let d = EngineConfig::default();
    let nonzero = |v: u32| (v != 0).then_some(v as usize);
    let parsed = |what: &str, e: String| Fail(PAGELLM_ERR_ARGUMENT, format!("{what}: {e}"));
    let kv_dtype = match opt_text(c.kv_dtype, "kv_dtype")? {
        Some(s) => s.parse::<KvDtype>().map_err(|e| parsed("kv_dtype", e))?,
        None => d.kv_dtype,
    };
    let weight_dtype = match opt_text(c.weight_dtype, "weight_dtype")? {
        Some(s) => Some(
            s.parse::<WeightDtype>()
                .map_err(|e| parsed("weight_dtype", e))?,
        ),
        None => None,
    };
    Ok(EngineConfig {
        block_size: nonzero(c.block_size).unwrap_or(d.block_size),
        num_gpu_blocks: nonzero(c.num_gpu_blocks),
        kv_cache_bytes: if c.kv_cache_bytes == 0 {
            d.kv_cache_bytes
        } else {
            Some(c.kv_cache_bytes)
        },
        num_cpu_blocks: nonzero(c.num_cpu_blocks),
        max_model_len: nonzero(c.max_model_len),
        max_num_seqs: nonzero(c.max_num_seqs).unwrap_or(d.max_num_seqs),
        kv_dtype,
        weight_dtype,
        enable_prefix_caching: c.enable_prefix_caching != 0,
        kv_cache_dir: opt_text(c.kv_cache_dir, "kv_cache_dir")?.map(Into::into),
        ..d
    })
}

/// Loads the model in `config` on a GPU and starts its engine; waits until it is loaded
/// (seconds for a large model). On success `*out` is the engine, to free with
/// [`pagellm_engine_free`].
///
/// # Safety
/// `config` points to a valid `pagellm_config` whose strings are null or NUL-terminated;
/// `out` points to writable memory.
///
/// Thread safety: any thread; engines are independent of each other.
#[no_mangle]
pub unsafe extern "C" fn pagellm_engine_new(
    config: *const pagellm_config,
    out: *mut *mut pagellm_engine,
) -> pagellm_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let Some(c) = config.as_ref() else {
            return fail(PAGELLM_ERR_ARGUMENT, "config is null");
        };
        let model = text(c.model_path, "model_path")?;
        let cfg = engine_config(c)?;
        let backends = opt_text(c.backends, "backends")?;
        let adapter = AdapterRequest::from_lookup(|var| match (var, backends) {
            ("PAGELLM_BACKEND", Some(b)) => Some(b.to_string()),
            _ => std::env::var(var).ok(),
        })
        .map_err(|e| Fail(PAGELLM_ERR_ARGUMENT, e.to_string()))?;
        let ctx = GpuContext::new(&adapter).map_err(|e| Fail(PAGELLM_ERR_LOAD, e.to_string()))?;
        let handle = EngineBuilder::new(std::path::Path::new(model))
            .config(cfg)
            .context(Arc::new(ctx))
            .load()
            .map_err(|e| Fail(PAGELLM_ERR_LOAD, e.to_string()))?;
        *out = insert(engines(), handle) as *mut pagellm_engine;
        Ok(PAGELLM_OK)
    })
}

/// Stops the engine and frees it: pending requests end (their next event says so), and
/// the call returns once the engine's thread has finished its step. Null is ignored.
///
/// Thread safety: any thread, once per engine. Calls on the engine already running on other
/// threads finish; calls that start after it get `PAGELLM_ERR_HANDLE`.
#[no_mangle]
pub extern "C" fn pagellm_engine_free(engine: *mut pagellm_engine) {
    let _ = guard(|| {
        if let Some(handle) = remove(engines(), engine as usize) {
            handle.shutdown();
        }
        Ok(PAGELLM_OK)
    });
}

/// The engine's statistics as a JSON object (KV cache blocks, requests, throughput), in
/// `*out`, to free with [`pagellm_string_free`].
///
/// # Safety
/// `out` points to writable memory.
///
/// Thread safety: any thread, at the same time as any other call.
#[no_mangle]
pub unsafe extern "C" fn pagellm_engine_stats_json(
    engine: *mut pagellm_engine,
    out: *mut *mut c_char,
) -> pagellm_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let handle = lookup(engines(), engine as usize, "engine")?;
        let Some(s) = handle.stats_now() else {
            return fail(PAGELLM_ERR_ENGINE, "the engine has stopped");
        };
        let c = &s.engine.cache;
        let json = serde_json::json!({
            "steps": s.steps,
            "tokens_computed": s.tokens_computed,
            "computed_per_s": s.computed_per_s,
            "pending_requests": s.engine.pending_requests,
            "running": s.engine.num_running,
            "waiting": s.engine.num_waiting,
            "swapped": s.engine.num_swapped,
            "kv_blocks": {
                "block_size": c.block_size,
                "device_total": c.device.total,
                "device_used": c.device.used,
                "device_cached": c.device.cached,
                "host_total": c.host.total,
                "host_used": c.host.used,
            },
            "kv_pool_bytes": s.engine.kv_pool_bytes,
            "preemptions": s.engine.scheduler.preemptions,
            "prefix_cache_hit_blocks": c.prefix_hits,
            "device": {
                "losses": s.engine.device.losses,
                "recoveries": s.engine.device.recoveries,
                "gave_up": s.engine.device.gave_up,
            },
        });
        *out = owned_string(&json.to_string());
        Ok(PAGELLM_OK)
    })
}

/// Resizes the engine's device KV pool to `bytes` while it runs (a live KV budget: give
/// GPU memory back to the application, or take more): after the step in progress, the
/// pool shrinks (requests holding blocks beyond the new size are preempted and resume in
/// what is left, with the same outputs) or grows. The blocks it has then go to
/// `*blocks_after` unless that is null. A size below what one sequence at the full context
/// needs is refused with `PAGELLM_ERR_ARGUMENT` and a message saying how many blocks it
/// needs; the pool is then unchanged.
///
/// # Safety
/// `blocks_after` is null or points to writable memory.
///
/// Thread safety: any thread, at the same time as any other call; the call waits for the
/// step in progress.
#[no_mangle]
pub unsafe extern "C" fn pagellm_engine_set_kv_budget(
    engine: *mut pagellm_engine,
    bytes: u64,
    blocks_after: *mut u64,
) -> pagellm_status {
    guard(|| {
        let handle = lookup(engines(), engine as usize, "engine")?;
        let done = handle
            .set_kv_budget(pagellm::PoolSize::Bytes(bytes))
            .map_err(|e| match e {
                pagellm::Error::Unavailable(_) => Fail(PAGELLM_ERR_ENGINE, e.to_string()),
                _ => Fail(PAGELLM_ERR_ARGUMENT, e.to_string()),
            })?;
        if !blocks_after.is_null() {
            *blocks_after = done.blocks_after as u64;
        }
        Ok(PAGELLM_OK)
    })
}

fn owned_string(s: &str) -> *mut c_char {
    CString::new(s.replace('\0', " "))
        .unwrap_or_default()
        .into_raw()
}

/// Frees a string the library returned. Null is ignored.
///
/// # Safety
/// `s` is null or a string from this library, not freed before.
///
/// Thread safety: any thread; each string once.
#[no_mangle]
pub unsafe extern "C" fn pagellm_string_free(s: *mut c_char) {
    if !s.is_null() {
        drop(CString::from_raw(s));
    }
}

// ---- requests -----------------------------------------------------------------------

/// The default sampling: greedy, 16 tokens.
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn pagellm_sampling_default() -> pagellm_sampling {
    let d = SamplingParams::default();
    pagellm_sampling {
        n: 1,
        temperature: d.temperature,
        top_p: d.top_p,
        top_k: 0,
        min_p: d.min_p,
        seed: 0,
        use_seed: 0,
        max_tokens: 16,
        logprobs: -1,
        ignore_eos: 0,
        presence_penalty: d.presence_penalty,
        frequency_penalty: d.frequency_penalty,
        repetition_penalty: d.repetition_penalty,
    }
}

fn sampling_params(s: &pagellm_sampling) -> SamplingParams {
    SamplingParams {
        n: s.n as usize,
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: (s.top_k > 0).then_some(s.top_k as usize),
        min_p: s.min_p,
        seed: (s.use_seed != 0).then_some(s.seed),
        max_tokens: s.max_tokens as usize,
        logprobs: usize::try_from(s.logprobs).ok(),
        ignore_eos: s.ignore_eos != 0,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        repetition_penalty: s.repetition_penalty,
        ..SamplingParams::default()
    }
}

/// A submitted request: its stream (aborting needs no lock, so an abort from one thread
/// never waits for another thread's read) and what its reader keeps.
struct RequestEntry {
    stream: RequestStream,
    state: Mutex<RequestState>,
}

/// A request's events as the caller reads them.
struct RequestState {
    /// FINISHED events not yet read, one per sample.
    finished: VecDeque<(usize, String, usize, f64, FinishReason)>,
    /// The final output, once it came.
    output: Option<RequestOutput>,
    /// No more events will come.
    ended: bool,
    /// The text the last event points to (NUL-terminated).
    text: Vec<u8>,
}

fn submit(
    engine: *mut pagellm_engine,
    request: Request,
    out: *mut *mut pagellm_request,
) -> Result<pagellm_status, Fail> {
    let out = out_ptr(out, "out")?;
    let handle = lookup(engines(), engine as usize, "engine")?;
    let stream = handle
        .submit(request)
        .map_err(|e| Fail(PAGELLM_ERR_REQUEST, e.to_string()))?;
    let state = RequestState {
        finished: VecDeque::new(),
        output: None,
        ended: false,
        text: Vec::new(),
    };
    let entry = RequestEntry {
        stream,
        state: Mutex::new(state),
    };
    // SAFETY: checked non-null above; the caller gives writable memory.
    unsafe { *out = insert(requests(), entry) as *mut pagellm_request };
    Ok(PAGELLM_OK)
}

/// Submits `prompt` (UTF-8 text, tokenized by the model's tokenizer) with `params` (null:
/// [`pagellm_sampling_default`]). The request is checked here: bad parameters or a prompt
/// longer than the context are [`pagellm_status::PAGELLM_ERR_REQUEST`] with the reason. On
/// success `*out` is the request, to read with [`pagellm_request_next`] and free with
/// [`pagellm_request_free`].
///
/// # Safety
/// `prompt` is NUL-terminated; `params` is null or valid; `out` is writable.
///
/// Thread safety: any thread, at the same time as any other call on the engine.
#[no_mangle]
pub unsafe extern "C" fn pagellm_submit(
    engine: *mut pagellm_engine,
    prompt: *const c_char,
    params: *const pagellm_sampling,
    out: *mut *mut pagellm_request,
) -> pagellm_status {
    guard(|| {
        let prompt = text(prompt, "prompt")?;
        let params = match params.as_ref() {
            Some(p) => sampling_params(p),
            None => sampling_params(&pagellm_sampling_default()),
        };
        submit(engine, Request::text(prompt).with_params(params), out)
    })
}

/// Submits a request written as JSON, the shape of the server's completions requests:
/// `{"prompt": "...", "max_tokens": 32, "temperature": 0, "stop": ["\n"], "n": 2,
/// "logprobs": 3, "seed": 7, "json_schema": {...}, "cache_salt": "user-1", ...}` (every
/// sampling option, stop strings, constraints: `json_schema`, `regex`, `choice` or
/// `grammar`). An unknown field is an error naming it.
///
/// # Safety
/// `json` is NUL-terminated; `out` is writable.
///
/// Thread safety: any thread, at the same time as any other call on the engine.
#[no_mangle]
pub unsafe extern "C" fn pagellm_submit_json(
    engine: *mut pagellm_engine,
    json: *const c_char,
    out: *mut *mut pagellm_request,
) -> pagellm_status {
    guard(|| {
        let json = text(json, "json")?;
        let request = JsonRequest::parse(json)
            .and_then(|r| r.into_request(&SamplingParams::default()))
            .map_err(|e| Fail(PAGELLM_ERR_REQUEST, e.to_string()))?;
        submit(engine, request, out)
    })
}

fn reason(r: FinishReason) -> *const c_char {
    let s: &'static CStr = match r {
        FinishReason::Stop => c"stop",
        FinishReason::Length => c"length",
        FinishReason::Abort => c"abort",
    };
    s.as_ptr()
}

impl RequestState {
    /// Fills `ev` with the next queued FINISHED event, if any.
    fn pop_finished(&mut self, ev: &mut pagellm_event) -> bool {
        let Some((index, text, tokens, logprob, why)) = self.finished.pop_front() else {
            return false;
        };
        self.set_text(&text);
        *ev = pagellm_event {
            kind: pagellm_event_kind::PAGELLM_EVENT_FINISHED,
            index: index as u32,
            token_id: tokens as u32,
            logprob,
            text: self.text.as_ptr().cast(),
            text_len: text.len(),
            finish_reason: reason(why),
        };
        true
    }

    fn set_text(&mut self, text: &str) {
        self.text.clear();
        self.text.extend_from_slice(text.as_bytes());
        self.text.push(0);
    }

    /// The next event into `ev`, waiting at most `timeout` (`None`: until one comes).
    fn next(
        &mut self,
        stream: &RequestStream,
        timeout: Option<Duration>,
        ev: &mut pagellm_event,
    ) -> Result<pagellm_status, Fail> {
        if self.pop_finished(ev) {
            return Ok(PAGELLM_OK);
        }
        if self.ended {
            return Ok(PAGELLM_END);
        }
        let event = match timeout {
            None => stream.recv(),
            Some(t) => match stream.recv_timeout(t) {
                Some(e) => Some(e),
                None if !stream.is_ended() => return Ok(PAGELLM_TIMEOUT),
                None => None,
            },
        };
        match event {
            Some(RequestEvent::Token {
                index,
                token_id,
                text,
                logprob,
            }) => {
                self.set_text(&text);
                *ev = pagellm_event {
                    kind: pagellm_event_kind::PAGELLM_EVENT_TOKEN,
                    index: index as u32,
                    token_id,
                    logprob: logprob.map_or(f64::NAN, |l| l.logprob),
                    text: self.text.as_ptr().cast(),
                    text_len: text.len(),
                    finish_reason: std::ptr::null(),
                };
                Ok(PAGELLM_OK)
            }
            Some(RequestEvent::Finished(output)) => {
                self.ended = true;
                for o in &output.outputs {
                    let item = (
                        o.index,
                        o.text.clone(),
                        o.token_ids.len(),
                        o.cumulative_logprob,
                        o.finish_reason,
                    );
                    self.finished.push_back(item);
                }
                self.output = Some(output);
                Ok(if self.pop_finished(ev) {
                    PAGELLM_OK
                } else {
                    PAGELLM_END
                })
            }
            Some(RequestEvent::Failed(why)) => {
                self.ended = true;
                fail(PAGELLM_ERR_REQUEST, why)
            }
            None => {
                self.ended = true;
                fail(
                    PAGELLM_ERR_ENGINE,
                    "the engine stopped before the request finished",
                )
            }
        }
    }
}

/// The request's next event into `*event`, waiting at most `timeout_ms` milliseconds (-1:
/// until one comes; 0: only look). Returns OK with an event, TIMEOUT when none came in
/// time, END once every event has been read (and on every call after), or an error: the
/// request failed ([`pagellm_status::PAGELLM_ERR_REQUEST`], with the reason) or the engine
/// stopped. Events: the tokens of every sample as they are generated, then one FINISHED
/// per sample. The event's pointers stay valid until the next call on this request.
///
/// # Safety
/// `event` is writable.
///
/// Thread safety: any thread; calls on one request are serialized (a second waits for the
/// first), and the event's pointers stay valid until the request's next call, free
/// included.
#[no_mangle]
pub unsafe extern "C" fn pagellm_request_next(
    request: *mut pagellm_request,
    timeout_ms: i32,
    event: *mut pagellm_event,
) -> pagellm_status {
    guard(|| {
        let event = out_ptr(event, "event")?;
        let entry = lookup(requests(), request as usize, "request")?;
        let mut state = entry.state.lock().unwrap_or_else(|p| p.into_inner());
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        state.next(&entry.stream, timeout, &mut *event)
    })
}

/// The finished request's output as JSON (`prompt_token_ids`, and per sample `text`,
/// `token_ids`, `finish_reason`, `cumulative_logprob`, `logprobs` when asked), in `*out`, to
/// free with [`pagellm_string_free`]. An error until its FINISHED events have arrived.
///
/// # Safety
/// `out` is writable.
///
/// Thread safety: any thread; serialized with the request's other calls.
#[no_mangle]
pub unsafe extern "C" fn pagellm_request_output_json(
    request: *mut pagellm_request,
    out: *mut *mut c_char,
) -> pagellm_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let entry = lookup(requests(), request as usize, "request")?;
        let state = entry.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(output) = &state.output else {
            return fail(PAGELLM_ERR_REQUEST, "the request has not finished");
        };
        let json =
            serde_json::to_string(output).map_err(|e| Fail(PAGELLM_ERR_PANIC, e.to_string()))?;
        *out = owned_string(&json);
        Ok(PAGELLM_OK)
    })
}

/// Asks the engine to end the request: its samples finish with reason "abort" (their
/// FINISHED events follow). A request already finished is left as it is. Unlike the other
/// calls on a request, this one never waits for a read in progress on another thread.
///
/// Thread safety: any thread, also while another thread waits in `pagellm_request_next` on
/// the same request.
#[no_mangle]
pub extern "C" fn pagellm_request_abort(request: *mut pagellm_request) -> pagellm_status {
    guard(|| {
        lookup(requests(), request as usize, "request")?
            .stream
            .abort();
        Ok(PAGELLM_OK)
    })
}

/// Frees a request; one still running is aborted and its memory given back at the engine's
/// next step. Null is ignored.
///
/// Thread safety: any thread, once per request; a call in progress on another thread
/// finishes first, and the pointers of an event it returns are then no longer valid.
#[no_mangle]
pub extern "C" fn pagellm_request_free(request: *mut pagellm_request) {
    let _ = guard(|| {
        remove(requests(), request as usize);
        Ok(PAGELLM_OK)
    });
}
