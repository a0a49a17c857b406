"""``wb check`` and ``workbench.check``: tables, JSON, exit codes, crashes, reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import workbench
from tests.impostors import write_impostors
from workbench.verify import CheckFailed

ROOT = Path(__file__).resolve().parent.parent


def wb(
    *args: str, cache: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "WB_CACHE_DIR": str(cache), "WB_QUIET": "1"}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def impostor_kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_impostors(tmp_path_factory.mktemp("impostors"))


def test_wb_check_prints_a_table_writes_json_and_exits_0(
    lib: Any, tmp_path: Path, cache_dir: Path
) -> None:
    """(lib: the bundled build is in the cache before the child process looks for it.)"""
    out = tmp_path / "rows.json"
    proc = wb(
        "check", "scale", "--device", "cpu", "--trials", "1", "--json", str(out), cache=cache_dir
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = proc.stdout.splitlines()[0].split()
    assert header[:6] == ["op", "device", "dtype", "check", "shapes", "verdict"]
    assert "scale  cpu     bfloat16  values" in proc.stdout
    data = json.loads(out.read_text())
    assert data["passed"] and {r["check"] for r in data["rows"]} >= {
        "values",
        "opcheck",
        "gradcheck",
    }


def test_a_family_name_checks_the_family_s_ops(lib: Any, tmp_path: Path, cache_dir: Path) -> None:
    """``inplace`` is a family, not an op: it stands for its ops (add_out, scale_)."""
    out = tmp_path / "rows.json"
    proc = wb(
        "check", "inplace", "--device", "cpu", "--trials", "1", "--json", str(out), cache=cache_dir
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {r["op"] for r in json.loads(out.read_text())["rows"]} == {"add_out", "scale_"}
    bad = wb("check", "inplac", "--device", "cpu", cache=cache_dir)
    assert bad.returncode == 2 and "inplace" in bad.stderr  # the close name is offered


def test_wb_check_exits_1_and_names_the_failure(impostor_kernels: Path, cache_dir: Path) -> None:
    proc = wb(
        "--kernels", str(impostor_kernels), "--namespace", "impostor",
        "check", "scale_but_last", "scale_default_stream", "--device", "cpu", "--no-contract",
        cache=cache_dir,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()[2:-1]}
    assert (
        "FAIL (unwritten)" in lines["scale_but_last"] and "never written" in lines["scale_but_last"]
    )
    assert "PASS" in lines["scale_default_stream"]


def test_isolate_survives_a_kernel_that_kills_its_process(
    impostor_kernels: Path, cache_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rows.json"
    proc = wb(
        "--kernels", str(impostor_kernels), "--namespace", "impostor",
        "check", "scale_segfault", "scale_default_stream", "--device", "cpu", "--no-contract",
        "--isolate", "--trials", "1", "--json", str(out), cache=cache_dir,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    crashed = [r for r in rows if r["op"] == "scale_segfault"]
    assert len(crashed) == 1 and crashed[0]["reason"] == "crash"
    assert "killed by SIGSEGV" in crashed[0]["detail"]
    assert all(r["passed"] for r in rows if r["op"] == "scale_default_stream")


def test_sanitize_without_compute_sanitizer_is_a_clear_error(
    tmp_path: Path, cache_dir: Path
) -> None:
    fake_cuda = tmp_path / "cuda"
    (fake_cuda / "bin").mkdir(parents=True)
    (fake_cuda / "bin" / "nvcc").write_text("")
    env = {"PATH": os.path.dirname(sys.executable), "CUDA_HOME": str(fake_cuda)}
    proc = wb("check", "--sanitize", "scale", cache=cache_dir, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--sanitize needs compute-sanitizer" in proc.stderr and "CUDA_HOME" in proc.stderr


@pytest.mark.cuda
def test_an_illegal_memory_access_fails_that_op_only(
    impostor_kernels: Path, cache_dir: Path
) -> None:
    proc = wb(
        "--kernels", str(impostor_kernels), "--namespace", "impostor",
        "check", "scale_out_of_bounds", "scale_default_stream", "--device", "cuda",
        "--trials", "1", "--no-contract", cache=cache_dir,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()[2:-1]}
    assert "FAIL (crash)" in lines["scale_out_of_bounds"]
    assert "CUDA_LAUNCH_BLOCKING=1" in lines["scale_out_of_bounds"]
    assert "PASS" in lines["scale_default_stream"]  # checked in a child process


def _sanitizer_or_skip() -> None:
    from workbench.errors import WorkbenchError
    from workbench.verify.isolate import find_sanitizer

    try:
        find_sanitizer()
    except WorkbenchError as e:
        pytest.skip(str(e))


@pytest.mark.cuda
def test_sanitize_passes_a_good_kernel_and_names_the_bad_write(
    impostor_kernels: Path, cache_dir: Path
) -> None:
    _sanitizer_or_skip()
    good = wb("check", "--sanitize", "scale", cache=cache_dir)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    assert "ERROR SUMMARY: 0 errors" in good.stdout + good.stderr
    bad = wb(
        "--kernels", str(impostor_kernels), "--namespace", "impostor",
        "check", "--sanitize", "scale_out_of_bounds", cache=cache_dir,
    )  # fmt: skip
    text = bad.stdout + bad.stderr
    assert bad.returncode != 0, text[-3000:]
    assert "Invalid __global__ write" in text and "scale_out_of_bounds" in text, text[-3000:]


def test_workbench_check_returns_a_report(lib: Any) -> None:
    report = workbench.check("scale", lib=lib, device="cpu", trials=1, contract=False)
    assert report.passed and bool(report)
    html = report._repr_html_()
    assert "<table>" in html and "PASS" in html and "scale" in html
    assert report.raise_for_failure() is report


def test_workbench_check_finds_the_spec_of_a_loaded_op(lib: Any) -> None:
    report = workbench.check(lib.mul, device="cpu", trials=1, contract=False)
    assert report.passed and {r.op for r in report.rows} == {"mul"}


def test_strict_raises_listing_the_failures(lib: Any) -> None:
    import dataclasses

    import torch

    wrong = dataclasses.replace(lib.specs["scale"], reference=lambda x, s: x * (s + 1e-3))
    with pytest.raises(CheckFailed, match=r"scale cpu float32 values \[.*\]: values: at \["):
        workbench.check(lib.scale, wrong, device="cpu", dtypes=[torch.float32], trials=1,
                        contract=False, strict=True)  # fmt: skip


def test_an_unknown_op_name_lists_the_known_ones(lib: Any) -> None:
    with pytest.raises(workbench.errors.WorkbenchError, match=r"no op spec named 'nope'.*muladd"):
        workbench.check("nope", lib=lib)
