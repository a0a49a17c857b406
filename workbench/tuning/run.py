"""``workbench.tune()``: build, check and time every variant of an op's family; keep the winners.

Lifecycle of one run (one op, one device, one dtype):

1. **Space**: the ``TUNE`` of the family's spec.py; its valid points, less the variants an
   earlier run saw crash the process (remembered by build key).
2. **Build** every variant at once: a pool of builds sharing the job limit, each variant's own
   cached library (a variant compiles only the TUs its parameters reach). A variant that fails
   to compile is reported with its first error and skipped. Where the family has device-only
   TUs, the plain build is first run on the inputs the variants will be checked and timed on,
   and each variant's modules hold only the kernels that run launched (:func:`launched_kernels`);
   a variant's launch of another compiles it then.
3. **Check** each built variant, registered under a private namespace: the checker's value rows
   for the tuned dtype on this device (special values included, one trial): the router sends a
   variant no other dtype. A wrong
   variant is disqualified with its worst element and never timed; one that raises or crashes
   is reported too. Variants that build to the same library (their parameters reach no TU of
   this build: a CUDA launcher's space on a CPU build) are checked and timed once. A crash
   that breaks the CUDA context is remembered, and the run stops with a message to run again
   (``wb tune`` does that itself, in a new process).
4. **Time** the survivors over the spec's size sweep with the bench harness: each round is the
   whole (size, variant) plan in its own shuffled order, plus an A/A pair of the default for the
   noise band; rounds after the first stop at the budget.
5. **Choose** per bucket of the first tensor argument's numel: the variant with the lowest mean
   log time relative to the best of each size; the default when it is within the noise band of
   that winner at every size of the bucket (no change without a measured reason).
6. **Remember** the table under (op, device, dtype) in the record of the family's plain build
   key and torch version, append the run to the op's history, and route the live library's op
   to the winners at once (:mod:`workbench.tuning.route`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any

import torch

from workbench import build, knobs, loader, specfile
from workbench.benchmark.run import (
    DEFAULT_ROUNDS,
    check_rounds,
    pick_sizes,
    resolve_device,
    resolve_dtype,
    spec_for,
    sweep,
)
from workbench.errors import WorkbenchError
from workbench.tuning import measure, parallel, store
from workbench.tuning.measure import device_kernels
from workbench.tuning.report import TuneResult, VariantResult
from workbench.tuning.space import (
    TuneError,
    TuneSpace,
    label,
    space_of,
    variant,
)
from workbench.verify.runner import invoker

if TYPE_CHECKING:
    from workbench.api import Library
    from workbench.nvrtc_worker import Workers
    from workbench.project import Family


def _say(line: str) -> None:
    if not knobs.quiet():
        print(f"wb tune: {line}", file=sys.stderr, flush=True)


def tune(
    op: str,
    *,
    lib: Library | None = None,
    device: str | None = None,
    dtype: torch.dtype | str = torch.float32,
    sizes: Sequence[str] | None = None,
    budget: float | None = None,
    jobs: int | None = None,
    rounds: int | None = None,
    seed: int = 0,
    min_time: float = 0.2,
    save: bool = True,
    vs: str | None = None,
    say: Callable[[str], None] | None = None,
    devices: str | Sequence[str] | None = None,
) -> TuneResult:
    """Tune ``op`` over its family's declared space; see the module docstring.

    ``lib``: a loaded library (``workbench.tune`` loads the bundled one where it is left
    out). ``device``: 'cpu' or 'cuda'
    (default: cuda where built and present). ``dtype``: what is checked, timed and routed
    (default float32). ``sizes``: labels of the spec's bench sweep (default: all). ``budget``:
    seconds for the whole run; timing rounds after the first stop when it is spent. ``jobs``:
    parallel compiles across all variants (default: from cores and memory). ``rounds``: timings
    per (size, variant), each round a shuffled plan (default: 3 on cuda, 1 on cpu).
    ``save``: remember the winners and route the op to them (default). ``vs="last"``: compare
    with the previous run of this op on this device and dtype. ``devices``: 'all' or a list of
    GPUs ('cuda:0,cuda:1'): they check and time the variants side by side, one worker process
    each (:mod:`workbench.tuning.parallel`); one GPU is the one-GPU run, on it.
    """
    say = say or _say
    if budget is not None and not budget > 0:
        raise WorkbenchError(f"budget must be a positive number of seconds, got {budget!r}")
    if jobs is not None and jobs < 1:
        raise WorkbenchError(f"jobs must be >= 1, got {jobs}")
    if min_time <= 0:
        raise WorkbenchError(f"min_time must be positive, got {min_time}")
    if vs not in (None, "last"):
        raise WorkbenchError(f"vs must be 'last' or left out, got {vs!r}")
    check_rounds(rounds)
    start = time.perf_counter()
    if lib is None:
        raise WorkbenchError(
            "tune needs the library it works on: pass lib=workbench.load(...), or call "
            "workbench.tune, which loads the bundled kernels when lib is left out"
        )
    dev, dt = resolve_device(lib, device), resolve_dtype(dtype)
    gpus = parallel.devices_of(devices, dev)
    if gpus is not None and len(gpus) == 1:  # the one-GPU run, on that GPU
        dev, gpus = torch.device("cuda", gpus[0]), None
    spec = spec_for(lib, op, dev, dt)
    family_name = family_of(lib, op)
    space = _space(lib, family_name)
    base = lib.families[family_name]
    samples = pick_sizes(sweep(spec, dt, dev, seed), sizes, op)
    if not samples:
        raise WorkbenchError(f"{op} has no sizes to time on {dev.type} for {dt}")

    result = TuneResult(
        op=op,
        family=family_name,
        device=_device_name(dev),
        device_type=dev.type,
        arch=_arch(dev),
        dtype=str(dt).removeprefix("torch."),
        build_key=base.key,
        default=label(space.default),
    )
    family = lib.project.family(family_name)
    crashed = measure.crashed()
    variants = [VariantResult(label(p), dict(p)) for p in space.points()]
    say(f"{op}: {len(variants)} variants of {family_name} ({space!r})")

    on = [f"cuda:{g}" for g in gpus or []]
    # The workers start CUDA and open the family now, at the library's first tune on them.
    pool = parallel.pool_for(lib, on, family_name) if on else None
    with parallel.closed_on_error(pool):
        with _workers(lib, family, dev, jobs) as workers:  # they start while the build runs
            t = time.perf_counter()
            only = launched_kernels(lib, spec, family, dev, dt, samples)
            if only is not None:
                result.phases["trace"] = time.perf_counter() - t
                say(f"{op}: the plain build launches {len(only)} kernels of its device-only "
                    f"TUs on {result.dtype}: variants compile those")  # fmt: skip
            t = time.perf_counter()
            built = build_variants(lib, family, variants, jobs, crashed, say, only, workers)
            result.phases["build"] = time.perf_counter() - t
        result.variants = variants
        deadline = None if budget is None else start + budget
        n_rounds = DEFAULT_ROUNDS[dev.type] if rounds is None else rounds
        timing = (samples, seed, min_time, n_rounds, deadline)
        if pool is None:
            _measure_here(lib, spec, dev, dt, built, family, only, timing, say, result)
        else:
            _measure_on(pool, built, only, timing, say, result)
    result.rounds_asked = n_rounds
    result.choose(space.buckets)
    if vs == "last":
        result.compared = True
        result.previous = store.last_run(op, result.device, result.dtype)
    if save:
        record_variants = {
            v.label: {
                "point": v.point,
                "key": built[v.label].key,
                "library": str(built[v.label].library),
            }
            for v in variants
            if v.label in result.winners
        }
        store.save_table(family_name, base.key, op, result.table_record(), record_variants)
        store.append_history(op, result.to_dict())
        lib._tune_records = None  # read the new record itself, not the listing of the last load
        lib.route(family_name)
    result.seconds = time.perf_counter() - start
    return result


def _measure_here(
    lib: Library,
    spec: Any,
    dev: torch.device,
    dt: torch.dtype,
    built: dict[str, build.Built],
    family: Family,
    only: set[tuple[str, str]] | None,
    timing: tuple[list[Any], int, float, int, float | None],
    say: Callable[[str], None],
    result: TuneResult,
) -> None:
    """Check and time the built variants in this process, on ``dev`` (steps 3 and 4)."""
    t = time.perf_counter()
    ops = measure.check_all(lib, spec, dev, dt, result.variants, built, say, family, only)
    result.phases["check"] = time.perf_counter() - t
    _something_to_time(result, len(ops), dev.type)
    t = time.perf_counter()
    samples, seed, min_time, n_rounds, deadline = timing
    result.sizes, result.rounds_done = measure.time_all(
        spec, dev, dt, ops, result.default, samples, seed, min_time, n_rounds, deadline, say
    )
    result.phases["time"] = time.perf_counter() - t


def _measure_on(
    pool: parallel.Pool,
    built: dict[str, build.Built],
    only: set[tuple[str, str]] | None,
    timing: tuple[list[Any], int, float, int, float | None],
    say: Callable[[str], None],
    result: TuneResult,
) -> None:
    """Check and time the built variants on the pool's GPUs, side by side (tuning.parallel)."""
    distinct = measure.distinct(result.variants, built)
    if len(distinct) == 1:
        _something_to_time(result, 1, "cuda")
    samples, seed, min_time, n_rounds, deadline = timing
    request = {
        "op": result.op, "dtype": result.dtype, "seed": seed, "min_time": min_time,
        "rounds": n_rounds, "sizes": [s.label for s in samples], "default": result.default,
        "seconds": None if deadline is None else max(0.0, deadline - time.perf_counter()),
        "only": sorted(only) if only is not None else None, "build": result.build_key,
    }  # fmt: skip
    keys = {label: b.key for label, b in built.items()}
    result.devices = list(pool.devices)
    say(f"{result.op}: {len(distinct)} variants checked and timed on {', '.join(result.devices)}")
    result.sizes, result.rounds_done = pool.measure(
        request, distinct, say, measure.crashed, keys, result.phases
    )
    _something_to_time(result, sum(v.status == "checked" for v in result.variants), "cuda")


def _something_to_time(result: TuneResult, checked: int, device_type: str) -> None:
    """A TuneError where no variant passed, or where every point built the same library."""
    if not checked:
        raise TuneError(
            f"{result.op}: no variant built and passed the check\n{result.variant_table()}"
        )
    if checked == 1 and any(v.status == "same build" for v in result.variants):
        raise TuneError(
            f"{result.op}: every point of the space builds the same library here: no TU that "
            f"runs on {device_type} reads the WB_TUNE_ macros (a CUDA launcher's space tunes "
            "nothing on a CPU), so there is nothing to tune"
        )


def family_of(lib: Library, op: str) -> str:
    for family, handle in loader.live_handles(lib.namespace).items():
        if op in handle.schemas:
            return family
    raise WorkbenchError(f"op {op!r} belongs to no loaded family; ops: {', '.join(lib.ops)}")


def _space(lib: Library, family: str) -> TuneSpace:
    spec_path = lib.project.family(family).spec_path
    module = specfile.load_module(family, lib.namespace, spec_path)
    space = space_of(module)
    if space is None:
        where = spec_path or f"kernels/{family}/spec.py"
        raise TuneError(
            f"family {family} declares no tuning space: add TUNE = TuneSpace({{...}}) to {where} "
            "and read the parameters in its kernels as WB_TUNE_<NAME> macros (docs/reference.md, "
            "'Tuning')"
        )
    return space


def _device_name(dev: torch.device) -> str:
    """The name the router matches: the CUDA device's own name; the CPU as calibration names it."""
    if dev.type == "cuda":
        return str(torch.cuda.get_device_properties(dev).name)
    from workbench.benchmark.calibrate import device_name

    return device_name(dev)


def _arch(dev: torch.device) -> str:
    if dev.type != "cuda":
        return ""
    major, minor = torch.cuda.get_device_capability(dev)
    return f"sm_{major}{minor}"


# --- trace --------------------------------------------------------------------------------------


def launched_kernels(
    lib: Library,
    spec: Any,
    family: Family,
    dev: torch.device,
    dt: torch.dtype,
    timed: list[Any],
) -> set[tuple[str, str]] | None:
    """The kernels of the family's device-only TUs that its plain build launches on the inputs
    a variant is checked and timed on (the check's samples of the tuned dtype and the timed
    sizes); None where the family has no modules here.

    A variant serves only the dtype it is tuned for (the router sends every other dtype to the
    plain build), so its modules start with these kernels: routing to a winner compiles the rest
    (``device.sync``). A variant may launch others on the same inputs (its launchers read its
    tile from its module, and a tuned matmul runs that tile where the plain build took a split-k
    or narrow route): such a launch compiles its kernel then, in the check, before any timing
    (:class:`workbench.device_live.Completion`).
    """
    from workbench import device
    from workbench.verify.runner import value_samples

    if dev.type != "cuda" or not device.has_modules(family, lib.config):
        return None
    handle = loader.live_handles(lib.namespace).get(family.name)
    if handle is None:
        return None
    call = invoker(getattr(getattr(torch.ops, lib.namespace), spec.name))
    for s in [*value_samples(spec, dt, dev.type, measure.CHECK_OPTIONS.seed), *timed]:
        try:  # what it launches is the point here; the check judges the results
            call(*s.args)
        except Exception:  # an input the plain build refuses launches nothing
            continue
    torch.cuda.synchronize(dev)
    return device.used_kernels(handle)


# --- build --------------------------------------------------------------------------------------


def _workers(
    lib: Library, family: Family, dev: torch.device, jobs: int | None
) -> contextlib.AbstractContextManager[Workers | None]:
    """NVRTC worker processes for the variants' device-only TUs (none without such TUs)."""
    from workbench import device

    if dev.type != "cuda" or not device.has_modules(family, lib.config):
        return contextlib.nullcontext()
    from workbench import ninja, nvrtc
    from workbench.nvrtc_worker import Workers

    return Workers(jobs or ninja.default_jobs(), nvrtc.library().path)


def build_variants(
    lib: Library,
    family: Any,
    variants: list[VariantResult],
    jobs: int | None,
    crashed: dict[str, str],
    say: Callable[[str], None],
    only: set[tuple[str, str]] | None = None,
    workers: Workers | None = None,
) -> dict[str, build.Built]:
    """Build every variant at once; each gets its share of the job limit. ``only``: the kernels
    of the device-only TUs a variant compiles (see :func:`launched_kernels`; None: every one named).

    A variant whose launchers are the plain build's (its options reach only device-only TUs)
    compiles its modules here, beside its host bookkeeping, its NVRTC programs in one pool that
    every variant shares (as many programs at once as jobs; in ``workers``' processes where
    given); the others compile theirs when the check opens their library and reads the names
    its own launchers register.
    """
    from workbench import device, ninja
    from workbench.ninja import first_error

    total = jobs or ninja.default_jobs()
    builders = max(1, min(len(variants), total))
    per = max(1, total // builders)
    fams = {v.label: variant(family, v.point) for v in variants}
    built: dict[str, build.Built] = {}
    done = 0
    kernels, _ = device_kernels(lib, family)
    names = kernels if only is None else [k for k in kernels if k in only]
    shared = {
        label: bool(names) and build.shares_host_objects(lib.project, fam, lib.config)
        for label, fam in fams.items()
    }

    def modules(name: str) -> tuple[float, list[Any]]:
        start = time.perf_counter()
        found = device.ensure(
            lib.project, fams[name], lib.config, names, pool=programs, workers=workers
        )
        return time.perf_counter() - start, found

    def one(name: str, compiling: Future[tuple[float, list[Any]]] | None) -> build.Built:
        b = build.ensure(lib.project, fams[name], lib.config, per)
        if compiling is not None:
            seconds, found = compiling.result()
            if any(i.seconds for m in found for i in m.images):
                b.seconds = (b.seconds if b.compiled else 0.0) + seconds
                b.compiled = [*b.compiled, *sorted({m.source for m in found})]
        return b

    with (
        ThreadPoolExecutor(max_workers=total) as programs,
        ThreadPoolExecutor(max_workers=len(variants)) as device_pool,
        ThreadPoolExecutor(max_workers=builders) as pool,
    ):
        compiling = {
            v.label: device_pool.submit(modules, v.label) if shared[v.label] else None
            for v in variants
        }
        futures = {pool.submit(one, v.label, compiling[v.label]): v for v in variants}
        for future in as_completed(futures):
            v = futures[future]
            done += 1
            try:
                b = future.result()
            except WorkbenchError as e:
                lines = str(e).strip().splitlines()
                v.status, v.detail = "build failed", first_error(str(e)) or (lines or [""])[0]
                say(f"[{done}/{len(variants)}] {v.label}: build failed: {v.detail}")
                continue
            v.compile_seconds, v.compiled = b.seconds if b.compiled else 0.0, len(b.compiled)
            if b.key in crashed:
                v.status, v.detail = "crashed", f"crashed in an earlier run: {crashed[b.key]}"
                say(f"[{done}/{len(variants)}] {v.label}: skipped, {v.detail}")
                continue
            built[v.label] = b
            v.status = "built"
            what = f"{len(b.compiled)} compiled in {b.seconds:.1f} s" if b.compiled else "cached"
            say(f"[{done}/{len(variants)}] {v.label}: {what}")
    return built


# Checking and timing the built variants on one device: workbench.tuning.measure.
