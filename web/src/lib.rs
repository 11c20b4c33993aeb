//! pagellm in the browser: the engine built for `wasm32-unknown-unknown` on the page's
//! WebGPU, bound to JavaScript by wasm-bindgen. [`WasmEngine`] is the bound class; the
//! hand-written wrapper `web/js/pagellm.js` turns it into the API a web page uses
//! (`Engine.load`, `for await (const delta of engine.generate(...))`, `abort`, `stats`).
//!
//! The engine here is the native one, shared by the page's tasks as a
//! [`pagellm::LocalEngine`] and stepped by awaiting rather than waiting: a step is begun
//! (its GPU work submitted), awaited until its read-back lands (the browser's event loop
//! delivers the map callback, so the page stays responsive) and ended. Requests are
//! JSON in the server's completions shape ([`pagellm::JsonRequest`]); events come back as
//! JSON records (see [`events`]).
//!
//! Natively this crate builds too (the workspace's clippy and tests see it); its plain-Rust
//! parts ([`Options`], [`events`]) are shared with the native reference run that the
//! browser build's outputs are compared with.

pub mod events;
mod options;

pub use options::Options;

use pagellm::{
    open_chat_template, ChatMessage, ChatTemplate, Engine, GpuContext, JsonRequest, LocalEngine,
    MemoryFiles, Prompt, RecordStore, Request, RequestHandle, SamplingParams,
};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use wasm_bindgen::prelude::*;

/// The engine and the requests it streams to JavaScript.
struct State {
    engine: LocalEngine,
    requests: RefCell<BTreeMap<u64, RequestHandle>>,
}

impl State {
    /// Every event the engine has sent since the last call, in order per request; finished
    /// requests are forgotten.
    fn drain(&self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        self.requests.borrow_mut().retain(|&id, handle| {
            let mut open = true;
            while let Ok(event) = handle.events.try_recv() {
                open &= !events::is_last(&event);
                out.push(events::to_json(id, &event));
            }
            open
        });
        out
    }

    fn add(&self, request: Request) -> Result<f64, JsError> {
        let handle = self.engine.add(request).map_err(js_error)?;
        let id = handle.id;
        self.requests.borrow_mut().insert(id, handle);
        Ok(id as f64)
    }
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console)]
    fn error(message: &str);
}

/// Runs when the module is instantiated: a panic (a bug: the engine's errors are values)
/// is written to the console with its message and place before the module traps.
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| error(&format!("pagellm panicked: {info}"))));
}

fn js_error(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// The engine as JavaScript sees it (the wrapper in `web/js/pagellm.js` drives it).
#[wasm_bindgen]
pub struct WasmEngine {
    state: Rc<State>,
    info: String,
    /// The disk tier's records, when the page keeps them.
    store: Option<RecordStore>,
    /// The model's chat template, or why it has none.
    chat: Result<ChatTemplate, String>,
}

#[wasm_bindgen]
impl WasmEngine {
    /// Opens the model in `files` (an array of `[name, Uint8Array]` pairs: a Hugging Face
    /// folder's `config.json`, `tokenizer.json`, `*.safetensors` ..., or one `.gguf` file)
    /// on the page's WebGPU adapter, with `options` as JSON (see [`Options`]).
    /// `progress(done, total)` is called with the bytes of weights uploaded.
    ///
    /// `records`, when given, are the prefix cache's disk-tier records the page kept (an
    /// array of `[name, Uint8Array]`, maybe empty): the engine then keeps such records
    /// itself, and [`Self::take_record_changes`] hands back what it wrote and deleted for
    /// the page to keep (in the Origin Private File System). Without it there is no disk
    /// tier.
    pub async fn load(
        name: String,
        files: js_sys::Array,
        options: String,
        progress: Option<js_sys::Function>,
        records: Option<js_sys::Array>,
    ) -> Result<WasmEngine, JsError> {
        let options = Options::parse(&options).map_err(js_error)?;
        let store = match records {
            Some(records) => Some(record_store(&records)?),
            None => None,
        };
        let mut model = MemoryFiles::new(name);
        for pair in files.iter() {
            let pair: js_sys::Array = pair
                .dyn_into()
                .map_err(|_| js_error("files: each entry must be a [name, Uint8Array] pair"))?;
            let file = pair
                .get(0)
                .as_string()
                .ok_or_else(|| js_error("files: a file's name must be a string"))?;
            let bytes: js_sys::Uint8Array = pair
                .get(1)
                .dyn_into()
                .map_err(|_| js_error(format!("files: {file}'s bytes must be a Uint8Array")))?;
            model = model.with_file(file, bytes.to_vec());
        }
        // The chat template, if the files have one (`chat` says why not otherwise).
        let chat = open_chat_template(model.clone()).map_err(|e| e.to_string());
        let ctx = Arc::new(open_gpu(options.power_preference()).await?);
        let mut config = options.engine_config().map_err(js_error)?;
        config.kv_cache_store = store.clone();
        let report = |done: u64, total: u64| {
            if let Some(f) = &progress {
                let _ = f.call2(
                    &JsValue::NULL,
                    &(done as f64).into(),
                    &(total as f64).into(),
                );
            }
        };
        let engine = Engine::with_context(ctx.clone(), model, config, report).map_err(js_error)?;
        let info = events::info(&engine);
        Ok(WasmEngine {
            state: Rc::new(State {
                engine: LocalEngine::new(engine),
                requests: RefCell::new(BTreeMap::new()),
            }),
            info: info.to_string(),
            store,
            chat,
        })
    }

    /// Queues a chat: `messages` (JSON `[{"role": ..., "content": ...}, ...]`) rendered by
    /// the model's chat template with the assistant's turn opened, its tokens taken as they
    /// are (the template writes the special tokens), with `request`'s fields (as
    /// [`Self::add_request`]; its `prompt` is ignored). Returns the request's id.
    pub fn add_chat(&self, messages: &str, request: &str) -> Result<f64, JsError> {
        let template = self.chat.as_ref().map_err(js_error)?;
        let messages: Vec<ChatMessage> =
            serde_json::from_str(messages).map_err(|e| js_error(format!("messages: {e}")))?;
        let text = template.render(&messages, true).map_err(js_error)?;
        let mut request = JsonRequest::parse(request)
            .and_then(|r| r.into_request(&SamplingParams::default()))
            .map_err(js_error)?;
        let ids = self.state.engine.engine().tokenizer().encode_plain(&text);
        request.prompt = Prompt::Tokens(ids.map_err(js_error)?);
        self.state.add(request)
    }

    /// The disk-tier records written (`[name, Uint8Array]`) and deleted (`[name, null]`)
    /// since the last call, for the page to keep; empty without a record store.
    pub fn take_record_changes(&self) -> js_sys::Array {
        let out = js_sys::Array::new();
        for (name, bytes) in self
            .store
            .as_ref()
            .map(|s| s.take_changes())
            .unwrap_or_default()
        {
            let bytes = match bytes {
                Some(b) => js_sys::Uint8Array::from(&b[..]).into(),
                None => JsValue::NULL,
            };
            out.push(&js_sys::Array::of2(&name.into(), &bytes));
        }
        out
    }

    /// Whether blocks computed by the last steps still wait to be written to the disk
    /// tier: the driver runs one more [`Self::step`] when it goes idle, which writes them.
    pub fn has_unsaved_prefix_blocks(&self) -> bool {
        self.state.engine.engine().has_unsaved_prefix_blocks()
    }

    /// The model, the adapter and the KV pool, as JSON.
    pub fn info(&self) -> String {
        self.info.clone()
    }

    /// Queues a request (JSON in the completions shape: `{"prompt": ..., "max_tokens": ...,
    /// "temperature": ..., "n": ..., "logprobs": ..., "regex": ...}`) and returns its id. A
    /// request that cannot run is an error here, naming what is wrong, and takes nothing.
    pub fn add_request(&self, request: &str) -> Result<f64, JsError> {
        let request = JsonRequest::parse(request)
            .and_then(|r| r.into_request(&SamplingParams::default()))
            .map_err(js_error)?;
        self.state.add(request)
    }

    /// Aborts a request; its `finished` event (finish reason `abort`) comes with the next
    /// events. False for an unknown or finished request.
    pub fn abort(&self, id: f64) -> bool {
        self.state.engine.abort(id as u64)
    }

    /// Whether any request is pending.
    pub fn has_unfinished(&self) -> bool {
        self.state.engine.has_unfinished()
    }

    /// The events sent since the last call (JSON array, see [`events`]).
    pub fn take_events(&self) -> String {
        serde_json::Value::Array(self.state.drain()).to_string()
    }

    /// Runs one engine step, awaiting the GPU; resolves to JSON `{"computed": tokens,
    /// "events": [...], "error": null | "...", "begin_ms", "wait_ms", "end_ms"}` (the
    /// milliseconds spent beginning the step, awaiting the GPU and ending it). An error failed every pending request
    /// (their `failed` events are in `events`); the engine takes new requests after it.
    pub fn step(&self) -> js_sys::Promise {
        let state = self.state.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let result = state.engine.step().await;
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            let t = result.as_ref().ok();
            let record = serde_json::json!({
                "computed": t.map_or(0, |t| t.computed),
                "events": state.drain(),
                "error": result.as_ref().err().map(|e| e.to_string()),
                "begin_ms": t.map_or(0.0, |t| ms(t.begin)),
                "wait_ms": t.map_or(0.0, |t| ms(t.wait)),
                "end_ms": t.map_or(0.0, |t| ms(t.end)),
            });
            Ok(JsValue::from_str(&record.to_string()))
        })
    }

    /// The KV cache and scheduler figures, as JSON (see [`events::stats`]).
    pub fn stats(&self) -> String {
        events::stats(&self.state.engine.stats()).to_string()
    }
}

/// A record store holding `records` (`[name, Uint8Array]` pairs).
fn record_store(records: &js_sys::Array) -> Result<RecordStore, JsError> {
    let store = RecordStore::new();
    for pair in records.iter() {
        let pair: js_sys::Array = pair
            .dyn_into()
            .map_err(|_| js_error("records: each entry must be a [name, Uint8Array] pair"))?;
        let (Some(name), Ok(bytes)) = (
            pair.get(0).as_string(),
            pair.get(1).dyn_into::<js_sys::Uint8Array>(),
        ) else {
            return Err(js_error(
                "records: each entry must be a [name, Uint8Array] pair",
            ));
        };
        store.insert(name, bytes.to_vec());
    }
    Ok(store)
}

/// The page's WebGPU adapter and a device of pagellm's own on it.
async fn open_gpu(power: pagellm::wgpu::PowerPreference) -> Result<GpuContext, JsError> {
    let instance = pagellm::wgpu::Instance::default();
    let adapter = instance
        .request_adapter(&pagellm::wgpu::RequestAdapterOptions {
            power_preference: power,
            ..Default::default()
        })
        .await
        .map_err(|e| js_error(format!("no WebGPU adapter: {e}")))?;
    GpuContext::open_async(adapter).await.map_err(js_error)
}
