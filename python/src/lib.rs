//! `pagellm._pagellm`: the native half of the Python package. It holds an
//! [`EngineHandle`] (the engine on its own thread) and the streams of submitted requests,
//! and releases the GIL whenever it waits. The vLLM-shaped API (`LLM`, `SamplingParams`,
//! `RequestOutput`, ...) is Python, in `pagellm/__init__.py`, over these few calls; requests
//! and options cross as JSON in the library's own shapes (`JsonRequest`), so every check
//! and error message is the library's.

use pagellm::{
    open_chat_template, AdapterRequest, ChatMessage, ChatTemplate, EngineBuilder, EngineConfig,
    EngineHandle, Event, GpuContext, JsonRequest, KvDtype, PreemptionMode, Prompt, RequestStream,
    SamplingParams, WeightDtype,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use serde::Deserialize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a wait runs before it looks for a signal (Ctrl-C) again.
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// The engine's options as the Python layer passes them (`LLM(...)`'s keywords, already
/// mapped to pagellm's names); every one may be absent.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    block_size: Option<usize>,
    num_gpu_blocks: Option<usize>,
    kv_cache_bytes: Option<u64>,
    kv_memory_fraction: Option<f64>,
    num_cpu_blocks: Option<usize>,
    swap_space_bytes: Option<u64>,
    max_model_len: Option<usize>,
    max_num_seqs: Option<usize>,
    max_num_batched_tokens: Option<usize>,
    kv_dtype: Option<String>,
    weight_dtype: Option<String>,
    enable_prefix_caching: Option<bool>,
    kv_cache_dir: Option<String>,
    preemption_mode: Option<String>,
    backends: Option<String>,
}

impl Options {
    fn config(&self) -> Result<EngineConfig, String> {
        let d = EngineConfig::default();
        let preemption_mode = match self.preemption_mode.as_deref() {
            None | Some("auto") => None,
            Some("swap") => Some(PreemptionMode::Swap),
            Some("recompute") => Some(PreemptionMode::Recompute),
            Some(other) => {
                return Err(format!(
                    "preemption_mode must be auto, swap or recompute, not {other:?}"
                ))
            }
        };
        if let Some(f) = self.kv_memory_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(format!(
                    "kv_memory_fraction must be above 0 and at most 1, not {f}"
                ));
            }
        }
        Ok(EngineConfig {
            block_size: self.block_size.unwrap_or(d.block_size),
            num_gpu_blocks: self.num_gpu_blocks,
            kv_cache_bytes: self.kv_cache_bytes.or(d.kv_cache_bytes),
            kv_memory_fraction: self.kv_memory_fraction.unwrap_or(d.kv_memory_fraction),
            num_cpu_blocks: self.num_cpu_blocks,
            swap_space_bytes: self.swap_space_bytes.unwrap_or(d.swap_space_bytes),
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs.unwrap_or(d.max_num_seqs),
            max_num_batched_tokens: (self.max_num_batched_tokens)
                .unwrap_or(d.max_num_batched_tokens),
            kv_dtype: match &self.kv_dtype {
                Some(s) => s.parse::<KvDtype>().map_err(|e| format!("kv_dtype: {e}"))?,
                None => d.kv_dtype,
            },
            weight_dtype: match &self.weight_dtype {
                Some(s) => Some(
                    s.parse::<WeightDtype>()
                        .map_err(|e| format!("weight_dtype: {e}"))?,
                ),
                None => None,
            },
            enable_prefix_caching: self.enable_prefix_caching.unwrap_or(true),
            kv_cache_dir: self.kv_cache_dir.as_ref().map(Into::into),
            preemption_mode,
            ..d
        })
    }
}

fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A loaded model and its engine thread.
#[pyclass(module = "pagellm._pagellm", frozen)]
struct Engine {
    handle: EngineHandle,
    model: String,
    /// The model's chat template, read at the first chat.
    chat: Mutex<Option<Result<Arc<ChatTemplate>, String>>>,
}

#[pymethods]
impl Engine {
    /// Loads `model` (a folder or a `.gguf` file) with `options` (JSON, see `Options`),
    /// without the GIL; returns once it is loaded.
    #[new]
    fn new(py: Python<'_>, model: String, options: &str) -> PyResult<Self> {
        let options: Options = serde_json::from_str(options).map_err(value_error)?;
        let config = options.config().map_err(value_error)?;
        let backends = options.backends.clone();
        let path = model.clone();
        let handle = py.detach(move || -> Result<EngineHandle, String> {
            let adapter = AdapterRequest::from_lookup(|var| match (var, &backends) {
                ("PAGELLM_BACKEND", Some(b)) => Some(b.clone()),
                _ => std::env::var(var).ok(),
            })
            .map_err(|e| e.to_string())?;
            let ctx = GpuContext::new(&adapter).map_err(|e| e.to_string())?;
            EngineBuilder::new(std::path::Path::new(&path))
                .config(config)
                .context(Arc::new(ctx))
                .load()
                .map_err(|e| e.to_string())
        });
        let handle = handle.map_err(PyRuntimeError::new_err)?;
        Ok(Engine {
            handle,
            model,
            chat: Mutex::new(None),
        })
    }

    /// Submits every request at once (so they are batched from the first step): each is a
    /// JSON request (the library's `JsonRequest`) and, where the prompt is given as token
    /// ids, those ids. All are checked first; if one is refused none runs, and the error
    /// names it.
    fn submit_all(
        &self,
        py: Python<'_>,
        requests: Vec<(String, Option<Vec<u32>>)>,
    ) -> PyResult<Vec<Stream>> {
        // Preparing requests (tokenizing, compiling constraints) can take a while: without
        // the GIL.
        let streams = py.detach(|| self.submit_prepared(requests));
        Ok(streams
            .map_err(value_error)?
            .into_iter()
            .map(|inner| Stream { inner })
            .collect())
    }

    /// The chat template's rendering of `messages` (JSON: `[{"role", "content"}, ...]`) and
    /// its token ids (the template writes the special tokens itself).
    fn render_chat(
        &self,
        py: Python<'_>,
        messages: &str,
        add_generation_prompt: bool,
    ) -> PyResult<(String, Vec<u32>)> {
        let messages: Vec<ChatMessage> = serde_json::from_str(messages).map_err(value_error)?;
        let template = self.chat_template()?;
        let intake = self.intake()?;
        py.detach(move || {
            let text = template
                .render(&messages, add_generation_prompt)
                .map_err(value_error)?;
            let ids = intake
                .tokenizer()
                .encode_plain(&text)
                .map_err(value_error)?;
            Ok((text, ids))
        })
    }

    /// `text` as token ids, special tokens added as the model's tokenizer says.
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        self.intake()?.tokenizer().encode(text).map_err(value_error)
    }

    /// Token ids as text.
    #[pyo3(signature = (ids, skip_special_tokens = true))]
    fn decode(&self, ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        (self.intake()?.tokenizer())
            .decode(&ids, skip_special_tokens)
            .map_err(value_error)
    }

    /// The context length requests are checked against.
    #[getter]
    fn max_model_len(&self) -> PyResult<usize> {
        Ok(self.intake()?.max_model_len())
    }

    #[getter]
    fn model(&self) -> &str {
        &self.model
    }

    /// The engine's statistics as JSON (after the step in progress).
    fn stats_json(&self, py: Python<'_>) -> PyResult<String> {
        let Some(s) = py.detach(|| self.handle.stats_now()) else {
            return Err(PyRuntimeError::new_err("the engine has stopped"));
        };
        let c = &s.engine.cache;
        Ok(serde_json::json!({
            "steps": s.steps,
            "tokens_computed": s.tokens_computed,
            "pending_requests": s.engine.pending_requests,
            "kv_blocks_total": c.device.total,
            "kv_blocks_used": c.device.used,
            "kv_blocks_cached": c.device.cached,
            "prefix_cache_hits": c.prefix_hits,
            "preemptions": s.engine.scheduler.preemptions,
            "kv_pool_bytes": s.engine.kv_pool_bytes,
            "device_losses": s.engine.device.losses,
            "device_recoveries": s.engine.device.recoveries,
        })
        .to_string())
    }

    /// Resizes the device KV pool to `bytes` while the engine runs (after the step in
    /// progress); the resize as JSON. A size below one sequence is a `ValueError`.
    fn set_kv_budget(&self, py: Python<'_>, bytes: u64) -> PyResult<String> {
        let done = py.detach(|| self.handle.set_kv_budget(pagellm::PoolSize::Bytes(bytes)));
        let r = done.map_err(|e| match e {
            pagellm::Error::Unavailable(_) => PyRuntimeError::new_err(e.to_string()),
            _ => value_error(e),
        })?;
        Ok(serde_json::json!({
            "blocks_before": r.blocks_before,
            "blocks_after": r.blocks_after,
            "bytes_before": r.bytes_before,
            "bytes_after": r.bytes_after,
            "preempted_groups": r.preempted_groups,
        })
        .to_string())
    }

    /// Stops the engine: pending requests end aborted.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| {
            self.handle.shutdown();
        });
    }
}

impl Engine {
    /// See `submit_all`.
    fn submit_prepared(
        &self,
        requests: Vec<(String, Option<Vec<u32>>)>,
    ) -> Result<Vec<RequestStream>, String> {
        let mut prepared = Vec::with_capacity(requests.len());
        for (i, (json, ids)) in requests.into_iter().enumerate() {
            let mut request = JsonRequest::parse(&json)
                .and_then(|r| r.into_request(&SamplingParams::default()))
                .map_err(|e| format!("request {i}: {e}"))?;
            if let Some(ids) = ids {
                request.prompt = Prompt::Tokens(ids);
            }
            prepared.push(request);
        }
        let mut streams = Vec::with_capacity(prepared.len());
        let mut refused = None;
        for (i, s) in self.handle.submit_all(prepared).into_iter().enumerate() {
            match s {
                Ok(stream) => streams.push(stream),
                Err(e) if refused.is_none() => refused = Some(format!("request {i}: {e}")),
                Err(_) => {}
            }
        }
        match refused {
            Some(why) => {
                streams.iter().for_each(RequestStream::abort);
                Err(why)
            }
            None => Ok(streams),
        }
    }

    fn intake(&self) -> PyResult<Arc<pagellm::Intake>> {
        self.handle
            .intake()
            .cloned()
            .ok_or_else(|| PyRuntimeError::new_err("the engine is not loaded"))
    }

    fn chat_template(&self) -> PyResult<Arc<ChatTemplate>> {
        let mut slot = self.chat.lock().unwrap_or_else(|p| p.into_inner());
        let loaded = slot.get_or_insert_with(|| {
            open_chat_template(std::path::Path::new(&self.model))
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        loaded.clone().map_err(value_error)
    }
}

/// One request's events.
#[pyclass(module = "pagellm._pagellm", frozen)]
struct Stream {
    inner: RequestStream,
}

/// An event as Python sees it: `("token", index, token_id, text, logprob, top)`,
/// `("finished", output_json)`, or `("end",)` once the stream is over.
type PyEvent<'py> = Bound<'py, pyo3::types::PyTuple>;

fn to_py<'py>(py: Python<'py>, event: Option<Event>) -> PyResult<PyEvent<'py>> {
    use pyo3::types::PyTuple;
    match event {
        Some(Event::Token {
            index,
            token_id,
            text,
            logprob,
        }) => {
            let (lp, top) = match logprob {
                Some(l) => (Some(l.logprob), l.top),
                None => (None, Vec::new()),
            };
            ("token", index, token_id, text, lp, top).into_pyobject(py)
        }
        Some(Event::Finished(output)) => {
            let json = serde_json::to_string(&output).map_err(value_error)?;
            ("finished", json).into_pyobject(py)
        }
        Some(Event::Failed(why)) => Err(value_error(why)),
        None => PyTuple::new(py, ["end"]),
    }
}

#[pymethods]
impl Stream {
    /// The engine's id of the request.
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id()
    }

    /// The next event, waiting at most `timeout` seconds (`None`: until one comes) without
    /// the GIL; `None` if none came in time. A failed request raises `ValueError` with the
    /// reason. Ctrl-C (a signal handler raising) aborts the request and raises.
    #[pyo3(signature = (timeout = None))]
    fn next<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Option<PyEvent<'py>>> {
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        loop {
            let slice = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(SIGNAL_SLICE),
                None => SIGNAL_SLICE,
            };
            let got = py.detach(|| self.inner.recv_timeout(slice));
            // Checked on every event too, not only when none came in time: a request whose
            // tokens keep coming faster than the slice would otherwise never see Ctrl-C.
            if let Err(e) = py.check_signals() {
                self.inner.abort();
                return Err(e);
            }
            if got.is_some() || self.inner.is_ended() {
                return to_py(py, got).map(Some);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// The next event if one has arrived, else `None` (for an event loop that polls).
    fn try_next<'py>(&self, py: Python<'py>) -> PyResult<Option<PyEvent<'py>>> {
        match self.inner.try_recv() {
            Some(e) => to_py(py, Some(e)).map(Some),
            None if self.inner.is_ended() => to_py(py, None).map(Some),
            None => Ok(None),
        }
    }

    /// Asks the engine to end the request (its outputs finish with reason `abort`).
    fn abort(&self) {
        self.inner.abort();
    }
}

#[pymodule]
fn _pagellm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Stream>()?;
    Ok(())
}
