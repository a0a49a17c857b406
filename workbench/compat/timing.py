"""Where a drop-in translation unit's compile time went: recorded at each compile, read by
``wb why FILE``.

A drop-in ``.cu`` that includes torch's headers spends its seconds in nvcc's front ends, each of
which parses those headers again (the host front end, cicc per arch, the host compile); the
kernels' own machine code (ptxas) is a sliver. The record keeps each pass's seconds (written by
``nvcc_pipeline --times``), whether the host object was reused, and how many of the files the
compile read are torch's, so the explanation is measured, not guessed.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from workbench import cache, ninja
from workbench.hashing import digest

SLOW = 5.0  # seconds: a compile this long gets a pointer to `wb why` on the load line
TORCH_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]((?:torch|ATen|c10)/[^>"]+)[>"]', re.M)
# The pass names nvcc_pipeline writes, in words.
PASSES = {
    "host-pp": "host preprocessor",
    "host-fe": "host front end (cudafe++)",
    "device-pp": "device preprocessor",
    "cicc": "device front end (cicc)",
    "ptxas": "ptxas (the kernels' machine code)",
    "fatbinary": "fatbinary",
    "host-cc": "host compile",
    "fatbin-bytes": "fat binary object",
    "merge": "merge",
}
FRONT_ENDS = ("host-fe", "cicc", "host-cc")


def _file(source: Path) -> Path:
    return cache.root() / "dropin-times" / f"{digest(str(source))[:24]}.json"


def torch_includes(source: Path) -> list[str]:
    """The torch headers (torch/, ATen/, c10/) a source includes itself, in its order. Its
    depfile cannot tell: torch's headers come in through -isystem, which -MMD leaves out."""
    try:
        text = source.read_text(errors="replace")
    except OSError:
        return []
    return TORCH_INCLUDE.findall(text)


def record(
    name: str, sources: list[Path], job: ninja.Job, seconds: float | None, pch: str | None
) -> dict[str, Any]:
    """Keep what the compile of ``job`` (one TU of the drop-in ``name``) took; return it.

    ``pch``: the precompiled header the compile read, or why it read none ("" for a source that
    includes no torch header)."""
    entry: dict[str, Any] = {
        "name": name,
        "sources": [str(s) for s in sources],
        "source": str(job.source),
        "when": time.time(),
        "seconds": seconds,
        "passes": None,
        "host_reused": None,
        "pch": pch,
    }
    times = cache.read_json(ninja.times_file(job))
    if isinstance(times, dict):
        entry["seconds"] = times.get("wall", seconds)
        entry["passes"] = times.get("passes")
        entry["host_reused"] = times.get("host_reused")
    entry["torch_includes"] = torch_includes(job.source)
    path = _file(job.source)
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(path, json.dumps(entry, indent=1))
    return entry


def last(source: Path) -> dict[str, Any] | None:
    """The record of ``source``'s last drop-in compile in this cache, or None."""
    entry = cache.read_json(_file(source.resolve()))
    return entry if isinstance(entry, dict) else None


def _passes(passes: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in passes:
        out[p["kind"]] = out.get(p["kind"], 0.0) + float(p["seconds"])
    return out


def adopt_command(entry: dict[str, Any]) -> str:
    names = " ".join(Path(s).name for s in entry["sources"])
    return f"wb adopt {names} --name {entry['name']}"


def explain(entry: dict[str, Any]) -> list[str]:
    """The record in words: what took the time, why, and what to do."""
    source = Path(entry["source"])
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry["when"]))
    secs = entry["seconds"]
    took = f"{secs:.1f} s" if isinstance(secs, (int, float)) else "an unknown time"
    lines = [f"{source.name}: last compiled {when} in {took} (drop-in {entry['name']})"]
    includes = entry.get("torch_includes") or []
    reads = (
        f"it includes {', '.join(includes)}: thousands of lines of torch's headers"
        if includes
        else ""
    )
    if source.suffix in (".cu", ".cuh"):
        lines += _explain_cuda(entry, reads)
    else:
        lines += _explain_cxx(entry, reads)
    return lines


def _explain_cuda(entry: dict[str, Any], reads: str) -> list[str]:
    out = []
    passes = _passes(entry["passes"] or [])
    if passes:
        shown = [
            f"{PASSES.get(k, k)} {v:.1f} s"
            for k, v in sorted(passes.items(), key=lambda kv: -kv[1])
            if v >= 0.05 or k == "ptxas"
        ]
        out.append("  passes: " + ", ".join(shown))
        if entry.get("host_reused"):
            out.append(
                "  the host compile was skipped: the edit left nvcc's host-side output as it was"
            )
    front = sum(passes.get(k, 0.0) for k in FRONT_ENDS)
    own = passes.get("ptxas", 0.0)
    if passes and reads:
        out.append(
            f"  why: {reads}, which nvcc's front ends parse again in every pass "
            f"({front:.1f} s of pass time), while the kernels' own code took {own:.2f} s of ptxas"
        )
    elif reads:
        out.append(f"  why: {reads}, which nvcc's host and device passes each parse")
    out.append(
        f"  fix: `{adopt_command(entry)}` moves its kernels into a device-only TU "
        "(NAME.kernel.cu, no torch headers) whose edits reload by a module swap in well under a "
        "second; until then, an edit inside a kernel body that moves no line skips the host compile"
    )
    return out


def _explain_cxx(entry: dict[str, Any], reads: str) -> list[str]:
    pch = entry.get("pch")
    reads = reads or "it includes no torch header"
    if pch is None:
        return [f"  {reads}; no precompiled header applies, so it compiles as written"]
    if pch.startswith("with "):
        return [
            f"  {reads}; {pch}: what remains is the code the source itself instantiates",
            f"  fix: move kernels out of it: `{adopt_command(entry)}`",
        ]
    return [
        f"  {reads}; no precompiled header: {pch}",
        "  fix: make the torch header the source's first include (the drop-in then precompiles it"
        " at the next edit), or see docs/adopt.md",
    ]
