"""The resources of the kernels a reload changed: one line per kernel, and a warning where it got
worse than the kernel it replaces (see :mod:`workbench.cubin` for what is read and how).

A reload notes, per live family, its build and the module key of each device-only TU
(:func:`snapshot`, a copy of two small dicts). After the swap, :func:`report` reads the kernels
of the translation units whose key changed, before and after: an nvcc TU's cubin from the fat
binary of its object in the cache and its spills from the compile log kept beside it, a
device-only TU's cubins and their NVRTC log. A kernel whose code and resources are the same is
left out, so an edit of one kernel names that kernel. One architecture is read, the newest
``sm_`` of the build (the one the GPU of a one-arch build runs). It reads a few files of the
cache and parses them in Python (about 1.5 ms for an object of 40 kernels), each object once
in an edit loop. A reload reads in a thread (:class:`Reader`, started with the snapshot): the
kernels it may replace while it compiles, and each new object or cubin as the build stores it,
while it links and loads; after the swap only what that thread has not reached is read.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from workbench import build, cache, cubin, device, events

Kernels = dict[str, tuple[cubin.Kernel, str]]  # mangled name -> (kernel, the name shown)


class Live(Protocol):
    """What is read of a live library (``workbench.loader.Handle`` is one)."""

    @property
    def built(self) -> build.Built: ...

    modules: dict[str, tuple[str, ...]]


class Snapshot:
    """A family's live build and the module key of each of its device-only TUs, at one time."""

    __slots__ = ("built", "modules")

    def __init__(self, built: build.Built, modules: dict[str, tuple[str, ...]]) -> None:
        self.built = built
        self.modules = modules


def snapshot(handles: Mapping[str, Live]) -> dict[str, Snapshot]:
    return {name: Snapshot(h.built, dict(h.modules)) for name, h in handles.items()}


def newest_arch(archs: list[str]) -> str | None:
    """The newest ``sm_`` architecture of a build (``sm_90a`` of sm_80 and sm_90a), or None."""
    sms = [a for a in archs if a.startswith("sm_")]
    return max(sms, key=cubin.sm_of) if sms else None


def report(
    before: Mapping[str, Snapshot],
    after: Mapping[str, Snapshot],
    arch: str,
    seconds: dict[str, float] | None = None,
) -> tuple[list[str], list[str]]:
    """(lines, warnings) for the kernels that changed between two snapshots of the families in
    both (see the module docstring). ``seconds`` gets the time spent reading the kernels
    ("read") and comparing and describing them ("lines")."""
    lines: list[str] = []
    warnings: list[str] = []
    spent = {"read": 0.0, "lines": 0.0}
    for family, new in after.items():
        old = before.get(family)
        if old is None or (old.built is new.built and old.modules == new.modules):
            continue
        start = time.perf_counter()
        was, now = _changed_units(old, new, arch)
        spent["read"] += time.perf_counter() - start
        start = time.perf_counter()
        olds = {name: k for name, (k, _) in was.items()}
        for k, previous in cubin.changed(olds, {n: k for n, (k, _) in now.items()}):
            shown = now[k.name][1]
            lines.append(f"{family}: {cubin.describe(k, shown)}")
            warnings += [f"{family}: {w}" for w in cubin.warnings_for(k, previous, shown)]
        spent["lines"] += time.perf_counter() - start
    if seconds is not None:
        seconds.update(spent)
    return lines, warnings


def _changed_units(old: Snapshot, new: Snapshot, arch: str) -> tuple[Kernels, Kernels]:
    """The kernels of the TUs whose key differs between ``old`` and ``new``, in each."""
    was, now = _objects(old.built), _objects(new.built)
    before: Kernels = {}
    after: Kernels = {}
    for source, key in now.items():
        if was.get(source) != key:
            after.update(_object_kernels(key, arch))
            if source in was:
                before.update(_object_kernels(was[source], arch))
    for file, keys in new.modules.items():
        if old.modules.get(file) != keys:
            after.update(_module_kernels(keys, arch))
            before.update(_module_kernels(old.modules.get(file, ()), arch))
    return before, _unique_names(after)


def _objects(built: build.Built) -> dict[str, str]:
    """Each nvcc TU of a build and the key of its object."""
    tus = built.manifest.get("tus", [])
    return {str(t["source"]): str(t["key"]) for t in tus if t.get("kind") == "cuda"}


# What was read, by (object or cubin key, arch): a reload's new kernels are the next reload's old
# ones, so an edit loop reads each object once. The latest few are kept.
_read: dict[tuple[str, str], Kernels] = {}
_KEPT = 128
_lock = threading.Lock()


def _remembered(key: str, arch: str, read: Callable[[str, str], Kernels]) -> Kernels:
    with _lock:
        found = _read.get((key, arch))
    if found is None:
        found = read(key, arch)
        with _lock:
            _read[(key, arch)] = found
            while len(_read) > _KEPT:
                del _read[next(iter(_read))]
    return found


def forget() -> None:
    """Drop every kernel read so far (the next reads go to the cache's files)."""
    with _lock:
        _read.clear()


def remembered(key: str, arch: str) -> bool:
    """Whether the kernels of the object or cubin ``key`` for ``arch`` were read already."""
    with _lock:
        return (key, arch) in _read


class Reader:
    """A reload's reader of kernels, in a thread: first the kernels of every CUDA TU of
    ``snapshots`` (those the reload may replace, read while it compiles), then each new object
    or cubin as the build stores it (``events.stored_hooks``: read while the reload links and
    loads), until :meth:`close`. ``seconds``: the time the thread spent reading."""

    def __init__(self, snapshots: Mapping[str, Snapshot], arch: str) -> None:
        self.arch = arch
        self.seconds = 0.0
        self._queue: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        events.stored_hooks.append(self._stored)
        self._thread = threading.Thread(
            target=self._run, args=(dict(snapshots),), name="wb-resources", daemon=True
        )
        self._thread.start()

    @classmethod
    def start(cls, snapshots: Mapping[str, Snapshot], archs: Sequence[str]) -> Reader | None:
        """A reader of the newest ``sm_`` of ``archs``; None where there is none."""
        arch = newest_arch(list(archs))
        return cls(snapshots, arch) if arch is not None else None

    def _stored(self, kind: str, key: str) -> None:
        self._queue.put((kind, key))

    def _run(self, snapshots: dict[str, Snapshot]) -> None:
        start = time.perf_counter()
        for snap in snapshots.values():
            for key in _objects(snap.built).values():
                _object_kernels(key, self.arch)
            for keys in snap.modules.values():
                _module_kernels(keys, self.arch)
        self.seconds += time.perf_counter() - start
        while (item := self._queue.get()) is not None:
            start = time.perf_counter()
            kind, key = item
            if kind == "object":
                _object_kernels(key, self.arch)
            else:
                _module_kernels((key,), self.arch)
            self.seconds += time.perf_counter() - start

    def close(self) -> float:
        """Stop taking new images and wait for the reads under way; the thread's seconds."""
        with contextlib.suppress(ValueError):  # closed twice
            events.stored_hooks.remove(self._stored)
        self._queue.put(None)
        self._thread.join()
        return self.seconds


def _object_kernels(key: str, arch: str) -> Kernels:
    return _remembered(key, arch, _read_object)


def _read_object(key: str, arch: str) -> Kernels:
    """The kernels for ``arch`` in the object of ``key`` ({} when it is gone from the cache)."""
    try:
        data = build.object_path(key).read_bytes()
    except OSError:
        return {}
    sm = cubin.sm_of(arch)
    try:
        cubins = cubin.fatbin_cubins(data)
        found = next((c for a, c in cubins.items() if cubin.sm_of(a) == sm), None)
        kernels = cubin.read(found, arch) if found is not None else {}
    except ValueError:  # not an image this reader knows: no line, the reload goes on
        return {}
    log = build.compile_log(key).get("output", "") if kernels else ""
    kernels = cubin.with_spills(kernels, str(log))
    return {name: (k, cubin.short_name(name)) for name, k in kernels.items()}


def _module_kernels(keys: tuple[str, ...], arch: str) -> Kernels:
    """The kernels for ``arch`` in the cubins of a device-only TU, by its name expressions."""
    out: Kernels = {}
    for key in keys:
        out.update(_remembered(key, arch, _read_cubin))
    return out


def _read_cubin(key: str, arch: str) -> Kernels:
    """The kernels of the cubin of ``key``, if it is one for ``arch`` ({} where not)."""
    path = device.cubin_path(key)
    meta: Any = cache.read_json(path.with_suffix(".json"))
    if not isinstance(meta, dict) or cubin.sm_of(str(meta.get("arch", ""))) != cubin.sm_of(arch):
        return {}
    try:
        kernels = cubin.read(Path(path).read_bytes(), str(meta["arch"]))
    except (OSError, ValueError):
        return {}
    kernels = cubin.with_spills(kernels, str(meta.get("log", "")))
    names = {v: k for k, v in dict(meta.get("lowered", {})).items()}
    return {n: (k, names.get(n, cubin.short_name(n))) for n, k in kernels.items()}


def _unique_names(kernels: Kernels) -> Kernels:
    """Mangled names where two kernels would show the same short name (two instantiations)."""
    seen: dict[str, int] = {}
    for _, shown in kernels.values():
        seen[shown] = seen.get(shown, 0) + 1
    return {n: (k, shown if seen[shown] == 1 else n) for n, (k, shown) in kernels.items()}
