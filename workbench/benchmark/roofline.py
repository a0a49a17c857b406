"""The roofline picture of a bench run: every op and size as a point under the device's roofs.

x is the row's arithmetic intensity (FLOP/B, the spec's counts), y the FLOP/s it reached; both
axes are logarithmic. Each roof group the points use (a device and the compute unit of their
dtype, :func:`.roofs.unit_for`) is drawn as its measured roof, min(peak, x * copy bandwidth), with
the datasheet roof dashed beside it where the device is known. A row that counts no FLOPs has no
place on the picture; a note under it names those rows. ``wb bench --plot roofline`` writes it
(SVG or PNG); in a notebook ``BenchResult.roofline()`` shows itself (the extension registers the
display) and the result's own display carries it.
"""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.benchmark import plot
from workbench.benchmark.roofs import rate_text


@dataclass(frozen=True)
class Point:
    op: str
    label: str
    device: str
    dtype: str
    intensity: float  # FLOP/B
    flops_per_s: float  # achieved
    roof: str  # the key of its Roof
    bound: str  # "memory" or "compute"
    share: float


@dataclass(frozen=True)
class Roof:
    """A device's copy bandwidth and (where its points count FLOPs in a dtype with a peak) the
    compute peak of their unit; measured, and from the datasheet where known."""

    device: str
    unit: str | None
    bandwidth: float  # B/s
    peak: float | None  # FLOP/s
    bandwidth_datasheet: float | None = None
    peak_datasheet: float | None = None

    @property
    def key(self) -> str:
        return f"{self.device} | {self.unit or 'memory only'}"

    @property
    def ridge(self) -> float | None:
        return self.peak / self.bandwidth if self.peak else None

    def label(self) -> str:
        peak = f"{self.unit} {rate_text(self.peak)}, " if self.peak and self.unit else ""
        return f"{peak}copy {self.bandwidth / 1e9:.4g} GB/s"


@dataclass
class Roofline:
    points: list[Point] = field(default_factory=list)
    roofs: list[Roof] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "op size" of rows with no FLOP count

    @classmethod
    def of(cls, ops: Iterable[Any]) -> Roofline:
        """From a BenchResult's ``ops`` (OpResult), read as the JSON they write: a live run and
        a saved one draw the same picture."""
        return cls.from_json({"ops": [r.to_dict() for r in ops]})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Roofline:
        """From the JSON a bench wrote (``wb bench --json``, ``BenchResult.write_json``): a run
        on a GPU host drawn anywhere."""
        pic = cls()
        roofs: dict[str, Roof] = {}
        for r in data.get("ops", []):
            for s in r.get("sizes", []):
                lim = s.get("limit")
                kernel = ((s.get("times") or {}).get("kernel") or {}).get("median_s") or 0.0
                flops, size_bytes = s.get("flops") or 0, s.get("bytes") or 0
                if not lim or flops <= 0 or not size_bytes or kernel <= 0:
                    pic.skipped.append(f"{r['op']} {s['label']}")
                    continue
                peak = lim.get("peak") or {}
                roof = Roof(
                    device=r["device"],
                    unit=peak.get("unit"),
                    bandwidth=lim["bandwidth_bytes_per_s"],
                    peak=peak.get("flops_per_s"),
                    bandwidth_datasheet=lim.get("bandwidth_datasheet_bytes_per_s"),
                    peak_datasheet=peak.get("datasheet_flops_per_s"),
                )
                roofs.setdefault(roof.key, roof)
                pic.points.append(
                    Point(
                        r["op"],
                        s["label"],
                        r["device"],
                        r["dtype"],
                        flops / size_bytes,
                        flops / kernel,
                        roof.key,
                        lim["bound"],
                        lim["share"],
                    )
                )
        pic.roofs = list(roofs.values())
        return pic

    def __repr__(self) -> str:
        drawn = f"{len(self.points)} points under {len(self.roofs)} roofs"
        how = "save(path) writes it; a notebook shows it" if plot.pyplot() else plot.INSTALL
        return f"<workbench roofline: {drawn}; {how}>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [asdict(p) for p in self.points],
            "roofs": [{**asdict(r), "key": r.key, "ridge": r.ridge} for r in self.roofs],
            "skipped": self.skipped,
        }

    def _x_range(self) -> tuple[float, float]:
        xs = [p.intensity for p in self.points]
        xs += [r.ridge for r in self.roofs if r.ridge]
        if not xs:
            return 0.01, 100.0
        return min(xs) / 4, max(xs) * 4

    def figure(self) -> Any | None:
        """The picture (a matplotlib Figure), or None without matplotlib."""
        plt = plot.pyplot()
        if plt is None:
            return None
        fig, ax = plt.subplots(figsize=(9, 6), constrained_layout=True)
        lo, hi = self._x_range()
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, roof in enumerate(self.roofs):
            _draw_roof(ax, roof, lo, hi, colors[i % len(colors)])
        markers = "osD^v<>ph*"
        ops = list(dict.fromkeys(p.op for p in self.points))
        for i, p in enumerate(self.points):
            k = ops.index(p.op)
            ax.plot(
                [p.intensity],
                [p.flops_per_s],
                marker=markers[k % len(markers)],
                color="black" if len(ops) == 1 else colors[(k + 3) % len(colors)],
                linestyle="none",
                markersize=6,
                label=p.op if i == [q.op for q in self.points].index(p.op) else None,
                gid=f"wb-point-{i}-{_slug(p.op)}-{_slug(p.label)}",
            )
            ax.annotate(
                f"{p.label} ({p.share:.0%})",
                (p.intensity, p.flops_per_s),
                textcoords="offset points",
                xytext=(4, 3),
                fontsize=6,
            )
        ax.set(
            xscale="log",
            yscale="log",
            xlim=(lo, hi),
            xlabel="arithmetic intensity (FLOP/byte, from the specs' counts)",
            ylabel="achieved FLOP/s (kernel, median)",
        )
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
        devices = sorted({r.device for r in self.roofs} | {p.device for p in self.points})
        dtypes = sorted({p.dtype for p in self.points})
        fig.suptitle(
            f"roofline: {'; '.join(devices) or 'no device'} ({', '.join(dtypes) or '-'}); "
            "measured roofs solid, datasheet dashed; labels: size (share of its roof)",
            fontsize=8,
        )
        if self.skipped:
            note = "not drawn, no FLOP count in the spec: " + ", ".join(self.skipped)
            fig.text(0.01, 0.005, textwrap.fill(note, 160), fontsize=6, va="bottom")
        return fig

    def save(self, path: str | Path) -> None:
        """Write the picture (SVG or PNG, from the suffix); needs matplotlib."""
        where = Path(path)
        plot.check_suffix(where)
        plot.require("the roofline picture")
        with _svg_text():
            plot.save(self.figure(), where)

    def svg(self) -> str | None:
        """The picture as SVG text, or None without matplotlib."""
        fig = self.figure()
        if fig is None:
            return None
        buf = io.StringIO()
        with _svg_text():
            fig.savefig(buf, format="svg")
        plot.close(fig)
        return buf.getvalue()


@contextlib.contextmanager
def _svg_text() -> Iterator[None]:
    """SVG with its text as text (searchable, smaller) and stable ids from run to run."""
    plt = plot.pyplot()
    if plt is None:
        yield
        return
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "workbench"}):
        yield


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _draw_roof(ax: Any, roof: Roof, lo: float, hi: float, color: str) -> None:
    """The measured roof solid, the datasheet roof dashed, each labelled at its right end."""
    for bw, peak, style, alpha, measured in (
        (roof.bandwidth, roof.peak, "-", 0.9, True),
        (roof.bandwidth_datasheet, roof.peak_datasheet, "--", 0.5, False),
    ):
        if bw is None or (not measured and roof.peak is not None and peak is None):
            continue
        ridge = peak / bw if peak else hi
        xs = [lo, min(ridge, hi)] + ([hi] if peak and ridge < hi else [])
        ys = [min(x * bw, peak) if peak else x * bw for x in xs]
        label = roof.label() if measured else None
        ax.plot(xs, ys, linestyle=style, color=color, alpha=alpha, linewidth=1.5, label=label)
        above = 3 if not measured else -11  # the datasheet roof lies above the measured one
        if peak:
            text = f"{roof.unit}: {rate_text(peak)}" + ("" if measured else " (datasheet)")
            ax.annotate(
                text,
                (hi, peak),
                xytext=(-4, above),
                textcoords="offset points",
                ha="right",
                fontsize=7,
                color=color,
            )
        slope = f"copy {bw / 1e9:.4g} GB/s" + ("" if measured else " (datasheet)")
        x0 = lo * 1.5
        ax.annotate(
            slope,
            (x0, x0 * bw),
            xytext=(6, above),
            textcoords="offset points",
            fontsize=7,
            color=color,
        )
