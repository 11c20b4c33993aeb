#!/usr/bin/env bash
# Measures what each KV cache setting costs in quality: scores the held-out text with an f32
# cache (the baseline), then with f16, int8 and int4, each without and with the Hadamard
# rotation, and prints one JSON line per run (perplexity, mean / p99 KL divergence against
# the baseline, top-1 agreement). docs/BENCHMARKS.md records the figures.
#
#   tools/kv_quality.sh [MODEL_DIR] [CONTEXT]   (defaults: the shipped model, 256)
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-models/fortunes-llama}"
context="${2:-256}"
text=tests/fixtures/heldout/fortunes.txt
cargo build --release --quiet
bin=target/release/pagellm
base="$(mktemp)"
trap 'rm -f "$base"' EXIT
"$bin" perplexity --model "$model" --file "$text" --context "$context" --kv-dtype f32 \
    --save-logits "$base" --json
for dtype in f16 int8 int4; do
    for rotation in none hadamard; do
        "$bin" perplexity --model "$model" --file "$text" --context "$context" \
            --kv-dtype "$dtype" --kv-rotation "$rotation" --kl-divergence "$base" --json
    done
done
