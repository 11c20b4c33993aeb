// The demo page: talks to the engine's worker (worker.js) and shows its stream and its KV cache.
const $ = (id) => document.getElementById(id);
const MODEL = "../../models/fortunes-llama/";

if ("serviceWorker" in navigator) {
  // Keeps the page's own files for offline use (the model's files are kept by the engine,
  // in Cache Storage, as it downloads them).
  navigator.serviceWorker.register("sw.js").catch((e) => console.warn("no offline copy:", e));
}

if (!("gpu" in navigator)) {
  $("status").innerHTML = '<span class="error">This browser offers no WebGPU (navigator.gpu); try a current Chrome, Edge or Firefox.</span>';
  throw new Error("no WebGPU");
}

const worker = new Worker("worker.js", { type: "module" });
let current = 0;
let nextId = 1;
// ?prompt=...&max_tokens=...&temperature=...&seed=...&auto=1 fills the form (and with auto,
// generates once loaded; the result lands in document.body.dataset.done as JSON, for
// scripted checks).
const query = new URLSearchParams(location.search);
for (const field of ["prompt", "max_tokens", "temperature", "seed"]) {
  if (query.has(field)) $(field).value = query.get(field);
}

function showStats(s) {
  const rows = [
    ["blocks in use", `${s.kv_blocks_used} / ${s.kv_blocks_total}`],
    ["blocks cached for reuse", s.kv_blocks_cached],
    ["prefix cache hits / misses", `${s.prefix_hits} / ${s.prefix_misses}`],
    ["host tier blocks / hits", `${s.host_tier_blocks} / ${s.host_tier_hits}`],
    ["kept across reloads (OPFS): records / hits", `${s.disk_records} / ${s.disk_hits}`],
    ["preemptions (swap / recompute)", `${s.preempted_by_swap} / ${s.preempted_by_recompute}`],
    ["copy-on-write copies", s.cow_copies],
    ["requests running / waiting", `${s.num_running} / ${s.num_waiting}`],
  ];
  $("stats").innerHTML = rows.map(([k, v]) => `<tr><td>${k}</td><td>${v}</td></tr>`).join("");
  // One square per device block, at most 512 shown.
  const shown = Math.min(s.kv_blocks_total, 512);
  const blocks = $("blocks");
  if (blocks.children.length !== shown) blocks.innerHTML = "<i></i>".repeat(shown);
  // A block type with any blocks gets at least one square.
  const squares = (n) => (n === 0 ? 0 : Math.max(1, Math.round(n * shown / s.kv_blocks_total)));
  const used = squares(s.kv_blocks_used);
  const cached = squares(s.kv_blocks_cached);
  [...blocks.children].forEach((b, i) => (b.className = i < used ? "used" : i < used + cached ? "cached" : ""));
}

worker.onmessage = ({ data }) => {
  switch (data.type) {
    case "progress": {
      $("progress").hidden = false;
      $("progress").value = data.total ? data.done / data.total : 0;
      $("status").textContent = data.phase === "download" ? `downloading ${data.file}…` : "uploading weights to the GPU…";
      break;
    }
    case "loaded":
      $("progress").hidden = true;
      $("status").textContent = `ready: context ${data.info.max_model_len} tokens`;
      $("adapter").textContent = `${data.info.adapter}; ${data.info.kv_blocks} blocks of ${data.info.kv_block_size} tokens (${data.info.kv_dtype}, ${(data.info.kv_pool_bytes / 2 ** 20).toFixed(0)} MiB)`;
      $("go").disabled = false;
      if (query.get("auto") === "1") $("go").click();
      break;
    case "delta":
      if (data.id === current) $("output").append(data.text);
      break;
    case "done":
      if (data.id === current) {
        const reason = data.output.outputs[0].finish_reason;
        $("speed").textContent = `${data.tokens} tokens in ${data.seconds.toFixed(2)} s (${(data.tokens / data.seconds).toFixed(1)} tokens/s), finished: ${reason}`;
        $("go").disabled = false;
        $("stop").disabled = true;
        document.body.dataset.done = JSON.stringify({ output: data.output, tokens: data.tokens, seconds: data.seconds, run: query.get("run") });
      }
      break;
    case "idle":
      document.body.dataset.idle = query.get("run") ?? "";
      break;
    case "stats":
      document.body.dataset.stats = JSON.stringify(data.stats);
      showStats(data.stats);
      break;
    case "error":
      document.body.dataset.error = data.message;
      $("status").innerHTML = `<span class="error"></span>`;
      $("status").firstChild.textContent = data.message;
      $("go").disabled = false;
      $("stop").disabled = true;
      break;
  }
};

$("go").onclick = () => {
  current = nextId++;
  const prompt = $("prompt").value;
  const params = { max_tokens: Number($("max_tokens").value), temperature: Number($("temperature").value) };
  if ($("seed").value !== "") params.seed = Number($("seed").value);
  $("output").innerHTML = "";
  const p = document.createElement("span");
  p.className = "prompt";
  p.textContent = prompt;
  $("output").append(p);
  $("speed").textContent = "";
  $("go").disabled = true;
  $("stop").disabled = false;
  worker.postMessage({ type: "generate", id: current, prompt, params });
};
$("stop").onclick = () => worker.postMessage({ type: "abort", id: current });

// 32 MiB of KV cache: 1,024 blocks of 16 tokens for this model, plenty for a demo.
worker.postMessage({ type: "load", model: MODEL, options: { kv_cache_bytes: 32 * 2 ** 20 } });
