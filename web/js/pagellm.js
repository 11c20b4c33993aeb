// pagellm in the browser: the JavaScript API over the wasm engine (web/pkg, built by
// tools/build_web.sh). One engine per page or Web Worker; it runs on the page's WebGPU and
// steps itself whenever requests are pending, yielding to the event loop while the GPU works.
//
//   import { Engine } from "./pagellm.js";
//   const engine = await Engine.load({ model: "models/fortunes-llama/" });
//   for await (const delta of engine.generate("A wise man once said", { max_tokens: 40 })) {
//     out.textContent += delta.text;
//   }
//
// Requests take the server's completions fields (max_tokens, temperature, top_p, top_k,
// min_p, seed, n, beam_width, stop, stop_token_ids, logprobs, ignore_eos, the penalties,
// json_schema, regex, choice, grammar, cache_salt); an unknown field is an error naming it.

import init, { WasmEngine } from "./pagellm_web.js";

let ready = null;

/** Loads the wasm module once (`wasm`: its URL or bytes; default: next to this file). */
export function initialize(wasm) {
  ready ??= init(wasm === undefined ? undefined : { module_or_path: wasm });
  return ready;
}

// The files a Hugging Face model folder may hold that the engine reads; weights are listed
// by the shard index when there is one.
const FOLDER_FILES = ["config.json", "tokenizer.json"];
const OPTIONAL_FILES = ["tokenizer_config.json", "generation_config.json", "chat_template.jinja"];

/**
 * The prefix cache's records kept in the Origin Private File System, under the folder
 * `root`: what a reloaded page reads instead of recomputing a long prompt. A store is any
 * object with `load()` (resolving to `[name, Uint8Array]` pairs) and `save(changes)`
 * (`[name, Uint8Array | null]` pairs: null deletes), names being `/`-separated paths.
 */
export function opfsStore(root = "pagellm-kv") {
  const dir = async (path, create) => {
    let d = await navigator.storage.getDirectory();
    for (const part of [root, ...path]) d = await d.getDirectoryHandle(part, { create });
    return d;
  };
  return {
    async load() {
      const out = [];
      const walk = async (handle, prefix) => {
        for await (const [name, entry] of handle.entries()) {
          const path = prefix ? `${prefix}/${name}` : name;
          if (entry.kind === "directory") await walk(entry, path);
          else out.push([path, new Uint8Array(await (await entry.getFile()).arrayBuffer())]);
        }
      };
      await walk(await dir([], true), "");
      return out;
    },
    async save(changes) {
      for (const [name, bytes] of changes) {
        const parts = name.split("/");
        const file = parts.pop();
        try {
          const d = await dir(parts, bytes !== null);
          if (bytes === null) {
            await d.removeEntry(file);
          } else {
            const w = await (await d.getFileHandle(file, { create: true })).createWritable();
            await w.write(bytes);
            await w.close();
          }
        } catch (e) {
          if (bytes !== null || e.name !== "NotFoundError") throw e;
        }
      }
    },
  };
}

const hasOpfs = () => typeof navigator !== "undefined" && !!navigator.storage?.getDirectory;

/** An error from the engine or from loading, with the engine's own message. */
export class PagellmError extends Error {
  constructor(message) {
    super(message);
    this.name = "PagellmError";
  }
}

async function fetchBytes(url, { cache, optional, onBytes, fetchFn }) {
  let response = cache ? await cache.match(url) : undefined;
  const cached = response !== undefined;
  if (!cached) {
    try {
      response = await fetchFn(url);
    } catch (e) {
      if (optional) return null;
      throw new PagellmError(`fetching ${url}: ${e.message ?? e}`);
    }
  }
  if (!response.ok) {
    if (optional && response.status === 404) return null;
    throw new PagellmError(`fetching ${url}: HTTP ${response.status}`);
  }
  if (cache && !cached) await cache.put(url, response.clone());
  const total = Number(response.headers.get("content-length") ?? 0);
  if (!response.body || !onBytes) return new Uint8Array(await response.arrayBuffer());
  const parts = [];
  let done = 0;
  for (const reader = response.body.getReader(); ;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    parts.push(value);
    done += value.length;
    onBytes(done, Math.max(total, done));
  }
  const bytes = new Uint8Array(done);
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.length;
  }
  return bytes;
}

/** The files of the model at `model` (a folder URL ending in "/" or a .gguf file URL). */
async function fetchModel(model, { cache, onProgress, fetchFn }) {
  const url = new URL(model, globalThis.location?.href ?? import.meta.url);
  const report = (file) => (done, total) =>
    onProgress?.({ phase: "download", file, done, total });
  const get = (name, optional = false) =>
    fetchBytes(new URL(name, url).href, { cache, optional, onBytes: report(name), fetchFn });
  if (url.pathname.endsWith(".gguf")) {
    const name = url.pathname.split("/").pop();
    return [[name, await fetchBytes(url.href, { cache, onBytes: report(name), fetchFn })]];
  }
  if (!url.pathname.endsWith("/")) url.pathname += "/";
  const files = [];
  for (const name of FOLDER_FILES) files.push([name, await get(name)]);
  for (const name of OPTIONAL_FILES) {
    const bytes = await get(name, true);
    if (bytes) files.push([name, bytes]);
  }
  const index = await get("model.safetensors.index.json", true);
  let weights = ["model.safetensors"];
  if (index) {
    files.push(["model.safetensors.index.json", index]);
    const map = JSON.parse(new TextDecoder().decode(index)).weight_map ?? {};
    weights = [...new Set(Object.values(map))].sort();
  }
  for (const name of weights) files.push([name, await get(name)]);
  return files;
}

function toBytes(data, name) {
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  throw new PagellmError(`files: ${name} must be a Uint8Array or an ArrayBuffer`);
}

/**
 * A request in flight: iterate it for its deltas (`{index, text, tokenId, logprob}`),
 * await `output` for the whole result, call `abort()` to stop it. Leaving a `for await`
 * loop early aborts the request.
 */
export class Request {
  #engine;
  #events = [];
  #wake = null;
  #done = false;
  #resolve;
  #reject;

  constructor(engine, id) {
    this.#engine = engine;
    this.id = id;
    /** The finished output: `{request_id, prompt_token_ids, outputs: [{index, text,
     * token_ids, finish_reason, logprobs, cumulative_logprob}]}`. */
    this.output = new Promise((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
    this.output.catch(() => {}); // a failure is also thrown to an iterating caller
  }

  /** Called by the engine with each of this request's events. */
  _push(event) {
    if (event.type === "finished") {
      this.#done = true;
      this.#resolve(event.output);
    } else if (event.type === "failed") {
      this.#done = true;
      this.#reject(new PagellmError(event.error));
    }
    this.#events.push(event);
    this.#wake?.();
    this.#wake = null;
  }

  /** Stops the request; its output (finish reason "abort") keeps what it generated. */
  abort() {
    if (!this.#done) this.#engine.abort(this);
  }

  async *[Symbol.asyncIterator]() {
    let finished = false;
    try {
      for (;;) {
        while (this.#events.length === 0) {
          await new Promise((wake) => (this.#wake = wake));
        }
        const event = this.#events.shift();
        if (event.type === "token") {
          yield { index: event.index, text: event.text, tokenId: event.token_id, logprob: event.logprob };
        } else if (event.type === "finished") {
          finished = true;
          return;
        } else {
          finished = true;
          throw new PagellmError(event.error);
        }
      }
    } finally {
      if (!finished) this.abort();
    }
  }
}

/** The engine: a model on the page's WebGPU adapter with its paged KV cache. */
export class Engine {
  #native;
  #requests = new Map();
  #running = null;
  #active = false;
  #closed = false;
  #store;
  #saving = Promise.resolve();
  #timing = { steps: 0, begin_ms: 0, wait_ms: 0, end_ms: 0, total_ms: 0 };

  constructor(native, store = null) {
    this.#native = native;
    this.#store = store;
    /** The adapter, the context length, the KV pool (see `info()` in web/src/events.rs). */
    this.info = JSON.parse(native.info());
  }

  /**
   * Loads a model. `model`: the URL of a Hugging Face folder (ending in "/") or of a .gguf
   * file; or `files`: `{name: Uint8Array}` (or `[name, bytes]` pairs) already in memory.
   * `options`: the KV cache and batch options (web/src/options.rs): `num_gpu_blocks`,
   * `kv_cache_bytes`, `kv_dtype`, `preemption_mode`, `max_num_seqs`, ...
   * `onProgress({phase: "download" | "upload", file, done, total})` reports bytes.
   * `cache`: a Cache Storage name to keep downloaded files in (so that a reload, or a page
   * offline, reads them from there; default "pagellm-models", `null` for none).
   * `wasm`: where the wasm module is (default: next to this file).
   * `prefixCache`: where computed prompt blocks are kept across reloads: a store (see
   * `opfsStore`), or null for nowhere; default: the Origin Private File System where the
   * browser has one. A damaged or foreign record is a miss, never a wrong output.
   */
  static async load({ model, files, name, options = {}, onProgress, cache = "pagellm-models", wasm, fetch: fetchFn = globalThis.fetch, prefixCache } = {}) {
    await initialize(wasm);
    const store = prefixCache === undefined ? (hasOpfs() ? opfsStore() : null) : prefixCache;
    let records;
    if (store) {
      try {
        records = await store.load();
      } catch (e) {
        console.warn(`pagellm: the prefix cache's records could not be read (${e.message ?? e}); starting without them`);
        records = [];
      }
    }
    let list;
    if (files !== undefined) {
      const entries = files instanceof Map ? [...files] : Array.isArray(files) ? files : Object.entries(files);
      list = entries.map(([n, data]) => [n, toBytes(data, n)]);
    } else if (model !== undefined) {
      const store = cache && globalThis.caches ? await globalThis.caches.open(cache) : null;
      list = await fetchModel(model, { cache: store, onProgress, fetchFn });
    } else {
      throw new PagellmError("Engine.load needs a model URL or files");
    }
    const upload = (done, total) => onProgress?.({ phase: "upload", file: null, done, total });
    try {
      const native = await WasmEngine.load(name ?? String(model ?? "model"), list, JSON.stringify(options), upload, records);
      return new Engine(native, store);
    } catch (e) {
      throw new PagellmError(e.message ?? String(e));
    }
  }

  /** Starts a request and returns it (iterate it for deltas, await `.output`). */
  generate(prompt, params = {}) {
    if (typeof prompt !== "string") throw new PagellmError("the prompt must be a string");
    return this.#start(() => this.#native.add_request(JSON.stringify({ ...params, prompt })));
  }

  /**
   * Starts a chat: `messages` (`[{role, content}, ...]`) rendered by the model's chat
   * template with the assistant's turn opened; `params` as for `generate`. An error when
   * the model has no chat template (its files: tokenizer_config.json's `chat_template`,
   * chat_template.jinja, or the GGUF file's).
   */
  chat(messages, params = {}) {
    if (!Array.isArray(messages)) throw new PagellmError("messages must be an array of {role, content}");
    return this.#start(() => this.#native.add_chat(JSON.stringify(messages), JSON.stringify({ ...params, prompt: "" })));
  }

  #start(add) {
    if (this.#closed) throw new PagellmError("the engine is closed");
    let id;
    try {
      id = add();
    } catch (e) {
      throw new PagellmError(e.message ?? String(e));
    }
    const request = new Request(this, id);
    this.#requests.set(id, request);
    this.#drive();
    return request;
  }

  /** The finished output of a request for `prompt` (see `generate`). */
  complete(prompt, params = {}) {
    return this.generate(prompt, params).output;
  }

  /** Aborts a request (a `Request` or its id); false when it was not pending. */
  abort(request) {
    const id = typeof request === "number" ? request : request.id;
    const pending = this.#native.abort(id);
    this.#dispatch(JSON.parse(this.#native.take_events()));
    return pending;
  }

  /** The KV cache's and scheduler's figures now (see `stats()` in web/src/events.rs), and
   * `timing`: the steps this engine drove and their milliseconds (beginning them, awaiting
   * the GPU, ending them, and in all, with the JavaScript around them). */
  stats() {
    return { ...JSON.parse(this.#native.stats()), timing: { ...this.#timing } };
  }

  #step() {
    const t = performance.now();
    return this.#native.step().then((text) => {
      const step = JSON.parse(text);
      const m = this.#timing;
      m.steps++;
      m.begin_ms += step.begin_ms;
      m.wait_ms += step.wait_ms;
      m.end_ms += step.end_ms;
      m.total_ms += performance.now() - t;
      return step;
    });
  }

  /** Resolves when no request is pending and the prefix cache's records are saved. */
  async idle() {
    while (this.#active) await this.#running;
    await this.#saving;
  }

  /** Aborts every request and frees the engine's GPU memory. */
  async close() {
    this.#closed = true;
    for (const r of [...this.#requests.values()]) r.abort();
    await this.idle();
    this.#native.free();
  }

  #dispatch(events) {
    for (const event of events) {
      const request = this.#requests.get(event.request);
      if (!request) continue;
      if (event.type !== "token") this.#requests.delete(event.request);
      request._push(event);
    }
  }

  #drive() {
    if (this.#active) return;
    this.#active = true;
    this.#running = this.#loop();
  }

  // Steps while requests are pending. The loop ends in the same task as its last check, so
  // a request added after that (even by code its last events woke) starts a new loop.
  async #loop() {
    try {
      for (;;) {
        while (this.#native.has_unfinished()) {
          const step = await this.#step();
          this.#dispatch(step.events);
          if (step.computed === 0) {
            // Nothing ran (the requests wait for memory, or were aborted): let the page's
            // other tasks run before trying again.
            await new Promise((resume) => setTimeout(resume, 0));
          }
          this.#save();
        }
        // Going idle: one more step writes the blocks the last one named to the disk
        // tier (then the loop looks again: a request may have come meanwhile).
        if (!(this.#store && this.#native.has_unsaved_prefix_blocks())) break;
        this.#dispatch((await this.#step()).events);
        this.#save();
      }
      this.#dispatch(JSON.parse(this.#native.take_events()));
    } finally {
      this.#active = false;
    }
  }

  // Hands the records the engine wrote and deleted to the store, one save after another.
  #save() {
    if (!this.#store) return;
    const changes = this.#native.take_record_changes();
    if (changes.length === 0) return;
    this.#saving = this.#saving
      .then(() => this.#store.save(changes))
      .catch((e) => console.warn(`pagellm: prefix cache records not saved: ${e.message ?? e}`));
  }
}
