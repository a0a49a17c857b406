"""Observers of the build: told of every translation unit compiled, by any backend.

``compile_hooks`` holds callables ``hook(family, source)``, each called once per TU compiled
(nvcc or the host compiler in :mod:`workbench.build`, NVRTC in :mod:`workbench.device`), never
for a cache hit. Tests count compiles with it: a rebuild that should not happen fails a test.

``stored_hooks`` holds callables ``hook(kind, key)``, called as each new CUDA image lands in the
cache: ``("object", key)`` for an nvcc TU's object, ``("cubin", key)`` for a device-only TU's
cubin (from any thread). A reload reads the new kernels' resources meanwhile
(:class:`workbench.resources.Reader`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

compile_hooks: list[Callable[[str, Path], None]] = []
stored_hooks: list[Callable[[str, str], None]] = []


def compiled(family: str, source: Path) -> None:
    """Tell every hook that ``source`` of ``family`` was compiled."""
    for hook in compile_hooks:
        hook(family, source)


def stored(kind: str, key: str) -> None:
    """Tell every hook that the CUDA image ``key`` (an "object" or a "cubin") is in the cache."""
    for hook in list(stored_hooks):
        hook(kind, key)
