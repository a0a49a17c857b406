"""``python -m bench kernel_goals``: how a goal is judged and reported, its errors on bad
arguments and on a host without a GPU, and (on a GPU) a real run of one op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.kernel_goals import Row, Variant, parse_ops, parse_variant, render, switches_read

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


def test_the_switches_are_read_off_the_kernel_sources() -> None:
    known = switches_read()
    assert {"WB_SOFTMAX_PATH", "WB_HISTOGRAM_KERNEL", "WB_WGMMA_CLUSTER"} <= known
    assert "WB_NO_SUCH_SWITCH" not in known


def test_a_variant_is_parsed_and_its_switches_checked() -> None:
    known = switches_read()
    v = parse_variant("wide+fma:WB_SOFTMAX_PATH=wide, WB_SOFTMAX_EXP=fma", known)
    assert v == Variant("wide+fma", {"WB_SOFTMAX_PATH": "wide", "WB_SOFTMAX_EXP": "fma"})
    assert v.name("softmax forward") == "softmax forward [wide+fma]"
    # a typo would time the default under another name: refused, with the family's switches
    with pytest.raises(
        SystemExit, match=r"no bundled kernel reads WB_SOFTMAX_PTH.*WB_SOFTMAX_PATH"
    ):
        parse_variant("wide:WB_SOFTMAX_PTH=wide", known)
    for bad in ("WB_SOFTMAX_PATH=wide", "a b:WB_SOFTMAX_PATH=wide", ":WB_SOFTMAX_PATH=wide"):
        with pytest.raises(SystemExit, match="LABEL:NAME=VALUE"):
            parse_variant(bad, known)
    with pytest.raises(SystemExit, match="is not NAME=VALUE"):
        parse_variant("wide:WB_SOFTMAX_PATH", known)


def test_a_variant_sets_its_switches_only_while_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WB_SOFTMAX_PATH", "wide")
    monkeypatch.delenv("WB_SOFTMAX_EXP", raising=False)
    v = Variant("x", {"WB_SOFTMAX_PATH": "wide", "WB_SOFTMAX_EXP": "fma"})
    with v.applied():
        assert os.environ["WB_SOFTMAX_PATH"] == "wide" and os.environ["WB_SOFTMAX_EXP"] == "fma"
    assert os.environ["WB_SOFTMAX_PATH"] == "wide" and "WB_SOFTMAX_EXP" not in os.environ


def test_repeated_variant_labels_are_refused() -> None:
    proc = goals("--variant", "a:WB_SOFTMAX_PATH=chunks", "--variant", "a:WB_SOFTMAX_PATH=wide")
    assert proc.returncode != 0 and "each label once" in proc.stderr


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


@pytest.mark.cuda
def test_variants_get_rows_of_their_own_and_are_checked(tmp_path: Path) -> None:
    """A variant's rows follow the default's; a read probe (no histogram) is caught as a wrong
    output, and a bad switch value is reported with the launcher's error, not timed."""
    proc = goals(
        "--ops", "histogram", "--reps", "3", "--out", str(tmp_path),
        "--variant", "plain:WB_HISTOGRAM_KERNEL=plain",
        "--variant", "probe:WB_HISTOGRAM_KERNEL=read",
        "--variant", "bad:WB_HISTOGRAM_KERNEL=nope",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]  # the probe and the bad value are not ok
    rows = json.loads((tmp_path / "kernel-goals.json").read_text())["rows"]
    names = [r["op"] for r in rows[:4]]
    assert names == ["histogram", "histogram [plain]", "histogram [probe]", "histogram [bad]"]
    by = {r["op"]: r for r in rows if r["case"] == "16 Mi, 256 bins"}
    assert by["histogram"]["ok"] and by["histogram [plain]"]["ok"]
    assert by["histogram [plain]"]["ours_us"] > 0
    assert not by["histogram [probe]"]["ok"] and by["histogram [probe]"]["ours_us"] > 0
    assert not by["histogram [bad]"]["ok"] and by["histogram [bad]"]["ours_us"] == 0
    assert "WB_HISTOGRAM_KERNEL" in by["histogram [bad]"]["note"]
    assert "[plain] = WB_HISTOGRAM_KERNEL=plain" in proc.stdout
