#!/usr/bin/env bash
# Set up a development environment: .venv (unless one is active), torch, the workbench (editable)
# with its development tools. Safe to run again; it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -d .venv ] || "${PYTHON:-python3}" -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi

# Any torch >= 2.4 works. Where none is installed, take the pinned CPU build; on a GPU host,
# install the CUDA build of torch you want first and it is kept.
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "torch==${WB_TORCH_VERSION:-2.13.0}"
fi
python -m pip install -q -e ".[dev,team]"
# NVRTC compiles device-only TUs (*.kernel.cu). CUDA builds of torch bring it; with a CPU torch
# (wb smoke and the tests on a machine without a GPU) take the release that matches nvcc.
if ! python -c "from workbench import nvrtc; nvrtc.library()" 2>/dev/null && command -v nvcc >/dev/null 2>&1; then
  release=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
  case "$release" in
    12.*) pkg="nvidia-cuda-nvrtc-cu12==${release}.*" ;;
    *) pkg="nvidia-cuda-nvrtc==${release}.*" ;;
  esac
  python -m pip install -q "$pkg" || echo "setup.sh: could not install $pkg (device-only TUs will not compile)" >&2
fi
# The team-cache test runs a real redis-server; install it where apt can (CI, containers).
if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo -n"
  { $sudo_ apt-get install -y -q redis-server >/dev/null 2>&1 ||
    { $sudo_ apt-get update -q >/dev/null 2>&1 && $sudo_ apt-get install -y -q redis-server >/dev/null 2>&1; }; } ||
    echo "setup.sh: could not install redis-server (the team-cache test will skip)" >&2
fi
python -c "import torch, workbench; print(f'workbench {workbench.__version__}, torch {torch.__version__}')"
