"""Ship the bundled kernels ahead of time, and load them where there is no compiler.

1. ``wb wheel`` of the bundled families (``--arch``, default ``sm_80;sm_90a`` on a CUDA torch,
   none on a CPU torch, given as TORCH_CUDA_ARCH_LIST so that the JIT of step 4 has the same
   build keys) from an empty cache, then again (every library from the cache).
2. ``pip install --no-deps --no-index --target DIR`` of that wheel: the host's torch is used
   and nothing is downloaded (a GPU host may have no network).
3. New processes with the compiler hidden (``CXX`` a program that fails and records its calls,
   no nvcc on PATH, only DIR added to the path): ``import torch``, then the package, timed
   (median of ``--runs``); whether the workbench or ninja was imported; the first call of every
   op on ``--device``; then ``wb check --package NAME --device DEVICE``.
4. For comparison, the JIT's warm start of the same families in a new process
   (``workbench.load()`` from the warm cache, after ``import torch``).

Usage: python -m bench ship [--arch 'sm_80;sm_90a'] [--device cuda] [--runs 5] [--out F]
Prints a markdown table last (also written to ``--out``); exits 1 when a check fails, a
compiler ran, or the package imported the workbench.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    ROOT,
    Spread,
    environment,
    markdown_table,
    parser,
    run,
    run_python,
    write_text,
)
from workbench import knobs, ship, toolchain

NAME = "wb_kernels"

IMPORT = """
import json, sys, time
import torch
start = time.perf_counter()
import {name} as pkg
imported = time.perf_counter() - start
leaked = sorted({{m.split(".")[0] for m in sys.modules}} & {{"workbench", "ninja"}})
device = torch.device("{device}")
start = time.perf_counter()
for op, spec in sorted(pkg.specs.items()):
    gen = torch.Generator().manual_seed(0)
    sample = next(s for s in spec.samples(spec.dtypes[0], device, gen) if s.label != "empty")
    fn = getattr(pkg, op)
    # A sample holds every argument in schema order: the keyword-only ones go by name.
    pairs = list(zip(getattr(fn, fn.overloads()[0])._schema.arguments, sample.args))
    by_name = {{a.name: v for a, v in pairs if a.kwarg_only}}
    fn(*(v for a, v in pairs if not a.kwarg_only), **by_name)
if device.type == "cuda":
    torch.cuda.synchronize()
first = time.perf_counter() - start
print(json.dumps({{"import_ms": imported * 1e3, "first_ms": first * 1e3, "leaked": leaked}}))
"""

JIT = """
import json, time
import torch
start = time.perf_counter()
import workbench
lib = workbench.load()
print(json.dumps({"load_ms": (time.perf_counter() - start) * 1e3}))
"""


def hidden_compiler_env(tmp: Path, site: Path) -> tuple[dict[str, str], Path]:
    called = tmp / "compiler-calls"
    fake = tmp / "no-compiler"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {called}\nexit 1\n')
    fake.chmod(0o755)
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvcc").exists()]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CUDA_HOME"))}
    env.update(CXX=str(fake), PATH=os.pathsep.join(path), PYTHONPATH=str(site))
    return env, called


def child(code: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    return run_python(code, env=env, cwd=cwd, what="ship: child").json()


def cubins(wheel_lib_dir: Path) -> str:
    """The device code in the libraries, as cuobjdump lists it (CUDA toolkit needed)."""
    tool = shutil.which("cuobjdump")
    if tool is None or not any(wheel_lib_dir.glob("*.so")):
        return "-"
    found: set[str] = set()
    for lib in sorted(wheel_lib_dir.glob("*.so")):
        out = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True)
        found |= {w.split(".")[-2] for w in out.stdout.split() if w.endswith(".cubin")}
    return ", ".join(sorted(found)) or "none"


def build_twice(out: Path) -> tuple[ship.Shipped, float, float]:
    start = time.perf_counter()
    first = ship.build_wheel(name=NAME, out=out)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    again = ship.build_wheel(name=NAME, out=out)
    warm = time.perf_counter() - start
    assert all(b.hit for b in again.built), "the second wheel compiled something"
    assert again.path.read_bytes() == first.path.read_bytes(), "the wheel is not reproducible"
    return first, cold, warm


def main(argv: list[str] | None = None) -> int:
    cuda = torch.version.cuda is not None and torch.cuda.is_available()
    p = parser(__name__, __doc__)
    p.add_argument("--arch", default="sm_80;sm_90a" if cuda else "")
    p.add_argument("--device", default="cuda" if cuda else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.arch:
        toolchain.parse_arch_list(args.arch)  # a bad list fails here
        os.environ["TORCH_CUDA_ARCH_LIST"] = args.arch  # the wheel's archs, and the JIT's below
    tmp = Path(tempfile.mkdtemp(prefix="wb-ship-"))
    cache = tmp / "cache"
    with knobs.override(WB_CACHE_DIR=str(cache), WB_QUIET="1"):
        shipped, cold, warm = build_twice(tmp / "dist")
    compiled = sum(len(b.compiled) for b in shipped.built)
    site = tmp / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    installed = run([*pip, "--target", str(site), str(shipped.path)], what="pip install").wall
    env, called = hidden_compiler_env(tmp, site)
    code = IMPORT.format(name=NAME, device=args.device)
    runs = [child(code, env, tmp) for _ in range(args.runs)]
    imports = Spread.of(float(r["import_ms"]) for r in runs)
    leaked = sorted({m for r in runs for m in r["leaked"]})
    check_env = dict(env, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    check = subprocess.run(
        [sys.executable, "-m", "workbench", "check", "--package", NAME, "--device", args.device],
        capture_output=True,
        text=True,
        env=check_env,
        cwd=tmp,
    )
    verdict = (check.stdout.strip().splitlines() or ["no output"])[-1]
    compiler_calls = len(called.read_text().splitlines()) if called.exists() else 0
    jit_env = dict(os.environ, WB_CACHE_DIR=str(cache), WB_QUIET="1", PYTHONPATH=str(ROOT))
    jit = Spread.of(float(child(JIT, jit_env, tmp)["load_ms"]) for _ in range(args.runs))
    info = shipped.info
    cuda_init = "; CUDA initialisation included" if args.device == "cuda" else ""
    size = shipped.path.stat().st_size / 2**20
    rows = [
        ("wheel", f"{shipped.path.name} ({size:.2f} MiB)"),
        (
            "built for",
            f"torch {info['torch']['version']}, CUDA {info['torch']['cuda'] or 'none'}, "
            f"archs {', '.join(info['archs']) or 'none'}",
        ),
        ("device code in the libraries (cuobjdump)", cubins(site / NAME / "_lib")),
        ("Python API used by the libraries", ", ".join(info["python_api"]) or "none"),
        ("wb wheel, empty cache (s)", f"{cold:.1f} ({compiled} objects compiled)"),
        ("wb wheel again (s)", f"{warm:.2f} (every library from the cache)"),
        ("pip install --no-deps --target (s)", f"{installed:.1f}"),
        (
            f"import after import torch, new process (ms, median of {args.runs})",
            f"{imports.median:.1f} (min {imports.min:.1f}, max {imports.max:.1f})",
        ),
        (
            f"first call of every op on {args.device} (ms, median{cuda_init})",
            f"{Spread.of(float(r['first_ms']) for r in runs).median:.1f}",
        ),
        ("workbench or ninja imported by the package", ", ".join(leaked) or "no"),
        ("compiler calls", str(compiler_calls)),
        (f"wb check --package {NAME} --device {args.device}", f"rc {check.returncode}: {verdict}"),
        (
            f"JIT warm start of the same families, new process (ms, median of {args.runs})",
            f"{jit.median:.1f}",
        ),
    ]
    env_line = environment().line(args.device)
    table = "\n".join([env_line, "", markdown_table(("what", "result"), rows)])
    if check.returncode != 0:
        print(check.stdout[-4000:], check.stderr[-4000:], file=sys.stderr)
    print(table)
    write_text(args.out, table)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if check.returncode == 0 and not leaked and compiler_calls == 0 else 1
