"""The on-disk cache: layout, atomic writes, and locks that die with their holder.

<root>/v1/obj/<k[:2]>/<key>.o          objects, content-addressed (one per TU and content)
<root>/v1/deps/<family-id>.json        last dependency list of each TU of a family
<root>/v1/lib/<family>/<key>/          a linked library: lib<family>.<key[:16]>.so and
                                       manifest.json, written last (it marks "complete")
<root>/v1/tmp/                         build directories, renamed into place when done
<root>/v1/locks/<family>.lock          fcntl.flock: the OS releases it when the holder dies
<root>/v1/toolchain/<id>.json          cached compiler version probes
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from workbench import knobs
from workbench.errors import CacheError

LAYOUT = "v1"


def root() -> Path:
    """The versioned cache root, created on first use with a clear error if it cannot be."""
    base = knobs.cache_dir()
    path = base / LAYOUT
    try:
        path.mkdir(parents=True, exist_ok=True)
        for sub in ("obj", "deps", "lib", "tmp", "locks"):
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
    return path


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


@contextlib.contextmanager
def lock(name: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive lock on ``locks/<name>.lock`` held by an open file descriptor.

    The kernel drops an flock when the holder exits or is killed, so no lock outlives its
    process. ``on_wait`` is called once if another process holds the lock.
    """
    path = root() / "locks" / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {time.time():.0f}\n".encode())
        yield
    finally:
        os.close(fd)  # closing releases the flock


def make_tmp_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=root() / "tmp"))
