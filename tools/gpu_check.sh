#!/usr/bin/env bash
# The GPU checks for a machine with a real GPU and no Rust toolchain, in two halves:
#
#   tools/gpu_check.sh --pack FILE.tar.xz
#       (here, with cargo) builds the release benches, the `pagellm` binary and the test
#       binaries that exercise the GPU, strips them and packs them into one archive
#       (about 22 MB: the binaries share most of their code, so one solid xz stream).
#   tools/gpu_check.sh --run FILE.tar.xz OUTDIR [SECONDS]
#       (there, in a checkout of the same commit at the same path as the build, since
#       tests and benches find fixtures and the shipped model through the folder they were
#       built in) runs, within SECONDS (default 540): `pagellm devices`, the GPU tests, the
#       Llama-3.2-1B decode step by weight format (issue 23's GPU target), then
#       tools/bench_all.sh --quick on the GPU-bound benches. Results go to OUTDIR:
#       machine.txt, tests.log, formats.md/.log, peak.md/.log, report.md/.log.
#
# The adapter is chosen as usual (PAGELLM_BACKEND, WGPU_ADAPTER_NAME); the GPU tests run on
# every backend that has an adapter.
set -uo pipefail
cd "$(dirname "$0")/.."
# Most valuable first: the kernels against their references, the transformers goldens, then
# the engine paths.
tests=(gpu_context kernels_matmul kernels_quant kernels_attention kernels_pointwise
    kernels_copy_blocks golden_gpu quant_model engine sliding_window kv_groups kv_quant
    cache_manager_gpu engine_pressure structured_engine shipped_model cache_engine
    gpu_bindings cli_generate eval sampling_penalties kernel_plan row_invariance speculative
    engine_handle step_split cache_salt device_loss kv_budget fit)

pack() {
    local archive="$1" stage
    stage=$(mktemp -d)
    bash tools/bench_all.sh --pack "$stage/b" || return 1
    local args=()
    for t in "${tests[@]}"; do args+=(--test "$t"); done
    mkdir -p "$stage/t"
    cargo test --release --no-run "${args[@]}" --message-format=json 2>/dev/null |
        python3 -c '
import json, subprocess, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and "test" in m["target"]["kind"]:
        subprocess.run(["strip", "-o", sys.argv[1] + "/" + m["target"]["name"],
                        m["executable"]], check=True)
' "$stage/t" || return 1
    echo "compressing (a few minutes) ..." >&2
    tar -C "$stage" -cf - b t | xz -9e --lzma2=dict=512MiB -T1 > "$archive"
    rm -rf "$stage"
    echo "packed $(du -h "$archive" | cut -f1) into $archive" >&2
}

run() {
    local archive="$1" out="$2" budget="${3:-540}" start
    start=$(date +%s)
    left() { echo $((budget - ($(date +%s) - start))); }
    mkdir -p "$out" .gpu-check
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$archive" .gpu-check || return 3
    mkdir -p target/release
    cp .gpu-check/b/pagellm target/release/pagellm
    { nvidia-smi 2>/dev/null; nproc; .gpu-check/b/pagellm devices; } > "$out/machine.txt" 2>&1
    cat "$out/machine.txt"
    : > "$out/tests.log"
    # The tests get what is left beyond the benches' share (about 390 s).
    for t in "${tests[@]}"; do
        if [[ $(left) -lt 390 ]]; then
            echo "SKIPPED $t (out of time)" | tee -a "$out/tests.log"
            continue
        fi
        local s rc=0
        s=$(date +%s)
        timeout 60 ".gpu-check/t/$t" --test-threads 8 >> "$out/tests.log" 2>&1 || rc=$?
        echo "== $t: exit status $rc, $(($(date +%s) - s)) s" | tee -a "$out/tests.log"
    done
    timeout 170 .gpu-check/b/engine --bench --shapes llama-3.2-1b \
        --weights f16,q8_0,q4_k,q6_k > "$out/formats.md" 2> "$out/formats.log"
    echo "1B weight formats: exit status $? at $(($(date +%s) - start)) s"
    # The adapter's arithmetic and weight-read rates, the bounds of the projection kernels.
    timeout 30 .gpu-check/b/matmul --bench --peak --quick > "$out/peak.md" 2> "$out/peak.log"
    echo "peak rates: exit status $? at $(($(date +%s) - start)) s"
    # (timeout 0 would mean no limit at all)
    if [[ $(left) -gt 0 ]]; then
        PAGELLM_BENCHES="engine matmul speculative paged_attention dispatch kv_quant serving structured" \
            PAGELLM_BENCH_BINS=.gpu-check/b PAGELLM_BENCH_TIMEOUT=45 \
            timeout "$(left)" bash tools/bench_all.sh "$out/report.md" --quick
        echo "bench_all: exit status $? at $(($(date +%s) - start)) s"
    fi
    grep "test result\|^==\|panicked" "$out/tests.log"
}

case "${1:-}" in
    --pack) pack "${2:?--pack needs an archive name}" ;;
    --run) run "${2:?--run needs the archive}" "${3:?--run needs an output folder}" "${4:-540}" ;;
    *)
        sed -n '2,16p' "$0"
        exit 2
        ;;
esac
