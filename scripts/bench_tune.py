"""What ``wb tune`` costs and gives, measured in one run on one host (issue 17's goals).

In a fresh cache (``--cache``, default: a new temporary folder), for the bundled families named
by ``--ops`` (default: matmul in bfloat16, scale and muladd in float32):

1. load the plain builds (cold; not part of any goal);
2. ``one``: build one non-default variant of the first op's family alone, with every core: the
   compile time of one variant;
3. ``tune``: ``workbench.tune`` of each op; its build phase compiles the other variants at once
   (goal: about ``one`` x ceil(variants / cores), not ``one`` x variants);
4. ``again``: a second tune of the first op with nothing changed (goal: nothing compiled);
5. ``load``: ``--processes`` new processes each, with the stored winners and without them (the
   tune folder moved aside), time ``workbench.load()`` after ``import torch`` and CUDA start
   (goal: the winners add under 10 ms).

Writes ``tune.md`` (tables) and ``tune.json`` into ``--out`` (default ``$OUT`` or .), prints
the summary table last.

Usage: python scripts/bench_tune.py [--ops matmul:bfloat16,scale:float32] [--processes 7]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, time
import torch
if torch.cuda.is_available():
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
import workbench
lib = workbench.load(families=FAMILIES)
print(json.dumps({"seconds": time.perf_counter() - t0, "tuned": lib.last.tuned,
                  "compiled": len(lib.last.compiled)}))
"""


def _load_times(families: list[str], n: int, env: dict[str, str]) -> list[dict]:
    code = CHILD.replace("FAMILIES", repr(families))
    out = []
    for _ in range(n):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise SystemExit(f"load child failed:\n{p.stderr}")
        out.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return out


def _compare_loads(families: list[str], n: int) -> tuple[list[dict], list[dict]]:
    """New-process loads with the stored winners, then with the tune folder moved aside."""
    from workbench.tuning import store

    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    with_w = _load_times(families, n, env)
    tune_dir = store.folder()
    aside = tune_dir.with_name("tune.aside")
    tune_dir.rename(aside)
    try:
        without = _load_times(families, n, env)
    finally:
        aside.rename(tune_dir)
    return with_w, without


def _load_line(families: list[str], n: int, with_w: list[dict], without: list[dict]) -> str:
    ms = [[x["seconds"] * 1e3 for x in runs] for runs in (with_w, without)]
    med = [statistics.median(m) for m in ms]
    return (
        f"New-process `workbench.load()` of {', '.join(families)} after import torch and CUDA "
        f"start, {n} processes each: with the winners median {med[0]:.1f} ms (min "
        f"{min(ms[0]):.1f}, max {max(ms[0]):.1f}; tuned {with_w[0]['tuned']}); without "
        f"{med[1]:.1f} ms (min {min(ms[1]):.1f}, max {max(ms[1]):.1f}); extra "
        f"{med[0] - med[1]:.1f} ms."
    )


def _load_only(args: argparse.Namespace) -> None:
    if not args.cache:
        raise SystemExit("--load-only needs the --cache of an earlier run")
    os.environ["WB_CACHE_DIR"] = args.cache
    families = sorted({x.split(":")[0] for x in args.ops.split(",")})
    with_w, without = _compare_loads(families, args.processes)
    line = _load_line(families, args.processes, with_w, without)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "tune_load.md").write_text(line + "\n")
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="matmul:bfloat16,scale:float32,muladd:float32")
    ap.add_argument("--processes", type=int, default=7)
    ap.add_argument("--cache")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rounds", type=int)
    ap.add_argument(
        "--load-only", action="store_true", help="only step 5, on a --cache tuned before"
    )
    args = ap.parse_args()
    if args.load_only:
        return _load_only(args)
    cache = args.cache or tempfile.mkdtemp(prefix="wb-tune-")
    os.environ["WB_CACHE_DIR"] = cache
    os.environ.setdefault("WB_QUIET", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    import workbench
    from workbench import build, ninja
    from workbench.tuning import run as tuning
    from workbench.tuning.space import label, variant

    ops = [tuple(x.split(":")) for x in args.ops.split(",")]
    # The bundled families are named after their first op (matmul, scale, muladd, ...).
    t = time.perf_counter()
    lib = workbench.load(families=sorted({o for o, _ in ops}))
    plain_s = time.perf_counter() - t
    families = [tuning.family_of(lib, op) for op, _ in ops]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    cores = os.cpu_count() or 1
    jobs = ninja.default_jobs()

    # 2. one variant alone, all jobs for it
    first = families[0]
    fam = lib.project.family(first)
    space = tuning._space(lib, first)
    points = [p for p in space.points() if p != space.default]
    t = time.perf_counter()
    one = build.ensure(lib.project, variant(fam, points[-1]), lib.config, jobs)
    one_s = time.perf_counter() - t

    rows, results = [], []
    for op, dtype in ops:
        r = workbench.tune(op, lib=lib, device=device, dtype=dtype, rounds=args.rounds)
        results.append(r)
        (out / f"tune_{op}_{dtype}.txt").write_text(str(r))
        n = len(r.variants)
        rows.append((op, dtype, n, r))
        print(r, flush=True)

    # 4. again, nothing changed (one size, one round: the build phase is what is measured)
    first_op, first_dtype = ops[0]
    label0 = results[0].sizes[0].label
    again = workbench.tune(
        first_op, lib=lib, device=device, dtype=first_dtype, sizes=[label0], rounds=1, save=False
    )

    # 5. new processes: with the winners, and with the tune folder moved aside
    fams = sorted(set(families))
    with_w, without = _compare_loads(fams, args.processes)
    load_line = _load_line(fams, args.processes, with_w, without)

    lines = [
        f"# wb tune on {gpu} ({cores} cores, {jobs} jobs), torch {torch.__version__}",
        "",
        f"Plain builds of {', '.join(sorted(set(families)))}, cold: {plain_s:.1f} s.",
        f"One variant of {first} alone ({label(points[-1])}, {len(one.compiled)} objects): "
        f"{one_s:.1f} s.",
        "",
        "| op | dtype | variants | built (objects compiled) | passed check | build s | "
        "x one variant | ceil(n/cores) | check s | time s | rounds | winners |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for op, dtype, n, r in rows:
        built = sum(v.status != "build failed" for v in r.variants)
        passed = sum(v.status == "checked" for v in r.variants)
        b = r.phases["build"]
        spans = "; ".join(x.strip() for x in r.winner_lines())
        lines.append(
            f"| {op} | {dtype} | {n} | {built} ({r.compiled}) | {passed} | {b:.1f} | "
            f"{b / one_s:.2f} | {math.ceil(n / cores)} | {r.phases['check']:.1f} | "
            f"{r.phases['time']:.1f} | {r.rounds_done}/{r.rounds_asked} | {spans} |"
        )
    lines += [
        "",
        f"Second tune of {first_op} with nothing changed: {again.compiled} objects compiled, "
        f"build phase {again.phases['build']:.2f} s.",
        "",
        load_line,
        "",
    ]
    for r in results:
        lines += [f"## {r.op} ({r.dtype})", "", "```", str(r), "```", ""]
    (out / "tune.md").write_text("\n".join(lines))
    (out / "tune.json").write_text(json.dumps([r.to_dict() for r in results], indent=1))
    for r in results:
        try:
            r.plot(out / f"tune_{r.op}_{r.dtype}.svg")
        except Exception as e:  # matplotlib may be missing on the host
            print(f"no plot: {e}")
    print("\n".join(lines[: 14 + len(rows)]))
    if not args.cache:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
