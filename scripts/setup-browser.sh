#!/usr/bin/env bash
# What the dashboard test needs besides Rust and torch: Debian's Chromium (the test drives it
# headless) and playwright-core from npm (its version pinned in tests/dashboard/package.json and
# package-lock.json). Installs only what is missing; a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
  echo "setup: installing Debian's chromium (once)" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get install -y -q chromium >/dev/null ||
    { $sudo_cmd apt-get update -q >/dev/null && $sudo_cmd apt-get install -y -q chromium >/dev/null; }
fi
if [ ! -d tests/dashboard/node_modules/playwright-core ]; then
  echo "setup: installing playwright-core into tests/dashboard (once)" >&2
  (cd tests/dashboard && npm ci --no-audit --no-fund --silent)
fi
