#!/usr/bin/env bash
# Vendor what the notebook tests need (IPython, ipykernel, nbclient, nbformat and their
# dependencies) into .nbdeps/ at the repository root, for a Linux x86_64 CPython host that has
# torch, numpy and pytest but nothing Jupyter and no network. Run it where pip reaches PyPI:
#
#   bash scripts/vendor_notebook_deps.sh [PYTHON_VERSION]   # the host's CPython; default 3.12
#
# Copy .nbdeps/ (about 21 MiB) beside the checkout on the host, then run there
#
#   bash scripts/gpu_evidence.sh notebooks
#
# which puts .nbdeps on PYTHONPATH for the tests and for the kernels they start.
#
# Left out (LEAVE_OUT below): the host's own stack, torch, numpy, pytest and the packages they
# depend on (a second numpy on the path would shadow the one torch was built against); the
# debugger (debugpy) and the completer (jedi, parso), which ipykernel and IPython use only when
# present (about 45 MiB between them); tests and bytecode. matplotlib stays out too: with pillow,
# fonttools and the rest it adds about 70 MiB; without it a benchmark table shows no plot.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${1:-3.12}
DEST=.nbdeps
WANT=(ipython ipykernel nbclient nbformat)
LEAVE_OUT="torch numpy triton pytest pluggy iniconfig packaging ninja pybind11 setuptools
  typing-extensions filelock sympy mpmath networkx jinja2 markupsafe fsspec
  debugpy jedi parso"
# Wheels for that CPython on glibc >= 2.28, as torch's wheels need; nothing builds from source.
TARGET_FLAGS=(--python-version "$VERSION" --implementation cp --only-binary=:all:
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. Resolve the whole set for the target (nothing installed), then pin all but LEAVE_OUT.
"$PY" -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" \
  --target "$work/resolve" "${TARGET_FLAGS[@]}" "${WANT[@]}"
LEAVE_OUT=$LEAVE_OUT "$PY" - "$work/report.json" >"$work/pins.txt" <<'EOF'
import json, os, re, sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

leave_out = {norm(n) for n in os.environ["LEAVE_OUT"].split()}
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    if norm(meta["name"]) not in leave_out:
        print(f"{meta['name']}=={meta['version']}")
EOF

# 2. Install exactly the pins, without their dependencies, and no bytecode.
rm -rf "$DEST"
"$PY" -m pip install --quiet --no-deps --no-compile --target "$DEST" "${TARGET_FLAGS[@]}" \
  -r "$work/pins.txt"

# 3. Strip what nothing imports at run time: console scripts, test suites, bytecode. Keep the
#    pins beside the packages, to say what is there.
rm -rf "$DEST/bin"
find "$DEST" -depth -type d \( -name tests -o -name test -o -name __pycache__ \) \
  -exec rm -rf {} +
cp "$work/pins.txt" "$DEST/pins.txt"

# 4. Where this interpreter is the target version, check that the set imports.
here=$("$PY" -c 'import sys; print(*sys.version_info[:2], sep=".")')
if [ "$here" = "$VERSION" ]; then
  PYTHONPATH="$PWD/$DEST" "$PY" -c "import IPython, ipykernel, jupyter_client, nbclient, nbformat"
  echo "imports with $PY: ok"
fi
size=$(du -sh --apparent-size "$DEST" | cut -f1)
echo "$(wc -l <"$DEST/pins.txt") packages for CPython $VERSION in $DEST/ ($size)"
