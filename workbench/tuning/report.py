"""What a tune run found: per size each variant's time and verdict, the winner per bucket, and
every variant that was skipped and why. Prints as text tables, serialises to JSON, draws a
heatmap (variant x size, time over the best of the size) and shows both in a notebook."""

from __future__ import annotations

import html
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.benchmark.stats import Measurement, noise_band, round_spread, verdict
from workbench.tuning.store import PLAIN

AA_SUFFIX = " (A/A)"


@dataclass
class VariantResult:
    label: str
    point: dict[str, Any]
    status: str = "pending"  # built, checked | build failed, load failed, wrong, crashed
    detail: str = ""
    compiled: int = 0
    compile_seconds: float = 0.0
    device: str = ""  # where it was checked and timed, with ``devices`` (tuning.parallel)


@dataclass
class TuneSize:
    """One size of the sweep: each timed variant's median round and round medians."""

    label: str
    numel: int  # of the first tensor argument: what buckets split on
    times: dict[str, Measurement]
    rounds: dict[str, list[float]]
    ref: str  # the variant timed twice (the default when it survived)

    @property
    def variants(self) -> list[str]:
        return [c for c in self.times if not c.endswith(AA_SUFFIX)]

    def time(self, name: str) -> float | None:
        m = self.times.get(name)
        return m.stats.median if m is not None else None

    @property
    def best(self) -> str:
        return min(self.variants, key=lambda c: self.times[c].stats.median)

    @property
    def noise(self) -> float:
        """The A/A band of the reference variant, widened by its spread between rounds."""
        aa = self.times.get(self.ref + AA_SUFFIX)
        spread = max(round_spread(self.rounds.get(self.ref, [])), 0.0)
        if aa is None:
            return max(self.times[self.ref].stats.rel_iqr / 2, spread)
        aa_spread = round_spread(self.rounds.get(self.ref + AA_SUFFIX, []))
        return max(noise_band(self.times[self.ref].stats, aa.stats), spread, aa_spread)

    def band(self, a: str, b: str) -> float:
        """The noise band for telling ``a`` from ``b``: the size's band, widened by both."""
        spreads = [round_spread(self.rounds.get(c, [])) for c in (a, b)]
        iqrs = [self.times[c].stats.rel_iqr / 2 for c in (a, b)]
        return max(self.noise, *spreads, *iqrs)

    def verdict(self, name: str) -> str:
        """'best', 'noise' (within the band of the best) or 'slower'."""
        best = self.best
        if name == best:
            return "best"
        t, b = self.times[name].stats.median, self.times[best].stats.median
        return verdict(t, b, self.band(name, best))


@dataclass
class TuneResult:
    op: str
    family: str
    device: str
    device_type: str
    arch: str
    dtype: str
    build_key: str
    default: str
    variants: list[VariantResult] = field(default_factory=list)
    sizes: list[TuneSize] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)
    winners: list[str] = field(default_factory=list)  # per bucket: len(bounds) + 1
    phases: dict[str, float] = field(default_factory=dict)
    rounds_done: int = 0
    rounds_asked: int = 0
    seconds: float = 0.0
    previous: dict[str, Any] | None = None
    compared: bool = False  # asked to compare with the last run (``vs="last"``)
    devices: list[str] = field(default_factory=list)  # the GPUs of a --devices run

    # --- choosing -------------------------------------------------------------------------

    def choose(self, buckets: tuple[int, ...] | None) -> None:
        """Set ``bounds`` and ``winners``: per bucket, the variant with the lowest mean log time
        over the best at each of its sizes; the default when it is within the noise band of that
        winner at every size of the bucket. Neighbouring buckets with one winner merge."""
        sizes = sorted(self.sizes, key=lambda s: s.numel)
        bounds = list(buckets) if buckets is not None else _midpoints([s.numel for s in sizes])
        groups: list[list[TuneSize]] = [[] for _ in range(len(bounds) + 1)]
        for s in sizes:
            groups[sum(1 for b in bounds if s.numel >= b)].append(s)
        picks = [self._pick(g) for g in groups]
        self.bounds, self.winners = [], []
        for i, pick in enumerate(picks):
            if self.winners and self.winners[-1] == pick:
                continue
            if self.winners:
                self.bounds.append(bounds[i - 1])
            self.winners.append(pick)

    def _pick(self, group: list[TuneSize]) -> str:
        if not group:  # no size fell in this bucket: nothing measured, nothing changes
            return PLAIN
        names = [n for n in group[0].variants if all(n in s.times for s in group)]

        def score(name: str) -> float:
            return sum(math.log(s.times[name].stats.median / s.times[s.best].stats.median)
                       for s in group)  # fmt: skip

        best = min(names, key=score)
        if self.default in names and all(s.verdict(self.default) != "slower" for s in group):
            return self.default
        return best

    # --- records ---------------------------------------------------------------------------

    def table_record(self) -> dict[str, Any]:
        """What the router needs for this (device, dtype), as stored in the build's record."""
        return {
            "device": self.device,
            "device_type": self.device_type,
            "arch": self.arch,
            "dtype": self.dtype,
            "bounds": self.bounds,
            "winners": self.winners,
            "sizes": {s.label: s.numel for s in self.sizes},
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.table_record(),
            "op": self.op,
            "family": self.family,
            "build_key": self.build_key,
            "default": self.default,
            "phases": self.phases,
            "rounds": [self.rounds_done, self.rounds_asked],
            "seconds": self.seconds,
            "devices": self.devices,
            "variants": [
                {
                    "label": v.label,
                    "point": v.point,
                    "status": v.status,
                    "detail": v.detail,
                    "compiled": v.compiled,
                    "compile_s": v.compile_seconds,
                    "device": v.device,
                }
                for v in self.variants
            ],
            "times": {
                s.label: {
                    "numel": s.numel,
                    "noise": s.noise,
                    "best": s.best,
                    "median_s": {c: m.stats.median for c, m in s.times.items()},
                    "rounds_s": s.rounds,
                    "method": s.times[s.ref].method,
                }
                for s in self.sizes
            },
        }

    @property
    def compiled(self) -> int:
        """Objects compiled by this run's builds (0 when every variant was cached)."""
        return sum(v.compiled for v in self.variants)

    # --- text ------------------------------------------------------------------------------

    def variant_table(self) -> str:
        rows = [["variant", "status", "detail"]]
        for v in self.variants:
            mark = " *" if v.label == self.default else ""
            status = f"{v.status} ({v.device})" if self.devices and v.device else v.status
            rows.append([v.label + mark, status, v.detail])
        return _grid(rows)

    def time_table(self) -> str:
        """variant x size: time in us, its ratio to the best of the size, and its verdict."""
        if not self.sizes:
            return "(nothing timed)"
        names = [n for n in self.sizes[0].variants]
        head = ["variant", *(f"{s.label}" for s in self.sizes)]
        rows = [head]
        for name in names:
            cells = [name + (" *" if name == self.default else "")]
            for s in self.sizes:
                t = s.time(name)
                if t is None:
                    cells.append("-")
                    continue
                ratio = t / s.times[s.best].stats.median
                v = s.verdict(name)
                mark = {"best": " best", "noise": " ~", "slower": ""}.get(v, "")
                cells.append(f"{t * 1e6:.2f} us x{ratio:.2f}{mark}")
            rows.append(cells)
        rows.append(["noise band", *(f"{s.noise * 100:.1f}%" for s in self.sizes)])
        return _grid(rows)

    def winner_lines(self) -> list[str]:
        lines = []
        edges = [0, *self.bounds, None]
        for i, w in enumerate(self.winners):
            lo, hi = edges[i], edges[i + 1]
            span = f"numel >= {lo}" if hi is None else f"{lo} <= numel < {hi}"
            lines.append(f"  {span}: {w}{' (default)' if w == self.default else ''}")
        return lines

    def vs_lines(self) -> list[str]:
        if self.previous is None:
            return ["vs last: no earlier run of this op on this device and dtype"]
        prev = self.previous
        lines = [f"vs last (build {str(prev.get('build_key', ''))[:12]}):"]
        old = dict(zip(_edges(prev.get("bounds", [])), prev.get("winners", []), strict=False))
        new = dict(zip(_edges(self.bounds), self.winners, strict=False))
        if old == new:
            lines.append("  same winners")
        for span in sorted(set(old) | set(new)):
            if old.get(span) != new.get(span):
                lines.append(f"  {span}: {old.get(span, '-')} -> {new.get(span, '-')}")
        for label, t in prev.get("times", {}).items():
            now = next((s for s in self.sizes if s.label == label), None)
            if now is None:
                continue
            before = t["median_s"].get(t["best"])
            after = now.times[now.best].stats.median
            if before:
                lines.append(
                    f"  {label}: best {t['best']} {before * 1e6:.2f} us -> "
                    f"{now.best} {after * 1e6:.2f} us (x{before / after:.2f})"
                )
        return lines

    def summary(self) -> str:
        p = self.phases
        built = [v for v in self.variants if v.status not in ("build failed",)]
        return (
            f"{self.op} on {self.device} ({self.dtype}): {len(self.variants)} variants, "
            f"{len(built)} built ({self.compiled} objects compiled), "
            f"{sum(v.status == 'checked' for v in self.variants)} passed the check; "
            f"build {p.get('build', 0):.1f} s, check {p.get('check', 0):.1f} s, "
            f"time {p.get('time', 0):.1f} s ({self.rounds_done}/{self.rounds_asked} rounds)"
        )

    def __str__(self) -> str:
        parts = [self.summary(), self.variant_table(), self.time_table()]
        parts.append("winners (* the default):\n" + "\n".join(self.winner_lines()))
        if self.compared:
            parts.append("\n".join(self.vs_lines()))
        return "\n\n".join(parts)

    def __repr__(self) -> str:
        return f"<TuneResult {self.op} {self.device} {self.dtype}: winners {self.winners}>"

    # --- pictures --------------------------------------------------------------------------

    def figure(self) -> Any | None:
        """A heatmap of time over the best of each size (variant x size); None without
        matplotlib."""
        from workbench.benchmark.plot import pyplot

        plt = pyplot()
        if plt is None or not self.sizes:
            return None
        names = self.sizes[0].variants
        grid = [
            [(s.time(n) or math.nan) / s.times[s.best].stats.median for s in self.sizes]
            for n in names
        ]
        fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(self.sizes), 0.9 + 0.35 * len(names)))
        image = ax.imshow(grid, cmap="viridis_r", aspect="auto", vmin=1.0)
        ax.set_xticks(range(len(self.sizes)), [s.label for s in self.sizes], rotation=30)
        ax.set_yticks(range(len(names)), [n + (" *" if n == self.default else "") for n in names])
        for i, row in enumerate(grid):
            for j, x in enumerate(row):
                if not math.isnan(x):
                    ax.text(j, i, f"{x:.2f}", ha="center", va="center", fontsize=7, color="w")
        fig.colorbar(image, ax=ax, label="time / best of the size")
        ax.set_title(f"{self.op}: {self.device}, {self.dtype}")
        fig.tight_layout()
        return fig

    def plot(self, path: str | Path) -> None:
        """Write the heatmap (PNG or SVG, from the suffix); needs matplotlib."""
        from workbench.benchmark import plot

        plot.check_suffix(Path(path))
        plot.save(self.figure(), Path(path))

    def _repr_html_(self) -> str:
        from workbench.benchmark.plot import svg_text

        svg = svg_text(self.figure()) or ""
        text = html.escape(str(self))
        return f"<div><pre>{text}</pre>{svg}</div>"


def _midpoints(numels: list[int]) -> list[int]:
    """Bounds between neighbouring distinct sizes, at their geometric middle."""
    distinct = sorted(set(numels))
    return [
        max(lo + 1, min(hi, round(math.sqrt(lo * hi)))) if lo > 0 else 1
        for lo, hi in itertools.pairwise(distinct)
    ]


def _edges(bounds: list[int]) -> list[str]:
    edges = [0, *bounds, None]
    return [
        f"numel >= {lo}" if hi is None else f"{lo} <= numel < {hi}"
        for lo, hi in itertools.pairwise(edges)
    ]


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)  # fmt: skip
