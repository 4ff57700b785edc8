# Sourced by the other scripts: points cargo's tch build at the PyTorch in `.venv`.
# torch-sys runs `python` from PATH when VIRTUAL_ENV is set, so the venv's bin comes first.
IOTA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VIRTUAL_ENV="$IOTA_ROOT/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
