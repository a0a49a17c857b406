#!/usr/bin/env bash
# The GPU evidence pass, run from a checkout on a CUDA host without installing anything:
#
#   bash scripts/gpu_evidence.sh tests [PYTEST ARGS]  # the test suite, CUDA tests included
#   bash scripts/gpu_evidence.sh bench                # wb check on every device, benchmarks
#
# Logs and result tables go under $OUT (default: a new temporary folder); a summary prints
# last. The steps share one cache ($WB_CACHE_DIR, default: a new temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export OUT
export WB_CACHE_DIR=${WB_CACHE_DIR:-$(mktemp -d)}
PY=${PYTHON:-python3}

step() {
  local name=$1
  shift
  local start=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-18s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >>"$OUT/summary.txt"
}

case "${1:-}" in
  tests)
    shift
    step pytest "$PY" -m pytest -p no:cacheprovider -q -rfEs --durations=15 "$@"
    tail -n 45 "$OUT/pytest.log"
    ;;
  bench)
    step check "$PY" -m workbench check --device all --json "$OUT/check.json"
    step bench_reload "$PY" scripts/bench_reload.py --out "$OUT/reload.md"
    step bench_calibration "$PY" scripts/bench_calibration.py
    tail -n 12 "$OUT/check.log"
    cat "$OUT/reload.md" 2>/dev/null
    ;;
  *)
    echo "usage: bash scripts/gpu_evidence.sh tests|bench" >&2
    exit 2
    ;;
esac
echo
cat "$OUT/summary.txt"
