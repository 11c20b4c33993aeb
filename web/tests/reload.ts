// The prefix cache survives a reload: an engine computes reload.json's long prompt and its
// records are kept in a store; a second engine (a reloaded page: a new device, new pools)
// loaded with that store reads the prompt's blocks instead of computing them, with the
// same outputs; damaged records are misses with the same outputs again. Deno has no Origin
// Private File System, so a folder through Deno's file API stands in for it (the same
// `/`-separated names opfsStore uses). The records stay in STORE_DIR, for
// tools/check_web.sh to compare with the native build's files.
//
//   deno run --unstable-webgpu --allow-read --allow-write web/tests/reload.ts MODEL_DIR STORE_DIR

import { Engine, initialize } from "../pkg/pagellm.js";

type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any
const [modelDir, storeDir] = Deno.args;
await initialize(await Deno.readFile(new URL("../pkg/pagellm_web_bg.wasm", import.meta.url)));
const files: Record<string, Uint8Array> = {};
for (const entry of Deno.readDirSync(modelDir)) {
  if (entry.isFile && /\.(json|safetensors|gguf|jinja)$/.test(entry.name)) {
    files[entry.name] = await Deno.readFile(`${modelDir}/${entry.name}`);
  }
}

/** A store in a folder: what opfsStore does in a browser. */
function folderStore(root: string) {
  const walk = (dir: string, prefix: string, out: [string, Uint8Array][]) => {
    for (const e of Deno.readDirSync(dir)) {
      const name = prefix ? `${prefix}/${e.name}` : e.name;
      if (e.isDirectory) walk(`${dir}/${e.name}`, name, out);
      else out.push([name, Deno.readFileSync(`${dir}/${e.name}`)]);
    }
    return out;
  };
  return {
    saves: 0,
    load() {
      Deno.mkdirSync(root, { recursive: true });
      return Promise.resolve(walk(root, "", []));
    },
    save(changes: [string, Uint8Array | null][]) {
      this.saves++;
      for (const [name, bytes] of changes) {
        const path = `${root}/${name}`;
        if (bytes === null) {
          try {
            Deno.removeSync(path);
          } catch { /* already gone */ }
        } else {
          Deno.mkdirSync(path.slice(0, path.lastIndexOf("/")), { recursive: true });
          Deno.writeFileSync(path, bytes);
        }
      }
      return Promise.resolve();
    },
  };
}

const c = JSON.parse(await Deno.readTextFile(new URL("reload.json", import.meta.url))).cases[0];
const request = c.requests[0];

async function run(prefixCache: Json): Promise<[Json, Json]> {
  const engine = await Engine.load({ files, name: modelDir, options: c.options, cache: null, prefixCache });
  const out = await engine.complete(request.prompt, request);
  const stats = engine.stats();
  await engine.close(); // waits for the records to be saved
  return [out, stats];
}

function check(ok: boolean, what: string) {
  if (!ok) {
    console.error(`reload check failed: ${what}`);
    Deno.exit(1);
  }
}

const [cold] = await run(null);
const blocks = Math.floor(cold.prompt_token_ids.length / 16);
const [first, s1] = await run(folderStore(storeDir));
check(JSON.stringify(first) === JSON.stringify(cold), "the first run's output differs from a run without a store");
const kept = folderStore(storeDir);
const records = (await kept.load()).filter(([n]) => n.endsWith(".kvb"));
check(records.length >= blocks, `${records.length} records kept, the prompt has ${blocks} full blocks`);
console.log(`first load: ${s1.disk_writes} records written, ${records.length} kept`);

const [second, s2] = await run(folderStore(storeDir));
check(JSON.stringify(second) === JSON.stringify(cold), "after the reload the output differs");
check(s2.disk_hits >= blocks, `after the reload ${s2.disk_hits} blocks were read, ${blocks} expected`);
console.log(`after a reload: ${s2.disk_hits} of the prompt's ${blocks} full blocks read from the store, output equal`);

// Damaged records: every one with a bit flipped in a copy of the store.
const damagedDir = `${storeDir}.damaged`;
const damaged = folderStore(damagedDir);
await damaged.save(records.map(([n, b]) => {
  const copy = b.slice();
  copy[copy.length >> 1] ^= 1;
  return [n, copy];
}));
const [third, s3] = await run(folderStore(damagedDir));
Deno.removeSync(damagedDir, { recursive: true });
check(JSON.stringify(third) === JSON.stringify(cold), "with damaged records the output differs");
check(s3.disk_hits === 0 && s3.disk_corrupt > 0, `damaged records: ${s3.disk_hits} hits, ${s3.disk_corrupt} found corrupt`);
console.log(`damaged records: ${s3.disk_corrupt} found corrupt, none used, output equal`);
