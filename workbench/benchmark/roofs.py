"""Which roof a benchmark row stands under, and how far below it: pure arithmetic, no torch.

A row's arithmetic intensity is its spec's FLOP count over its bytes moved (FLOP/B). A device
has two kinds of roof: its measured copy bandwidth (B/s, :mod:`.calibrate`) and a measured
compute peak per unit (FLOP/s, :mod:`.peaks`). The unit follows the dtype: the tensor cores for
float16 and bfloat16, and for float32 where the op's spec allows TF32 (``OpSpec.allow_tf32``);
the CUDA cores for float32 otherwise; float64 as cuBLAS runs it (the FP64 tensor cores of an
A100, H100 or H200); on a CPU the matmul rate of the dtype.

The ridge point is peak / bandwidth. A row whose intensity lies below it is memory bound (the
rate it can attain is intensity * bandwidth), one above it compute bound (it can attain the
peak): attainable = min(peak, intensity * bandwidth). The row's limit is its share of that:
achieved FLOP/s over attainable, which is the time the roofs allow, max(bytes / bandwidth,
flops / peak), over the measured time (the same number, and defined for a row that counts bytes
but no FLOPs: its share of the copy bandwidth).

The datasheet figures are NVIDIA's (dense: half the figure quoted with sparsity; boost clock),
printed beside the measured peak; a device not listed shows the measured one only.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

MEMORY, COMPUTE = "memory", "compute"
COPY_ROOF = "copy bandwidth"


@dataclass(frozen=True)
class Unit:
    """A compute roof: ``key`` names it in the cache and the JSON ("bf16 tensor core"),
    ``short`` in the default table ("TC"); ``dtype`` and ``tf32`` say how to calibrate it."""

    key: str
    short: str
    dtype: str  # torch dtype name of the calibration's matmul
    tf32: bool = False


_ABBR = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}


def unit_for(dtype: str, device_type: str, allow_tf32: bool = False) -> Unit | None:
    """The compute roof of ``dtype`` on ``device_type`` ("cpu" or "cuda"); None for a dtype
    with no floating-point peak (integers, booleans): such rows stand under the memory roof."""
    dtype = dtype.removeprefix("torch.")
    if dtype not in _ABBR:
        return None
    abbr = _ABBR[dtype]
    if device_type != "cuda":
        return Unit(f"cpu {abbr}", "CPU", dtype)
    if dtype in ("float16", "bfloat16"):
        return Unit(f"{abbr} tensor core", "TC", dtype)
    if dtype == "float32" and allow_tf32:
        return Unit("tf32 tensor core", "TC", dtype, tf32=True)
    if dtype == "float32":
        return Unit("fp32 CUDA core", "FP32", dtype)
    return Unit("fp64", "FP64", dtype)


def units_of(device_type: str) -> list[Unit]:
    """Every compute roof of a device type, as ``wb bench --calibrate`` measures them."""
    names = ("bfloat16", "float16", "float32", "float64")
    found = [unit_for(d, device_type) for d in names]
    if device_type == "cuda":
        found.insert(2, unit_for("float32", device_type, allow_tf32=True))
    return [u for u in found if u is not None]


# Datasheet figures, dense, TFLOP/s per unit key and memory bandwidth in TB/s, by a pattern of
# torch's device name (the first that matches). "fp64" is the FP64 tensor-core figure where the
# GPU has them (cuBLAS runs float64 matmuls on them). Sources: the NVIDIA H100, H200, A100, L4,
# L40, L40S, A10, V100 and T4 datasheets and the Ada (RTX 4090) and Ampere (RTX 3090) whitepapers
# (tensor-core figures with float32 accumulation).
_HOPPER_SXM = {"bf16": 989.5, "fp16": 989.5, "tf32": 494.7, "fp32": 66.9, "fp64": 66.9}
_HOPPER_PCIE = {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2, "fp64": 51.2}
_HOPPER_NVL = {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0, "fp64": 60.0}
_A100 = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5, "fp64": 19.5}
DATASHEET: list[tuple[str, dict[str, float], float]] = [
    (r"H100.*PCIe", _HOPPER_PCIE, 2.0),
    (r"H100.*NVL", _HOPPER_NVL, 3.9),
    (r"H100", _HOPPER_SXM, 3.35),
    (r"H200.*NVL", _HOPPER_NVL, 4.8),
    (r"H200", _HOPPER_SXM, 4.8),
    (r"A100.*(PCIE-40GB|40GB.*PCIe)", _A100, 1.555),
    (r"A100.*(PCIE|PCIe)", _A100, 1.935),
    (r"A100.*40GB", _A100, 1.555),
    (r"A100", _A100, 2.039),
    (r"L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}, 0.864),
    (r"L40\b", {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5}, 0.864),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}, 0.3),
    (r"RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}, 1.008),
    (r"RTX 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}, 0.936),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}, 0.6),
    (r"V100.*PCIE", {"fp16": 112.0, "fp32": 14.0, "fp64": 7.0}, 0.9),
    (r"V100", {"fp16": 125.0, "fp32": 15.7, "fp64": 7.8}, 0.9),
    (r"\bT4\b", {"fp16": 65.0, "fp32": 8.1}, 0.32),
]


def _datasheet_row(device: str) -> tuple[dict[str, float], float] | None:
    if device.startswith("cpu"):
        return None
    name = device.split(" (")[0]  # calibrate.device_name: "NVIDIA H100 80GB HBM3 (sm_90, ...)"
    for pattern, peaks, tbps in DATASHEET:
        if re.search(pattern, name, re.IGNORECASE):
            return peaks, tbps
    return None


def datasheet_peak(device: str, unit: Unit | str) -> float | None:
    """The datasheet FLOP/s of ``unit`` on ``device`` (a calibrate.device_name), or None."""
    key = unit.key if isinstance(unit, Unit) else unit
    row = _datasheet_row(device)
    if row is None or key.startswith("cpu"):
        return None
    tflops = row[0].get(key.split()[0])
    return None if tflops is None else tflops * 1e12


def datasheet_bandwidth(device: str) -> float | None:
    """The datasheet memory bandwidth of ``device`` in B/s, or None."""
    row = _datasheet_row(device)
    return None if row is None else row[1] * 1e12


def rate_text(flops_per_s: float) -> str:
    """A FLOP rate for people: TFLOP/s from 1e12 up, GFLOP/s below (a CPU's fp16 can be slow)."""
    if flops_per_s >= 1e12:
        return f"{flops_per_s / 1e12:.4g} TFLOP/s"
    return f"{flops_per_s / 1e9:.4g} GFLOP/s"


def intensity(flops: int, nbytes: int) -> float | None:
    """FLOP per byte moved; None where no bytes are counted."""
    return flops / nbytes if nbytes > 0 else None


def ridge(peak: float, bandwidth: float) -> float:
    """The intensity (FLOP/B) where the memory roof meets the compute roof."""
    return peak / bandwidth


def roof_of(flops: int, nbytes: int, peak: float | None, bandwidth: float) -> str:
    """MEMORY or COMPUTE: which roof a row of ``flops`` over ``nbytes`` stands under.

    Below the ridge (or with no FLOPs, or no peak for its dtype) the memory roof; at or above it
    the compute roof; with FLOPs but no bytes counted, the compute roof.
    """
    if peak is None or flops <= 0:
        return MEMORY
    if nbytes <= 0:
        return COMPUTE
    return COMPUTE if flops / nbytes >= ridge(peak, bandwidth) else MEMORY


def attainable(flops: int, nbytes: int, peak: float | None, bandwidth: float) -> float | None:
    """The FLOP/s the roofs allow a row: min(peak, intensity * bandwidth); None without FLOPs."""
    if flops <= 0:
        return None
    rate = intensity(flops, nbytes)
    by_memory = rate * bandwidth if rate is not None else float("inf")
    return min(peak, by_memory) if peak is not None else by_memory


@dataclass(frozen=True)
class PeakInfo:
    """A compute roof as a row carries it: measured and datasheet FLOP/s and how it was read."""

    unit: str
    short: str
    flops_per_s: float
    datasheet_flops_per_s: float | None
    detail: str
    measured: float = 0.0  # unix time of the calibration


@dataclass(frozen=True)
class Limit:
    """How far one row stands below its roof (see the module docstring)."""

    intensity: float | None  # FLOP/B; None: no bytes counted
    bound: str  # MEMORY or COMPUTE
    bandwidth: float  # measured copy bandwidth, B/s
    bandwidth_datasheet: float | None
    peak: PeakInfo | None  # the dtype's compute roof; None: no FLOPs or no peak for the dtype
    share: float  # the row's share of the roof it stands under

    @property
    def roof(self) -> str:
        """The roof's name: "copy bandwidth" or the unit's, e.g. "bf16 tensor core"."""
        return self.peak.unit if self.bound == COMPUTE and self.peak else COPY_ROOF

    @property
    def roof_value(self) -> float:
        """B/s for the memory roof, FLOP/s for a compute roof."""
        return self.peak.flops_per_s if self.bound == COMPUTE and self.peak else self.bandwidth

    @property
    def ridge(self) -> float | None:
        return ridge(self.peak.flops_per_s, self.bandwidth) if self.peak else None

    def short(self) -> str:
        """The default table's tag: "mem", or the compute unit's ("TC", "FP32", "CPU")."""
        return self.peak.short if self.bound == COMPUTE and self.peak else "mem"

    def text(self) -> str:
        """The wide table's cell, e.g. '71% of bf16 tensor core peak (measured 756 TFLOP/s;
        datasheet 989)' or '83% of copy bandwidth (measured 3010 GB/s; datasheet 3350)'."""
        if self.bound == COMPUTE and self.peak is not None:
            sheet = self.peak.datasheet_flops_per_s
            what, value = f"{self.peak.unit} peak", rate_text(self.peak.flops_per_s)
            beside = f"; datasheet {rate_text(sheet)}" if sheet else ""
        else:
            sheet = self.bandwidth_datasheet
            what, value = COPY_ROOF, f"{self.bandwidth / 1e9:.4g} GB/s"
            beside = f"; datasheet {sheet / 1e9:.4g} GB/s" if sheet else ""
        return f"{self.share:.0%} of {what} (measured {value}{beside})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "intensity_flop_per_byte": self.intensity,
            "bound": self.bound,
            "roof": self.roof,
            "roof_value": self.roof_value,
            "roof_units": "FLOP/s" if self.bound == COMPUTE else "B/s",
            "share": self.share,
            "ridge_flop_per_byte": self.ridge,
            "bandwidth_bytes_per_s": self.bandwidth,
            "bandwidth_datasheet_bytes_per_s": self.bandwidth_datasheet,
            "peak": asdict(self.peak) if self.peak else None,
        }


def limit(
    flops: int,
    nbytes: int,
    seconds: float,
    bandwidth: float,
    peak: PeakInfo | None,
    bandwidth_datasheet: float | None = None,
) -> Limit | None:
    """The limit of a row that ran in ``seconds``; None where it counts neither bytes nor
    FLOPs (a training step) or has no time."""
    if seconds <= 0 or not (flops > 0 or nbytes > 0):
        return None
    rate = peak.flops_per_s if peak is not None and flops > 0 else None
    floor = nbytes / bandwidth
    if rate is not None:
        floor = max(floor, flops / rate)
    return Limit(
        intensity=intensity(flops, nbytes),
        bound=roof_of(flops, nbytes, rate, bandwidth),
        bandwidth=bandwidth,
        bandwidth_datasheet=bandwidth_datasheet,
        peak=peak if flops > 0 else None,
        share=floor / seconds,
    )


def peak_line(peak: PeakInfo, bandwidth: float | None = None) -> str:
    """One line for a terminal: the unit, its measured and datasheet peak, the ridge point."""
    sheet = peak.datasheet_flops_per_s
    beside = f" (datasheet {rate_text(sheet)})" if sheet else ""
    ridge_text = f", ridge {peak.flops_per_s / bandwidth:.3g} FLOP/B" if bandwidth else ""
    return (
        f"{peak.unit} peak [{peak.short}]: {rate_text(peak.flops_per_s)}{beside}{ridge_text}; "
        f"{peak.detail}"
    )
