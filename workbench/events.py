"""Observers of the build: told of every translation unit compiled, by any backend.

``compile_hooks`` holds callables ``hook(family, source)``, each called once per TU compiled
(nvcc or the host compiler in :mod:`workbench.build`, NVRTC in :mod:`workbench.device`), never
for a cache hit. Tests count compiles with it: a rebuild that should not happen fails a test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

compile_hooks: list[Callable[[str, Path], None]] = []


def compiled(family: str, source: Path) -> None:
    """Tell every hook that ``source`` of ``family`` was compiled."""
    for hook in compile_hooks:
        hook(family, source)
