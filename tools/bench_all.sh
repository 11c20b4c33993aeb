#!/usr/bin/env bash
# Runs every benchmark on one adapter and collects their reports in one Markdown file, so a
# machine with a real GPU can be measured in one go (docs/BENCHMARKS.md records the figures).
#
#   tools/bench_all.sh [OUT.md] [--quick]
#
# The adapter is chosen as usual (PAGELLM_BACKEND, WGPU_ADAPTER_NAME, WGPU_POWER_PREF);
# `pagellm devices` lists them. --quick passes --quick to every bench (a few minutes in all
# on a GPU); without it the full runs take longer, mostly on software adapters.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-report.md}"
extra=()
if [[ "${2:-}" == "--quick" || "${1:-}" == "--quick" ]]; then
    extra=(--quick)
    [[ "${1:-}" == "--quick" ]] && out="bench-report.md"
fi
cargo build --release --benches
{
    echo "# pagellm benchmark report"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- options: ${extra[*]:-full}"
    echo
    echo '```'
    cargo run --release --quiet -- devices 2>/dev/null || true
    echo '```'
} > "$out"
for bench in dispatch matmul paged_attention engine kv_memory kv_quant structured serving; do
    echo "running $bench ..." >&2
    {
        echo
        echo "## cargo bench --bench $bench ${extra[*]:-}"
        echo
        cargo bench --quiet --bench "$bench" -- "${extra[@]}" 2>/dev/null
    } >> "$out"
done
# The gated activation fused into the down projection or a pass of its own, at the
# Llama-3.2-1B and tiny15m down shapes (the forward pass fuses it on GPUs only).
for shape in "2048 8192" "288 768"; do
    read -r n k <<< "$shape"
    echo "running matmul --gated $n x $k ..." >&2
    {
        echo
        echo "## cargo bench --bench matmul -- --gated --n $n --k $k --rows 1,16,128 ${extra[*]:-}"
        echo
        cargo bench --quiet --bench matmul -- --gated --n "$n" --k "$k" --rows 1,16,128 "${extra[@]}" 2>/dev/null
    } >> "$out"
done
# The RMSNorm fused into the next projection or a pass of its own, at the Llama-3.2-1B
# gate-up and q k v shapes and tiny15m's q k v (GPUs fuse every such norm; CPU adapters
# only one-row steps of small projections).
for shape in "16384 2048" "3072 2048" "864 288"; do
    read -r n k <<< "$shape"
    echo "running matmul --normed $n x $k ..." >&2
    {
        echo
        echo "## cargo bench --bench matmul -- --normed --n $n --k $k --rows 1,16,128 ${extra[*]:-}"
        echo
        cargo bench --quiet --bench matmul -- --normed --n "$n" --k "$k" --rows 1,16,128 "${extra[@]}" 2>/dev/null
    } >> "$out"
done
# The greedy arg-max kernels over tiny15m's and Llama 3's vocabularies (GPUs split a row
# across workgroups, CPU adapters keep eight lanes per row).
for vocab in 32000 128256; do
    echo "running matmul --argmax $vocab ..." >&2
    {
        echo
        echo "## cargo bench --bench matmul -- --argmax --n $vocab --rows 1,16 ${extra[*]:-}"
        echo
        cargo bench --quiet --bench matmul -- --argmax --n "$vocab" --rows 1,16 "${extra[@]}" 2>/dev/null
    } >> "$out"
done
# Per-kernel profiles of decode and prefill on the model shapes users run (the engine
# bench's --profile section); the full 1B shape only without --quick.
runs=("tiny15m" "m110")
# The whole 1B shape (2.5 GB of weights) only without --quick, and briefly.
[[ ${#extra[@]} -eq 0 ]] && runs+=("llama-3.2-1b --profile-seqs 1,16 --profile-tokens 8")
for r in "${runs[@]}"; do
    read -ra a <<< "$r"
    echo "profiling ${a[0]} ..." >&2
    {
        echo
        echo "## cargo bench --bench engine -- --shapes $r --profile"
        echo
        cargo bench --quiet --bench engine -- --shapes "${a[@]}" --profile 2>/dev/null
    } >> "$out"
done
echo "report written to $out" >&2
