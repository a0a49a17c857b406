#!/usr/bin/env bash
# The workbench as a user installs it: build the sdist, then the wheel from the sdist (a file the
# sdist forgets fails here), install the wheel into a new virtual environment outside the
# checkout (torch pinned as in setup.sh), and from there load the bundled kernels with
# workbench.load(), call each op, and `wb check` one of them. Leaves the sdist and the wheel in
# dist/. Run by .ci/run after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
rm -rf dist
python -c "from setuptools import build_meta; build_meta.build_sdist('dist')" >/dev/null
python -m pip wheel -q --no-deps --no-build-isolation dist/workbench-*.tar.gz -w dist
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "torch==${WB_TORCH_VERSION:-2.13.0}" dist/workbench-*.whl
cd "$work"
export WB_CACHE_DIR="$work/cache"
unset PYTHONPATH
"$work/venv/bin/python" - <<'PY'
import torch

import workbench
from workbench.project import INSTALLED, WB_ROOT

assert INSTALLED, f"the workbench runs from {WB_ROOT}, not from its installed package"
lib = workbench.load()
x, w = torch.randn(3, 64), torch.rand(64)
torch.testing.assert_close(lib.scale(x, 2.0), x * 2.0)
torch.testing.assert_close(lib.muladd(x, x, 0.5), x * x + 0.5)
torch.testing.assert_close(lib.rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (64,), w, 1e-6))
print(f"ship smoke: {lib} from {WB_ROOT}")
PY
"$work/venv/bin/wb" check scale --device cpu | tail -n 1
