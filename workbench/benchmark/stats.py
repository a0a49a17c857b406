"""Summaries of timing samples, and the rule that calls a difference real or noise."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stats:
    """Median and quartiles of per-call times, in seconds."""

    median: float
    q1: float
    q3: float
    n: int

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.median > 0 else 0.0


def summarize(samples: Sequence[float]) -> Stats:
    """Median and quartiles (the 'inclusive' method: quartiles lie within the samples)."""
    if not samples:
        raise ValueError("no timing samples to summarize")
    if len(samples) == 1:
        return Stats(samples[0], samples[0], samples[0], 1)
    q1, med, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return Stats(med, q1, q3, len(samples))


@dataclass
class Measurement:
    """One timed callable: its statistics, how it was timed, and what looked wrong."""

    stats: Stats
    method: str  # printed beside the number, e.g. "events, L2 flushed, 412 calls"
    warnings: list[str] = field(default_factory=list)
    wall_per_call: float | None = None  # synchronized wall time of the cross-check batch


def rel_diff(a: float, b: float) -> float:
    """|a - b| relative to the smaller of the two."""
    low = min(a, b)
    return abs(a - b) / low if low > 0 else 0.0


def noise_band(aa_first: Stats, aa_second: Stats) -> float:
    """The relative difference that two timings of one callable can show by chance.

    The larger of the A/A difference of the medians and half the wider relative IQR: a single
    lucky A/A pair that agreed closely must not make a smaller real spread count as a signal.
    """
    spread = rel_diff(aa_first.median, aa_second.median)
    return max(spread, aa_first.rel_iqr / 2, aa_second.rel_iqr / 2)


def verdict(time: float, baseline: float, noise: float) -> str:
    """'faster', 'slower' or 'noise': ``time`` against ``baseline`` with the noise band."""
    if rel_diff(time, baseline) <= noise:
        return "noise"
    return "faster" if time < baseline else "slower"
