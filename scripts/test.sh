#!/usr/bin/env bash
# The tests: lint and types (pre-commit), then pytest, which includes the nvcc smoke compile of
# every kernel for every target arch (sm_80, sm_86, sm_89, sm_90a). pytest runs on WB_TEST_WORKERS
# processes (default 2; 0 runs it in this process), each test file on one of them. Extra arguments
# go to pytest. Each stage's seconds print at the end (and are appended to $WB_STAGE_LOG when set:
# .ci/run's summary).
set -euo pipefail
cd "$(dirname "$0")/.."
stages=()
stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  stages+=("$(printf '%-8s %5d s  rc=%d' "$name" "$((SECONDS - start))" "$rc")")
  return "$rc"
}
summary() {
  printf 'test.sh stages:\n' >&2
  printf '  %s\n' "${stages[@]}" >&2
  [ -z "${WB_STAGE_LOG:-}" ] || printf '%s\n' "${stages[@]}" >>"$WB_STAGE_LOG"
}
trap summary EXIT
stage setup bash scripts/setup.sh
if [ -z "${VIRTUAL_ENV:-}" ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
stage lint pre-commit run --all-files --show-diff-on-failure
rc=0
# Two workers: on CI's 2 cores a third made the suite slower (pytest 1925 s against 1786 s, fresh
# clones of the same tree, bench/results/ci.md): the tests are mostly compiles, the cores stay busy.
workers=${WB_TEST_WORKERS:-2}
parallel=()
# Whole files in the order tests/conftest.py collects them (its longest files first).
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
stage pytest python -m pytest "${parallel[@]}" --durations=25 "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
