#!/usr/bin/env bash
# The GPU evidence pass, run from a checkout on a CUDA host without installing anything:
#
#   bash scripts/gpu_evidence.sh tests [PYTEST ARGS]  # the test suite, CUDA tests included
#   bash scripts/gpu_evidence.sh bench                # wb check on every device, benchmarks
#   bash scripts/gpu_evidence.sh notebooks            # the notebooks and the IPython extension
#   bash scripts/gpu_evidence.sh matmul               # matmul's tests, check, bench per path, and
#                                                     # the edit-to-result time of its kernels
#   bash scripts/gpu_evidence.sh reductions           # softmax, layer_norm, inplace, histogram,
#                                                     # index_add: tests, check, bench
#   bash scripts/gpu_evidence.sh warm [OTHER_TREE]    # the warm start of 30 families, per phase
#                                                     # (and another checkout's, in turn)
#   bash scripts/gpu_evidence.sh tune                 # tuning's CUDA tests; matmul tuned on two
#                                                     # shapes, then benched against cuBLAS
#   bash scripts/gpu_evidence.sh goals                # every bundled kernel's goal shapes against
#                                                     # its peer (python -m bench kernel_goals)
#   bash scripts/gpu_evidence.sh compile              # nvcc's host and device phases per CUDA TU;
#                                                     # the wgmma kernels through NVRTC and nvcc
#
# The measurements are the repository's bench runner (python -m bench NAME; python -m bench lists
# them); each file of bench/results/ names the command that regenerates it.
#
# `notebooks` takes IPython, ipykernel and nbclient from .nbdeps/ at the repository root, made
# where there is network by `bash scripts/vendor_notebook_deps.sh` and copied here.
#
# Logs and result tables are packed into $OUT/logs.tar.gz (default $OUT: a new temporary
# folder), with summary.txt beside it: one archive, since a GPU host may hand back only a few
# files of a run. The warm step with another tree takes about 6 minutes on an H100 host (two
# cold builds of 30 families, then 40 new processes). A summary prints last. The steps share one cache ($WB_CACHE_DIR, default: a
# new temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
export OUT LOGS
export WB_CACHE_DIR=${WB_CACHE_DIR:-$(mktemp -d)}
PY=${PYTHON:-python3}

# Each step's output also goes, as it is written, to $OUT/progress.log (one file), so that a run
# cut off at its time limit still hands back what its steps printed.
step() {
  local name=$1
  shift
  local start=$SECONDS
  echo "== $name: $*" >>"$OUT/progress.log"
  "$@" 2>&1 | tee "$LOGS/$name.log" >>"$OUT/progress.log"
  local rc=$?
  printf '%-18s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >>"$LOGS/summary.txt"
  return "$rc"
}

case "${1:-}" in
  tests)
    shift
    step pytest "$PY" -m pytest -p no:cacheprovider -q -rfEs --durations=15 "$@"
    tail -n 45 "$LOGS/pytest.log"
    ;;
  bench)
    step check "$PY" -m workbench check --device all --json "$LOGS/check.json"
    step bench_reload "$PY" -m bench reload --out "$LOGS/reload.md"
    step bench_calibration "$PY" -m bench calibration
    tail -n 12 "$LOGS/check.log"
    cat "$LOGS/reload.md" 2>/dev/null
    ;;
  matmul)
    step matmul_tests "$PY" -m pytest -p no:cacheprovider -q -rfEs tests/test_matmul.py \
      tests/test_check_matmul.py
    step matmul_check "$PY" -m workbench check matmul matmul_path --device cuda
    for dtype in bfloat16 float16; do
      step "paths_$dtype" "$PY" -m workbench bench matmul_path --dtype "$dtype" --no-compile
      step "matmul_$dtype" "$PY" -m workbench bench matmul --dtype "$dtype" --json "$LOGS/matmul_$dtype.json"
    done
    step matmul_float32 "$PY" -m workbench bench matmul --dtype float32 --sizes 4096x4096x4096
    step reload_matmul "$PY" -m bench reload_matmul --repeats 5
    tail -n 8 "$LOGS/matmul_tests.log" "$LOGS/matmul_check.log"
    for f in "$LOGS"/paths_*.log "$LOGS"/matmul_*.log; do echo "== $f"; cat "$f"; done
    tail -n 8 "$LOGS/reload_matmul.log"
    ;;
  reductions)
    ops="softmax softmax_backward layer_norm layer_norm_backward add_out scale_ histogram index_add"
    step red_tests "$PY" -m pytest -p no:cacheprovider -q -rfEs tests/test_softmax.py \
      tests/test_layer_norm.py tests/test_inplace.py tests/test_histogram.py \
      tests/test_index_add.py tests/test_check_outputs.py tests/test_bench_backward.py \
      tests/test_autograd.py
    step autograd_step "$PY" -m bench autograd_step --device cuda
    # shellcheck disable=SC2086
    step red_check "$PY" -m workbench check $ops --device cuda
    for dtype in float32 bfloat16; do
      for op in softmax softmax_backward layer_norm layer_norm_backward; do
        step "bench_${op}_$dtype" "$PY" -m workbench bench "$op" --dtype "$dtype" \
          --json "$LOGS/${op}_$dtype.json"
      done
      for op in softmax layer_norm; do
        step "bench_${op}_backward_$dtype" "$PY" -m workbench bench "$op" --backward \
          --dtype "$dtype" --json "$LOGS/${op}_step_$dtype.json"
      done
    done
    for op in histogram index_add add_out scale_; do
      step "bench_$op" "$PY" -m workbench bench "$op" --json "$LOGS/$op.json"
    done
    tail -n 8 "$LOGS/red_tests.log" "$LOGS/red_check.log"
    for f in "$LOGS"/bench_*.log; do echo "== $f"; cat "$f"; done
    ;;
  warm)
    # With a second checkout (bash scripts/gpu_evidence.sh warm OTHER_TREE): this tree, the
    # other, this one again, on the same host (each tree with its own registry and cache).
    # This tree registers each family at the first lookup of its ops (workbench.deferred);
    # warm_eager is the same tree and cache with WB_EAGER=1 (every family at load).
    base=${2:-}
    step warm "$PY" -m bench warm_start --families 30 --processes 10 --json \
      --work "$LOGS/new" --profile --dump "$LOGS/warm.pstats"
    [ -n "$base" ] && step warm_base "$PY" -m bench warm_start --families 30 \
      --processes 10 --json --work "$LOGS/base" --tree "$base"
    step warm_eager "$PY" -m bench warm_start --families 30 --processes 10 --json \
      --work "$LOGS/new" --eager
    step warm2 "$PY" -m bench warm_start --families 30 --processes 10 --json \
      --work "$LOGS/new"
    rm -rf "$LOGS/new" "$LOGS/base"
    for log in warm warm_base warm_eager warm2; do
      [ -f "$LOGS/$log.log" ] && echo "== $log" && tail -n 17 "$LOGS/$log.log"
    done
    ;;
  tune)
    step tune_tests "$PY" -m pytest -p no:cacheprovider -q -rfEs tests/test_tune_cuda.py
    step tune_matmul "$PY" -m workbench tune matmul --dtype bfloat16 \
      --sizes 4096x4096x4096,16x4096x4096 --rounds 1 --json "$LOGS/tune_matmul.json"
    step tuned_bench "$PY" -m workbench bench matmul --dtype bfloat16 --rounds 1 --no-compile
    tail -n 8 "$LOGS/tune_tests.log"
    tail -n 25 "$LOGS/tune_matmul.log"
    tail -n 12 "$LOGS/tuned_bench.log"
    ;;
  goals)
    step kernel_goals "$PY" -m bench kernel_goals --out "$LOGS"
    cp "$LOGS/kernel-goals.md" "$OUT/kernel-goals.md"
    tail -n 60 "$LOGS/kernel_goals.log"
    ;;
  compile)
    step device_compile "$PY" -m bench device_compile --arch sm_90a --repeats 3
    # NVRTC's cubins would otherwise come from the driver's compute cache
    step wgmma_compile env CUDA_CACHE_DISABLE=1 "$PY" -m bench wgmma_compile --arch sm_90a \
      --repeats 3
    tail -n 20 "$LOGS/device_compile.log"
    tail -n 8 "$LOGS/wgmma_compile.log"
    ;;
  notebooks)
    if [ ! -d .nbdeps ]; then
      version=$("$PY" -c 'import sys; print(*sys.version_info[:2], sep=".")')
      echo "gpu_evidence: no .nbdeps/ here. Where pip reaches PyPI, run" >&2
      echo "  bash scripts/vendor_notebook_deps.sh $version" >&2
      echo "and copy the .nbdeps/ it makes to the repository root here." >&2
      exit 2
    fi
    # Absolute: the notebook kernels run in notebooks/ and inherit this path.
    export PYTHONPATH="$PWD/.nbdeps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # IPython's profile and the kernels' connection files go to a new folder, not $HOME.
    IPYTHONDIR=$(mktemp -d)
    JUPYTER_RUNTIME_DIR=$IPYTHONDIR/runtime
    export IPYTHONDIR JUPYTER_RUNTIME_DIR
    # The tests skip without these modules: stop here instead.
    probe="import IPython, ipykernel, nbclient, nbformat, torch
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'IPython', IPython.__version__)"
    if ! step imports "$PY" -c "$probe"; then
      tail -n 5 "$LOGS/imports.log"
      echo "gpu_evidence: .nbdeps/ does not import with $PY; make it for this Python" >&2
      exit 1
    fi
    cat "$LOGS/imports.log"
    step notebooks "$PY" -m pytest -p no:cacheprovider -q -rfEs --durations=10 \
      tests/test_notebooks.py tests/test_ipython.py
    tail -n 25 "$LOGS/notebooks.log"
    ;;
  *)
    echo "usage: bash scripts/gpu_evidence.sh tests|bench|notebooks|matmul|reductions|warm|tune|goals|compile" >&2
    exit 2
    ;;
esac
tar czf "$OUT/logs.tar.gz" -C "$LOGS" .
cp "$LOGS/summary.txt" "$OUT/summary.txt"
echo
cat "$LOGS/summary.txt"
