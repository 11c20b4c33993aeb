// The JavaScript API's own behaviour, under Deno's WebGPU: requests started from the code a
// finished request woke (the driver must start again), a `for await` loop left early
// aborts its request, n > 1 streams every sample, a chat renders the model's template (and
// is refused without one), bad options and bad request fields are errors naming them that
// take nothing, and everything is freed at the end.
//
//   deno run --unstable-webgpu --allow-read web/tests/api.ts MODEL_DIR

import { Engine, initialize, PagellmError } from "../pkg/pagellm.js";

const [modelDir] = Deno.args;
await initialize(await Deno.readFile(new URL("../pkg/pagellm_web_bg.wasm", import.meta.url)));
const files: Record<string, Uint8Array> = {};
for (const entry of Deno.readDirSync(modelDir)) {
  if (entry.isFile && /\.(json|safetensors)$/.test(entry.name)) {
    files[entry.name] = await Deno.readFile(`${modelDir}/${entry.name}`);
  }
}

let failures = 0;
function check(ok: boolean, what: string) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures++;
}
function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  return Promise.race([
    p,
    new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms)),
  ]);
}

// A bad option: an error naming it, before anything is loaded.
try {
  await Engine.load({ files, options: { num_gpu_block: 8 }, cache: null, prefixCache: null });
  check(false, "an unknown option is refused");
} catch (e) {
  check(e instanceof PagellmError && /num_gpu_block/.test((e as Error).message), `an unknown option is refused: ${(e as Error).message}`);
}

const engine = await Engine.load({ files, options: { kv_cache_bytes: 8 << 20 }, cache: null, prefixCache: null });
const greedy = { max_tokens: 12, temperature: 0 };

// Requests one after another, each started by the code its predecessor's output woke.
const outs = [];
for (let i = 0; i < 3; i++) {
  outs.push(await within(60_000, engine.complete("A wise man once said", greedy), `request ${i}`));
}
check(outs.every((o) => JSON.stringify(o.outputs) === JSON.stringify(outs[0].outputs)),
  "three requests in a row, each started after the last finished, all answer alike");

// Leaving a `for await` early aborts the request.
const r = engine.generate("The early bird", { max_tokens: 50, temperature: 0, ignore_eos: true });
let seen = 0;
for await (const _ of r) {
  if (++seen === 3) break;
}
const aborted = await within(60_000, r.output, "the aborted request");
check(aborted.outputs[0].finish_reason === "abort" && aborted.outputs[0].token_ids.length < 50,
  `breaking out of the loop aborts (${aborted.outputs[0].token_ids.length} tokens)`);

// n = 2: deltas of both samples, which concatenate to each sample's text.
const two = engine.generate("Love is", { n: 2, max_tokens: 10, temperature: 0.8, seed: 5 });
const texts = ["", ""];
for await (const d of two) texts[d.index] += d.text;
const both = await two.output;
check(both.outputs.length === 2 && both.outputs.every((o: { index: number; text: string }) => texts[o.index] === o.text),
  "n = 2 streams both samples, and the deltas add up to each sample's text");

// Bad request fields: errors naming them, nothing taken.
for (const [params, field] of [[{ max_tokenz: 3 }, "max_tokenz"], [{ temperature: -1 }, "temperature"], [{ top_p: "x" }, "top_p"]] as const) {
  try {
    engine.generate("Hi", params as Record<string, unknown>);
    check(false, `${field} is refused`);
  } catch (e) {
    check(e instanceof PagellmError && (e as Error).message.includes(field), `${field} is refused: ${(e as Error).message}`);
  }
}

// The shipped model has no chat template: a chat is an error saying so.
try {
  engine.chat([{ role: "user", content: "Hi" }]);
  check(false, "a chat without a template is refused");
} catch (e) {
  check(e instanceof PagellmError && /template/i.test((e as Error).message), `a chat without a template is refused: ${(e as Error).message}`);
}

// With a template among the files: the rendered conversation's tokens, taken as they are
// (the template writes BOS), are the prompt.
const template = "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
const chatty = await Engine.load({
  files: { ...files, "chat_template.jinja": new TextEncoder().encode(template) },
  options: { kv_cache_bytes: 8 << 20 }, cache: null, prefixCache: null,
});
const conversation = [{ role: "user", content: "A wise man once said" }];
const viaChat = await chatty.chat(conversation, greedy).output;
const rendered = "user: A wise man once said\nassistant:";
const plain = await chatty.complete(rendered, greedy);
check(JSON.stringify(viaChat.prompt_token_ids) === JSON.stringify(plain.prompt_token_ids) &&
  JSON.stringify(viaChat.outputs[0].token_ids) === JSON.stringify(plain.outputs[0].token_ids),
  `a chat is its rendered text (${viaChat.prompt_token_ids.length} prompt tokens, one BOS)`);
try {
  chatty.chat([{ role: "user" }]);
  check(false, "a message without content is refused");
} catch (e) {
  check(e instanceof PagellmError && /messages/.test((e as Error).message), `a message without content is refused: ${(e as Error).message}`);
}
await chatty.close();

await engine.idle();
const s = engine.stats();
check(s.kv_blocks_used === 0 && s.pending_requests === 0, `everything freed (${s.kv_blocks_used} blocks used, ${s.pending_requests} pending)`);
await engine.close();
if (failures) {
  console.error(`${failures} API checks failed`);
  Deno.exit(1);
}
