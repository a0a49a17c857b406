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

Usage: python -m bench tune [--ops matmul:bfloat16,scale:float32] [--processes 7]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time

from bench.common import (
    Spread,
    child_env,
    environment,
    out_dir,
    parser,
    run_python,
    tune_space,
    write_text,
)

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


def load_times(families: list[str], n: int, env: dict[str, str]) -> list[dict]:
    code = CHILD.replace("FAMILIES", repr(families))
    return [run_python(code, env=env, cwd=None, what="load child").json() for _ in range(n)]


def compare_loads(families: list[str], n: int) -> tuple[list[dict], list[dict]]:
    """New-process loads with the stored winners, then with the tune folder moved aside."""
    from workbench.tuning import store

    env = child_env(bytecode=False)
    with_w = load_times(families, n, env)
    tune_dir = store.folder()
    aside = tune_dir.with_name("tune.aside")
    tune_dir.rename(aside)
    try:
        without = load_times(families, n, env)
    finally:
        aside.rename(tune_dir)
    return with_w, without


def load_line(families: list[str], n: int, with_w: list[dict], without: list[dict]) -> str:
    w, wo = (Spread.of(x["seconds"] * 1e3 for x in runs) for runs in (with_w, without))
    return (
        f"New-process `workbench.load()` of {', '.join(families)} after import torch and CUDA "
        f"start, {n} processes each: with the winners median {w.median:.1f} ms (min "
        f"{w.min:.1f}, max {w.max:.1f}; tuned {with_w[0]['tuned']}); without "
        f"{wo.median:.1f} ms (min {wo.min:.1f}, max {wo.max:.1f}); extra "
        f"{w.median - wo.median:.1f} ms."
    )


def load_only(args: argparse.Namespace) -> None:
    if not args.cache:
        raise SystemExit("--load-only needs the --cache of an earlier run")
    os.environ["WB_CACHE_DIR"] = args.cache
    families = sorted({x.split(":")[0] for x in args.ops.split(",")})
    with_w, without = compare_loads(families, args.processes)
    line = load_line(families, args.processes, with_w, without)
    write_text(out_dir(args.out) / "tune_load.md", line)
    print(line)


def main(argv: list[str] | None = None) -> None:
    ap = parser(__name__, __doc__)
    ap.add_argument("--ops", default="matmul:bfloat16,scale:float32,muladd:float32")
    ap.add_argument("--processes", type=int, default=7)
    ap.add_argument("--cache")
    ap.add_argument("--out", help="the folder for the files (default: $OUT, else .)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument(
        "--load-only", action="store_true", help="only step 5, on a --cache tuned before"
    )
    args = ap.parse_args(argv)
    if args.load_only:
        return load_only(args)
    cache = args.cache or tempfile.mkdtemp(prefix="wb-tune-")
    os.environ["WB_CACHE_DIR"] = cache
    os.environ.setdefault("WB_QUIET", "1")
    out = out_dir(args.out)

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
    env = environment()
    cores = os.cpu_count() or 1
    jobs = ninja.default_jobs()

    # 2. one variant alone, all jobs for it
    first = families[0]
    fam = lib.project.family(first)
    space = tune_space(fam.spec_path, f"{first}_spec_for_bench")
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
    with_w, without = compare_loads(fams, args.processes)
    loads = load_line(fams, args.processes, with_w, without)

    lines = [
        f"# wb tune on {gpu} ({cores} cores, {jobs} jobs), torch {torch.__version__}",
        "",
        env.line(device),
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
        loads,
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
    print("\n".join(lines[: 16 + len(rows)]))
    if not args.cache:
        shutil.rmtree(cache, ignore_errors=True)
