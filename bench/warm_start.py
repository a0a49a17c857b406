"""Warm start of a registry in new processes: the spread, and where the time goes.

Builds a registry of ``--families`` template families (what ``wb new`` writes) once, loads it
once more in an untimed process (the first load after a build records the warm-start index; a
file written in the last two seconds is never recorded, so it waits for that), then starts
``--processes`` new Python processes one after another. Each imports torch and initialises CUDA
when a GPU is present (outside the timing: every user of a GPU op pays that anyway), then times
``import workbench``, ``workbench.load()`` of the registry and one call of an op on the device.
The workbench imports from cached bytecode, as an installed package does, even where
PYTHONDONTWRITEBYTECODE is set (the families' spec.py files are compiled through the
workbench's own cache either way).
Inside ``load()`` the phases are timed by wrapping the functions that do them:

- ``index``: the warm-start index (``workbench.warm``: identity, reading the index, the stat
  stamps of every input per family);
- ``spec``: each family's ``spec.py``: reading it, and running it where its facts are not
  recorded (``workbench.specfile``; an older tree: importing it);
- ``open``: ``dlopen`` of each family's library and reading its schemas;
- ``device``: the modules of device-only TUs (``workbench.device.sync``: the kernels the launchers
  name, the warm record's stamps, handing the library its cubins; for a family left for its
  first call, ``workbench.device.prepare``: the stamps alone);
- ``define``: defining each op from Python (``torch.library``);
- ``python``: registering each op's fake function and autograd formula;
- ``kernels``: the library registering its CPU/CUDA kernels with the dispatcher;
- ``other``: the rest of ``load()`` (discovery of the registry, configuration, the summary line).

A family that this cache has loaded before is registered at the first lookup of one of its ops
(``workbench.deferred``), so the phases from ``open`` to ``kernels`` are spent in the first call
of an op (``call``, one family's) rather than in ``load()``. ``rest``, outside the total, is the
first call of every other family's op: where the rest of that cost went. ``--eager`` registers
every family at load (WB_EAGER=1), as before.

Prints a JSON line per process with ``--json``, then a JSON line of the summary (with the
environment), the environment line, and a markdown table: min, median and max over the
processes of each phase, of the total and of ``rest``; and last, in how many processes the load
left the called op's spec.py unrun (``spec_deferred``) and its backward and fake function then
worked on the device (``grad_ok``, ``fake_ok``), checked after the timing, and how many families
the load left for their first call.

``--tree DIR`` measures the workbench of another checkout (e.g. an older commit's, for a
before/after on one host): its package is imported and its ``wb new`` template writes the
registry; the phases its code lacks count as ``other``.

Usage: python -m bench warm_start [--families 30] [--processes 10] [--profile]
       [--tree DIR] [--eager]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, Spread, child_env, environment, markdown_table, parser, run_python

PHASES = (
    "import",
    "index",
    "spec",
    "open",
    "device",
    "define",
    "python",
    "kernels",
    "other",
    "call",
)

CHILD = r"""
import json, sys, time
from collections import defaultdict
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cuda":
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
spent = defaultdict(float)
t0 = time.perf_counter()
import importlib
import workbench
mods = {{}}
for name in ("build", "device", "loader", "runtime", "specfile", "warm"):
    try:  # an older tree (--tree) may lack one
        mods[name] = importlib.import_module("workbench." + name)
    except ImportError:
        mods[name] = None
build, device_tus, loader, runtime, specfile, warm = (
    mods[n] for n in ("build", "device", "loader", "runtime", "specfile", "warm")
)
spent["import"] = time.perf_counter() - t0

def timed(module, name, phase):
    inner = getattr(module, name, None)
    if inner is None:  # not in this tree: its time stays in "other"
        return
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[phase] += time.perf_counter() - start
    setattr(module, name, wrapper)

for module, name, phase in [
    (warm, "identity", "index"), (warm, "Index", "index"), (build, "from_index", "index"),
    (loader, "load_spec_module", "spec"), (specfile, "family_specs", "spec"),
    (runtime, "open_library", "open"),
    (runtime, "define", "define"), (runtime, "register_python", "python"),
    (runtime, "register_kernels", "kernels"), (device_tus, "sync", "device"),
    (device_tus, "prepare", "device"),
]:
    timed(module, name, phase)

profile = {profile}
if profile:
    import cProfile, io, pstats
    prof = cProfile.Profile()
    prof.enable()
t1 = time.perf_counter()
lib = workbench.load({kernels!r}, namespace="warmstart")
loaded = time.perf_counter() - t1
if profile:
    prof.disable()
rec = defaultdict(float, spent)  # inside load(); what the first calls do counts as theirs
inside = sum(rec[p] for p in ("index", "spec", "open", "device", "define", "python", "kernels"))
rec["other"] = loaded - inside
t2 = time.perf_counter()
out = getattr(lib, {family!r})(torch.ones(4, device=device), 1.0)
if device == "cuda":
    torch.cuda.synchronize()
rec["call"] = time.perf_counter() - t2
rec["total"] = time.perf_counter() - t0
# Outside the total: the first call of every other family's op (each registers its family where
# the load left it for the first lookup: workbench.deferred), so the moved cost is shown too.
rec["deferred"] = len(getattr(lib.last, "deferred", []))
t3 = time.perf_counter()
for name in lib.ops:
    if name != {family!r}:
        getattr(lib, name)(torch.ones(4, device=device), 1.0)
if device == "cuda":
    torch.cuda.synchronize()
rec["rest"] = time.perf_counter() - t3
assert len(lib.ops) == {count}, lib.ops
# Untimed: whether the load left the spec.py unrun (workbench.specfile), and that its backward
# (alpha * grad) and fake function then work on the device all the same.
op = getattr(lib, {family!r})
checks = {{"spec_deferred": "workbench._specs.warmstart." + {family!r} not in sys.modules}}
x = torch.ones(4, device=device, requires_grad=True)
(grad,) = torch.autograd.grad(op(x, 2.0).sum(), x)
checks["grad_ok"] = bool((grad == 2.0).all())
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode() as mode:
    fake = op(mode.from_tensor(torch.empty(3, device=device)), 1.0)
checks["fake_ok"] = tuple(fake.shape) == (3,)
if profile:
    text = io.StringIO()
    for order in ("tottime", "cumulative"):
        pstats.Stats(prof, stream=text).sort_stats(order).print_stats(40)
    sys.stderr.write(text.getvalue())
    if {dump!r}:
        prof.dump_stats({dump!r})
print(json.dumps({{**rec, **checks}}))
"""


def child(
    kernels: Path, family: str, count: int, profile: bool, env: dict[str, str], dump: str = ""
) -> dict:
    code = CHILD.format(
        kernels=str(kernels), family=family, count=count, profile=profile, dump=dump
    )
    cwd = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    ran = run_python(code, env=env, cwd=cwd, what="warm-start process")
    if profile:
        print(ran.stderr, file=sys.stderr)
    return ran.json()


def summarize(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per phase, for the total and for the other ops' first calls: min, median and max over the
    runs, in milliseconds."""
    return {
        phase: Spread.of(r.get(phase, 0.0) * 1e3 for r in runs).to_dict()
        for phase in (*PHASES, "total", "rest")
    }


def table(summary: dict[str, dict[str, float]], runs: int) -> str:
    rows = [
        (phase, *(f"{s[k]:.1f}" for k in ("min", "median", "max"))) for phase, s in summary.items()
    ]
    head = (f"phase (ms, {runs} new processes)", "min", "median", "max")
    return markdown_table(head, rows, align="lrrr")


def write_registry(tree: Path, folder: Path, families: int, env: dict[str, str]) -> Path:
    """A registry of ``families`` template families, written by ``tree``'s own template."""
    if tree.resolve() == ROOT:
        from workbench import scaffold

        return scaffold.write_registry(folder, families)
    write = "import sys; from pathlib import Path; from workbench import scaffold; "
    write += "print(scaffold.write_registry(Path(sys.argv[1]), int(sys.argv[2])))"
    ran = run_python(write, str(folder), str(families), env=env, cwd=tree)
    return Path(ran.last_line)


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--families", type=int, default=30)
    p.add_argument("--processes", type=int, default=10)
    p.add_argument("--profile", action="store_true", help="cProfile the last process")
    p.add_argument("--dump", type=Path, help="with --profile: also write the pstats here")
    p.add_argument("--json", action="store_true", help="print each process's phases")
    p.add_argument("--work", type=Path, help="registry and cache folder (default: temp)")
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    p.add_argument("--eager", action="store_true", help="register every family at load")
    args = p.parse_args(argv)
    if args.families < 1 or args.processes < 1:
        raise SystemExit("--families and --processes must be at least 1")
    with tempfile.TemporaryDirectory(prefix="wb-warm-") as tmp:
        work = args.work or Path(tmp)
        extra = {"WB_EAGER": "1"} if args.eager else {}
        env = child_env(work / "cache", tree=args.tree, **extra)
        kernels = write_registry(args.tree, work / "registry", args.families, env)
        family = f"op{args.families // 2:02d}"
        start = time.perf_counter()
        child(kernels, family, args.families, False, env)  # the cold build
        cold = time.perf_counter() - start
        time.sleep(2.1)  # past the racy-timestamp window of the files the build wrote
        child(kernels, family, args.families, False, env)  # records the index
        last = args.processes - 1
        runs = [
            child(
                kernels,
                family,
                args.families,
                args.profile and i == last,
                env,
                str(args.dump or "") if i == last else "",
            )
            for i in range(args.processes)
        ]
    if args.json:
        for r in runs:
            print(json.dumps(r))
    summary = summarize(runs)
    env_now = environment()
    print(
        json.dumps(
            {
                "families": args.families,
                "cold_s": cold,
                "summary": summary,
                "environment": env_now.to_dict(),
            }
        )
    )
    print(env_now.line("cuda"))
    print(table(summary, len(runs)))
    counts = {k: sum(bool(r.get(k)) for r in runs) for k in ("spec_deferred", "grad_ok", "fake_ok")}
    later = sorted({int(r.get("deferred", 0)) for r in runs})
    print(
        ", ".join(f"{k}: {n} of {len(runs)}" for k, n in counts.items())
        + f"; families left for their first call by the load: {'/'.join(map(str, later))}"
    )
