"""scripts/bench_device_compile.py: nvcc phase timing of a bundled TU, full and device-only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.nvcc
def test_the_device_compile_bench_splits_host_and_device_phases() -> None:
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_device_compile.py"), "--tu", "scale"]
    proc = subprocess.run([*cmd, "--arch", "sm_80"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| scale/scale.cu |")]
    full, host, device, cubin, ratio = (float(c) for c in row.strip("|").split("|")[1:])
    assert host > 0 and device > 0 and cubin > 0  # nvcc -time reported both sides
    assert host + device <= full * 1.05  # the phases ran inside the measured compile
    assert ratio == pytest.approx(cubin / full, abs=0.01)
    assert "sm_80, median of 1" in proc.stdout


def test_the_device_compile_bench_names_a_missing_tu() -> None:
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_device_compile.py"), "--tu", "nosuch"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "no TU named ['nosuch'] under kernels/" in proc.stderr
