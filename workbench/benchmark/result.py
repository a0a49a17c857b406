"""What a benchmark run found: per op and size, each candidate's time, the limit, verdicts.

``BenchResult`` prints as a text table that fits a 120-column terminal (``table(wide=True)``:
every column, as the JSON has), serialises to JSON (``to_dict``), and draws itself in a
notebook (``_repr_html_``: the table, a plot of time and limit against size, and the roofline
picture, :mod:`.roofline`).

The limit column is the row's share of the roof it stands under (:mod:`.roofs`): its arithmetic
intensity (FLOP/B, the spec's counts) against the ridge point of the device's copy bandwidth and
the compute peak of its dtype. The default table tags the roof: ``mem`` the copy bandwidth, ``TC``
the tensor-core peak (float16, bfloat16, TF32), ``FP32``/``FP64`` the CUDA-core peak, ``CPU`` a
CPU's matmul peak; the wide table names it with the measured and datasheet figures.

The roofline's copy ceiling is measured on a working set larger than the last-level cache (L2 of
a GPU, the LLC of a CPU). A size whose bytes fit in that cache can be served from it, faster
than the ceiling: its roofline cell is marked with the cache's name (``258% L2``) and a note
under the table says which ceiling applies; the JSON says ``fits_in_cache``.
"""

from __future__ import annotations

import functools
import glob
import html
import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from workbench.benchmark.calibrate import Calibration
from workbench.benchmark.roofline import Roofline
from workbench.benchmark.roofs import MEMORY, Limit, peak_line
from workbench.benchmark.stats import Measurement, noise_band, rel_diff, round_spread, verdict
from workbench.cli.table import render

KERNEL, KERNEL_AA, EAGER, COMPILED = "kernel", "kernel (A/A)", "eager", "compiled"
# The PyTorch op a user would call instead, where the spec's reference is not it (OpSpec.anchor).
ANCHOR = "anchor"


class Cache(NamedTuple):
    """The last-level cache a copy ceiling was measured past: ``L2`` of a GPU, ``LLC`` of a CPU
    (its largest unified cache); ``bytes`` 0 where it is not known."""

    name: str
    bytes: int

    def holds(self, nbytes: int) -> bool:
        return 0 < nbytes <= self.bytes

    def text(self) -> str:
        if self.bytes >= 1 << 20:
            return f"{self.bytes / (1 << 20):g} MiB {self.name}"
        return f"{self.bytes / (1 << 10):g} KiB {self.name}"


@functools.cache
def device_cache(device_type: str) -> Cache:
    """The last-level cache of this process's ``device_type`` device ("cuda": the current GPU's
    L2; "cpu": the largest unified cache sysfs lists for cpu0)."""
    if device_type == "cuda":
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return Cache("L2", int(props.L2_cache_size))
    largest = 0
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            kind = Path(index, "type").read_text().strip()
            size = Path(index, "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if kind == "Unified" and size[:-1].isdigit() and size[-1] in units:
            largest = max(largest, int(size[:-1]) * units[size[-1]])
    return Cache("LLC", largest)


@dataclass
class SizeResult:
    """One size of an op's sweep: per candidate its median round's timing and every round's
    median (in the order they were timed; empty when built without rounds, read as one)."""

    label: str
    bytes: int
    flops: int
    times: dict[str, Measurement]  # candidate -> measurement of its median round
    rounds: dict[str, list[float]] = field(default_factory=dict)  # candidate -> round medians
    limit: Limit | None = None  # the roof it stands under and its share of it (roofs.limit)

    @property
    def kernel(self) -> float:
        return self.times[KERNEL].stats.median

    def spread(self, candidate: str) -> float:
        """(max - min) / min of ``candidate``'s round medians (0 with one round)."""
        return round_spread(self.rounds.get(candidate, []))

    @property
    def round_spread(self) -> float:
        """How far the kernel's timing moved between rounds."""
        return self.spread(KERNEL)

    @property
    def aa_spread(self) -> float:
        """Relative difference of the two timings of the kernel (the A/A control)."""
        if KERNEL_AA not in self.times:
            return 0.0
        return rel_diff(self.times[KERNEL].stats.median, self.times[KERNEL_AA].stats.median)

    @property
    def noise(self) -> float:
        """The noise band: differences smaller than this are called noise.

        The largest of the A/A difference, half the relative IQR of either kernel timing, and
        the spread between rounds of either: a kernel that moved by X between rounds cannot be
        told apart from another at a difference below X.
        """
        rounds = max(self.spread(KERNEL), self.spread(KERNEL_AA))
        if KERNEL_AA not in self.times:
            return max(self.times[KERNEL].stats.rel_iqr / 2, rounds)
        return max(noise_band(self.times[KERNEL].stats, self.times[KERNEL_AA].stats), rounds)

    @property
    def intensity(self) -> float | None:
        """FLOP per byte moved (None where no bytes are counted)."""
        return self.flops / self.bytes if self.bytes > 0 else None

    def roofline(self, cal: Calibration | None) -> float | None:
        """Fraction of the roofline: the time the ceilings allow over the measured time (the
        limit's share where one is attached; else against ``cal``'s copy and matmul rates)."""
        if self.limit is not None:
            return self.limit.share
        if cal is None or self.kernel <= 0 or not (self.bytes or self.flops):
            return None  # nothing counted (e.g. a forward + backward step)
        floor = max(self.bytes / cal.copy_bytes_per_s, self.flops / cal.matmul_flops_per_s)
        return floor / self.kernel

    def against(self, other: str) -> tuple[float, str] | None:
        """(speed-up of the kernel over ``other``, verdict) or None if ``other`` was not timed.

        The band is the kernel's noise band widened to half the relative IQR of ``other`` and to
        the spread of ``other``'s round medians: a difference must stand out of both timings'
        spreads, not only the kernel's.
        """
        if other not in self.times:
            return None
        base = self.times[other].stats
        noise = max(self.noise, base.rel_iqr / 2, self.spread(other))
        return base.median / self.kernel, verdict(self.kernel, base.median, noise)

    def to_dict(self, cal: Calibration | None, cache: Cache | None = None) -> dict[str, Any]:
        roof = self.roofline(cal)
        return {
            "label": self.label,
            "bytes": self.bytes,
            "flops": self.flops,
            "gb_per_s": self.bytes / self.kernel / 1e9 if self.kernel > 0 else None,
            "tflop_per_s": self.flops / self.kernel / 1e12 if self.kernel > 0 else None,
            "roofline": roof,
            "intensity_flop_per_byte": self.intensity,
            "limit": self.limit.to_dict() if self.limit is not None else None,
            "fits_in_cache": cache is not None and cache.holds(self.bytes),
            "aa_spread": self.aa_spread,
            "round_spread": self.round_spread,
            "noise": self.noise,
            "times": {
                name: {
                    "median_s": m.stats.median,
                    "rounds_s": self.rounds.get(name) or [m.stats.median],
                    "q1_s": m.stats.q1,
                    "q3_s": m.stats.q3,
                    "n": m.stats.n,
                    "method": m.method,
                    "wall_per_call_s": m.wall_per_call,
                    "warnings": m.warnings,
                }
                for name, m in self.times.items()
            },
        }


@dataclass
class OpResult:
    op: str
    device: str  # calibration-style device name
    device_type: str  # "cpu" or "cuda"
    dtype: str
    build_key: str
    sizes: list[SizeResult]
    calibration: Calibration | None
    previous: dict[str, Any] | None = None  # the stored result compared against (--vs)
    created: float = 0.0
    # The last-level cache the copy ceiling was measured past (default: this process's device's).
    cache: Cache | None = None

    def last_level_cache(self) -> Cache:
        if self.cache is None:
            self.cache = device_cache(self.device_type)
        return self.cache

    def roofline_cell(self, s: SizeResult, wide: bool = False) -> str:
        """``s``'s limit: its share and the roof's tag ("71% TC", "83% mem"), the cache's name
        for the memory roof where its bytes fit in that cache ("258% L2"); ``wide``: the roof
        named with its measured and datasheet figures."""
        cache = self.last_level_cache()
        fits = bool(s.bytes) and cache.holds(s.bytes)
        lim = s.limit
        if lim is None:  # a result built without one: the share against the ceilings, untagged
            roof = s.roofline(self.calibration)
            return f"{_pct(roof)} {cache.name}" if roof is not None and fits else _pct(roof)
        if wide:
            where = f"; the bytes fit in the {cache.text()}" if fits and lim.bound == MEMORY else ""
            return lim.text() + where
        return f"{lim.share:.0%} {cache.name if fits and lim.bound == MEMORY else lim.short()}"

    def roofs(self) -> dict[str, Any]:
        """The roofs its rows stand under: the copy bandwidth and each compute peak used."""
        found: dict[str, Any] = {}
        for s in self.sizes:
            if s.limit is None:
                continue
            found["copy bandwidth"] = {
                "bytes_per_s": s.limit.bandwidth,
                "datasheet_bytes_per_s": s.limit.bandwidth_datasheet,
            }
            if s.limit.peak is not None:
                found[s.limit.peak.unit] = s.limit.peak.__dict__
        return found

    def warnings(self) -> list[str]:
        return [
            f"{self.op} {s.label} {name}: {w}"
            for s in self.sizes
            for name, m in s.times.items()
            for w in m.warnings
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "device": self.device,
            "device_type": self.device_type,
            "dtype": self.dtype,
            "build_key": self.build_key,
            "created": self.created,
            "calibration": self.calibration.__dict__ if self.calibration else None,
            "cache": self.last_level_cache()._asdict(),
            "roofs": self.roofs(),
            "sizes": [s.to_dict(self.calibration, self.last_level_cache()) for s in self.sizes],
            "vs": self.vs_rows(),
        }

    def vs_rows(self) -> list[dict[str, Any]]:
        """Per size in both runs: the previous build's kernel time against this one's."""
        if self.previous is None:
            return []
        before = {s["label"]: s for s in self.previous["sizes"]}
        rows = []
        for s in self.sizes:
            old = before.get(s.label)
            if old is None:
                continue
            t_old = float(old["times"][KERNEL]["median_s"])
            noise = max(s.noise, float(old["noise"]))
            rows.append(
                {
                    "label": s.label,
                    "previous_build": self.previous["build_key"],
                    "previous_s": t_old,
                    "now_s": s.kernel,
                    "speedup": t_old / s.kernel if s.kernel > 0 else None,
                    "noise": noise,
                    "verdict": verdict(s.kernel, t_old, noise),
                }
            )
        return rows


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}" if seconds < 1e-4 else f"{seconds * 1e6:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _intensity(x: float | None) -> str:
    """FLOP/B in at most 6 characters: 0.167, 7.76, 85.3, 1365."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _vs(s: SizeResult, other: str) -> str:
    got = s.against(other)
    return "-" if got is None else f"{got[0]:.2f}x {got[1]}"


HEADERS = [
    "op",
    "size",
    "kernel us",
    "IQR",
    "GB/s",
    "TFLOP/s",
    "FLOP/B",
    "limit",
    "vs eager",
    "vs compiled",
    "A/A",
    "noise",
    "method",
]
# The default table's columns: within 120 columns (the rest are in table(wide=True) and the JSON).
NARROW = (
    "op",
    "size",
    "kernel us",
    "GB/s",
    "TFLOP/s",
    "FLOP/B",
    "limit",
    "vs eager",
    "vs compiled",
)
NARROW_TAIL = ("noise",)


@dataclass
class BenchResult:
    ops: list[OpResult] = field(default_factory=list)

    def rows(self, wide: bool = False) -> list[list[str]]:
        """Every column (HEADERS, with "vs anchor" after "vs compiled" where an op has one);
        ``wide``: the limit cell names its roof in full."""
        out = []
        for r in self.ops:
            for s in r.sizes:
                k = s.times[KERNEL]
                gbs = s.bytes / s.kernel / 1e9 if s.kernel > 0 else 0.0
                out.append(
                    [
                        r.op,
                        s.label,
                        _us(s.kernel),
                        f"{k.stats.rel_iqr:.1%}",
                        f"{gbs:.1f}" if s.bytes else "-",
                        f"{s.flops / s.kernel / 1e12:.1f}" if s.flops and s.kernel > 0 else "-",
                        _intensity(s.intensity) if s.flops else "-",
                        r.roofline_cell(s, wide),
                        _vs(s, EAGER),
                        _vs(s, COMPILED),
                        *([_vs(s, ANCHOR)] if self._anchored() else []),
                        f"{s.aa_spread:.1%}",
                        f"{s.noise:.1%}",
                        k.method,
                    ]
                )
        return out

    def _anchored(self) -> bool:
        return any(ANCHOR in s.times for r in self.ops for s in r.sizes)

    def columns(self, wide: bool = False) -> list[str]:
        """The table's column names: every one, or the default's (a rate column that no row
        fills left out)."""
        after = HEADERS.index("vs compiled") + 1  # where rows() puts the anchor's column
        every = (
            HEADERS if not self._anchored() else [*HEADERS[:after], "vs anchor", *HEADERS[after:]]
        )
        if wide:
            return every
        rows = self.rows()
        filled = {h for i, h in enumerate(every) if any(row[i] != "-" for row in rows)}
        rates = {"GB/s", "TFLOP/s", "FLOP/B"}
        keep = [*NARROW, *(["vs anchor"] if self._anchored() else []), *NARROW_TAIL]
        return [h for h in keep if h not in rates or h in filled]

    def vs_lines(self) -> list[str]:
        lines = []
        for r in self.ops:
            if r.previous is None:
                continue
            lines.append(
                f"{r.op}: against build {r.previous['build_key'][:12]} (now {r.build_key[:12]})"
            )
            for v in r.vs_rows():
                lines.append(
                    f"  {v['label']:>10}  {_us(v['previous_s'])} -> {_us(v['now_s'])} us  "
                    f"{v['speedup']:.3f}x  {v['verdict']} (noise band {v['noise']:.1%})"
                )
        return lines

    def roof_lines(self) -> list[str]:
        """One line per compute roof the rows used: measured and datasheet peak, ridge point."""
        lines = []
        for r in self.ops:
            for s in r.sizes:
                lim = s.limit
                if lim is None or lim.peak is None:
                    continue
                line = peak_line(lim.peak, lim.bandwidth)
                if line not in lines:
                    lines.append(line)
        return lines

    def limit_notes(self) -> list[str]:
        """What the default table's limit tags stand for (those it uses)."""
        meaning = {
            "mem": "the copy bandwidth",
            "TC": "the dtype's tensor-core peak",
            "FP32": "the fp32 CUDA-core peak",
            "FP64": "the fp64 peak",
            "CPU": "the CPU's matmul peak of the dtype",
        }
        used = {s.limit.short() for r in self.ops for s in r.sizes if s.limit is not None}
        if not used:
            return []
        tags = ", ".join(f"{t} = {m}" for t, m in meaning.items() if t in used)
        return [
            "limit: the share of the roof the row's FLOP/B puts it under (below the ridge point, "
            f"peak / bandwidth, the memory roof; above it the compute roof): {tags}; --wide "
            "names each roof with its measured and datasheet figures"
        ]

    def cache_notes(self) -> list[str]:
        """Which ceiling applies to the rows marked with a cache's name."""
        notes = []
        for r in self.ops:
            cache = r.last_level_cache()
            fits = [s.label for s in r.sizes if r.roofline_cell(s).endswith(f" {cache.name}")]
            if not fits or r.calibration is None:
                continue
            note = (
                f"{r.op} {', '.join(fits)}: the bytes moved fit in the {cache.text()}; the copy "
                f"ceiling ({r.calibration.copy_bytes_per_s / 1e9:.1f} GB/s) is measured past it, "
                f"so a limit marked {cache.name} is against DRAM and can pass 100%"
            )
            if note not in notes:
                notes.append(note)
        return notes

    def table(self, wide: bool = False) -> str:
        """The text table: within 120 columns, or with every column (``wide``: IQR, A/A and the
        timing method too)."""
        heads = {(r.device, r.dtype) for r in self.ops}
        top = [f"{dev}, {dt}" for dev, dt in sorted(heads)]
        every = self.columns(wide=True)
        chosen = [every.index(c) for c in self.columns(wide)]
        rows = [[row[i] for i in chosen] for row in self.rows(wide)]
        parts = [*top, render([every[i] for i in chosen], rows)]
        parts += self.vs_lines()
        notes = [*([] if wide else self.limit_notes()), *self.cache_notes()]
        parts += [textwrap.fill(f"note: {n}", 120, subsequent_indent="  ") for n in notes]
        parts += [f"warning: {w}" for r in self.ops for w in r.warnings()]
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<workbench.BenchResult {', '.join(r.op for r in self.ops)}>\n{self.table()}"

    def to_dict(self) -> dict[str, Any]:
        return {"format": 1, "ops": [r.to_dict() for r in self.ops]}

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    def figure(self) -> Any | None:
        """Time per call and % of roofline against bytes moved, one line per candidate (time)
        and per op (roofline); None without matplotlib."""
        from workbench.benchmark.plot import pyplot

        plt = pyplot()
        if plt is None:
            return None
        fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
        for r in self.ops:
            xs = [s.bytes for s in r.sizes]
            for name in r.sizes[0].times if r.sizes else []:
                ys = [s.times[name].stats.median * 1e6 for s in r.sizes]
                ax_t.plot(xs, ys, marker="o", label=f"{r.op} {name}")
            roof = [s.roofline(r.calibration) for s in r.sizes]
            if all(v is not None for v in roof):
                ax_r.plot(xs, [100 * float(v or 0) for v in roof], marker="o", label=r.op)
        top = max([105.0, *(1.05 * y for line in ax_r.lines for y in line.get_ydata())])
        ax_t.set(xscale="log", yscale="log", xlabel="bytes moved", ylabel="time per call (us)")
        ax_r.set(
            xscale="log",
            xlabel="bytes moved",
            ylabel="limit: % of its roof (kernel)",
            ylim=(0, top),
        )
        ax_t.legend(fontsize=7)
        if ax_r.lines:
            ax_r.legend(fontsize=7)
        devices = sorted({f"{r.device}, {r.dtype}" for r in self.ops})
        fig.suptitle("; ".join(devices), fontsize=9)
        return fig

    def roofline(self) -> Roofline:
        """The roofline picture of this run: every op and size that counts FLOPs as a point
        under the device's measured roofs (``.save(path)``, ``.svg()``; a notebook shows it)."""
        return Roofline.of(self.ops)

    def plot(self, path: str | Path) -> None:
        """Write the plot (PNG or SVG, from the suffix); needs matplotlib."""
        from workbench.benchmark import plot

        plot.check_suffix(Path(path))
        plot.save(self.figure(), Path(path))

    def _repr_html_(self) -> str:
        from workbench.benchmark.plot import svg_text

        columns = self.columns(wide=True)
        head = "".join(f"<th>{html.escape(h)}</th>" for h in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self.rows(wide=True)
        )
        notes = [
            *self.vs_lines(),
            *(f"note: {n}" for n in self.cache_notes()),
            *(f"warning: {w}" for r in self.ops for w in r.warnings()),
        ]
        extra = "".join(f"<div><code>{html.escape(n)}</code></div>" for n in notes)
        svg = svg_text(self.figure())
        picture = svg if svg is not None else "<p>(install matplotlib for the plot)</p>"
        roof = self.roofline()
        if svg is not None and roof.points:
            picture += roof.svg() or ""
        return f"<table><tr>{head}</tr>{body}</table>{extra}{picture}"
