"""The device's compute peaks, one per unit (:func:`.roofs.unit_for`), measured once and cached.

The practical peak of a unit is the best rate ``torch.matmul`` (cuBLAS on a GPU) reaches on a
large square matmul of the unit's dtype: sizes grow (1024 to 8192 on a GPU) while a call of the
next fits the time budget; the largest is timed as back-to-back calls between two CUDA events (a
CPU: the wall clock), best of three runs, each size warmed up first. A size whose call took
less than twice the time of the size below (8x the work) is dominated by a fixed cost per call
(a launch; a CPU's thread pool on a loaded host, seen at 15 ms per 128^3 call on 2 cores), so
the sizes grow past it as long as the next call stays within the budget.

A unit is measured at the first row that needs it (a row that counts FLOPs on that device in
that dtype), in about ``BUDGET_S`` seconds plus the warm-ups (under a second), and kept beside
the copy ceiling in ``<cache>/bench/calibration/<device>-torch<version>.peaks.json``;
``wb bench --calibrate`` measures them all again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch

from workbench import cache
from workbench.benchmark import calibrate
from workbench.benchmark.roofs import PeakInfo, Unit, datasheet_peak
from workbench.verify.oracle import float32_precision

FORMAT = 1
BUDGET_S = {"cuda": 0.3, "cpu": 0.4}  # seconds of timing per unit, about
DIMS = {"cuda": (1024, 2048, 4096, 8192), "cpu": (128, 256, 512, 1024, 2048)}
RUNS = 3
WARM_S = 0.03  # wall seconds of calls at each size before it is timed


def _timer(device: torch.device) -> Callable[[Callable[[], Any], int], float]:
    """(fn, n) -> seconds per call of ``n`` back-to-back calls of ``fn``."""
    if device.type == "cuda":

        def on_gpu(fn: Callable[[], Any], n: int) -> float:
            with torch.cuda.device(device):  # the events on the stream the calls run on
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                for _ in range(n):
                    fn()
                end.record()
                end.synchronize()
            return float(start.elapsed_time(end)) / 1e3 / n

        return on_gpu

    def on_cpu(fn: Callable[[], Any], n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n

    return on_cpu


def _fits(device: torch.device, dim: int, dtype: torch.dtype) -> bool:
    """Three dim x dim matrices in a quarter of the GPU's free memory (always on a CPU)."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return 3 * dim * dim * dtype.itemsize <= free // 4


def measure(device: torch.device, unit: Unit) -> PeakInfo:
    """Time ``unit``'s matmul on ``device`` now (see the module docstring)."""
    dtype: torch.dtype = getattr(torch, unit.dtype)
    budget, dims, timer = BUDGET_S[device.type], DIMS[device.type], _timer(device)

    def operands(dim: int) -> Callable[[], Any]:
        a = torch.randn(dim, dim, device=device, dtype=dtype)  # random: zeros run faster
        b = torch.randn(dim, dim, device=device, dtype=dtype)
        out = torch.empty(dim, dim, device=device, dtype=dtype)

        def call() -> torch.Tensor:
            return torch.mm(a, b, out=out)

        call()  # warm-up: the library picks its kernel for this shape here
        return call

    with float32_precision(unit.tf32):
        before = None  # the previous size's time per call
        for i, dim in enumerate(dims):  # grow while a call of the next size fits the budget
            call = operands(dim)
            warm_until = time.perf_counter() + WARM_S  # threads and clocks up before timing
            while time.perf_counter() < warm_until:
                timer(call, 1)
            per_call = min(timer(call, 1) for _ in range(RUNS))
            # 8x the work in under 2x the time: the call's fixed cost hides the rate, grow on
            overhead = before is None or per_call < 2 * before
            before = per_call
            last = i + 1 == len(dims) or not _fits(device, dims[i + 1], dtype)
            if last or per_call * 8 > budget or (per_call * 8 > budget / 10 and not overhead):
                break
        n = max(1, min(200, int(budget / (RUNS + 1) / max(per_call, 1e-9))))
        best = min(per_call, *(timer(call, n) for _ in range(RUNS)))
    library = "cuBLAS" if device.type == "cuda" else "CPU"
    calls = f"{n} call{'s' if n > 1 else ''}"
    return PeakInfo(
        unit=unit.key,
        short=unit.short,
        flops_per_s=2 * dim**3 / best,
        datasheet_flops_per_s=datasheet_peak(calibrate.device_name(device), unit),
        detail=f"torch.mm ({library}) {unit.dtype} {dim}^3, best of {RUNS} runs of {calls}",
        measured=time.time(),
    )


def _read(device: torch.device) -> dict[str, dict[str, Any]]:
    data = cache.read_json(calibrate.path(device, ".peaks.json"))
    if isinstance(data, dict) and data.get("format") == FORMAT:
        peaks = data.get("peaks")
        if isinstance(peaks, dict):
            return peaks
    return {}


def load_or_measure(
    device: torch.device,
    unit: Unit,
    refresh: bool = False,
    say: Callable[[str], None] | None = None,
) -> PeakInfo:
    """``unit``'s cached peak on ``device``, measuring (and caching) it when missing; ``say``
    hears a line before a measurement."""
    name = calibrate.device_name(device)
    stored = None if refresh else _read(device).get(unit.key)
    if isinstance(stored, dict):
        try:
            return PeakInfo(
                unit=unit.key,
                short=unit.short,
                flops_per_s=float(stored["flops_per_s"]),
                datasheet_flops_per_s=datasheet_peak(name, unit),
                detail=str(stored["detail"]),
                measured=float(stored["measured"]),
            )
        except (KeyError, TypeError, ValueError):
            pass  # written by another layout: measure again
    if say is not None:
        say(f"calibrating the {unit.key} peak (once per device)")
    peak = measure(device, unit)
    kept = {k: v for k, v in peak.__dict__.items() if k in ("flops_per_s", "detail", "measured")}
    peaks = {**_read(device), unit.key: kept}  # read again: another process may have added one
    where = calibrate.path(device, ".peaks.json")
    where.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": FORMAT, "device": name, "torch": torch.__version__, "peaks": peaks}
    cache.write_atomic(where, json.dumps(record, indent=1))
    return peak
