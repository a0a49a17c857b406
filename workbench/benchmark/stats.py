"""Summaries of timing samples and of repeated rounds, and the rule that calls a difference real
or noise."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace


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


def round_spread(medians: Sequence[float]) -> float:
    """(max - min) / min of one callable's per-round medians: 0 with fewer than two rounds.

    A timing can move between rounds by more than its IQR and the A/A pair show (on a GPU, the
    gap between replayed kernels changes from one graph capture to the next; per-call events
    can read one of two levels for a whole timing), so the rounds measure what one pair cannot.
    The full range, not half of it: a callable that itself moved by X between rounds cannot be
    ranked against another at a difference below X.
    """
    low = min(medians, default=0.0)
    return (max(medians) - low) / low if len(medians) > 1 and low > 0 else 0.0


def median_round(rounds: Sequence[Measurement]) -> Measurement:
    """The round whose median is the median of the round medians (the lower one of an even count).

    Reporting one real round keeps its median, IQR and method together, which a median of
    medians would not. The warnings of every round come with it, tagged with their round when
    there are several, so a warning seen in one round only is not lost.
    """
    if not rounds:
        raise ValueError("no rounds to choose from")
    order = sorted(range(len(rounds)), key=lambda r: rounds[r].stats.median)
    chosen = rounds[order[(len(rounds) - 1) // 2]]
    if len(rounds) == 1:
        return chosen
    notes = [f"round {r + 1}/{len(rounds)}: {w}" for r, m in enumerate(rounds) for w in m.warnings]
    return replace(chosen, warnings=notes)


def verdict(time: float, baseline: float, noise: float) -> str:
    """'faster', 'slower' or 'noise': ``time`` against ``baseline`` with the noise band."""
    if rel_diff(time, baseline) <= noise:
        return "noise"
    return "faster" if time < baseline else "slower"
