#!/usr/bin/env bash
# Model FLOP utilisation on a GPU machine, in one go and within 8 minutes: installs torch
# as scripts/setup.sh does (nothing else), builds the binary and the mfu bench (release),
# and runs train-local and 2- and 4-stage local swarms of the base, large and Llama-3.2-1B
# shapes on `--device cuda --dtype bf16` (every swarm node shares the one GPU). Prints the
# `RESULT mfu` lines and the time taken; docs/BENCHMARKS.md says how to read them.
#
# Environment (defaults in brackets): IOTA_GPU_BENCH_DEVICE [cuda] (`cuda:0,cuda:1,…`
# spreads a swarm over several GPUs; `cpu` tries the script on a machine without one),
# IOTA_GPU_BENCH_DTYPE [bf16], IOTA_MFU_PRESETS [base,large,llama-3.2-1b], IOTA_MFU_MODES
# [train-local,swarm-2,swarm-4], IOTA_GPU_BENCH_LIMIT [480] seconds for the whole script,
# IOTA_GPU_BENCH_PROFILE [bench] (`dev` reuses a development build), IOTA_GPU_BENCH_SKIP_SETUP
# [0] (1 on a machine already set up); the bench's own IOTA_MFU_* settings
# (node/benches/mfu.rs) pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
limit="${IOTA_GPU_BENCH_LIMIT:-480}"
elapsed() { echo "$(( $(date +%s) - started )) s"; }
left() { echo "$(( limit - ($(date +%s) - started) ))"; }

[ "${IOTA_GPU_BENCH_SKIP_SETUP:-0}" = 1 ] || ./scripts/setup.sh
source scripts/env.sh
echo "gpu-bench: setup done after $(elapsed)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || true

# Build first, on its own clock, so the runs get what is left.
profile="${IOTA_GPU_BENCH_PROFILE:-bench}"
timeout "$(left)" cargo bench --profile "$profile" -p iota-p2p --bench mfu --no-run
echo "gpu-bench: built after $(elapsed)"

export IOTA_MFU_DEVICE="${IOTA_GPU_BENCH_DEVICE:-cuda}"
export IOTA_MFU_DTYPE="${IOTA_GPU_BENCH_DTYPE:-bf16}"
export IOTA_MFU_PRESETS="${IOTA_MFU_PRESETS:-base,large,llama-3.2-1b}"
# Sized for an H100/H200-class GPU: 8 windows of 512 tokens per sample, a few dozen steps
# (the first ones warm libtorch's kernels up), and 24 samples through each swarm.
export IOTA_MFU_BATCH="${IOTA_MFU_BATCH:-8}"
export IOTA_MFU_SEQ="${IOTA_MFU_SEQ:-512}"
export IOTA_MFU_STEPS="${IOTA_MFU_STEPS:-30}"
export IOTA_MFU_SAMPLES="${IOTA_MFU_SAMPLES:-24}"
export IOTA_MFU_TIMEOUT="${IOTA_MFU_TIMEOUT:-120}"
log="$(mktemp -t gpu-bench.XXXXXX)"
status=0
timeout --kill-after=10 "$(left)" cargo bench --profile "$profile" -p iota-p2p --bench mfu 2>&1 | tee "$log" || status=$?
echo
echo "gpu-bench: $(elapsed) in all (limit ${limit} s), exit status ${status}"
grep '^RESULT mfu' "$log" | awk '!seen[$0]++' | grep . || echo "gpu-bench: no RESULT mfu line"
rm -f "$log"
exit "$status"
