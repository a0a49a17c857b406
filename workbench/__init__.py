"""The kernel workbench: build, load, reload, check and time C++/CUDA ops for PyTorch.

``import workbench`` does no work: no compiler probing, no CUDA initialisation, no directories
created. Everything happens in :func:`load` and the ``wb`` command.

``workbench.load(path, namespace=..., ...)`` loads a kernel registry;
``workbench.load(name, sources, ...)`` and ``workbench.load_inline(...)`` are drop-ins for
``torch.utils.cpp_extension.load`` / ``load_inline`` (the rule: ``workbench.compat.dispatch``).
``workbench.tune(op)`` times the variants of a family's declared ``TuneSpace`` and keeps the
winners. ``%load_ext workbench`` in IPython adds the notebook magics (``workbench.ipython``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.version import VERSION as __version__

if TYPE_CHECKING:
    from workbench.api import Library
    from workbench.compat.dispatch import load
    from workbench.compat.dropin import load_inline
    from workbench.facade import bench, check, tune
    from workbench.ipython import load_ipython_extension, unload_ipython_extension
    from workbench.tuning.space import TuneSpace

__all__ = [
    "Library",
    "TuneSpace",
    "__version__",
    "bench",
    "check",
    "load",
    "load_inline",
    "load_ipython_extension",
    "tune",
    "unload_ipython_extension",
]

_LAZY = {
    "Library": "workbench.api",
    "bench": "workbench.facade",
    "check": "workbench.facade",
    "load": "workbench.compat.dispatch",
    "load_inline": "workbench.compat.dropin",
    "load_ipython_extension": "workbench.ipython",
    "unload_ipython_extension": "workbench.ipython",
    "TuneSpace": "workbench.tuning.space",
    "tune": "workbench.facade",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
