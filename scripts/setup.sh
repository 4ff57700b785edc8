#!/usr/bin/env bash
# Installs PyTorch 2.11.0 (the version tch 0.24 is built against), the transformers the
# export test loads models with, and bittensor-wallet (the hotkey cross-check) into an ignored
# `.venv`, once: a second run finds them and does nothing. Then links `.venv/torch` to the
# torch package and `.venv/torch-lib` to torch's shared libraries, which the binaries find
# through their rpath (see .cargo/config.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.11.0
# The export test loads an exported model with Hugging Face's Llama to compare logits.
TRANSFORMERS_VERSION=5.24.0
# The wallet cross-check (bootstrap/tests/bittensor_wallet.rs) loads hotkey files and checks
# signatures with Bittensor's own wallet package.
BITTENSOR_WALLET_VERSION=4.1.1
PYTHON="${PYTHON:-python3}"

have_torch() {
  [ -x .venv/bin/python ] &&
    .venv/bin/python -W ignore -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null
}

if ! have_torch; then
  echo "setup: installing torch==$TORCH_VERSION into .venv (a few minutes, once)" >&2
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
  have_torch || { echo "setup: torch==$TORCH_VERSION did not install into .venv" >&2; exit 1; }
fi

if ! .venv/bin/python -W ignore -c "import transformers, sys; sys.exit(0 if transformers.__version__ == '$TRANSFORMERS_VERSION' else 1)" 2>/dev/null; then
  echo "setup: installing transformers==$TRANSFORMERS_VERSION into .venv (once)" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "transformers==$TRANSFORMERS_VERSION"
fi

if ! .venv/bin/python -W ignore -c "import bittensor_wallet, sys; sys.exit(0 if bittensor_wallet.__version__ == '$BITTENSOR_WALLET_VERSION' else 1)" 2>/dev/null; then
  echo "setup: installing bittensor-wallet==$BITTENSOR_WALLET_VERSION into .venv (once)" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "bittensor-wallet==$BITTENSOR_WALLET_VERSION"
fi

lib="$(.venv/bin/python -W ignore -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
ln -sfn "$lib" .venv/torch-lib
# torch-sys reads headers and libraries from here (LIBTORCH in .cargo/config.toml).
ln -sfn "$(dirname "$lib")" .venv/torch

# The namespace tests (tests/src/netns.rs) build their NATs with nftables inside the
# namespaces they create; they need root, `ip` (iproute2) and `nft`.
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: not root: the network namespace tests (NAT traversal) will skip" >&2
elif ! command -v nft >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing nftables for the network namespace tests (once)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends nftables >/dev/null; then
      apt-get update -qq >/dev/null
      apt-get install -y -qq --no-install-recommends nftables >/dev/null
    fi
    command -v nft >/dev/null 2>&1 || { echo "setup: nftables did not install (no nft on PATH)" >&2; exit 1; }
  else
    echo "setup: no nft and no apt-get: install nftables for the network namespace tests" >&2
  fi
fi
