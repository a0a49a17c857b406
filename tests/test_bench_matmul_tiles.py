"""``python -m bench matmul_tiles``: its errors on bad arguments and on a host without a sm_90 GPU,
and (on one) a real run whose columns are checked against float64 and timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def tiles(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bench", "matmul_tiles", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shapes", "4096x4160"], "--shapes: '4096x4160' is not MxNxK"),
        (["--shapes", "0x8x8"], "--shapes: '0x8x8' is not MxNxK"),
        (["--shapes", "8x8x8", "--reps", "2"], "--reps must be at least 3, got 2"),
        (["--shapes", "8x8x8", "--variant", "x:WB_NO_SUCH=1"], "no bundled kernel reads"),
        (["--shapes", "8x8x8", "--variant", "a:WB_WGMMA_SQUARE=off", "--variant",
          "a:WB_WGMMA_SQUARE=square256"], "--variant: each label once"),
        (["--shapes", "8x8x8", "--dtype", "float32"], "invalid choice: 'float32'"),
    ],
)  # fmt: skip
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    proc = tiles(*args)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.skipif(_hopper(), reason="the error of a host without a sm_90 GPU")
def test_a_host_without_a_hopper_gpu_is_told_so() -> None:
    proc = tiles("--shapes", "4096x4160x4096")
    assert proc.returncode == 2 and "needs an sm_90 GPU" in proc.stderr, proc.stderr


@pytest.mark.cuda
def test_each_tile_runs_is_checked_and_timed(tmp_path: Path) -> None:
    if not _hopper():
        pytest.skip("the wgmma tiles run on sm_90")
    out = tmp_path / "tiles.md"
    proc = tiles("--shapes", "1024x4224x512,300x1000x200", "--reps", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 1024x4224x512")]
    assert len(rows) == 1 and rows[0].count("x)") == 4, rows  # default, three tiles: time (share)
    assert "128x256, us" in out.read_text() and out.read_text() in proc.stdout
