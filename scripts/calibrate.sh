#!/usr/bin/env bash
# The live side of the simulator's calibration (docs/BENCHMARKS.md, "Calibration against live
# runs"): one core's training speed for each setting, the limited-link benchmark with the
# miners' epoch phases logged, the fit run and the default local swarm, then the core speeds
# again (this machine's speed drifts by up to a fifth between hours: the two measurements
# bracket the runs), then the simulator's prediction of each run with this round's core
# speeds, side by side (`scripts/calibration_table.py`). Needs root for the benchmark's
# network namespaces. About 15 minutes.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$IOTA_ROOT"
out="${1:-/tmp/iota-calibration}"
rm -rf "$out" && mkdir -p "$out"
cargo build -q -p iota-p2p --bin iota-p2p
bin=target/debug/iota-p2p
cores() {
  for setting in "32 bf16" "0 f32" "1 bf16"; do
    set -- $setting
    printf 'core bottleneck=%s wire=%s ' "$1" "$2"
    "$bin" train-local --steps 300 --stages 3 --bottleneck "$1" --wire "$2" --threads 1 \
      --eval-interval 0 2>&1 | grep -o 'tokens_per_s=\S*'
  done
}
phases="info,iota_p2p::services::miner::task=debug,training::butterfly=debug"
cores | tee "$out/cores-before.txt"
# Six epochs a setting (six merges) and seven in the default swarm (seven merges), so that
# one slow merge weighs less in a round's figure (the rounds still differ by up to a tenth:
# the machine's speed drifts between them).
IOTA_BENCH_EPOCHS="${IOTA_BENCH_EPOCHS:-6}" IOTA_BENCH_KEEP_LOGS=1 RUST_LOG="$phases" \
  cargo bench -q --profile dev -p iota-p2p --bench wan \
  | tee "$out/wan.txt"
RUST_LOG="$phases" "$bin" local-swarm --stages 2 --miners 4 --epochs 5 --out "$out/fit" \
  | grep RESULT | tee "$out/fit.txt"
RUST_LOG="$phases" "$bin" local-swarm --epochs 7 --out "$out/local-swarm" \
  | grep RESULT | tee "$out/local-swarm.txt"
cores | tee "$out/cores-after.txt"
logs="$(sed -n 's/^node logs kept in //p' "$out/wan.txt")"
python3 scripts/merge_times.py "$out/local-swarm" "$logs"/*mbit-* "$logs"/*gbit-*
python3 scripts/calibration_table.py "$out" "$bin" | tee "$out/table.md"
