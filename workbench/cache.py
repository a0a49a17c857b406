"""The on-disk cache: layout, atomic writes, and locks that die with their holder.

<root>/v1/obj/<k[:2]>/<key>.o          objects, content-addressed (one per TU and content), each
                                       with <key>.json: the compile's seconds and compiler output
<root>/v1/deps/<family-id>.json        last dependency list of each TU of a family
<root>/v1/lib/<family>/<key>/          a linked library: lib<family>.<key[:16]>.so and
                                       manifest.json, written last (it marks "complete")
<root>/v1/failed/<family>.json         the last failed build attempt of a family (for wb status)
<root>/v1/tmp/<family>-<pid>-*/        build directories, renamed into place when done
<root>/v1/locks/<name>.lock            fcntl.flock: the OS releases it when the holder dies
<root>/v1/toolchain/<id>.json          cached compiler version probes
<root>/v1/pch/<id>/wb/torch_pch.h.gch  the precompiled torch header, first on binding TUs' path
<root>/v1/team-cache.json              sccache's counters over the last build through a launcher
<root>/v1/cubin/<k[:2]>/<key>.cubin    NVRTC's cubins of device-only TUs, with <key>.json
<root>/v1/warm/                        warm-start records: <id>.json per registry (the libraries'
                                       stamps), device.json (device-only TUs), specs.json (what
                                       each spec.py text declares)
<root>/v1/specs/<key>.code             the compiled code of each spec.py text

Locks: ``<family>.lock`` serialises the builds of a family and the removal of its libraries;
``objects.lock`` is held shared by every build and exclusively by whoever deletes objects;
a family's use lock, one byte of ``use.lock`` (see :func:`use_locks`), is held shared by a process
from finding the family's library to opening it and exclusively by ``wb gc`` / ``wb clean`` while
they remove its libraries, so a library is never removed between the check that found it and the
``dlopen`` that maps it (once mapped, a process keeps its copy). Lock order: the use lock before
``<family>.lock``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import struct
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from workbench import knobs
from workbench.errors import CacheError

T = TypeVar("T")

LAYOUT = "v1"
SUBDIRS = ("obj", "deps", "lib", "tmp", "locks", "failed")
# A full disk, a quota, or a file-size limit: each reads as "no room for the build".
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


# Cache roots this process has made and checked, by the knobs that place them: root() is called
# for every object, library and spec a load touches (about 250 calls for 30 families), and its
# seven mkdirs and access check were 14 ms of a 30-family warm start. A root removed since (a
# test, `rm -rf`) is made again: one stat of its last folder tells.
_ready: dict[tuple[str | None, ...], tuple[Path, str]] = {}


def location() -> tuple[str | None, ...]:
    """The knobs that place the cache: equal tuples, the same cache folder (nothing read)."""
    return (knobs.get("WB_CACHE_DIR"), knobs.get("XDG_CACHE_HOME"), os.environ.get("HOME"))


def per_cache(table: dict[tuple[str | None, ...], T], make: Callable[[], T]) -> T:
    """What ``table`` keeps for the current cache folder, made by ``make`` on first use: one
    object per cache folder and process (a record read once, saved when changed)."""
    where = location()
    found = table.get(where)
    if found is None:
        found = table[where] = make()
    return found


def root() -> Path:
    """The versioned cache root, created on first use with a clear error if it cannot be."""
    where = location()
    known = _ready.get(where)
    if known is not None and os.path.isdir(known[1]):
        return known[0]
    base = knobs.cache_dir()
    path = base / LAYOUT
    try:
        path.mkdir(parents=True, exist_ok=True)
        for sub in SUBDIRS:
            (path / sub).mkdir(exist_ok=True)
    except OSError as e:
        raise CacheError(
            f"cache directory {base} is not usable ({e.strerror}); "
            "set WB_CACHE_DIR to a writable folder"
        ) from e
    if not os.access(path, os.W_OK):
        raise CacheError(
            f"cache directory {base} is not writable; set WB_CACHE_DIR to a writable folder"
        )
    _ready[where] = (path, os.path.join(path, SUBDIRS[-1]))
    return path


def no_space_error(e: OSError, what: str) -> CacheError:
    """The error for a write that failed for lack of room, naming the cache and the knob."""
    return CacheError(
        f"{what}: no space left for the cache in {knobs.cache_dir()} ({e.strerror}); "
        f"{free_space_text()}. Free space (`wb gc --max-size SIZE`) or set WB_CACHE_DIR to a "
        "folder on a disk with room"
    )


def free_space_text() -> str:
    try:
        st = os.statvfs(knobs.cache_dir())
    except OSError:
        return "free space unknown"
    return f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB free there"


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside ``path`` and rename it into place."""
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def lock_path(name: str) -> Path:
    return root() / "locks" / f"{name}.lock"


@contextlib.contextmanager
def lock(
    name: str, on_wait: Callable[[], None] | None = None, shared: bool = False
) -> Iterator[None]:
    """A lock on ``locks/<name>.lock`` held by an open file descriptor (exclusive by default).

    The kernel drops an flock when the holder exits or is killed, so no lock outlives its
    process. ``on_wait`` is called once if another process holds the lock.
    """
    fd = os.open(lock_path(name), os.O_RDWR | os.O_CREAT, 0o644)
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, mode)
        if not shared:
            _record_holder(fd)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _record_holder(fd: int) -> None:
    """Write "pid time" into the lock file, for ``wb doctor``; a full disk only loses that."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {time.time():.0f}\n".encode())


USE_LOCKS = "use"  # locks/use.lock: a byte per family


def _use_byte(family: str) -> int:
    """The offset of ``family``'s byte in ``use.lock``: from a hash of the name, so any process
    finds it alone. Two families that share a byte only make gc and clean more careful."""
    return int.from_bytes(hashlib.sha256(family.encode()).digest()[:4], "little")


def _range_lock(fd: int, kind: int, offset: int, wait: bool) -> bool:
    """An open-file-description lock (``F_OFD_SETLK``: held by the descriptor, dropped when it is
    closed or its process dies) of ``kind`` on one byte; False when ``wait`` is off and it is
    held. ``struct flock``: type, whence, start, length, pid (0), as on every 64-bit Linux."""
    request = struct.pack("hhqqixxxx", kind, os.SEEK_SET, offset, 1, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, request)
    except OSError as e:
        if wait or e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _open_use_locks() -> int:
    return os.open(lock_path(USE_LOCKS), os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def use_locks(families: Iterable[str]) -> Iterator[None]:
    """Shared use locks on ``families``, for a load: held from finding to opening libraries.

    Shared, so loads never wait for each other; ``wb gc`` skips, and ``wb clean`` waits for,
    a family a process is loading. All of them are bytes of one file, so a load of 30 families
    opens one file (a profile on an H100 host put 5 ms of a 30-family warm start in the opens
    of one lock file per family).
    """
    fd = _open_use_locks()
    try:
        for family in sorted(set(families)):
            _range_lock(fd, fcntl.F_RDLCK, _use_byte(family), wait=True)
        yield
    finally:
        os.close(fd)  # closing releases every lock it holds


@contextlib.contextmanager
def use_lock_exclusive(
    family: str, on_wait: Callable[[], None] | None = None, wait: bool = True
) -> Iterator[bool]:
    """``family``'s use lock, exclusively: for removing its libraries. Yields False (holding
    nothing) when ``wait`` is off and a process is loading the family; otherwise waits, calling
    ``on_wait`` once first."""
    fd = _open_use_locks()
    try:
        offset = _use_byte(family)
        free = _range_lock(fd, fcntl.F_WRLCK, offset, wait=False)
        if not free and wait:
            if on_wait is not None:
                on_wait()
            free = _range_lock(fd, fcntl.F_WRLCK, offset, wait=True)
        yield free
    finally:
        os.close(fd)


@contextlib.contextmanager
def try_lock(name: str) -> Iterator[bool]:
    """An exclusive lock taken only if free: yields False (holding nothing) when busy."""
    fd = os.open(lock_path(name), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            yield False
            return
        _record_holder(fd)
        yield True
    finally:
        os.close(fd)


def lock_holder(name: str) -> int | None:
    """The pid recorded by the process holding ``name`` now, or None if it is free."""
    path = root() / "locks" / f"{name}.lock"
    with try_lock(name) as free:
        if free:
            return None
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1  # held, by a process that has not written its pid yet


def make_tmp_dir(prefix: str) -> Path:
    """A fresh build directory; its name carries this pid so that gc can find dead ones."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=root() / "tmp"))


def tmp_owner(path: Path) -> int | None:
    """The pid that made build directory ``path``, from its name."""
    parts = path.name.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_entry(
    folder: Path, key: str, file_field: str
) -> tuple[dict[str, Any], Path | None] | None:
    """A complete cache entry for ``key``: (its manifest, its checked file or None), else None.

    The manifest is written last, so an entry without one is incomplete. The file named by
    ``manifest[file_field]`` must match the manifest's sha256; a truncated or corrupted entry
    is reported as missing and left in place: the build that follows replaces it under its
    lock (:func:`install_entry`). Never raises for a missing entry.
    """
    from workbench.hashing import file_digest

    manifest = read_json(folder / "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return None
    name = manifest.get(file_field)
    if name is None:
        return manifest, None
    path = folder / str(name)
    if file_digest(str(path)) != manifest.get("sha256"):
        return None
    return manifest, path


def install_entry(folder: Path, final: Path, intact: Callable[[], bool]) -> None:
    """Rename a finished build ``folder`` to ``final``; call under the entry's build lock.

    An entry already at ``final`` was refused by :func:`read_entry` under that lock (damaged),
    so it is replaced; a process that has its file mapped keeps its copy (Linux frees an
    unlinked file only when its last mapping goes). If the rename still fails, another writer
    finished the same key first (caches shared without our lock): ``intact()`` says whether
    theirs is as good as ours.
    """
    import shutil

    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.rename(folder, final)
    except OSError:
        if not intact():
            raise
