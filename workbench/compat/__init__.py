"""The drop-in for ``torch.utils.cpp_extension.load`` / ``load_inline`` (see ``dropin.py``)."""

from __future__ import annotations

from typing import Any

__all__ = ["load", "load_inline"]


def __getattr__(name: str) -> Any:  # lazy: workbench.load of a registry never needs the drop-in
    if name in __all__:
        from workbench.compat import dropin

        return getattr(dropin, name)
    raise AttributeError(f"module 'workbench.compat' has no attribute {name!r}")
