// Loads the demo page (examples/web) in headless Chromium with WebGPU, lets it generate
// greedily from the shipped model, keeps a screenshot, and checks the streamed tokens
// against transformers' greedy tokens for the same prompt (models/fortunes-llama/
// expected.json). Then a long prompt, and the page reloaded: the prompt's blocks come from
// the Origin Private File System. Last, the server stopped: the page reloads from its
// service worker and the model from Cache Storage, and generates offline. Headless
// Chromium offers WebGPU on SwiftShader (its CPU Vulkan), not on the machine's lavapipe, so
// this is a second software adapter, through Dawn.
//
//   deno run --allow-run --allow-net --allow-read --allow-write web/tests/browser_demo.ts \
//     CHROMIUM SCREENSHOT.png        (from the repository's root, which it serves)

const [chromium, shot] = Deno.args;
if (!shot) {
  console.error("usage: browser_demo.ts CHROMIUM SCREENSHOT.png");
  Deno.exit(2);
}

// The repository's root over HTTP, as tools/serve_web.sh serves it.
const TYPES: Record<string, string> = {
  html: "text/html", js: "text/javascript", wasm: "application/wasm", json: "application/json",
};
const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
  const path = decodeURIComponent(new URL(req.url).pathname);
  const file = "." + (path.endsWith("/") ? path + "index.html" : path);
  if (file.includes("..")) return new Response("no", { status: 403 });
  try {
    const body = await Deno.readFile(file);
    const type = TYPES[file.split(".").pop() ?? ""] ?? "application/octet-stream";
    return new Response(body, { headers: { "content-type": type } });
  } catch {
    return new Response("not found", { status: 404 });
  }
});
const base = `http://127.0.0.1:${server.addr.port}`;
const expected = JSON.parse(
  await Deno.readTextFile(new URL("../../models/fortunes-llama/expected.json", import.meta.url)),
);
const reference = expected.cases[0];
const profile = await Deno.makeTempDir();
const browser = new Deno.Command(chromium, {
  args: [
    "--headless=new", "--no-sandbox", "--no-first-run", "--disable-gpu-sandbox",
    "--enable-unsafe-webgpu", "--enable-unsafe-swiftshader", "--use-webgpu-adapter=swiftshader",
    "--remote-debugging-port=0", `--user-data-dir=${profile}`, "--window-size=1100,1000",
    "about:blank",
  ],
  stdout: "null",
  stderr: "piped",
}).spawn();

function fail(why: string): never {
  console.error(`browser demo check failed: ${why}`);
  try {
    browser.kill();
  } catch { /* gone already */ }
  Deno.exit(1);
}

// The DevTools endpoint, from Chromium's first lines on stderr.
const port = await (async () => {
  const lines = browser.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let seen = "";
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    const { value, done } = await lines.read();
    if (done) break;
    seen += value;
    const m = seen.match(/DevTools listening on ws:\/\/[^:]+:(\d+)\//);
    if (m) {
      // Keep draining stderr so that Chromium never blocks on a full pipe.
      (async () => {
        while (!(await lines.read()).done) { /* discard */ }
      })();
      return Number(m[1]);
    }
  }
  fail(`Chromium gave no DevTools endpoint:\n${seen.slice(-2000)}`);
})();

const targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
const page = targets.find((t: { type: string }) => t.type === "page");
if (!page) fail("no page target");
const ws = new WebSocket(page.webSocketDebuggerUrl);
await new Promise((ok, err) => {
  ws.onopen = ok;
  ws.onerror = err;
});
let nextId = 1;
const waiting = new Map<number, (r: Record<string, unknown>) => void>();
ws.onmessage = (m) => {
  const msg = JSON.parse(m.data);
  if (msg.id && waiting.has(msg.id)) {
    waiting.get(msg.id)!(msg.result ?? { error: msg.error });
    waiting.delete(msg.id);
  } else if (msg.method === "Runtime.consoleAPICalled") {
    const text = msg.params.args.map((a: { value?: unknown; description?: string }) => a.value ?? a.description).join(" ");
    console.log(`  [page ${msg.params.type}] ${text}`);
  } else if (msg.method === "Runtime.exceptionThrown") {
    console.log(`  [page exception] ${msg.params.exceptionDetails.exception?.description ?? msg.params.exceptionDetails.text}`);
  }
};
// deno-lint-ignore no-explicit-any
function send(method: string, params: Record<string, unknown> = {}): Promise<any> {
  const id = nextId++;
  ws.send(JSON.stringify({ id, method, params }));
  return new Promise((ok) => waiting.set(id, ok));
}

await send("Runtime.enable");
await send("Page.enable");
type Done = { output: { outputs: { token_ids: number[]; text: string }[] }; tokens: number; seconds: number; run: string };

/** Opens the demo on `params` (marked as run `run`) and waits for its completion; returns
 * it with the page's last KV cache figures. */
async function demo(params: Record<string, string>, run: string, reload = false): Promise<[Done, Record<string, number>]> {
  const url = `${base}/examples/web/?${new URLSearchParams({ ...params, temperature: "0", auto: "1", run })}`;
  console.log(`${reload ? "reloading" : "opening"} ${url}`);
  await send(reload ? "Page.reload" : "Page.navigate", reload ? {} : { url });
  const started = Date.now();
  while (Date.now() - started < 300_000) {
    await new Promise((r) => setTimeout(r, 500));
    const r = await send("Runtime.evaluate", {
      expression: "JSON.stringify([document.body?.dataset.done ?? null, document.body?.dataset.error ?? null, document.getElementById('status')?.textContent, document.body?.dataset.stats ?? null, document.body?.dataset.idle ?? null])",
      returnByValue: true,
    });
    const [done, error, status, stats, idle] = JSON.parse(r.result?.value ?? "[null,null,null,null,null]");
    if (error) fail(`the page reported: ${error}`);
    if (status?.startsWith("This browser offers no WebGPU")) fail(status);
    if (done) {
      const d = JSON.parse(done) as Done;
      // The previous page's result until the new one has loaded; then wait until the
      // page's engine is idle (its records saved).
      if (d.run === run && idle === run) return [d, JSON.parse(stats ?? "{}")];
    }
  }
  fail(`run ${run}: no completion within 300 s`);
}

const [result] = await demo({ prompt: reference.prompt, max_tokens: String(expected.max_new_tokens) }, "1");
const png = await send("Page.captureScreenshot", { format: "png" });
await Deno.writeFile(shot, Uint8Array.from(atob(png.data), (c) => c.charCodeAt(0)));

// The prefix cache in the Origin Private File System: a long prompt computed once, then
// the page reloaded: its blocks come back from OPFS, with the same tokens.
const long = { prompt: "A wise man once said that the best way to find out if you can trust somebody is to trust them, and the early bird gets the worm.", max_tokens: "12" };
const [computed] = await demo(long, "2");
const [reloaded, stats] = await demo(long, "2", true);
if (JSON.stringify(reloaded.output.outputs) !== JSON.stringify(computed.output.outputs)) {
  fail("after the reload the tokens differ");
}
if (!(stats.disk_hits > 0)) fail(`after the reload no block came from OPFS: ${JSON.stringify(stats)}`);
console.log(`after a reload: ${stats.disk_hits} prompt blocks read from OPFS (${stats.disk_records} records kept), the same tokens`);

// Offline: the server gone, the page comes from its service worker, the model from Cache
// Storage, and it generates what it generated online.
await server.shutdown();
const [offline] = await demo(long, "2", true);
if (JSON.stringify(offline.output.outputs) !== JSON.stringify(computed.output.outputs)) {
  fail("offline, the tokens differ");
}
console.log("with the server stopped, the page reloaded from its service worker and generated the same tokens");
browser.kill();
await browser.status;
await Deno.remove(profile, { recursive: true }).catch(() => {});

const got = result.output.outputs[0].token_ids;
console.log(`streamed ${result.tokens} tokens in ${result.seconds.toFixed(2)} s: ${JSON.stringify(result.output.outputs[0].text)}`);
console.log(`screenshot: ${shot}`);
if (JSON.stringify(got) !== JSON.stringify(reference.greedy_ids)) {
  fail(`tokens ${JSON.stringify(got)} differ from transformers' ${JSON.stringify(reference.greedy_ids)}`);
}
console.log("the demo page's greedy tokens equal transformers' for the same prompt");
