#!/usr/bin/env bash
# Runs every benchmark on one adapter and collects their reports in one Markdown file, so a
# machine with a real GPU can be measured in one go (docs/BENCHMARKS.md records the figures).
#
#   tools/bench_all.sh [OUT.md] [--quick]
#   tools/bench_all.sh --pack DIR
#
# The adapter is chosen as usual (PAGELLM_BACKEND, WGPU_ADAPTER_NAME, WGPU_POWER_PREF);
# `pagellm devices` lists them. --quick passes --quick to every bench (a few minutes in all
# on a GPU); without it the full runs take longer, mostly on software adapters.
#
# A GPU machine without a Rust toolchain: `--pack DIR` builds the release benches and copies
# them, stripped, with the `pagellm` binary into DIR; there, with PAGELLM_BENCH_BINS=DIR, this
# script runs those binaries instead of cargo. The benches find the shipped model through the
# folder they were built in, so run them from a checkout at that same path (and with
# `pagellm` at target/release/pagellm, which the serving bench starts).
set -euo pipefail
cd "$(dirname "$0")/.."
benches=(dispatch matmul paged_attention engine kv_memory kv_quant structured speculative serving)
# PAGELLM_BENCHES="engine matmul" runs those, in that order, instead of the whole list (the
# kernel sweeps and profiles below still run).
read -ra only <<< "${PAGELLM_BENCHES:-}"
if [[ "${1:-}" == "--pack" ]]; then
    dir="${2:?--pack needs a folder}"
    mkdir -p "$dir"
    cargo build --release --benches --bins
    for bench in "${benches[@]}"; do
        # The newest build of each bench (deps/NAME-HASH, the executable one).
        bin=$(find target/release/deps -maxdepth 1 -type f -executable -name "$bench-*" \
            -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2)
        strip -o "$dir/$bench" "$bin"
    done
    strip -o "$dir/pagellm" target/release/pagellm
    echo "packed ${#benches[@]} benches and pagellm into $dir" >&2
    exit 0
fi
out="${1:-bench-report.md}"
extra=()
if [[ "${2:-}" == "--quick" || "${1:-}" == "--quick" ]]; then
    extra=(--quick)
    [[ "${1:-}" == "--quick" ]] && out="bench-report.md"
fi
# Each bench's progress and errors go to a log beside the report.
log="${out%.md}.log"
: > "$log"
bins="${PAGELLM_BENCH_BINS:-}"
# One bench with its arguments: the packed binary when PAGELLM_BENCH_BINS is set, else cargo.
# A bench that fails is noted in the report and the rest still run (a GPU session is rare).
bench() {
    local name="$1" rc=0
    shift
    # PAGELLM_BENCH_TIMEOUT=SECONDS bounds each bench (status 124 when it runs out).
    local limit=()
    [[ -n "${PAGELLM_BENCH_TIMEOUT:-}" ]] && limit=(timeout "$PAGELLM_BENCH_TIMEOUT")
    if [[ -n "$bins" ]]; then
        "${limit[@]}" "$bins/$name" --bench "$@" || rc=$?
    else
        "${limit[@]}" cargo bench --quiet --bench "$name" -- "$@" || rc=$?
    fi
    if [[ $rc -ne 0 ]]; then
        echo "(failed: exit status $rc)"
        echo "bench $name $* failed: exit status $rc" >&2
    fi
}
pagellm() {
    if [[ -n "$bins" ]]; then "$bins/pagellm" "$@"; else cargo run --release --quiet -- "$@"; fi
}
[[ -z "$bins" ]] && cargo build --release --benches
{
    echo "# pagellm benchmark report"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- options: ${extra[*]:-full}"
    echo
    echo '```'
    pagellm devices 2>/dev/null || true
    echo '```'
} > "$out"
[[ ${#only[@]} -gt 0 ]] && benches=("${only[@]}")
for name in "${benches[@]}"; do
    echo "running $name ..." >&2
    {
        echo
        echo "## cargo bench --bench $name ${extra[*]:-}"
        echo
        bench "$name" "${extra[@]}" 2>>"$log"
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
        bench matmul --gated --n "$n" --k "$k" --rows 1,16,128 "${extra[@]}" 2>>"$log"
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
        bench matmul --normed --n "$n" --k "$k" --rows 1,16,128 "${extra[@]}" 2>>"$log"
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
        bench matmul --argmax --n "$vocab" --rows 1,16 "${extra[@]}" 2>>"$log"
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
        bench engine --shapes "${a[@]}" --profile 2>>"$log"
    } >> "$out"
done
# The prefix cache's tiers: a long prompt after a restart from the disk tier, and the
# prompt tokens a multi-turn workload computes with and without the host tier.
echo "prefix tiers ..." >&2
{
    echo
    echo "## cargo bench --bench engine -- --tiers ${extra[*]:-}"
    echo
    bench engine --tiers "${extra[@]}" 2>>"$log"
} >> "$out"
# Speculative decoding with the shipped 2-layer draft model instead of the n-gram lookup.
echo "speculative --draft ..." >&2
{
    echo
    echo "## cargo bench --bench speculative -- --draft models/fortunes-draft ${extra[*]:-}"
    echo
    bench speculative --draft models/fortunes-draft "${extra[@]}" 2>>"$log"
} >> "$out"
echo "report written to $out (stderr of the benches in $log)" >&2
