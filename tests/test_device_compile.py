"""python -m bench device_compile: nvcc phase timing of a bundled TU, full and device-only.

Clock-free checks only: the phases ran and the report parses. How the phases compare with the
measured compile is the measurement's own report (its ``phases / -c`` column)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, "-m", "bench", "device_compile"]


@pytest.mark.nvcc
def test_the_device_compile_bench_splits_host_and_device_phases() -> None:
    cmd = [*BENCH, "--tu", "scale", "--arch", "sm_80"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| scale/scale.cu |")]
    full, host, device, cubin, ratio, covered = (float(c) for c in row.strip("|").split("|")[1:])
    assert host > 0 and device > 0 and cubin > 0  # nvcc -time reported both sides
    assert ratio == pytest.approx(cubin / full, abs=_slack(cubin, full))
    assert covered == pytest.approx((host + device) / full, abs=_slack(host + device, full, 2))
    (total,) = [line for line in proc.stdout.splitlines() if line.startswith("| **all 1** |")]
    assert total.split("|")[2:] == row.split("|")[2:]  # one TU: the totals are its row
    assert "sm_80, median of 1" in proc.stdout


def _slack(part: float, whole: float, parts: int = 1) -> float:
    """How far part / whole may move when every cell is printed to 2 decimals (0.005 each)."""
    half = 0.005
    return half + (parts * half) / whole + part * half / (whole * (whole - half)) + 1e-9


def test_the_device_compile_bench_names_a_missing_tu() -> None:
    cmd = [*BENCH, "--tu", "nosuch"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "no TU named ['nosuch'] under kernels/" in proc.stderr
