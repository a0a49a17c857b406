"""``workbench.bench()``: verify, then time the kernel, its eager reference and the compiled
reference over the spec's size sweep, in a random order, with an A/A control.

Lifecycle of one op: (1) draw the sweep's inputs and check the kernel against the reference on
each of them, stopping before any timing on a mismatch; (2) call every candidate once (the
compile of ``torch.compile`` stays out of the numbers); (3) on a GPU, probe the kernel at each
size (one replay of a small CUDA graph, which a busy host cannot slow) to choose per-call events
or graph replay, the same method for every candidate of that size; (4) time every (size,
candidate) pair ``rounds`` times: each round is the whole plan in its own shuffled order, so the
rounds of one candidate interleave with the others' instead of running back to back; each
candidate reports its median round, and the spread of its round medians widens the noise band
(a GPU timing can move between rounds by more than one A/A pair shows); (5) attach each size's
limit (the roof its FLOP/B puts it under and its share of it, :mod:`.roofs`; the compute peak of
the dtype is measured at the first size that needs it, :mod:`.peaks`), store the result under
the family's build key, and compare with a stored build when asked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from workbench.benchmark import calibrate, peaks, roofs, store, training
from workbench.benchmark.check import verify_sample
from workbench.benchmark.result import (
    ANCHOR,
    COMPILED,
    EAGER,
    KERNEL,
    KERNEL_AA,
    BenchResult,
    OpResult,
    SizeResult,
)
from workbench.benchmark.stats import Measurement, median_round
from workbench.errors import WorkbenchError
from workbench.spec import OpSpec, Sample
from workbench.verify.oracle import float32_precision
from workbench.verify.runner import invoker
from workbench.verify.schema import Signature, signature

if TYPE_CHECKING:
    from workbench.api import Library


def resolve_dtype(value: torch.dtype | str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    found = getattr(torch, value, None)
    if not isinstance(found, torch.dtype):
        raise WorkbenchError(f"dtype {value!r} is not a torch dtype (e.g. float32, bfloat16)")
    return found


def resolve_device(lib: Library, device: str | None) -> torch.device:
    cuda_ok = lib.config.with_cuda and torch.cuda.is_available()
    if device is None:
        return torch.device("cuda" if cuda_ok else "cpu")
    if device not in ("cpu", "cuda"):
        raise WorkbenchError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not cuda_ok:
        raise WorkbenchError(f"no CUDA build to time ({lib.config.cpu_reason}); use device='cpu'")
    return torch.device(device)


def build_key(lib: Library, op: str) -> str:
    """The build hash of the family that holds ``op``."""
    from workbench import loader

    handles = loader.live_handles(lib.namespace)
    for family, built in lib.families.items():
        if family in handles and op in handles[family].schemas:
            return built.key
    raise WorkbenchError(f"op {op!r} belongs to no loaded family")


def sweep(spec: OpSpec, dtype: torch.dtype, device: torch.device, seed: int) -> list[Sample]:
    """The spec's size sweep (its non-empty samples when it declares none)."""
    gen = torch.Generator().manual_seed(seed)
    if spec.bench_sizes is not None:
        return spec.bench_sizes(dtype, device, gen)
    samples = spec.samples(dtype, device, gen)
    return [s for s in samples if all(a.numel() > 0 for a in s.args if isinstance(a, torch.Tensor))]


def pick_sizes(samples: list[Sample], labels: Sequence[str] | None, op: str) -> list[Sample]:
    if not labels:
        return samples
    known = [s.label for s in samples]
    missing = [x for x in labels if x not in known]
    if missing:
        raise WorkbenchError(f"{op}: no sizes {missing} in its sweep; sizes: {', '.join(known)}")
    return [s for s in samples if s.label in labels]


def timer_for(
    device: torch.device, min_time: float
) -> Callable[[Callable[..., Any], tuple[Any, ...], str], Measurement]:
    if device.type == "cuda":
        from workbench.benchmark.timer_cuda import time_cuda

        return lambda fn, args, method: time_cuda(fn, args, device, method)
    from workbench.benchmark.timer_cpu import time_cpu

    return lambda fn, args, method: time_cpu(fn, args, min_time)


def shuffled_plan(n_sizes: int, candidates: list[str], seed: int) -> list[tuple[int, str]]:
    """Every (size index, candidate) pair once, in a random order.

    A fixed interleaving (ABAB...) lets drift and cache state favour one position; a shuffle
    turns that bias into noise, which the A/A pair and the rounds then measure.
    """
    plan = [(i, c) for i in range(n_sizes) for c in candidates]
    random.Random(seed).shuffle(plan)
    return plan


def round_plans(
    n_sizes: int, candidates: list[str], seed: int, rounds: int
) -> list[tuple[int, int, str]]:
    """(round, size index, candidate): ``rounds`` whole plans one after another, round r shuffled
    with seed + r, so every pair is timed ``rounds`` times, its rounds spread over the whole run
    (a slow stretch of the machine lands on one round of a pair, not on all of them)."""
    return [
        (r, i, c) for r in range(rounds) for i, c in shuffled_plan(n_sizes, candidates, seed + r)
    ]


# Within a long round, a progress line at most this often (seconds): a tune of the matmul's 15
# variants spends minutes in one round, which would otherwise pass in silence.
PROGRESS_SECONDS = 10.0


def time_rounds(
    candidates: dict[str, Callable[..., Any]],
    samples: list[Sample],
    timer: Callable[[Callable[..., Any], tuple[Any, ...], str], Measurement],
    methods: list[str],
    seed: int,
    n_rounds: int,
    deadline: float | None = None,
    say: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[dict[str, list[Measurement]]], int]:
    """Time every (size, candidate) pair ``n_rounds`` times in shuffled plans (round_plans).

    Returns per size the measurements of each candidate, and the rounds done: at a round's
    start past ``deadline`` (a ``clock()`` value) the rest are skipped, so the first round
    always completes. ``say`` hears a line per round done, a progress line within a round at
    most every PROGRESS_SECONDS, and when the deadline stops the run.
    """
    times: list[dict[str, list[Measurement]]] = [{c: [] for c in candidates} for _ in samples]
    per_round = len(samples) * len(candidates)
    done = 0
    last_line = clock()
    for k, (r, i, c) in enumerate(round_plans(len(samples), list(candidates), seed, n_rounds)):
        if r > done:
            done = r
            if deadline is not None and clock() > deadline:
                if say is not None:
                    say(f"budget spent after {done} of {n_rounds} rounds")
                return times, done
        times[i][c].append(timer(candidates[c], samples[i].args, methods[i]))
        if say is None:
            continue
        if (k + 1) % per_round == 0:
            say(f"round {r + 1}/{n_rounds} timed ({per_round} timings)")
            last_line = clock()
        elif clock() - last_line >= PROGRESS_SECONDS:
            say(f"round {r + 1}/{n_rounds}: {k % per_round + 1}/{per_round} timed")
            last_line = clock()
    return times, n_rounds


# Rounds per (size, candidate) when the caller gives none. A GPU timing can shift between rounds
# (a new graph capture, a new level of per-call events) by more than its IQR shows; a CPU timing
# is already a long blocked_autorange run, so one round keeps the CPU bench as fast as before.
DEFAULT_ROUNDS = {"cuda": 3, "cpu": 1}


def check_rounds(rounds: int | None) -> None:
    if rounds is None:
        return
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise WorkbenchError(
            f"rounds must be a whole number of 1 or more, got {rounds!r}: each round times every "
            "candidate once (leave it out for the default, 3 on cuda and 1 on cpu)"
        )


def timing_methods(kernel: Any, samples: list[Sample], device: torch.device) -> list[str]:
    if device.type != "cuda":
        return ["blocked_autorange"] * len(samples)
    from workbench.benchmark.timer_cuda import method_for, probe

    return [method_for(probe(kernel, s.args, device)) for s in samples]


def bench_op(
    lib: Library,
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    *,
    sizes: Sequence[str] | None,
    compile: bool,
    seed: int,
    min_time: float,
    calibration: calibrate.Calibration | None,
    rounds: int | None = None,
    backward: bool = False,
    graph: bool = False,
    say: Callable[[str], None] | None = None,
) -> OpResult:
    """Verify, then time one op over its sweep (see the module docstring); ``rounds``,
    ``backward`` and ``say`` as in ``bench``, which checks them. ``graph`` (with ``backward``, on
    CUDA): time each training step by CUDA graph replay (the GPU's time) instead of by wall
    clock."""
    spec = spec_for(lib, name, device, dtype)
    # float32 matmuls at the precision the spec allows (OpSpec.allow_tf32), for all candidates.
    with float32_precision(spec.allow_tf32):
        n_rounds = DEFAULT_ROUNDS[device.type] if rounds is None else rounds
        op = getattr(lib, name)
        sig = signature(op)
        kernel = invoker(op)  # kernel(*sample.args), keyword-only arguments passed by name
        samples = pick_sizes(sweep(spec, dtype, device, seed), sizes, name)
        if not samples:
            raise WorkbenchError(f"{name} has no sizes to time on {device.type} for {dtype}")
        for i, s in enumerate(samples):
            if say is not None:
                say(f"verifying size {s.label} ({i + 1}/{len(samples)})")
            verify_sample(op, spec, s, dtype)
        candidates: dict[str, Callable[..., Any]] = {KERNEL: kernel, KERNEL_AA: kernel}
        candidates[EAGER] = partial(_by_schema, sig, spec.reference)
        if compile:
            candidates[COMPILED] = partial(_by_schema, sig, torch.compile(spec.reference))
        if spec.anchor is not None and (spec.differentiable or not backward):
            candidates[ANCHOR] = partial(_by_schema, sig, spec.anchor)
        if backward:  # each candidate becomes forward + backward (workbench.benchmark.training)
            samples = training.samples(spec, samples, seed)
            candidates = {c: training.step(fn) for c, fn in candidates.items()}
            for s in samples:
                training.verify(candidates[KERNEL], spec, s, dtype)
        for s in samples:
            for fn in candidates.values():
                fn(*s.args)
        methods = ["steps"] * len(samples)
        timer: Callable[[Callable[..., Any], tuple[Any, ...], str], Measurement]
        timer = partial(_time_steps, device=device, min_time=min_time)
        if backward and graph:  # the steps' GPU time: the timer of forward ops, by replay
            methods = ["graph"] * len(samples)
            timer = timer_for(device, min_time)
        elif not backward:
            methods = timing_methods(candidates[KERNEL], samples, device)
            timer = timer_for(device, min_time)

        times, _ = time_rounds(candidates, samples, timer, methods, seed, n_rounds, say=say)
        results = []
        for s, t in zip(samples, times, strict=True):
            chosen = {c: median_round(t[c]) for c in candidates}
            medians = {c: [m.stats.median for m in t[c]] for c in candidates}
            bytes_moved, flops = 0, 0  # a training step has no roofline count in the spec
            if not backward:
                out = kernel(*s.args)
                bytes_moved, flops = spec.bytes_moved(s.args, out), spec.flops(s.args, out)
            limit = row_limit(
                calibration,
                device,
                roofs.unit_for(str(dtype), device.type, spec.allow_tf32),
                (flops, bytes_moved, chosen[KERNEL].stats.median),
                say,
            )
            results.append(
                SizeResult(s.label, bytes_moved, flops, chosen, rounds=medians, limit=limit)
            )
        return OpResult(
            op=(f"{name}+backward" + (" (graph)" if graph else "")) if backward else name,
            device=calibrate.device_name(device),
            device_type=device.type,
            dtype=str(dtype).removeprefix("torch."),
            build_key=build_key(lib, name),
            sizes=results,
            calibration=calibration,
            created=time.time(),
        )


def row_limit(
    calibration: calibrate.Calibration | None,
    device: torch.device,
    unit: roofs.Unit | None,
    counts: tuple[int, int, float],
    say: Callable[[str], None] | None = None,
) -> roofs.Limit | None:
    """The limit of a size that counts (flops, bytes) and ran in a median of seconds; the
    compute peak of ``unit`` is read from the cache, or measured there, only where it counts
    FLOPs. None without a calibration (``roofline=False``) or counts."""
    flops, nbytes, seconds = counts
    if calibration is None:
        return None
    peak = None
    if flops > 0 and unit is not None:
        peak = peaks.load_or_measure(device, unit, say=say)
    bandwidth = calibration.copy_bytes_per_s
    sheet = roofs.datasheet_bandwidth(calibration.device)
    return roofs.limit(flops, nbytes, seconds, bandwidth, peak, sheet)


def _time_steps(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    method: str,
    *,
    device: torch.device,
    min_time: float,
) -> Measurement:
    return training.time_steps(fn, args, device, min_time)


def _by_schema(sig: Signature, fn: Callable[..., Any], *args: Any) -> Any:
    return sig.call(fn, args)


def spec_for(lib: Library, name: str, device: torch.device, dtype: torch.dtype) -> OpSpec:
    if name not in lib.specs:
        raise WorkbenchError(
            f"no spec for op {name!r}; ops with specs: {', '.join(sorted(lib.specs))}"
        )
    spec = lib.specs[name]
    if device.type not in spec.devices:
        raise WorkbenchError(
            f"{name} does not run on {device.type} (its spec lists {list(spec.devices)})"
        )
    if dtype not in spec.dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in spec.dtypes)
        raise WorkbenchError(f"{name} does not support {dtype}; dtypes: {names}")
    return spec


def bench(
    ops: str | Sequence[str] | None = None,
    *,
    lib: Library | None = None,
    device: str | None = None,
    dtype: torch.dtype | str = torch.float32,
    sizes: Sequence[str] | None = None,
    compile: bool = True,
    vs: str | None = None,
    seed: int = 0,
    min_time: float = 0.2,
    rounds: int | None = None,
    roofline: bool = True,
    save: bool = True,
    backward: bool = False,
    say: Callable[[str], None] | None = None,
) -> BenchResult:
    """Verify, then time ``ops`` (names; default: every op with a spec) against eager and compiled.

    ``lib``: a loaded library (``workbench.bench`` loads the bundled one where it is left
    out). ``device``: 'cpu' or 'cuda'
    (default: cuda where built and present). ``sizes``: labels from the spec's sweep (default:
    all). ``compile``: also time ``torch.compile`` of the reference. ``vs``: 'last' or a build
    key prefix to compare the kernel with a stored result. ``min_time``: seconds of measurement
    per CPU timing (GPU timings follow their own protocol). ``rounds``: how many times every
    (size, candidate) pair is timed, each round a whole plan in its own shuffled order; the spread
    of a candidate's round medians widens its noise band (default: 3 on cuda, where a timing can
    move between rounds by more than its IQR; 1 on cpu, where each timing is already a long
    blocked_autorange run). ``roofline``: attach this device's ceilings (measured once per device
    and cached). ``save``: store the result under the build key. ``backward``: time forward and
    backward together (each candidate a training step; ops whose spec has a backward), reported
    as ``<op>+backward`` (wall clock over back-to-back steps, as an eager loop runs them), with
    no roofline; on CUDA also as ``<op>+backward (graph)``, each step timed by CUDA graph replay
    (the GPU's time, which the host's share of a single op's step hides). ``say``: hears what
    runs (the size being verified, then the timing rounds: see :func:`time_rounds`).
    """
    if min_time <= 0:
        raise WorkbenchError(f"min_time must be positive, got {min_time}")
    check_rounds(rounds)
    if lib is None:
        raise WorkbenchError(
            "bench needs the library it works on: pass lib=workbench.load(...), or call "
            "workbench.bench, which loads the bundled kernels when lib is left out"
        )
    dev, dt = resolve_device(lib, device), resolve_dtype(dtype)
    names = [ops] if isinstance(ops, str) else list(ops or sorted(lib.specs))
    cal = calibrate.load_or_measure(dev) if roofline else None
    result = BenchResult()
    runs = [(name, False) for name in names]
    if backward and dev.type == "cuda":
        runs = [(name, graph) for name in names for graph in (False, True)]
    for name, graph in runs:
        r = bench_op(
            lib,
            name,
            dev,
            dt,
            sizes=sizes,
            compile=compile,
            seed=seed,
            min_time=min_time,
            calibration=cal,
            rounds=rounds,
            backward=backward,
            graph=graph,
            say=say,
        )
        if vs is not None:
            r.previous = store.previous(r.op, r.device, r.dtype, r.build_key, vs)
            if r.previous is None and vs != "last":
                known = ", ".join(k[:12] for k in store.builds(r.op, r.device, r.dtype))
                raise WorkbenchError(
                    f"{name}: no stored result of a build {vs!r}; stored: {known or 'none'}"
                )
        if save:
            store.save(r.to_dict())
        result.ops.append(r)
    return result
