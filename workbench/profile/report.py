"""What ``wb profile`` reads from Nsight Compute and prints: the raw page of ncu's CSV
(``--csv --page raw``) as one :class:`Kernel` per profiled launch, and the table of them.

The raw page is a header row of column names (a launch's identity, then one column per metric,
named as ncu names it), a row of units, and a row per kernel. Values may carry thousands
separators (``1,234,567``) and units other than the base ones where ``--print-units base`` was
not given; both are read here, and a metric ncu could not collect (``n/a``) is None.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from typing import Any

from workbench.cli.table import render

# A launch's identity columns; every other column is a metric.
IDENTITY = (
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
)

# Unit -> factor to the base unit (nanoseconds for time, bytes for sizes).
_SCALE = {
    "nsecond": 1.0,
    "ns": 1.0,
    "usecond": 1e3,
    "us": 1e3,
    "msecond": 1e6,
    "ms": 1e6,
    "second": 1e9,
    "s": 1e9,
    "byte": 1.0,
    "Kbyte": 1e3,
    "Mbyte": 1e6,
    "Gbyte": 1e9,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "Kibyte": 1024.0,
    "Mibyte": 1024.0**2,
    "KiB": 1024.0,
    "MiB": 1024.0**2,
}

DURATION = "gpu__time_duration.sum"
REGISTERS = "launch__registers_per_thread"
SMEM = ("launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic")
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM = (
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
)
L2_HIT = "lts__t_sector_hit_rate.pct"
LOCAL = re.compile(r"^l1tex__t_(bytes|sectors)_pipe_lsu_mem_local_op_(ld|st)\.sum$")
TENSOR = re.compile(r"^sm__pipe_tensor[a-z_]*_cycles_active\.avg\.pct_of_peak_sustained_active$")
# Stall reasons, in the order their families are read: the first family present wins.
STALLS = (
    re.compile(r"^smsp__average_warps_issue_stalled_([a-z_]+)_per_issue_active\.ratio$"),
    re.compile(r"^smsp__average_warp_latency_issue_stalled_([a-z_]+?)(\.ratio)?$"),
    re.compile(r"^smsp__pcsamp_warps_issue_stalled_([a-z_]+)$"),
)


def number(text: str) -> float | None:
    """A value as ncu prints it: ``1,234.5`` -> 1234.5; ``n/a`` or text -> None."""
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def base_value(value: float | None, unit: str) -> float | None:
    """``value`` in its base unit: ``1.5`` ``usecond`` -> 1500 (ns); ``48`` ``Kbyte/block`` ->
    48000 (bytes). Units that are not time or size stay as they are."""
    if value is None:
        return None
    return value * _SCALE.get(unit.split("/")[0].strip(), 1.0)


@dataclass
class Kernel:
    """One profiled launch: its name as ncu prints it (demangled), its launch shape, and every
    metric column of its row (name -> value in base units, or the text where it is not a
    number), with the units ncu gave."""

    name: str
    grid: str
    block: str
    device: str
    metrics: dict[str, float | str | None] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)

    def value(self, *names: str) -> float | None:
        """The first of ``names`` with a number."""
        for name in names:
            v = self.metrics.get(name)
            if isinstance(v, float):
                return v
        return None

    def matching(self, pattern: re.Pattern[str]) -> dict[str, float]:
        return {n: v for n, v in self.metrics.items() if isinstance(v, float) and pattern.match(n)}

    @property
    def duration_ns(self) -> float | None:
        return self.value(DURATION)

    @property
    def registers(self) -> int | None:
        v = self.value(REGISTERS)
        return None if v is None else int(v)

    @property
    def smem_bytes(self) -> int | None:
        parts = [self.value(n) for n in SMEM]
        known = [p for p in parts if p is not None]
        return int(sum(known)) if known else None

    @property
    def local_bytes(self) -> int | None:
        """Bytes loaded and stored to local memory: register spills (and local arrays)."""
        found = {LOCAL.match(n).groups(): v for n, v in self.matching(LOCAL).items()}  # type: ignore[union-attr]
        if not found:
            return None
        total = 0.0
        for op in ("ld", "st"):
            if ("bytes", op) in found:
                total += found["bytes", op]
            elif ("sectors", op) in found:
                total += 32 * found["sectors", op]  # a sector is 32 bytes
        return int(total)

    @property
    def tensor_pct(self) -> float | None:
        """The busiest tensor pipe's share of its peak (None where ncu measured none)."""
        found = self.matching(TENSOR)
        return max(found.values()) if found else None

    @property
    def stalls(self) -> list[tuple[str, float]]:
        """Warp stall reasons, largest first: cycles per issued instruction in each (the
        reasons no warp was held by left out)."""
        for pattern in STALLS:
            found: dict[str, float] = {}
            for name, v in self.matching(pattern).items():
                reason = pattern.match(name).group(1)  # type: ignore[union-attr]
                if reason != "selected" and not reason.endswith("_not_issued") and v > 0:
                    found[reason] = v
            if found:
                return sorted(found.items(), key=lambda kv: -kv[1])
        return []

    def summary(self) -> dict[str, Any]:
        """The table's columns by name (None where ncu gave no number)."""
        return {
            "name": self.name,
            "duration_us": None if self.duration_ns is None else self.duration_ns / 1e3,
            "grid": self.grid,
            "block": self.block,
            "registers": self.registers,
            "local_bytes": self.local_bytes,
            "smem_bytes": self.smem_bytes,
            "occupancy_pct": self.value(OCCUPANCY),
            "dram_pct": self.value(*DRAM),
            "memory_pct": self.value(MEMORY),
            "sm_pct": self.value(SM),
            "tensor_pct": self.tensor_pct,
            "l2_hit_pct": self.value(L2_HIT),
            "stalls": [[reason, v] for reason, v in self.stalls[:3]],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "device": self.device,
            "metrics": {
                n: {"value": v, "unit": self.units.get(n, "")} for n, v in self.metrics.items()
            },
        }


def parse_raw(text: str) -> list[Kernel]:
    """The kernels of ncu's ``--csv --page raw`` output (other lines around it are skipped:
    ``==PROF==`` progress, the application's own output)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return []
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    units: dict[str, str] = {}
    kernels = []
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        cells = dict(zip(header, row, strict=True))
        if not cells["ID"].strip():  # the units row
            units = {n: u for n, u in cells.items() if n not in IDENTITY}
            continue
        kernels.append(_kernel(cells, units))
    return kernels


def _kernel(cells: dict[str, str], units: dict[str, str]) -> Kernel:
    metrics: dict[str, float | str | None] = {}
    for name, raw in cells.items():
        if name in IDENTITY:
            continue
        value = base_value(number(raw), units.get(name, ""))
        metrics[name] = value if value is not None else (raw.strip() or None)
        if metrics[name] == "n/a":
            metrics[name] = None
    device = cells.get("Device", "")
    shown = metrics.get("device__attribute_display_name")
    return Kernel(
        name=cells.get("Kernel Name", "") or cells.get("Function Name", ""),
        grid=cells.get("Grid Size", ""),
        block=cells.get("Block Size", ""),
        device=shown if isinstance(shown, str) else device,
        metrics=metrics,
        units={n: units.get(n, "") for n in metrics},
    )


def short_name(full: str, width: int = 44) -> str:
    """A demangled kernel name for a table: no return type, no parameter list, no namespaces,
    at most ``width`` characters.

    ``void wb::matmul::simt_kernel<float, 64>(const float*, int)`` -> ``simt_kernel<float, 64>``
    """
    # An anonymous namespace, as ncu prints it ("<unnamed>", seen without its "<" too) or as
    # c++filt does: its unbalanced brackets would cut the name at the wrong place.
    name = re.sub(r"<?unnamed>::|\(anonymous namespace\)::", "", full.strip())
    if name.endswith(")"):  # the parameter list: from the ( that closes the name's last )
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    # The function's own name: after the last "::" or space before its template arguments (a
    # count of brackets would trip on a bracket left unbalanced in them).
    at = name.find("<")
    base, args = (name, "") if at < 0 else (name[:at], name[at:])
    base = re.split(r"::| ", base)[-1]
    name = base + re.sub(r"\b\w+::", "", args)  # namespaces within template arguments
    return name if len(name) <= width else name[: width - 3] + "..."


def _dim(text: str) -> str:
    """``(256, 1, 1)`` -> ``256``; ``(64, 32, 1)`` -> ``64x32``."""
    parts = re.findall(r"\d+", text)
    while len(parts) > 1 and parts[-1] == "1":
        parts.pop()
    return "x".join(parts) if parts else text


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for shift, unit in ((20, "Mi"), (10, "Ki")):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f}{unit}"
    return str(n)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _cell(v: float | str | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return v


def _us(ns: float | None) -> str:
    if ns is None:
        return "-"
    us = ns / 1e3
    return f"{us:.2f}" if us < 10 else f"{us:.1f}"


HEADERS = [
    "kernel",
    "time us",
    "grid",
    "block",
    "regs",
    "local B",
    "smem B",
    "occ %",
    "DRAM %",
    "SM %",
    "TC %",
    "L2 hit %",
    "top stalls (cycles/issue)",
]


def table(kernels: list[Kernel], extra: list[str] | None = None) -> str:
    """One row per kernel (the columns of ``HEADERS``), then a column per metric in ``extra``."""
    extra = extra or []
    rows = []
    for k in kernels:
        stalls = ", ".join(f"{reason} {v:.1f}" for reason, v in k.stalls[:3]) or "-"
        row: list[object] = [
            short_name(k.name),
            _us(k.duration_ns),
            _dim(k.grid),
            _dim(k.block),
            "-" if k.registers is None else k.registers,
            _bytes(k.local_bytes),
            _bytes(k.smem_bytes),
            _pct(k.value(OCCUPANCY)),
            _pct(k.value(*DRAM)),
            _pct(k.value(SM)),
            _pct(k.tensor_pct),
            _pct(k.value(L2_HIT)),
            stalls,
        ]
        for name in extra:
            v = k.metrics.get(name)
            row.append(_cell(v))
        rows.append(row)
    return render([*HEADERS, *extra], rows)


def extra_columns(kernels: list[Kernel], asked: list[str]) -> list[str]:
    """The columns for metrics the user asked for: each name ncu printed that is one of them
    or that one of them (a ``regex:``, or a name without its suffix) matches."""
    present = list(dict.fromkeys(n for k in kernels for n in k.metrics))
    columns: list[str] = []
    for a in asked:
        if a.startswith("regex:"):
            pattern = re.compile(a.removeprefix("regex:"))
            columns += [n for n in present if pattern.search(n)]
        else:
            columns += [n for n in present if n == a or n.startswith(a + ".")]
    return list(dict.fromkeys(columns))
