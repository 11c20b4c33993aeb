#!/usr/bin/env bash
# Serves the browser demo (examples/web) on http://127.0.0.1:${PORT:-8080}/examples/web/:
# the repository's root over HTTP, so that the page reaches the web package (web/pkg,
# built first if missing) and the shipped model (models/fortunes-llama). Open it in a
# browser with WebGPU (a current Chrome or Edge; Firefox 141+ on Windows; Safari 26).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f web/pkg/pagellm_web_bg.wasm ] || bash tools/build_web.sh
port=${PORT:-8080}
echo "serving http://127.0.0.1:$port/examples/web/ (Ctrl-C stops)"
exec python3 -m http.server --bind 127.0.0.1 "$port"
