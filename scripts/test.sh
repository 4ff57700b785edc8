#!/usr/bin/env bash
# Every check the project holds itself to: formatting, lints, and every test of every crate
# (the multi-node tests start real node processes on 127.0.0.1). Installs torch into .venv on
# first use, and Chromium with playwright-core for the dashboard test. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/setup-browser.sh
source scripts/env.sh
export RUST_BACKTRACE=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
