"""matplotlib for the benchmark's and the tuner's pictures: optional, imported only when a
picture is asked for. Without it there is no picture, and asking to save one says how to get it.

The pictures themselves are drawn by the results that own the data (:mod:`.result`,
:mod:`workbench.tuning.report`); this module holds only what they share.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

SUFFIXES = (".png", ".svg")


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the Agg backend (no display needed), or None without it."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


INSTALL = "pip install matplotlib (or pip install 'workbench[plot]')"


def require(what: str) -> None:
    """Raise, naming the install command, where matplotlib cannot be imported."""
    if pyplot() is None:
        raise WorkbenchError(f"{what} needs matplotlib, which is not installed here: {INSTALL}")


def close(fig: Any) -> None:
    """Free a figure (pyplot keeps every figure it made until it is closed)."""
    plt = pyplot()
    if plt is not None:
        plt.close(fig)


def check_suffix(path: Path) -> None:
    if path.suffix.lower() not in SUFFIXES:
        raise WorkbenchError(f"plot path {path} must end in .png or .svg")


def save(fig: Any | None, path: Path) -> None:
    """Write ``fig`` to ``path`` (PNG or SVG, from the suffix) and close it; ``fig`` None (no
    matplotlib) raises saying how to install it."""
    check_suffix(path)
    if fig is None:
        raise WorkbenchError(f"plotting needs matplotlib: {INSTALL}")
    fig.savefig(path)
    close(fig)


def svg_text(fig: Any | None) -> str | None:
    """``fig`` as SVG text (closed after), or None for no figure."""
    if fig is None:
        return None
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    close(fig)
    return buf.getvalue()
