"""The bench's limit column: a row's arithmetic intensity from its spec, the roof it stands under
(copy bandwidth below the ridge point, the dtype's compute peak above), its share of that roof,
the compute peaks calibrated once per device and cached, and all of it in the JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import workbench
from workbench import knobs
from workbench.benchmark import calibrate, roofs
from workbench.benchmark.result import (
    ANCHOR,
    COMPILED,
    EAGER,
    KERNEL,
    KERNEL_AA,
    BenchResult,
    Cache,
    OpResult,
    SizeResult,
)
from workbench.benchmark.roofs import COMPUTE, MEMORY, PeakInfo
from workbench.benchmark.stats import Measurement, summarize

ROOT = Path(__file__).resolve().parent.parent
H100 = "NVIDIA H100 80GB HBM3 (sm_90, 50 MiB L2)"
BF16_TC = PeakInfo("bf16 tensor core", "TC", 756e12, 989.5e12, "torch.mm (cuBLAS) ...")


def _spec(family: str, op: str) -> Any:
    loaded = importlib.util.spec_from_file_location(
        f"{family}_spec_limit", ROOT / "kernels" / family / "spec.py"
    )
    assert loaded is not None and loaded.loader is not None
    module: ModuleType = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return next(s for s in module.OPS if s.name == op)


def _counts(spec: Any, *args: Any) -> tuple[int, int]:
    """(flops, bytes) of one call, from the spec's own counts, on meta tensors (no memory)."""
    out = spec.fake(*args)
    return spec.flops(args, out), spec.bytes_moved(args, out)


def test_intensity_and_roof_from_the_specs() -> None:
    """On an H100's measured roofs (3.0 TB/s copy, 756 TFLOP/s bf16): the ridge is 252 FLOP/B;
    a square matmul stands under the tensor-core peak, a 16-row one and muladd under memory."""
    meta = {"device": "meta", "dtype": torch.bfloat16}
    matmul, muladd = _spec("matmul", "matmul"), _spec("muladd", "muladd")
    bw, peak = 3.0e12, 756e12
    assert roofs.ridge(peak, bw) == pytest.approx(252)
    square = _counts(matmul, torch.empty(4096, 4096, **meta), torch.empty(4096, 4096, **meta))
    assert square == (2 * 4096**3, 3 * 4096 * 4096 * 2)
    assert roofs.intensity(*square) == pytest.approx(4096 / 3)
    assert roofs.roof_of(*square, peak, bw) == COMPUTE
    assert roofs.attainable(*square, peak, bw) == peak
    skinny = _counts(matmul, torch.empty(16, 4096, **meta), torch.empty(4096, 4096, **meta))
    rate = roofs.intensity(*skinny)
    assert rate == pytest.approx(2 * 16 * 4096 * 4096 / ((2 * 16 * 4096 + 4096 * 4096) * 2))
    assert roofs.roof_of(*skinny, peak, bw) == MEMORY
    assert roofs.attainable(*skinny, peak, bw) == pytest.approx(rate * bw)
    n = 1 << 20
    elementwise = _counts(muladd, torch.empty(n, **meta), torch.empty(n, **meta), -0.75)
    assert roofs.intensity(*elementwise) == pytest.approx(1 / 3)  # 2 FLOPs per 3 x 2 bytes
    assert roofs.roof_of(*elementwise, peak, bw) == MEMORY
    # No FLOPs counted, or no peak for the dtype: the memory roof; no bytes: the compute roof.
    assert roofs.roof_of(0, 100, peak, bw) == MEMORY
    assert roofs.roof_of(10**9, 100, None, bw) == MEMORY
    assert roofs.roof_of(10**9, 0, peak, bw) == COMPUTE


def test_the_share_is_of_the_roof_the_row_stands_under() -> None:
    flops, nbytes = 2 * 8192**3, 3 * 8192 * 8192 * 2
    at_70 = flops / (0.7 * 756e12)  # the seconds of a matmul at 70% of the peak
    lim = roofs.limit(flops, nbytes, at_70, 3.0e12, BF16_TC, 3.35e12)
    assert lim is not None and lim.bound == COMPUTE and lim.roof == "bf16 tensor core"
    assert lim.share == pytest.approx(0.7) and lim.roof_value == 756e12
    assert lim.ridge == pytest.approx(252) and lim.short() == "TC"
    assert lim.text() == (
        "70% of bf16 tensor core peak (measured 756 TFLOP/s; datasheet 989.5 TFLOP/s)"
    )
    copy = roofs.limit(2 * 10**6, 12 * 10**6, 12e6 / (0.83 * 3.0e12), 3.0e12, BF16_TC, 3.35e12)
    assert copy is not None and copy.bound == MEMORY and copy.roof == "copy bandwidth"
    assert copy.share == pytest.approx(0.83) and copy.roof_value == 3.0e12
    assert copy.text() == "83% of copy bandwidth (measured 3000 GB/s; datasheet 3350 GB/s)"
    no_flops = roofs.limit(0, 12 * 10**6, 12e6 / 1.5e12, 3.0e12, BF16_TC)
    assert no_flops is not None and no_flops.peak is None and no_flops.share == pytest.approx(0.5)
    assert no_flops.intensity == 0 and no_flops.text().endswith("(measured 3000 GB/s)")
    assert roofs.limit(0, 0, 1e-3, 3.0e12, BF16_TC) is None  # a training step counts nothing


def test_units_and_datasheet_figures() -> None:
    unit = roofs.unit_for
    assert unit("bfloat16", "cuda") == roofs.Unit("bf16 tensor core", "TC", "bfloat16")
    assert unit("torch.float16", "cuda").key == "fp16 tensor core"  # type: ignore[union-attr]
    assert unit("float32", "cuda", allow_tf32=True).key == "tf32 tensor core"  # type: ignore[union-attr]
    assert unit("float32", "cuda").short == "FP32"  # type: ignore[union-attr]
    assert unit("float64", "cuda").short == "FP64"  # type: ignore[union-attr]
    assert unit("float32", "cpu") == roofs.Unit("cpu fp32", "CPU", "float32")
    assert unit("int32", "cuda") is None and unit("uint8", "cpu") is None
    assert [u.key for u in roofs.units_of("cuda")] == [
        "bf16 tensor core",
        "fp16 tensor core",
        "tf32 tensor core",
        "fp32 CUDA core",
        "fp64",
    ]
    sheet = roofs.datasheet_peak
    assert sheet(H100, "bf16 tensor core") == pytest.approx(989.5e12)
    assert sheet("NVIDIA H100 PCIe (sm_90, 50 MiB L2)", "bf16 tensor core") == 756.5e12
    assert sheet("NVIDIA H200 (sm_90, 60 MiB L2)", "tf32 tensor core") == 494.7e12
    assert sheet("NVIDIA A100-SXM4-80GB (sm_80, 40 MiB L2)", "fp64") == 19.5e12
    assert sheet("NVIDIA L40S (sm_89, 96 MiB L2)", "fp32 CUDA core") == 91.6e12
    assert sheet("NVIDIA L40 (sm_89, 96 MiB L2)", "bf16 tensor core") == 181e12
    assert sheet("NVIDIA L4 (sm_89, 48 MiB L2)", "bf16 tensor core") == 121e12
    assert sheet("NVIDIA GeForce RTX 4090 (sm_89, 72 MiB L2)", "fp16 tensor core") == 165.2e12
    assert sheet("Tesla T4 (sm_75, 4 MiB L2)", "bf16 tensor core") is None  # no bf16 there
    assert sheet("NVIDIA GeForce GTX 1080 (sm_61, 2 MiB L2)", "fp32 CUDA core") is None
    assert sheet("cpu: x86_64, 2 threads", "cpu fp32") is None
    assert roofs.datasheet_bandwidth(H100) == 3.35e12
    assert roofs.datasheet_bandwidth("NVIDIA A100-SXM4-40GB (sm_80, 40 MiB L2)") == 1.555e12
    assert roofs.datasheet_bandwidth("cpu: x86_64, 2 threads") is None


def _size(label: str, nbytes: int, flops: int, seconds: float, cands: tuple[str, ...]) -> Any:
    m = Measurement(summarize([seconds * 0.99, seconds, seconds * 1.01]), "events")
    lim = roofs.limit(flops, nbytes, seconds, 3.0e12, BF16_TC if flops else None, 3.35e12)
    return SizeResult(label, nbytes, flops, dict.fromkeys(cands, m), limit=lim)


def test_the_default_table_fits_120_columns_with_the_widest_cells() -> None:
    """matmul_path's labels, 4-digit intensities, a limit past 1000% in L2, every vs column."""
    every = (KERNEL, KERNEL_AA, EAGER, COMPILED, ANCHOR)
    sizes = [
        _size("8192x8192x1024", 3 * 8192 * 1024 * 2, 2 * 8192**2 * 1024, 1.1e-3, every),
        _size("16x4096x4096", 16 * 4096 * 2 + 4096**2 * 4, 2 * 16 * 4096**2, 123456.7e-6, every),
        _size("4096^3 wgmma", 3 * 4096**2 * 2, 2 * 4096**3, 0.2e-3, every),
        _size("64Ki", 64 << 10, 0, 2e-9, every),  # 1092% of the copy bandwidth, in L2
    ]
    op = OpResult("matmul_path", H100, "cuda", "bfloat16", "k" * 64, sizes, None)
    op.cache = Cache("L2", 50 << 20)
    result = BenchResult([op])
    table = result.table()
    lines = table.splitlines()
    assert max(len(ln) for ln in lines) <= 120, table
    assert "FLOP/B" in lines[1] and "limit" in lines[1] and "vs anchor" in lines[1]
    assert "1365" in lines[5] and "91% TC" in lines[5] and "1092% L2" in lines[6]
    assert "% mem" in lines[4]  # 16 rows: 15.9 FLOP/B, below the ridge
    assert any(ln.startswith("note: limit:") for ln in lines)
    assert "TC = the dtype's tensor-core peak" in " ".join(table.split())
    wide = result.table(wide=True)
    assert "of bf16 tensor core peak (measured 756 TFLOP/s; datasheet 989.5 TFLOP/s)" in wide
    assert "of copy bandwidth (measured 3000 GB/s; datasheet 3350 GB/s); the bytes fit" in wide
    assert result.roof_lines() == [
        "bf16 tensor core peak [TC]: 756 TFLOP/s (datasheet 989.5 TFLOP/s), ridge 252 FLOP/B; "
        "torch.mm (cuBLAS) ..."
    ]


def test_the_cpu_peak_is_measured_once_and_reused(lib: Any, tmp_path: Path) -> None:
    """Two real bench runs of a FLOP-counting op in a fresh cache: the first measures the CPU's
    float32 peak and writes it beside the copy ceiling, the second reads it (same calibration
    time, the file untouched)."""
    cpu = torch.device("cpu")
    start = time.time()
    fast = {"device": "cpu", "compile": False, "min_time": 0.02, "save": False}
    with knobs.override(WB_CACHE_DIR=str(tmp_path / "cache")):
        where = calibrate.path(cpu, ".peaks.json")
        assert not where.exists()
        first = workbench.bench("muladd", lib=lib, sizes=["1Ki"], **fast).to_dict()
        stamp = where.stat().st_mtime_ns
        second = workbench.bench("muladd", lib=lib, sizes=["16Ki"], **fast).to_dict()
        assert where.stat().st_mtime_ns == stamp
        stored = json.loads(where.read_text())
        assert calibrate.path(cpu).exists() and calibrate.path(cpu).parent == where.parent
    peak_1 = first["ops"][0]["sizes"][0]["limit"]["peak"]
    peak_2 = second["ops"][0]["sizes"][0]["limit"]["peak"]
    assert peak_1 == peak_2 and peak_1["unit"] == "cpu fp32" and peak_1["flops_per_s"] > 0
    assert start <= peak_1["measured"] <= time.time()
    assert list(stored["peaks"]) == ["cpu fp32"]  # float32 only: no other unit was measured
    assert stored["peaks"]["cpu fp32"]["measured"] == peak_1["measured"]
    assert stored["device"] == calibrate.device_name(cpu) and stored["torch"] == torch.__version__


def _wb(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, WB_CACHE_DIR=str(cache), WB_QUIET="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )


def test_the_json_of_a_cpu_bench_carries_the_limit(lib: Any, tmp_path: Path) -> None:
    """A real `wb bench matmul` on the CPU (the bundled op): every size carries its intensity,
    roof, roof value, ridge and share, each consistent with the roofs it names."""
    out = tmp_path / "m.json"
    proc = _wb(
        *("bench", "matmul", "--device", "cpu", "--no-compile", "--min-time", "0.02"),
        *("--sizes", "256x256x256,16x1024x1024", "--no-save", "--json", str(out)),
        cache=Path(str(knobs.cache_dir())),
    )
    assert proc.returncode == 0, proc.stderr
    assert "cpu fp32 peak [CPU]:" in proc.stdout and "ridge" in proc.stdout
    header = next(ln for ln in proc.stdout.splitlines() if ln.startswith("op "))
    assert "FLOP/B" in header and "limit" in header
    (op,) = json.loads(out.read_text())["ops"]
    assert set(op["roofs"]) == {"copy bandwidth", "cpu fp32"}
    bw = op["roofs"]["copy bandwidth"]["bytes_per_s"]
    peak = op["roofs"]["cpu fp32"]["flops_per_s"]
    for s in op["sizes"]:
        lim = s["limit"]
        seconds = s["times"]["kernel"]["median_s"]
        assert lim["intensity_flop_per_byte"] == pytest.approx(s["flops"] / s["bytes"])
        assert s["intensity_flop_per_byte"] == lim["intensity_flop_per_byte"]
        assert lim["ridge_flop_per_byte"] == pytest.approx(peak / bw)
        compute = lim["intensity_flop_per_byte"] >= lim["ridge_flop_per_byte"]
        assert lim["bound"] == ("compute" if compute else "memory")
        assert lim["roof"] == ("cpu fp32" if compute else "copy bandwidth")
        assert lim["roof_value"] == (peak if compute else bw)
        assert lim["roof_units"] == ("FLOP/s" if compute else "B/s")
        floor = max(s["bytes"] / bw, s["flops"] / peak)
        assert lim["share"] == pytest.approx(floor / seconds) == pytest.approx(s["roofline"])
        assert lim["peak"]["unit"] == "cpu fp32" and lim["peak"]["datasheet_flops_per_s"] is None
    square = op["sizes"][0]  # 42.7 FLOP/B: above any ridge a CPU has (its peak over its copy)
    assert square["limit"]["intensity_flop_per_byte"] == pytest.approx(256 / 6)


def test_calibrate_measures_every_unit_again(tmp_path: Path) -> None:
    proc = _wb("bench", "--calibrate", "--device", "cpu", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    for unit in ("cpu bf16", "cpu fp16", "cpu fp32", "cpu fp64"):
        assert f"{unit} peak [CPU]:" in proc.stdout
    assert "copy ceiling" in proc.stdout and "ridge" in proc.stdout


@pytest.mark.cuda
def test_gpu_rows_stand_under_the_tensor_core_peak_or_the_copy_bandwidth(lib: Any) -> None:
    fast = {"device": "cuda", "compile": False, "save": False}
    mm = workbench.bench("matmul", lib=lib, dtype="bfloat16", sizes=["8192x8192x8192"], **fast)
    lim = mm.ops[0].sizes[0].limit
    assert lim is not None and lim.bound == COMPUTE and lim.roof == "bf16 tensor core"
    assert lim.peak is not None and 0.2 < lim.share < 1.1, lim.text()
    sheet = lim.peak.datasheet_flops_per_s
    if sheet is not None:  # a known GPU: cuBLAS reaches most of its datasheet, never past it
        assert 0.4 * sheet < lim.peak.flops_per_s < 1.02 * sheet, roofs.peak_line(lim.peak)
    add = workbench.bench("muladd", lib=lib, sizes=["64Mi"], **fast).ops[0].sizes[0].limit
    assert add is not None and add.bound == MEMORY and 0.3 < add.share < 1.2, add.text()
