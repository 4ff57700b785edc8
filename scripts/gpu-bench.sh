#!/usr/bin/env bash
# Model FLOP utilisation on a GPU machine, in one go and within 8 minutes: installs torch
# as scripts/setup.sh does (nothing else), builds the binary and the mfu bench (release),
# and runs train-local and 2- and 4-stage local swarms of the base, large and Llama-3.2-1B
# shapes on `--device cuda --dtype bf16` (every swarm node shares the one GPU). Prints the
# `RESULT mfu` lines and the time taken; docs/BENCHMARKS.md says how to read them.
#
# A GPU machine with no Rust toolchain or no network (PyTorch 2.11 already installed):
#   ./scripts/gpu-bench.sh --pack DIR     here: builds the two programs into DIR
#   IOTA_GPU_BENCH_PREBUILT=DIR ./scripts/gpu-bench.sh     there: installs and builds
#     nothing, runs DIR's programs against the torch of `$IOTA_GPU_BENCH_PYTHON` [python3]
#     (it must be 2.11.0, the version the programs were built against).
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

profile="${IOTA_GPU_BENCH_PROFILE:-bench}"
# Builds with `cargo "$@" --message-format=json` and prints the path of the executable
# named by the first argument (from cargo's JSON messages: each profile has its own folder).
built() {
  local name="$1"
  shift
  cargo "$@" --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$name"
}

if [ "${1:-}" = --pack ]; then
  dir="${2:?--pack needs the folder to put the programs in}"
  ./scripts/setup.sh
  source scripts/env.sh
  binary="$(built iota-p2p build --profile "$profile" -p iota-p2p --bin iota-p2p)"
  program="$(built mfu bench --profile "$profile" -p iota-p2p --bench mfu --no-run)"
  [ -x "$binary" ] && [ -x "$program" ] || { echo "gpu-bench: the programs were not built" >&2; exit 1; }
  mkdir -p "$dir"
  # Without their debug sections the programs are a fraction of the size to carry.
  objcopy --strip-debug "$binary" "$dir/iota-p2p"
  objcopy --strip-debug "$program" "$dir/mfu"
  ls -l "$dir"
  exit 0
fi

if [ -n "${IOTA_GPU_BENCH_PREBUILT:-}" ]; then
  prebuilt="$(cd "$IOTA_GPU_BENCH_PREBUILT" && pwd)"
  python="${IOTA_GPU_BENCH_PYTHON:-python3}"
  torch_lib="$("$python" -W ignore -c 'import os, torch; assert torch.__version__.split("+")[0] == "2.11.0", torch.__version__; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')" ||
    { echo "gpu-bench: $python has no torch 2.11.0, which the programs in $prebuilt were built against" >&2; exit 1; }
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export IOTA_BENCH_BINARY="$prebuilt/iota-p2p"
  bench=("$prebuilt/mfu")
  echo "gpu-bench: programs from $prebuilt, torch from $torch_lib"
else
  [ "${IOTA_GPU_BENCH_SKIP_SETUP:-0}" = 1 ] || ./scripts/setup.sh
  source scripts/env.sh
  echo "gpu-bench: setup done after $(elapsed)"
  # Build first, on its own clock, so the runs get what is left.
  timeout "$(left)" cargo bench --profile "$profile" -p iota-p2p --bench mfu --no-run
  echo "gpu-bench: built after $(elapsed)"
  bench=(cargo bench --profile "$profile" -p iota-p2p --bench mfu)
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || true

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
timeout --kill-after=10 "$(left)" "${bench[@]}" 2>&1 | tee "$log" || status=$?
echo
echo "gpu-bench: $(elapsed) in all (limit ${limit} s), exit status ${status}"
grep '^RESULT mfu' "$log" | awk '!seen[$0]++' | grep . || echo "gpu-bench: no RESULT mfu line"
rm -f "$log"
exit "$status"
