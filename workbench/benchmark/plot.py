"""The benchmark plot: time per call and % of roofline against bytes moved, one line per
candidate (time) and per op (roofline). matplotlib is optional: without it there is no plot."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from workbench.benchmark.result import BenchResult


def _pyplot() -> Any | None:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def figure(result: BenchResult) -> Any | None:
    """A matplotlib figure of ``result``, or None when matplotlib is not installed."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for r in result.ops:
        xs = [s.bytes for s in r.sizes]
        for name in r.sizes[0].times if r.sizes else []:
            ys = [s.times[name].stats.median * 1e6 for s in r.sizes]
            ax_t.plot(xs, ys, marker="o", label=f"{r.op} {name}")
        roof = [s.roofline(r.calibration) for s in r.sizes]
        if all(v is not None for v in roof):
            ax_r.plot(xs, [100 * float(v or 0) for v in roof], marker="o", label=r.op)
    top = max([105.0, *(1.05 * y for line in ax_r.lines for y in line.get_ydata())])
    ax_t.set(xscale="log", yscale="log", xlabel="bytes moved", ylabel="time per call (us)")
    ax_r.set(xscale="log", xlabel="bytes moved", ylabel="% of roofline (kernel)", ylim=(0, top))
    ax_t.legend(fontsize=7)
    if ax_r.lines:
        ax_r.legend(fontsize=7)
    devices = sorted({f"{r.device}, {r.dtype}" for r in result.ops})
    fig.suptitle("; ".join(devices), fontsize=9)
    return fig


def save(result: BenchResult, path: Path) -> None:
    if path.suffix.lower() not in (".png", ".svg"):
        raise WorkbenchError(f"plot path {path} must end in .png or .svg")
    fig = figure(result)
    if fig is None:
        raise WorkbenchError("plotting needs matplotlib: pip install matplotlib")
    fig.savefig(path)
    _close(fig)


def svg_or_none(result: BenchResult) -> str | None:
    fig = figure(result)
    if fig is None:
        return None
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    _close(fig)
    return buf.getvalue()


def _close(fig: Any) -> None:
    plt = _pyplot()
    if plt is not None:
        plt.close(fig)
