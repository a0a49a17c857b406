#!/usr/bin/env bash
# The tests: lint and types (pre-commit), then pytest, which includes the nvcc smoke compile of
# every kernel for sm_80 and sm_90a. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${VIRTUAL_ENV:-}" ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
pre-commit run --all-files --show-diff-on-failure
rc=0
python -m pytest "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
