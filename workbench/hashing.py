"""Content hashes for build identity (sha256; never Python's ``hash()``).

File digests are memoised per process by (path, size, mtime, inode), except for files modified
in the last two seconds: an edit that lands within the filesystem's timestamp granularity and
keeps the size would otherwise be missed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

_RACY_SECONDS = 2.0
_memo: dict[str, tuple[tuple[int, int, int], str]] = {}


def file_digest(path: str) -> str | None:
    """sha256 of a file's bytes, or None if it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    hit = _memo.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None
    if time.time() - st.st_mtime_ns / 1e9 > _RACY_SECONDS:
        _memo[path] = (stamp, digest)
    return digest


def digest(*parts: Any) -> str:
    """sha256 over a canonical JSON rendering of ``parts``."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
