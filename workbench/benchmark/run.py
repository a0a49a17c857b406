"""``workbench.bench()``: verify, then time the kernel, its eager reference and the compiled
reference over the spec's size sweep, in a random order, with an A/A control.

Lifecycle of one op: (1) draw the sweep's inputs and check the kernel against the reference on
each of them, stopping before any timing on a mismatch; (2) call every candidate once (the
compile of ``torch.compile`` stays out of the numbers); (3) on a GPU, probe the kernel at each
size (one replay of a small CUDA graph, which a busy host cannot slow) to choose per-call events
or graph replay, the same method for every candidate of that size; (4) time every (size,
candidate) pair in a shuffled order; (5) attach the roofline, store the result under the
family's build key, and compare with a stored build when asked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from workbench.benchmark import calibrate, store
from workbench.benchmark.check import verify_sample
from workbench.benchmark.result import (
    COMPILED,
    EAGER,
    KERNEL,
    KERNEL_AA,
    BenchResult,
    OpResult,
    SizeResult,
)
from workbench.benchmark.stats import Measurement
from workbench.errors import WorkbenchError
from workbench.spec import OpSpec, Sample

if TYPE_CHECKING:
    from workbench.api import Library


def _dtype(value: torch.dtype | str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    found = getattr(torch, value, None)
    if not isinstance(found, torch.dtype):
        raise WorkbenchError(f"dtype {value!r} is not a torch dtype (e.g. float32, bfloat16)")
    return found


def _device(lib: Library, device: str | None) -> torch.device:
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


def _pick(samples: list[Sample], labels: Sequence[str] | None, op: str) -> list[Sample]:
    if not labels:
        return samples
    known = [s.label for s in samples]
    missing = [x for x in labels if x not in known]
    if missing:
        raise WorkbenchError(f"{op}: no sizes {missing} in its sweep; sizes: {', '.join(known)}")
    return [s for s in samples if s.label in labels]


def _timer(
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
    turns that bias into noise, which the A/A pair then measures.
    """
    plan = [(i, c) for i in range(n_sizes) for c in candidates]
    random.Random(seed).shuffle(plan)
    return plan


def _methods(kernel: Any, samples: list[Sample], device: torch.device) -> list[str]:
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
) -> OpResult:
    """Verify, then time one op over its sweep (see the module docstring)."""
    spec = _spec(lib, name, device, dtype)
    kernel = getattr(lib, name)
    samples = _pick(sweep(spec, dtype, device, seed), sizes, name)
    if not samples:
        raise WorkbenchError(f"{name} has no sizes to time on {device.type} for {dtype}")
    for s in samples:
        verify_sample(kernel, spec, s, dtype)
    candidates: dict[str, Callable[..., Any]] = {KERNEL: kernel, KERNEL_AA: kernel}
    candidates[EAGER] = spec.reference
    if compile:
        candidates[COMPILED] = torch.compile(spec.reference)
    for s in samples:
        for fn in candidates.values():
            fn(*s.args)
    methods = _methods(kernel, samples, device)
    timer = _timer(device, min_time)
    times: list[dict[str, Measurement]] = [{} for _ in samples]
    for i, c in shuffled_plan(len(samples), list(candidates), seed):
        times[i][c] = timer(candidates[c], samples[i].args, methods[i])
    results = []
    for s, t in zip(samples, times, strict=True):
        out = kernel(*s.args)
        ordered = {c: t[c] for c in candidates}
        results.append(
            SizeResult(s.label, spec.bytes_moved(s.args, out), spec.flops(s.args, out), ordered)
        )
    return OpResult(
        op=name,
        device=calibrate.device_name(device),
        device_type=device.type,
        dtype=str(dtype).removeprefix("torch."),
        build_key=build_key(lib, name),
        sizes=results,
        calibration=calibration,
        created=time.time(),
    )


def _spec(lib: Library, name: str, device: torch.device, dtype: torch.dtype) -> OpSpec:
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
    roofline: bool = True,
    save: bool = True,
) -> BenchResult:
    """Verify, then time ``ops`` (names; default: every op with a spec) against eager and compiled.

    ``lib``: a loaded library (default: ``workbench.load()``). ``device``: 'cpu' or 'cuda'
    (default: cuda where built and present). ``sizes``: labels from the spec's sweep (default:
    all). ``compile``: also time ``torch.compile`` of the reference. ``vs``: 'last' or a build
    key prefix to compare the kernel with a stored result. ``min_time``: seconds of measurement
    per CPU timing (GPU timings follow their own protocol). ``roofline``: attach this device's
    ceilings (measured once per device and cached). ``save``: store the result under the build key.
    """
    if min_time <= 0:
        raise WorkbenchError(f"min_time must be positive, got {min_time}")
    if lib is None:
        import workbench

        lib = workbench.load()
    dev, dt = _device(lib, device), _dtype(dtype)
    names = [ops] if isinstance(ops, str) else list(ops or sorted(lib.specs))
    cal = calibrate.load_or_measure(dev) if roofline else None
    result = BenchResult()
    for name in names:
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
