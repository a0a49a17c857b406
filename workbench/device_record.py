"""What the device-only layer (:mod:`workbench.device`) keeps of its compiles: the cubin of each
device-only TU as an :class:`Image`, and the warm record of each TU's last cubins by the stamps of
its inputs (:class:`Warm`), so that a warm start finds them without reading a header."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench import cache
from workbench.hashing import file_digest


class Image:
    """One cubin of a device-only TU: its architecture, cache key, file and lowered names."""

    __slots__ = ("arch", "file", "key", "lowered", "seconds")

    def __init__(self, arch: str, key: str, path: str | Path, lowered: dict[str, str]) -> None:
        self.arch = arch
        self.key = key
        self.file = os.fspath(path)  # a string: a warm start hands it on without a Path
        self.lowered = lowered
        self.seconds = 0.0  # compile time; 0 for a cache hit

    @property
    def path(self) -> Path:
        return Path(self.file)

    def record(self) -> dict[str, Any]:
        """What its compile recorded: seconds, NVRTC's log, options, headers ({} if unknown)."""
        meta = cache.read_json(self.path.with_suffix(".json"))
        return meta if isinstance(meta, dict) else {}


class Warm:
    """What :func:`workbench.device.ensure` found for each device-only TU, by its inputs' stamps.

    Kept in one file of the cache (``warm/device.json``), read once per process; the same
    racy-timestamp rule as the library index (:mod:`workbench.warm`): a file changed in the last
    two seconds is never recorded, so an edit that keeps size and mtime is not missed.
    """

    def __init__(self) -> None:
        self.path = cache.root() / "warm" / "device.json"
        loaded = cache.read_json(self.path)
        if not isinstance(loaded, dict) or loaded.get("version") != 2:
            loaded = {}
        self.entries: dict[str, Any] = loaded.get("tus", {})
        # The kernels each library's launchers name, by the library's path: a library of the
        # cache is never rewritten under its name (the key is in it), so the list stays true.
        self.kernels: dict[str, list[list[str]]] = loaded.get("kernels", {})
        self.dirty = False
        self.lock = threading.Lock()  # wb tune compiles the modules of its variants in threads

    def kernels_of(
        self, library: Path | None, read: Callable[[], list[tuple[str, str]]]
    ) -> list[tuple[str, str]]:
        """The kernels the launchers of ``library`` name: as recorded when first read (by
        ``read``, :func:`workbench.device.kernel_names`)."""
        key = os.fspath(library) if library is not None else None
        found = self.kernels.get(key) if key is not None else None
        if isinstance(found, list):
            return [(str(f), str(e)) for f, e in found]
        names = read()
        if key is not None:
            with self.lock:
                self.kernels[key] = [[f, e] for f, e in names]
                self.dirty = True
        return names

    def lookup(
        self, source: str, identity: list[Any], seen: dict[str, list[int] | None]
    ) -> list[Image] | None:
        """The images recorded for ``source``, if its inputs are as recorded; ``seen`` holds the
        stamps read by this call's caller (families share the workbench's headers)."""
        from workbench import warm

        entry = self.entries.get(source)
        if not isinstance(entry, dict) or entry.get("identity") != identity:
            return None
        for path, stamp in entry.get("stamps", {}).items():
            if path not in seen:
                seen[path] = warm.read_stamp(path)
            if seen[path] != stamp:
                return None
        images = entry["images"]
        # A cubin removed since (wb gc, wb clean --all) is compiled again, not handed to a
        # library that would fail at the kernel's first launch (one stat per cubin).
        if not all(os.path.exists(i["path"]) for i in images):
            return None
        return [Image(i["arch"], i["key"], i["path"], i["lowered"]) for i in images]

    def record(
        self, source: str, identity: list[Any], inputs: list[str], images: list[Image]
    ) -> None:
        from workbench import warm

        now = time.time()
        stamps = {}
        for path in inputs:  # the cubins are files of the cache, named by their keys
            stamp = warm.stamp_of(path, now)
            if stamp is None:
                with self.lock:
                    if self.entries.pop(source, None) is not None:
                        self.dirty = True
                return
            stamps[path] = list(stamp)
        entry = {
            "identity": identity,
            "stamps": stamps,
            "images": [
                {"arch": i.arch, "key": i.key, "path": i.file, "lowered": i.lowered} for i in images
            ],
        }
        with self.lock:
            self.entries[source] = entry
            self.dirty = True

    def save(self) -> None:
        with self.lock:
            if not self.dirty:
                return
            # Only saved after a build or a first load: the names of libraries gone since (an
            # edit's older builds, removed by wb gc or clean) are dropped then.
            self.kernels = {k: v for k, v in self.kernels.items() if os.path.exists(k)}
            kept = {"version": 2, "tus": self.entries, "kernels": self.kernels}
            text = json.dumps(kept, sort_keys=True)
            self.dirty = False
        with contextlib.suppress(OSError):  # only saves time
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cache.write_atomic(self.path, text)


_warm_state: dict[tuple[str | None, ...], Warm] = {}


def warm() -> Warm:
    """The warm record of the current cache (one per cache folder and process)."""
    return cache.per_cache(_warm_state, Warm)


def cubin_path(key: str) -> Path:
    """Where the cubin of ``key`` is kept; its record (arch, names, NVRTC's log) is beside it,
    with the suffix .json."""
    return cache.root() / "cubin" / key[:2] / f"{key}.cubin"


def cached(arch: str, key: str) -> Image | None:
    """The cubin of ``key`` kept in the cache, if it is whole (its digest as recorded)."""
    path = cubin_path(key)
    meta = cache.read_json(path.with_suffix(".json"))
    if not isinstance(meta, dict) or not path.is_file():
        return None
    if file_digest(str(path)) != meta.get("sha256"):
        return None  # damaged: compiled again, and replaced
    return Image(arch, key, path, dict(meta.get("lowered", {})))
