# Sourced by the other scripts: the venv's Python first on PATH (the tests' Python scripts),
# and the same libtorch that .cargo/config.toml names (set here too, so that a value left in
# the environment cannot point torch-sys elsewhere).
IOTA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VIRTUAL_ENV="$IOTA_ROOT/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export LIBTORCH="$IOTA_ROOT/.venv/torch"
unset LIBTORCH_USE_PYTORCH
