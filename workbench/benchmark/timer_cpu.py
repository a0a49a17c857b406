"""Timing on the CPU: ``torch.utils.benchmark.Timer.blocked_autorange``.

blocked_autorange picks a block of calls long enough to dwarf the timer's own cost, then times
blocks until ``min_time`` has passed; each block gives one per-call sample. The summary is the
median and IQR of those samples, at the thread count torch uses for everything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import benchmark

from workbench.benchmark.stats import Measurement, summarize

WARMUP_S = 0.05  # first-call work (allocator growth, lazy init) stays out of the samples


def time_cpu(fn: Callable[..., Any], args: tuple[Any, ...], min_time: float) -> Measurement:
    """Median and IQR of ``fn(*args)`` per call, with ``min_time`` seconds of measurement."""
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_S:
        fn(*args)
    threads = torch.get_num_threads()
    timer = benchmark.Timer(stmt="fn(*args)", globals={"fn": fn, "args": args}, num_threads=threads)
    m = timer.blocked_autorange(min_run_time=min_time)
    stats = summarize(list(m.times))
    method = (
        f"blocked_autorange, {len(m.times)} blocks x {m.number_per_run} calls, "
        f"{threads} thread{'s' * (threads != 1)}"
    )
    return Measurement(stats, method)
