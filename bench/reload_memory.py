"""Memory over many edit-and-reload cycles of one ``wb new`` family: does the process grow?

One process loads a one-family registry (``workbench.scaffold``, what ``wb new`` writes) and
then, per cycle: edits the family's kernel (every cycle a new value, so every cycle is a new
build), calls ``lib.reload()``, runs the op and checks the result of the new code. After the
load and after every cycle it reads, from /proc/self: the resident set (VmRSS), the libraries
mapped (``/proc/self/maps``: this family's builds, and every shared object), and the open file
descriptors. With ``--device cuda`` the CUDA kernel is edited and run too (where a GPU is
present), and the GPU memory in use is read as well.

The loader keeps at most two builds of a family mapped (its first, which torch still points
into, and the live one): the ``family libs`` column.

Usage: python -m bench reload_memory [--cycles 200] [--device cpu|cuda] [--every 20]
       [--cache DIR] [--json PATH]
A fresh cache folder is used unless --cache names one (the first build of a fresh cache also
precompiles the torch headers). Prints the environment line, then a markdown table.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import environment, markdown_table, parser, write_json

FAMILY = "reload_mem"
ALPHA = 2.0
SHIFT = 1.0  # the template's shift for family index 1
EDITS = {  # device -> (kernel file, text in the template, the edited text with {k})
    "cpu": (f"{FAMILY}.cpp", "{ return apply(v, a); }", "{{ return apply(v, a) + {k}; }}"),
    "cuda": (
        f"{FAMILY}.cu",
        "{ return apply(x, alpha); }",
        "{{ return apply(x, alpha) + A({k}); }}",
    ),
}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def mapped_libraries() -> tuple[int, int]:
    """(builds of the family mapped, shared objects mapped), from /proc/self/maps."""
    paths = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and ".so" in fields[5]:
            paths.add(fields[5].removesuffix(" (deleted)"))
    family = {p for p in paths if Path(p).name.startswith(f"lib{FAMILY}.")}
    return len(family), len(paths)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def sample(cycle: int, seconds: float, cuda: bool) -> dict[str, Any]:
    import torch

    family_libs, all_libs = mapped_libraries()
    row: dict[str, Any] = {
        "cycle": cycle,
        "rss_mib": round(rss_mib(), 1),
        "family_libs": family_libs,
        "shared_objects": all_libs,
        "fds": open_fds(),
        "reload_s": round(seconds, 3),
    }
    if cuda:
        free, total = torch.cuda.mem_get_info()
        row["gpu_used_mib"] = round((total - free) / 2**20, 1)
    return row


def cycles_of(cycles: int, devices: list[str], every: int) -> list[dict[str, Any]]:
    import torch

    import workbench
    from workbench import scaffold

    edits = dict(EDITS)
    with tempfile.TemporaryDirectory(prefix="wb-reload-mem-") as tmp:
        kernels = Path(tmp) / "kernels"
        scaffold.write_family(kernels, FAMILY, shift=SHIFT)
        lib = workbench.load(kernels, namespace="wb_reload_mem", devices=",".join(devices))
        op = getattr(lib, FAMILY)
        cuda = "cuda" in devices and lib.config.with_cuda
        rows = [sample(0, lib.last.seconds, cuda)]
        for k in range(1, cycles + 1):
            start = time.perf_counter()
            for device in devices:
                name, old, new = edits[device]
                path = kernels / FAMILY / name
                path.write_text(path.read_text().replace(old, new.format(k=k)))
                edits[device] = (name, new.format(k=k), new)
            lib.reload()
            for device in devices if cuda else ["cpu"]:
                x = torch.zeros(4, device=device)
                got = op(x, ALPHA)
                want = torch.full_like(x, SHIFT + k)
                if not torch.equal(got, want):
                    raise SystemExit(f"cycle {k} on {device}: got {got.tolist()}, want {want}")
            seconds = time.perf_counter() - start
            if k == 1 or k % every == 0 or k == cycles:
                rows.append(sample(k, seconds, cuda))
                print(table_row(rows[-1]), file=sys.stderr, flush=True)
        return rows


def table_row(row: dict[str, Any]) -> str:
    return "| " + " | ".join(str(v) for v in row.values()) + " |"


def table(rows: list[dict[str, Any]]) -> str:
    return markdown_table(list(rows[0]), [list(r.values()) for r in rows])


def main(argv: list[str] | None = None) -> None:
    import torch

    from workbench import knobs

    p = parser(__name__, __doc__)
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--every", type=int, default=20, help="print a row every N cycles")
    p.add_argument("--cache", type=Path, help="cache folder (default: a fresh one)")
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no GPU here; measuring the CPU part only", file=sys.stderr)
    devices = ["cpu", "cuda"] if args.device == "cuda" and torch.cuda.is_available() else ["cpu"]
    cache = args.cache or Path(tempfile.mkdtemp(prefix="wb-reload-mem-cache-"))
    try:
        with knobs.override(WB_CACHE_DIR=str(cache), WB_QUIET="1"):
            rows = cycles_of(args.cycles, devices, args.every)
    finally:
        if args.cache is None:
            shutil.rmtree(cache, ignore_errors=True)
    print(environment().line(devices[-1]))
    print(f"{args.cycles} cycles, devices {'+'.join(devices)}")
    print(table(rows))
    write_json(args.json, rows)
