// The engine's Web Worker: loads the model once, runs requests, posts their deltas and the
// KV cache's figures back to the page. Messages in: {type: "load", model, options},
// {type: "generate", id, prompt, params}, {type: "abort", id}. Messages out: "progress",
// "loaded", "delta", "done", "error", "stats", "idle" (nothing runs, records saved).
import { Engine } from "../../web/pkg/pagellm.js";

let engine = null;
const running = new Map();

function postStats() {
  if (engine) postMessage({ type: "stats", stats: engine.stats() });
}

async function generate({ id, prompt, params }) {
  const request = engine.generate(prompt, params);
  running.set(id, request);
  const started = performance.now();
  let tokens = 0;
  let last = 0;
  try {
    for await (const delta of request) {
      tokens++;
      postMessage({ type: "delta", id, text: delta.text });
      const now = performance.now();
      if (now - last > 100) {
        last = now;
        postStats();
      }
    }
    const output = await request.output;
    const seconds = (performance.now() - started) / 1000;
    postMessage({ type: "done", id, output, tokens, seconds });
  } catch (e) {
    postMessage({ type: "error", id, message: e.message });
  } finally {
    running.delete(id);
    postStats();
  }
  // Once nothing runs and the prefix cache's records are saved (a reload finds them).
  await engine.idle();
  if (running.size === 0) postMessage({ type: "idle" });
}

onmessage = async ({ data }) => {
  try {
    if (data.type === "load") {
      engine = await Engine.load({
        model: new URL(data.model, self.location.href).href,
        options: data.options ?? {},
        onProgress: (p) => postMessage({ type: "progress", ...p }),
      });
      postMessage({ type: "loaded", info: engine.info });
      postStats();
    } else if (data.type === "generate") {
      await generate(data);
    } else if (data.type === "abort") {
      running.get(data.id)?.abort();
    }
  } catch (e) {
    postMessage({ type: "error", id: data.id ?? null, message: e.message ?? String(e) });
  }
};
