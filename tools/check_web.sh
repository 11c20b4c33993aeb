#!/usr/bin/env bash
# The browser build's check (CI runs it): builds the web package (tools/build_web.sh, with
# warnings as errors), runs its cases (web/tests/cases.json: greedy with logprobs, n > 1,
# beams, constraints, an abort, tiny pools that preempt by swap and by recompute, a bad
# request) through the JavaScript API on Deno's WebGPU, which runs on the machine's Vulkan
# driver (lavapipe here), then runs the same cases on the native build on the same adapter,
# with the browser device's features and limits, and requires equal outputs, bit for bit;
# then a reload reads the prefix cache's kept records (the same files the native build
# writes); last, the demo page streams in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

# The getrandom cfg of .cargo/config.toml, repeated: RUSTFLAGS replaces that file's flags.
RUSTFLAGS='--cfg getrandom_backend="wasm_js" -D warnings' bash tools/build_web.sh

# Deno, at the version web/tests/package-lock.json pins, from the npm registry.
(cd web/tests && npm ci --silent --no-audit --no-fund)
deno=web/tests/node_modules/.bin/deno
"$deno" --version | head -1

# The web crate's own tests, natively (the options' parsing and errors).
cargo test --locked -q -p pagellm-web

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$deno" run --quiet --unstable-webgpu --allow-read --allow-write web/tests/run_cases.ts \
  run web/tests/cases.json models/fortunes-llama "$out/wasm.json"
PAGELLM_BACKEND=vulkan cargo run --locked -q -p pagellm-web --example reference -- \
  web/tests/cases.json models/fortunes-llama --like "$out/wasm.json" > "$out/native.json"
"$deno" run --quiet --allow-read web/tests/run_cases.ts \
  compare web/tests/cases.json "$out/wasm.json" "$out/native.json"

# The transformers fixtures (each architecture, mixtures of experts included, a sharded
# folder, GGUF files with f16 and Q8_0 weights): greedy tokens, logprobs and seeded samples
# equal to the native build's.
for model in llama-gqa llama-bias-mha llama-odd-heads llama3-rope-scaled mistral-f16 \
    qwen2-bias-tied qwen2-sharded-untied qwen3-qknorm-window gemma2-softcap-window \
    gemma3-local-rope phi3-longrope-window mixtral-moe qwen3-moe-dense-layer gpt-oss-sinks-moe \
    gpt-oss-mxfp4 \
    gguf/llama-gqa-q8_0.gguf gguf/gemma3-local-rope.gguf; do
  name=${model//\//-}
  "$deno" run --quiet --unstable-webgpu --allow-read --allow-write web/tests/run_cases.ts \
    run web/tests/fixture_cases.json "tests/fixtures/$model" "$out/$name.wasm.json" > /dev/null
  PAGELLM_BACKEND=vulkan cargo run --locked -q -p pagellm-web --example reference -- \
    web/tests/fixture_cases.json "tests/fixtures/$model" --like "$out/$name.wasm.json" \
    > "$out/$name.native.json" 2> /dev/null
  printf '%s: ' "$model"
  "$deno" run --quiet --allow-read web/tests/run_cases.ts \
    compare web/tests/fixture_cases.json "$out/$name.wasm.json" "$out/$name.native.json"
done

# The JavaScript API's own behaviour (chained requests, early exits, n > 1, errors).
"$deno" run --quiet --unstable-webgpu --allow-read web/tests/api.ts models/fortunes-llama

# The prefix cache across a reload (Deno has no Origin Private File System: a folder
# stands in for it), and the records it keeps against the native build's files for the
# same request: the same names with the same bytes.
"$deno" run --quiet --unstable-webgpu --allow-read --allow-write web/tests/reload.ts \
  models/fortunes-llama "$out/kept"
PAGELLM_BACKEND=vulkan cargo run --locked -q -p pagellm-web --example reference -- \
  web/tests/reload.json models/fortunes-llama --like "$out/wasm.json" \
  --kv-cache-dir "$out/native-kv" > /dev/null
diff -r --exclude=model-ids "$out/kept" "$out/native-kv"
echo "the browser build keeps the native build's records: $(find "$out/kept" -name '*.kvb' | wc -l) files, equal bytes"

# The demo page in headless Chromium: WebGPU there runs on Chromium's own SwiftShader
# adapter (through Dawn), a second implementation with stricter validation than wgpu's. The
# page loads the shipped model in its worker and streams; its greedy tokens must equal
# transformers'; a reload reads a long prompt from OPFS; with the server stopped the page
# still loads and generates. The screenshot stays in target/artifacts/web-demo.png.
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
  echo "no chromium: the demo page's browser check needs Debian's chromium package" >&2
  exit 1
fi
mkdir -p target/artifacts
"$deno" run --quiet --allow-run --allow-net --allow-read --allow-write --allow-env \
  web/tests/browser_demo.ts "$chromium" target/artifacts/web-demo.png
