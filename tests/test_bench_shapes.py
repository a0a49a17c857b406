"""``python -m bench shapes``: its errors on bad arguments and on a host without a GPU, and (on a
GPU) a real run of one op whose rows are checked and timed both ways."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def shapes(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bench", "shapes", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ops", "matmul,conv"], "--ops: unknown conv; choose from"),
        (["--reps", "2"], "--reps must be at least 3, got 2"),
        (["--floor", "0"], "--floor must be above 0"),
        (["--variant", "x:WB_NO_SUCH_SWITCH=1"], "no bundled kernel reads WB_NO_SUCH_SWITCH"),
        (
            ["--variant", "a:WB_WGMMA_SQUARE=off", "--variant", "a:WB_WGMMA_SQUARE=on"],
            "--variant: each label once, got a, a",
        ),
    ],
)
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    proc = shapes(*args)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU-less error")
def test_a_host_without_a_gpu_is_told_so() -> None:
    proc = shapes("--ops", "histogram")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


@pytest.mark.cuda
def test_one_op_runs_and_each_row_is_checked_and_timed(tmp_path: Path) -> None:
    proc = shapes("--ops", "histogram", "--reps", "3", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "shapes.json").read_text())["rows"]
    assert len(rows) == 11 and all(r["ok"] for r in rows)
    assert all(r["ours_us"] > 0 and r["peer_us"] > 0 and "eager" in r["note"] for r in rows)
    assert (tmp_path / "shapes.md").read_text() in proc.stdout
