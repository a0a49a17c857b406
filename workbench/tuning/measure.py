"""Checking and timing a tune run's built variants on one device (steps 3 and 4 of
:mod:`workbench.tuning.run`), and the memory of the variants that crashed a process.

``wb tune`` runs them in its own process; ``wb tune --devices`` in one worker process per GPU
(:mod:`workbench.tuning.parallel`), each on its share of the variants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from workbench import build, cache, loader
from workbench.benchmark.run import time_rounds, timer_for, timing_methods
from workbench.benchmark.stats import median_round
from workbench.errors import WorkbenchError
from workbench.tuning import store
from workbench.tuning.report import AA_SUFFIX, TuneSize, VariantResult
from workbench.tuning.space import TuneError
from workbench.verify import isolate
from workbench.verify.oracle import CRASH, float32_precision
from workbench.verify.report import summarise
from workbench.verify.runner import Options, check_op, invoker

if TYPE_CHECKING:
    from workbench.api import Library
    from workbench.project import Family

CHECK_OPTIONS = Options(trials=1, contract=False)  # a variant's check: value rows, one trial


def objects(built: build.Built) -> dict[str, str]:
    """Each TU of a build's library and its object's key."""
    return {str(t["source"]): str(t["key"]) for t in built.manifest.get("tus", [])}


def device_kernels(lib: Library, family: Family) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The kernels the live build's launchers name from device-only TUs ([] for none), and the
    objects they were linked from: a variant with the same objects names the same kernels."""
    from workbench import device

    if not device.has_modules(family, lib.config):
        return [], {}
    handle = loader.live_handles(lib.namespace).get(family.name)
    if handle is None:
        return [], {}
    if handle.kernels is None:
        handle.kernels = device.kernel_names(handle)
    return list(handle.kernels), objects(handle.built)


# --- check --------------------------------------------------------------------------------------


def distinct(variants: list[VariantResult], built: dict[str, build.Built]) -> list[VariantResult]:
    """The built variants, one per library: a variant built to an earlier one's library (its
    parameters reach no TU of this build: a CUDA launcher's space on a CPU build) is marked
    'same build' and checked and timed once, as that one."""
    seen: dict[str, str] = {}  # build key -> the first variant built to it
    out = []
    for v in variants:
        if v.label not in built:
            continue
        key = built[v.label].key
        if key in seen:
            v.status, v.detail = "same build", f"the same library as {seen[key]}"
            continue
        seen[key] = v.label
        out.append(v)
    return out


def check_all(
    lib: Library,
    spec: Any,
    dev: torch.device,
    dt: torch.dtype,
    variants: list[VariantResult],
    built: dict[str, build.Built],
    say: Callable[[str], None],
    family: Family,
    only: set[tuple[str, str]] | None = None,
    starting: Callable[[str | None], None] | None = None,
) -> dict[str, Any]:
    """Check each built variant on the tuned dtype ``dt``, the only one the router will send it;
    the ops of those that pass, by label. ``only``: as for :func:`build_variants`, for the variants
    whose launchers are the plain build's (they name the same kernels) in a library of their own
    (the plain build's library is live: its modules keep every kernel). ``starting`` is told each
    variant's label before it is opened and checked, and None after the last."""
    from workbench.tuning import route

    preparers = {
        False: route.variant_preparer(lib.project, family, lib.config),
        True: route.variant_preparer(lib.project, family, lib.config, only),
    }
    plain = lib.families[family.name].library
    plain_objects = device_kernels(lib, family)[1] if only is not None else {}
    ops: dict[str, Any] = {}
    for v in distinct(variants, built):
        if starting is not None:
            starting(v.label)
        b = built[v.label]
        preparer = preparers[
            only is not None and b.library != plain and objects(b) == plain_objects
        ]
        try:
            prepare = preparer(v.point) if preparer is not None else None
            pns = route.open_variant(lib.namespace, built[v.label], prepare)
        except WorkbenchError as e:
            v.status, v.detail = "load failed", str(e).splitlines()[0]
            say(f"{v.label}: {v.detail}")
            continue
        op = getattr(getattr(torch.ops, pns), spec.name)
        try:
            rows = check_op(op, spec, dev.type, [dt], options=CHECK_OPTIONS)
        except isolate.ContextLost as lost:
            bad = next((r for r in reversed(lost.report.rows) if r.reason == CRASH), None)
            detail = bad.detail if bad is not None else "the CUDA context was lost"
            remember_crash(built[v.label].key, detail)
            raise TuneError(
                f"variant {v.label} of {spec.name} crashed and broke this process's CUDA context "
                f"({detail}). It is remembered and will be skipped: run the tune again in a new "
                "process (`wb tune` does so itself)"
            ) from None
        failed = [r for r in summarise(rows) if not r.passed]
        if failed:
            worst = max(failed, key=lambda r: r.ratio if math.isfinite(r.ratio) else math.inf)
            crash = worst.reason == CRASH
            v.status = "crashed" if crash else "wrong"
            v.detail = (
                f"{worst.dtype} [{worst.label}] {worst.reason}: err/tol {worst.ratio:.3g}, "
                f"{worst.detail}"
            )
            if crash:
                remember_crash(built[v.label].key, worst.detail)
            say(f"{v.label}: disqualified, {v.detail}")
            continue
        v.status = "checked"
        ops[v.label] = op
    if starting is not None:
        starting(None)
    return ops


def _crash_file() -> Any:
    return store.folder() / "crashed.json"


def crashed() -> dict[str, str]:
    found = cache.read_json(_crash_file())
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def remember_crash(key: str, detail: str) -> None:
    import json

    found = crashed()
    found[key] = detail
    path = _crash_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(path, json.dumps(found, indent=1, sort_keys=True))


# --- time ---------------------------------------------------------------------------------------


def time_all(
    spec: Any,
    dev: torch.device,
    dt: torch.dtype,
    ops: dict[str, Any],
    default: str,
    samples: list[Any],
    seed: int,
    min_time: float,
    n_rounds: int,
    deadline: float | None,
    say: Callable[[str], None],
    aa: bool = True,
) -> tuple[list[TuneSize], int]:
    """Time every (size, survivor) pair in rounds of shuffled plans; (sizes, rounds done).
    ``aa``: time the default twice, the A/A pair of the noise band (a worker of a --devices run
    other than the first times it once: its times are only scaled by it)."""
    from workbench.benchmark.check import verify_sample

    ref = default if default in ops else next(iter(ops))
    candidates = {name: invoker(op) for name, op in ops.items()}
    if aa:
        candidates[ref + AA_SUFFIX] = candidates[ref]
    with float32_precision(spec.allow_tf32):
        for s in samples:  # the exact inputs that will be timed, checked once more
            for op in ops.values():
                verify_sample(op, spec, s, dt)
            for fn in candidates.values():
                fn(*s.args)
        methods = timing_methods(candidates[ref], samples, dev)
        timer = timer_for(dev, min_time)
        times, done = time_rounds(
            candidates, samples, timer, methods, seed, n_rounds, deadline, say
        )
    sizes = []
    for s, t in zip(samples, times, strict=True):
        first = next(a for a in s.args if isinstance(a, torch.Tensor))
        chosen = {c: median_round(t[c]) for c in candidates if t[c]}
        medians = {c: [m.stats.median for m in t[c]] for c in candidates if t[c]}
        sizes.append(TuneSize(s.label, int(first.numel()), chosen, medians, ref))
    return sizes, done
