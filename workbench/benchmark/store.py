"""Benchmark results kept per build: one JSON file per (op, device, dtype, build key).

    <cache>/bench/results/<op>/<device>/<dtype>/<key[:32]>.json

A later run of the same build replaces its file; ``previous`` finds the newest result of
another build of the op, which is what ``wb bench OP --vs last`` compares against.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from workbench import cache

FORMAT = 1


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def folder(op: str, device: str, dtype: str) -> Path:
    return cache.root() / "bench" / "results" / _slug(op) / _slug(device) / _slug(dtype)


def save(record: dict[str, Any]) -> Path:
    """Write ``record`` (with keys op, device, dtype, build_key, created) under its build key."""
    path = (
        folder(record["op"], record["device"], record["dtype"]) / f"{record['build_key'][:32]}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(path, json.dumps({"format": FORMAT, **record}, indent=1))
    return path


def _records(op: str, device: str, dtype: str) -> list[dict[str, Any]]:
    where = folder(op, device, dtype)
    found = []
    for path in sorted(where.glob("*.json")) if where.is_dir() else []:
        data = cache.read_json(path)
        if isinstance(data, dict) and data.get("format") == FORMAT:
            found.append(data)
    return sorted(found, key=lambda r: float(r.get("created", 0.0)))


def previous(op: str, device: str, dtype: str, build_key: str, which: str) -> dict[str, Any] | None:
    """The stored result to compare against: ``which`` is 'last' (the newest result of another
    build) or a build-key prefix. None when there is none."""
    records = _records(op, device, dtype)
    if which == "last":
        others = [r for r in records if r["build_key"] != build_key]
        return others[-1] if others else None
    matches = [r for r in records if str(r["build_key"]).startswith(which)]
    return matches[-1] if matches else None


def builds(op: str, device: str, dtype: str) -> list[str]:
    """Build keys with stored results, oldest first."""
    return [str(r["build_key"]) for r in _records(op, device, dtype)]
