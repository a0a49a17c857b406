"""The kernel workbench: build, load, reload, check and time C++/CUDA ops for PyTorch.

``import workbench`` does no work: no compiler probing, no CUDA initialisation, no directories
created. Everything happens in :func:`load` and the ``wb`` command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from workbench.api import Library, load
    from workbench.benchmark import bench
    from workbench.verify import check

__all__ = ["Library", "__version__", "bench", "check", "load"]


def __getattr__(name: str) -> Any:
    if name in ("load", "Library"):
        from workbench import api

        return getattr(api, name)
    if name == "check":
        from workbench.verify import check

        return check
    if name == "bench":
        from workbench.benchmark import bench

        return bench
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
