#!/usr/bin/env bash
# The main job: set up, build the bundled kernels for the devices present, check every op
# against its reference on every sample and dtype, then time every op against eager PyTorch
# and torch.compile on the devices present. Each step prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${VIRTUAL_ENV:-}" ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
wb build
wb check --device all
wb bench
