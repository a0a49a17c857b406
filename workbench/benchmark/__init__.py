"""Benchmarks that say what they measured: verify, then time against eager and torch.compile.

stats.py        median, IQR, the A/A noise band and the faster/slower/noise verdict
timer_cuda.py   the GPU protocol: warm-up, L2 flush, events, graph replay, wall cross-check
timer_cpu.py    the CPU protocol: torch.utils.benchmark blocked_autorange
calibrate.py    this device's copy and matmul ceilings, measured once and cached
roofs.py        a row's arithmetic intensity, the roof it stands under and its share of it
peaks.py        this device's compute peak per dtype and unit, measured once and cached
check.py        the correctness check run on the exact inputs before timing
run.py          bench(): the sweep, the randomized plan, the roofline, the stored result
store.py        results per build key, for comparisons with an earlier build
result.py       BenchResult: text table, JSON, notebook HTML
plot.py         matplotlib, optional: what the pictures share
roofline.py     the roofline picture: every op and size under the device's measured roofs
"""

from __future__ import annotations

from workbench.benchmark.result import BenchResult
from workbench.benchmark.run import bench

__all__ = ["BenchResult", "bench"]
