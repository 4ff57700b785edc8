#!/usr/bin/env bash
# The main job on its built-in defaults: a local network of iota-p2p nodes on 127.0.0.1.
# Installs torch into .venv and builds the binary on first use. Extra arguments go to
# `iota-p2p local-swarm` (see `--help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/env.sh
cargo build --release -p iota-p2p --bin iota-p2p
exec target/release/iota-p2p local-swarm "$@"
