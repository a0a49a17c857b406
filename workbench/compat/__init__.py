"""The drop-in for ``torch.utils.cpp_extension.load`` / ``load_inline`` (see ``dropin.py``)."""

from __future__ import annotations

from workbench.compat.dropin import load, load_inline

__all__ = ["load", "load_inline"]
