"""``python -m bench kernel_goals``: how a goal is judged and reported, its errors on bad
arguments and on a host without a GPU, and (on a GPU) a real run of one op."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.kernel_goals import Row, parse_ops, render

ROOT = Path(__file__).resolve().parent.parent


def row(value: float, kind: str = "x", goal: float = 1.0, ok: bool = True) -> Row:
    return Row("op", "case", "float32", 10.0, "peer", 12.0, value, kind, goal, ok)


def goals(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bench", "kernel_goals", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.parametrize(
    ("value", "kind", "goal", "met"),
    [
        (1.0, "x", 1.0, True),
        (0.99, "x", 1.0, False),
        (0.85, "%", 0.85, True),
        (0.84, "%", 0.85, False),
        (2.0, "err", 2.0, True),
        (2.1, "err", 2.0, False),
    ],
)
def test_a_goal_is_met_at_its_bound_and_not_below_it(
    value: float, kind: str, goal: float, met: bool
) -> None:
    assert row(value, kind, goal).met is met


def test_a_wrong_output_meets_no_goal_however_fast() -> None:
    fast_but_wrong = row(5.0, ok=False)
    assert not fast_but_wrong.met
    assert "WRONG OUTPUT" in fast_but_wrong.cells()


def test_the_report_counts_the_goals_met_and_prints_each_kind() -> None:
    text = render([row(1.2), row(0.5), row(0.9, "%", 0.85), row(3.0, "err", 2.0)], "HEADER")
    assert text.startswith("HEADER\n") and text.rstrip().endswith("2 of 4 goals met.")
    assert "| 1.20x | >= 1.00x | **met** |" in text
    assert "| 90% | >= 85% | **met** |" in text
    assert "| 3.00x | <= 2.0x | not met |" in text


def test_an_unknown_op_is_named_with_the_known_ones() -> None:
    assert parse_ops("softmax, matmul") == ["softmax", "matmul"]
    with pytest.raises(SystemExit, match=r"unknown op.*softmx.*choose from matmul, softmax"):
        parse_ops("softmx")


def test_too_few_repetitions_are_refused() -> None:
    proc = goals("--reps", "1")
    assert proc.returncode != 0 and "--reps must be at least 3" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU-less error")
def test_a_host_without_a_gpu_is_told_so() -> None:
    proc = goals("--ops", "histogram")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


@pytest.mark.cuda
def test_one_op_runs_and_writes_its_rows(tmp_path: Path) -> None:
    proc = goals("--ops", "histogram", "--reps", "3", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "kernel-goals.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["16 Mi, 256 bins", "16 Mi, 65536 bins", "64 Mi, 256 bins"]
    assert all(r["ok"] and r["ours_us"] > 0 and r["peer_us"] > 0 for r in rows)
    assert (tmp_path / "kernel-goals.md").read_text() in proc.stdout
