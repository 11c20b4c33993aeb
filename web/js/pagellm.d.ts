// Types of pagellm's browser API (pagellm.js).

/** Loads the wasm module once (default: pagellm_web_bg.wasm next to pagellm.js). */
export function initialize(wasm?: string | URL | Request | Response | BufferSource | WebAssembly.Module): Promise<unknown>;

/** Where the prefix cache's records are kept across page loads (names are `/`-separated paths). */
export interface PrefixStore {
  load(): Promise<[string, Uint8Array][]>;
  /** null deletes the record. */
  save(changes: [string, Uint8Array | null][]): Promise<void>;
}

/** A PrefixStore in the Origin Private File System, under the folder `root` (default "pagellm-kv"). */
export function opfsStore(root?: string): PrefixStore;

/** An error from the engine or from loading, with the engine's message (it names the field or file). */
export class PagellmError extends Error {}

/** Options of the engine: the KV cache and the batch (every field optional). */
export interface EngineOptions {
  /** Tokens per KV block. */
  block_size?: number;
  /** Device KV blocks (default: as many as `kv_cache_bytes` holds). */
  num_gpu_blocks?: number;
  /** GPU memory for the KV cache, in bytes (default: half the device's largest buffer, 256 MiB at most). */
  kv_cache_bytes?: number;
  /** Host blocks for swapped-out sequences. */
  num_cpu_blocks?: number;
  kv_dtype?: "f16" | "f32" | "int8" | "int4";
  /** Default: whichever costs less, by measurement. */
  preemption_mode?: "swap" | "recompute";
  max_num_seqs?: number;
  max_num_batched_tokens?: number;
  max_model_len?: number;
  enable_prefix_caching?: boolean;
  /** Quantize the weights at load. */
  weight_dtype?: "f32" | "f16" | "bf16" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q8_0" | "q4_k" | "q5_k" | "q6_k";
  power_preference?: "high-performance" | "low-power";
  /** Most bytes of prefix-cache records kept across reloads (default 256 MiB). */
  prefix_cache_bytes?: number;
}

export interface LoadProgress {
  phase: "download" | "upload";
  /** The file being downloaded (null while uploading weights to the GPU). */
  file: string | null;
  done: number;
  total: number;
}

export interface LoadOptions {
  /** A Hugging Face folder's URL (ending in "/") or a .gguf file's URL. */
  model?: string | URL;
  /** The model's files, already in memory. */
  files?: Record<string, Uint8Array | ArrayBuffer> | Map<string, Uint8Array | ArrayBuffer> | [string, Uint8Array | ArrayBuffer][];
  /** The model's name (errors and the prefix cache's keys use it). */
  name?: string;
  options?: EngineOptions;
  onProgress?: (p: LoadProgress) => void;
  /** A Cache Storage name for downloaded files (default "pagellm-models"); null: none. */
  cache?: string | null;
  /** Where the wasm module is. */
  wasm?: string | URL | BufferSource;
  fetch?: typeof fetch;
  /** Where computed prompt blocks are kept across reloads (default: OPFS where the browser has it; null: nowhere). */
  prefixCache?: PrefixStore | null;
}

/** A request's fields, as the OpenAI completions API and vLLM name them. */
export interface SamplingParams {
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  /** -1 or 0: off. */
  top_k?: number;
  min_p?: number;
  seed?: number;
  /** Parallel samples. */
  n?: number;
  /** Beam search with this many beams (streams nothing until it finishes). */
  beam_width?: number;
  length_penalty?: number;
  stop?: string | string[];
  stop_token_ids?: number[];
  /** Log-probabilities of each token and of this many alternatives. */
  logprobs?: number;
  ignore_eos?: boolean;
  presence_penalty?: number;
  frequency_penalty?: number;
  repetition_penalty?: number;
  /** The output is JSON valid for this schema. */
  json_schema?: object;
  /** The output matches this regular expression. */
  regex?: string;
  /** The output is one of these strings. */
  choice?: string[];
  /** The output follows this Lark grammar. */
  grammar?: string;
  /** Cached prompt blocks are shared only among requests of the same salt. */
  cache_salt?: string;
}

export interface TokenLogprob {
  token_id: number;
  logprob: number;
  /** The most likely tokens, [id, logprob], most likely first. */
  top: [number, number][];
}

/** One streamed token of sample `index`, with the text it completes (maybe ""). */
export interface Delta {
  index: number;
  text: string;
  tokenId: number;
  logprob: TokenLogprob | null;
}

export interface CompletionOutput {
  index: number;
  text: string;
  token_ids: number[];
  finish_reason: "stop" | "length" | "abort";
  logprobs?: TokenLogprob[];
  cumulative_logprob: number;
}

export interface RequestOutput {
  request_id: number;
  prompt_token_ids: number[];
  outputs: CompletionOutput[];
}

/** A request in flight. Leaving a `for await` loop over it early aborts it. */
export class Request implements AsyncIterable<Delta> {
  readonly id: number;
  /** The whole result; rejects with a PagellmError when the request failed. */
  readonly output: Promise<RequestOutput>;
  abort(): void;
  [Symbol.asyncIterator](): AsyncIterator<Delta>;
}

export interface EngineInfo {
  adapter: string;
  max_model_len: number;
  vocab_size: number;
  kv_blocks: number;
  kv_block_size: number;
  kv_pool_bytes: number;
  kv_dtype: string;
  shader_f16: boolean;
  subgroups: boolean;
}

export interface EngineStats {
  kv_blocks_total: number;
  kv_blocks_used: number;
  kv_blocks_cached: number;
  kv_blocks_free: number;
  host_blocks_total: number;
  host_blocks_used: number;
  prefix_hits: number;
  prefix_misses: number;
  evictions: number;
  host_tier_blocks: number;
  host_tier_hits: number;
  cow_copies: number;
  swapped_out_blocks: number;
  swapped_in_blocks: number;
  preemptions: number;
  preempted_by_swap: number;
  preempted_by_recompute: number;
  steps: number;
  pending_requests: number;
  num_waiting: number;
  num_running: number;
  num_swapped: number;
  /** The prefix cache's kept records (its disk tier): how many, their bytes, reads that found one, ... */
  disk_records: number;
  disk_bytes: number;
  disk_hits: number;
  disk_misses: number;
  disk_corrupt: number;
  disk_writes: number;
  /** The steps this engine drove: how many, and their milliseconds beginning them (host work
   * and submission), awaiting the GPU, ending them (sampling, streaming), and in all. */
  timing: { steps: number; begin_ms: number; wait_ms: number; end_ms: number; total_ms: number };
}

export class Engine {
  readonly info: EngineInfo;
  static load(options: LoadOptions): Promise<Engine>;
  /** Starts a request (a bad parameter throws a PagellmError naming it). */
  generate(prompt: string, params?: SamplingParams): Request;
  /** Starts a chat: the messages rendered by the model's chat template, the assistant's turn opened. */
  chat(messages: { role: string; content: string }[], params?: SamplingParams): Request;
  /** The finished output of a request. */
  complete(prompt: string, params?: SamplingParams): Promise<RequestOutput>;
  abort(request: Request | number): boolean;
  stats(): EngineStats;
  /** Resolves when no request is pending and the prefix cache's records are saved. */
  idle(): Promise<void>;
  /** Aborts every request and frees the engine's GPU memory. */
  close(): Promise<void>;
}
