"""The device's measured ceilings: copy bandwidth and matmul rate, measured once and cached.

A roofline needs the rates this device actually reaches, not its datasheet: a large
device-to-device copy (bytes read plus bytes written, over the median time) and a large matmul
(2*M*N*K over the median time; bfloat16 on a GPU, float32 on a CPU). Both are timed by the same
protocol as every benchmark. The result is kept in ``<cache>/bench/calibration/<device>.json``
and measured again only on request (``wb bench --calibrate``) or when the device, torch or the
protocol version changes.
"""

from __future__ import annotations

import json
import platform
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from workbench import cache
from workbench.benchmark.stats import Measurement

FORMAT = 1


@dataclass(frozen=True)
class Calibration:
    device: str  # e.g. "NVIDIA H100 80GB HBM3" or "cpu: x86_64, 2 threads"
    torch: str
    copy_bytes_per_s: float
    copy_detail: str  # size, method, spread
    matmul_flops_per_s: float
    matmul_detail: str
    measured: float  # unix time

    def lines(self) -> list[str]:
        return [
            f"device: {self.device} (torch {self.torch}), measured "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(self.measured))}",
            f"copy ceiling:   {self.copy_bytes_per_s / 1e9:10.1f} GB/s      {self.copy_detail}",
            f"matmul ceiling: {self.matmul_flops_per_s / 1e12:10.2f} TFLOP/s  {self.matmul_detail}",
        ]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} (sm_{props.major}{props.minor}, {props.L2_cache_size >> 20} MiB L2)"
    return f"cpu: {platform.machine()}, {torch.get_num_threads()} threads"


def path(device: torch.device, suffix: str = ".json") -> Path:
    """Where ``device``'s calibration is cached (keyed by its name and torch's version); the
    compute peaks of :mod:`.peaks` sit beside it with ``suffix`` ".peaks.json"."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{device_name(device)}-torch{torch.__version__}")
    return cache.root() / "bench" / "calibration" / f"{slug.strip('-')}{suffix}"


def _time(fn: Any, args: tuple[Any, ...], device: torch.device, min_time: float) -> Measurement:
    if device.type == "cuda":
        from workbench.benchmark.timer_cuda import time_cuda

        return time_cuda(fn, args, device, "events")
    from workbench.benchmark.timer_cpu import time_cpu

    return time_cpu(fn, args, min_time)


def _copy_bytes(device: torch.device) -> int:
    """1 GiB on a GPU with room for two of it, else an eighth of free memory; 64 MiB on a CPU."""
    if device.type != "cuda":
        return 64 << 20
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(1 << 30, free // 8)) // 16 * 16


def measure(device: torch.device, min_time: float = 0.2) -> Calibration:
    """Time a large copy and a large matmul on ``device`` now."""
    nbytes = _copy_bytes(device)
    src = torch.randn(nbytes // 4, device=device)  # drawn where it lives: 1 GiB in milliseconds
    dst = torch.empty_like(src)
    copy = _time(lambda s, d: d.copy_(s), (src, dst), device, min_time)
    copy_rate = 2 * nbytes / copy.stats.median
    del src, dst
    dim, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (1024, torch.float32)
    a = torch.randn(dim, dim, device=device, dtype=dtype)  # random, never zeros: zeros run fast
    b = torch.randn(dim, dim, device=device, dtype=dtype)
    mm = _time(torch.matmul, (a, b), device, min_time)
    flops_rate = 2 * dim**3 / mm.stats.median
    dtype_name = str(dtype).removeprefix("torch.")
    return Calibration(
        device=device_name(device),
        torch=torch.__version__,
        copy_bytes_per_s=copy_rate,
        copy_detail=f"copy of {nbytes >> 20} MiB, {_spread(copy)}",
        matmul_flops_per_s=flops_rate,
        matmul_detail=f"{dtype_name} matmul {dim}x{dim}x{dim}, {_spread(mm)}",
        measured=time.time(),
    )


def _spread(m: Measurement) -> str:
    return f"median {m.stats.median * 1e6:.1f} us, IQR {m.stats.rel_iqr:.1%}; {m.method}"


def load_or_measure(device: torch.device, refresh: bool = False) -> Calibration:
    """The cached calibration of ``device``, measuring (and caching) it when missing."""
    where = path(device)
    data = None if refresh else cache.read_json(where)
    if isinstance(data, dict) and data.get("format") == FORMAT:
        fields = {k: v for k, v in data.items() if k != "format"}
        try:
            return Calibration(**fields)
        except TypeError:
            pass  # written by another layout of this version: measure again
    result = measure(device)
    where.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(where, json.dumps({"format": FORMAT, **asdict(result)}, indent=1))
    return result
