#!/usr/bin/env bash
# Tokens/s of the browser build (wasm32 under Deno's WebGPU) against the native build, on
# the same adapter (the machine's Vulkan driver), in one run: web/tests/bench.json's cases,
# each timed after a warm-up request, through both builds; their outputs must be equal
# too. Usage: tools/bench_web.sh [ROUNDS] (default 3: the builds alternate, medians shown).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
[ -f web/pkg/pagellm_web_bg.wasm ] || bash tools/build_web.sh
(cd web/tests && npm ci --silent --no-audit --no-fund)
deno=web/tests/node_modules/.bin/deno
cargo build --release --locked -q -p pagellm-web --example reference
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  "$deno" run --quiet --unstable-webgpu --allow-read --allow-write web/tests/run_cases.ts \
    run web/tests/bench.json models/fortunes-llama "$out/wasm$r.json" > /dev/null
  PAGELLM_BACKEND=vulkan target/release/examples/reference web/tests/bench.json \
    models/fortunes-llama --like "$out/wasm$r.json" > "$out/native$r.json" 2> /dev/null
  "$deno" run --quiet --allow-read web/tests/run_cases.ts \
    compare web/tests/bench.json "$out/wasm$r.json" "$out/native$r.json" > /dev/null
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {k: [json.load(open(f"{out}/{k}{r}.json"))["cases"] for r in range(1, rounds + 1)]
        for k in ("wasm", "native")}
print(f"{'case':<52} {'wasm tok/s':>11} {'native tok/s':>13} {'wasm/native':>12}")
for i, case in enumerate(runs["wasm"][0]):
    rate = {k: statistics.median(c[i]["tokens"] / c[i]["ms"] * 1e3 for c in runs[k]) for k in runs}
    print(f"{case['name']:<52} {rate['wasm']:>11.1f} {rate['native']:>13.1f} {rate['wasm'] / rate['native']:>12.2f}")
print(f"adapter: {runs['wasm'][0][0]['info']['adapter']}; medians of {rounds} alternating rounds; outputs equal")
PY
