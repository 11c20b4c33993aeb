// The browser build's side of the comparison with the native build: runs the cases of
// cases.json through the JavaScript API (web/pkg/pagellm.js) on Deno's WebGPU, writes the
// outputs as JSON, and, given the native build's outputs (examples/reference.rs), compares
// them: equal bit for bit, except that an aborted request may hold one token more or less
// (when the abort lands depends on the driver: between steps natively, maybe during the
// next step here); then its tokens must be a prefix of the other's.
//
//   deno run --unstable-webgpu --allow-read --allow-write web/tests/run_cases.ts \
//     run CASES.json MODEL_DIR OUT.json
//   deno run --allow-read web/tests/run_cases.ts compare CASES.json OUT.json NATIVE.json

import { Engine, initialize } from "../pkg/pagellm.js";

type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any

const [mode, casesPath, a, b] = Deno.args;
if (!["run", "compare"].includes(mode) || !b) {
  console.error("usage: run_cases.ts run CASES.json MODEL_DIR OUT.json\n" +
    "       run_cases.ts compare CASES.json WASM_OUT.json NATIVE_OUT.json");
  Deno.exit(2);
}
const cases = JSON.parse(await Deno.readTextFile(casesPath));
if (mode === "compare") {
  const [got, want] = [a, b].map((p) => JSON.parse(Deno.readTextFileSync(p)));
  Deno.exit(compare(got.cases, want.cases) ? 0 : 1);
}
const [modelDir, outPath] = [a, b];

await initialize(await Deno.readFile(new URL("../pkg/pagellm_web_bg.wasm", import.meta.url)));

// A model folder's files, or one .gguf file.
const files: Record<string, Uint8Array> = {};
if (modelDir.endsWith(".gguf")) {
  files[modelDir.split("/").pop()!] = await Deno.readFile(modelDir);
} else {
  for (const entry of Deno.readDirSync(modelDir)) {
    if (entry.isFile && /\.(json|safetensors|jinja)$/.test(entry.name)) {
      files[entry.name] = await Deno.readFile(`${modelDir}/${entry.name}`);
    }
  }
}

async function runCase(c: Json): Promise<Json> {
  const engine = await Engine.load({ files, name: modelDir, options: c.options, cache: null });
  // A warm-up request compiles the kernels before the timed part (benchmark cases).
  if (c.warmup) await engine.complete(c.warmup.prompt, c.warmup);
  const t0 = performance.now();
  const started = c.requests.map((r: Json) => {
    try {
      return engine.generate(r.prompt, r);
    } catch (e) {
      return { error: (e as Error).message };
    }
  });
  const abort = c.abort;
  const watchers: Promise<void>[] = [];
  if (abort) {
    const req = started[abort.request];
    watchers.push((async () => {
      let n = 0;
      for await (const _ of req) {
        if (++n === abort.after_tokens) req.abort();
      }
    })());
  }
  const outputs = await Promise.all(started.map(async (r: Json) => {
    if (r.error !== undefined) return r;
    try {
      return await r.output;
    } catch (e) {
      return { error: (e as Error).message };
    }
  }));
  await Promise.all(watchers);
  const ms = performance.now() - t0;
  const tokens = outputs.reduce((n: number, o: Json) =>
    n + (o.outputs ?? []).reduce((k: number, x: Json) => k + x.token_ids.length, 0), 0);
  const stats = engine.stats();
  const info = engine.info;
  await engine.close();
  return { name: c.name, outputs, info, stats, ms, tokens };
}

const results = [];
for (const c of cases.cases) {
  const t = performance.now();
  const r = await runCase(c);
  console.log(`${c.name}: ${(performance.now() - t).toFixed(0)} ms with loading; ` +
    `${r.tokens} tokens in ${r.ms.toFixed(0)} ms (${(r.tokens / r.ms * 1000).toFixed(1)} tokens/s), ` +
    `preemptions ${r.stats.preemptions}; per step: ` +
    ["begin_ms", "wait_ms", "end_ms", "total_ms"].map((k) => `${k.slice(0, -3)} ${(r.stats.timing[k] / r.stats.timing.steps).toFixed(2)} ms`).join(", "));
  results.push(r);
}
console.log(`adapter: ${results[0].info.adapter}; shader_f16 ${results[0].info.shader_f16}, subgroups ${results[0].info.subgroups}`);
await Deno.writeTextFile(outPath, JSON.stringify({ cases: results }, null, 2));


/** Whether every output equals the native one (see the head of this file); prints each
 * difference. */
function compare(results: Json[], expected: Json[]): boolean {
  let failures = 0;
  const isPrefix = (x: number[], y: number[]) => x.every((t, i) => y[i] === t);
  results.forEach((got: Json, ci: number) => {
    const want = expected[ci];
    const c = cases.cases[ci];
    got.outputs.forEach((out: Json, ri: number) => {
      const ref = want.outputs[ri];
      let same = JSON.stringify(out) === JSON.stringify(ref);
      if (!same && c.abort?.request === ri && out.outputs && ref.outputs) {
        const [x, y] = [out.outputs[0], ref.outputs[0]];
        const [short, long] = x.token_ids.length <= y.token_ids.length ? [x, y] : [y, x];
        same = x.finish_reason === "abort" && y.finish_reason === "abort" &&
          short.token_ids.length >= c.abort.after_tokens &&
          long.token_ids.length - short.token_ids.length <= 1 &&
          isPrefix(short.token_ids, long.token_ids);
      }
      if (!same) {
        failures++;
        console.error(`MISMATCH in "${c.name}", request ${ri}:\n  wasm:   ${JSON.stringify(out)}\n  native: ${JSON.stringify(ref)}`);
      }
    });
  });
  const total = results.reduce((n: number, r: Json) => n + r.outputs.length, 0);
  if (failures) {
    console.error(`${failures} of ${total} outputs differ from the native build's`);
    return false;
  }
  console.log(`all ${total} outputs equal the native build's, bit for bit`);
  return true;
}
