"""What ``wb tune`` remembers: the winners of a family's build, and the history of each op's runs.

    <cache>/tune/<family>-<digest(build key, torch version)>.json   the winners (one per build)
    <cache>/tune/history/<op>.jsonl                                  every run's table, appended

A record holds, per op, one table per (device, dtype): the bucket bounds (numel of the first
tensor argument) and each bucket's winning variant; and per variant its point, build key and
library. It is keyed by the build key of the family's *plain* sources and the torch version, so
an edit of any of the family's sources, or another torch, finds no record: that family loads
untuned until it is tuned again, and no other family's record is touched. A new process reads
the record of each loaded family's build (one directory listing per load finds which exist) and
routes its ops (:mod:`workbench.tuning.route`): no timing, no compile.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from workbench import cache
from workbench.hashing import digest

FORMAT = 1
# The winner of a bucket no timed size fell in (declared buckets only): the plain build.
PLAIN = "(plain build)"


def folder() -> Path:
    return cache.root() / "tune"


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def record_name(family: str, build_key: str) -> str:
    """The file name of the record of ``family`` built with ``build_key`` under this torch."""
    return f"{family}-{digest(build_key, torch_version())[:16]}.json"


def listing() -> frozenset[str]:
    """The names of every stored record: one directory read, however many families load."""
    try:
        return frozenset(os.listdir(folder()))
    except OSError:
        return frozenset()


def lookup(
    family: str, build_key: str, names: frozenset[str] | None = None
) -> dict[str, Any] | None:
    """The record of this build of ``family``, or None (``names``: a :func:`listing`)."""
    if names is not None and not names:
        return None  # nothing tuned: the common case of a load, without hashing the key
    name = record_name(family, build_key)
    if names is not None and name not in names:
        return None
    found = cache.read_json(folder() / name)
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        return None
    if found.get("build_key") != build_key or found.get("torch") != torch_version():
        return None
    return found


def table_key(table: dict[str, Any]) -> tuple[str, str]:
    return (table["device"], table["dtype"])


def save_table(
    family: str, build_key: str, op: str, table: dict[str, Any], variants: dict[str, Any]
) -> Path:
    """Store ``table`` (one op's winners on one device and dtype) in the build's record, in
    place of any earlier table of that (op, device, dtype); other tables are kept."""
    path = folder() / record_name(family, build_key)
    record = lookup(family, build_key) or {
        "format": FORMAT,
        "family": family,
        "build_key": build_key,
        "torch": torch_version(),
        "ops": {},
        "variants": {},
    }
    tables = [t for t in record["ops"].get(op, []) if table_key(t) != table_key(table)]
    record["ops"][op] = [*tables, table]
    record["variants"].update(variants)
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(path, json.dumps(record, indent=1, sort_keys=True))
    return path


def forget(family: str, build_key: str, op: str | None = None) -> bool:
    """Remove the build's winners (of ``op`` only, when given); whether anything was removed."""
    path = folder() / record_name(family, build_key)
    record = lookup(family, build_key)
    if record is None:
        return False
    if op is not None and op in record["ops"] and len(record["ops"]) > 1:
        del record["ops"][op]
        cache.write_atomic(path, json.dumps(record, indent=1, sort_keys=True))
        return True
    if op is not None and op not in record["ops"]:
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def _history(op: str) -> Path:
    return folder() / "history" / f"{op}.jsonl"


def append_history(op: str, entry: dict[str, Any]) -> None:
    """Add one run (its table as :meth:`TuneResult.to_dict` gives it) to the op's history."""
    path = _history(op)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"created": time.time(), **entry}, sort_keys=True)
    with open(path, "a", encoding="utf-8") as f:  # one line per run: appends do not interleave
        f.write(line + "\n")


def last_run(op: str, device: str, dtype: str) -> dict[str, Any] | None:
    """The newest stored run of ``op`` on this device name and dtype, or None."""
    try:
        lines = _history(op).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("device") == device and entry.get("dtype") == dtype:
                return dict(entry)
    return None
