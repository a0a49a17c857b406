"""``wb check`` and ``wb bench`` show progress: a live line on a terminal (op, what runs on it,
steps done of the total, seconds), one line per op otherwise."""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import pytest

from workbench import scaffold
from workbench.cli import main
from workbench.cli.progress import Steps


def test_steps_print_one_line_per_op_in_a_log() -> None:
    stream = io.StringIO()
    steps = Steps("check", 3, stream, live=False)
    steps.begin("a", "cpu float32")
    steps.step_done()
    steps.begin("a", "cpu float64")
    steps.step_done()
    steps.begin("b", "cpu float32")
    steps.done()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("wb check: a cpu float32 · 0 of 3 done · ")
    assert lines[1].startswith("wb check: b cpu float32 · 2 of 3 done · ")
    assert lines[1].endswith(" s")


def test_steps_redraw_one_live_line_on_a_terminal() -> None:
    stream = io.StringIO()
    steps = Steps("bench", 2, stream, live=True)
    steps.begin("a", "float32: timing")
    steps.step_done()
    steps.begin("b", "float32: timing")
    time.sleep(1.6)  # a long step: the line is redrawn, its seconds going on
    steps.done()
    text = stream.getvalue()
    assert "\n" not in text
    assert text.count("\r\x1b[K") >= 2 + 1 + 1  # two begins, a redraw of the ticker, the end
    assert "wb bench: b float32: timing · 1 of 2 done · " in text
    assert text.endswith("\r\x1b[K")  # cleared before the table
    drawn = stream.getvalue().count("\r\x1b[K")
    time.sleep(0.7)
    assert stream.getvalue().count("\r\x1b[K") == drawn  # done() stopped the ticker


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kernels = tmp_path_factory.mktemp("progress") / "ops"
    for name in ("first_op", "second_op"):
        scaffold.write_family(kernels, name)
    return kernels


def _per_op_lines(err: str, command: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(f"wb {command}: ")]


def test_wb_check_prints_a_line_per_op_to_a_log(
    two: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = f"wbprogress{os.getpid()}"
    argv = ["check", "--kernels", str(two), "--namespace", ns, "--device", "cpu"]
    assert main([*argv, "--trials", "1", "--no-contract"]) == 0
    out, err = capsys.readouterr()
    lines = _per_op_lines(err, "check")
    assert [ln.split()[2] for ln in lines] == ["first_op", "second_op"]
    # four dtypes each (float32, float64, float16, bfloat16): the second op starts at 4 of 8
    assert re.match(r"wb check: second_op cpu \w+ · 4 of 8 done · [0-9.]+ s$", lines[1])
    assert "first_op" in out and "second_op" in out  # the table, on stdout


def test_wb_bench_prints_a_line_per_op_to_a_log(
    two: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = f"wbprogressb{os.getpid()}"
    argv = ["bench", "--kernels", str(two), "--namespace", ns, "--device", "cpu"]
    fast = ["--sizes", "one", "--no-compile", "--min-time", "0.02", "--no-save"]
    assert main([*argv, *fast]) == 0
    out, err = capsys.readouterr()
    lines = _per_op_lines(err, "bench")
    assert [ln.split()[2] for ln in lines] == ["first_op", "second_op"]
    assert " · 1 of 2 done · " in lines[1]
    assert "first_op" in out and "second_op" in out


def test_a_live_line_names_what_runs_within_a_step() -> None:
    stream = io.StringIO()
    steps = Steps("check", 1, stream, live=True)
    steps.begin("a", "cpu float64")
    steps.detail("float64 gradcheck")
    steps.done()
    assert "wb check: a cpu float64: float64 gradcheck · 0 of 1 done · " in stream.getvalue()
    logged = io.StringIO()
    plain = Steps("check", 1, logged, live=False)
    plain.begin("a", "cpu float64")
    plain.detail("float64 gradcheck")  # a log keeps one line per op
    assert len(logged.getvalue().splitlines()) == 1


def test_check_and_bench_say_which_check_size_and_round_runs(lib: object) -> None:
    import torch

    from workbench.benchmark.run import bench
    from workbench.verify.runner import Options, check_op

    heard: list[str] = []
    spec = lib.specs["scale"]  # type: ignore[attr-defined]
    check_op(
        lib.scale, spec, "cpu", [torch.float64], options=Options(trials=1), on_check=heard.append
    )  # type: ignore[attr-defined]
    assert heard == ["float64 values", "float64 contract (opcheck, compile)", "float64 gradcheck"]
    heard.clear()
    fast = {"sizes": ["1Ki"], "compile": False, "min_time": 0.02, "save": False}
    bench("scale", lib=lib, device="cpu", say=heard.append, **fast)  # type: ignore[arg-type]
    assert heard[0] == "verifying size 1Ki (1/1)"
    rounds = [i for i, h in enumerate(heard) if h.startswith("round ")]
    assert rounds and heard[rounds[-1]].startswith("round 1/1 timed (")
    # after the rounds, only a cache's first bench of the device: its peaks, measured once
    assert all(h.endswith("(once per device)") for h in heard[rounds[-1] + 1 :]), heard
