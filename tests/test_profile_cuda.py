"""wb profile on a GPU with the real Nsight Compute: the table parsed from a real ncu run, for a
kernel of an nvcc TU (matmul's SIMT path), of a device-only TU loaded as a driver module
(scale, and matmul's wgmma path), and for every path of matmul; an error inside the profiled
process reaches the user as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.errors import WorkbenchError
from workbench.profile import ncu

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.cuda


def _ncu() -> Path:
    try:
        return ncu.find()
    except WorkbenchError as e:
        pytest.skip(str(e))


def _profile(cache_dir: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    """``wb profile ARGS --json F`` in a process of its own, on the session's cache (the ``lib``
    fixture of each test has built the bundled registry there, so no build runs under ncu)."""
    _ncu()
    out = tmp_path / "profile.json"
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "profile", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "WB_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)},
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    return json.loads(out.read_text())


def _one_kernel_named(run: dict[str, Any], part: str) -> dict[str, Any]:
    found = [k for k in run["kernels"] if part in k["name"]]
    assert found, [k["name"] for k in run["kernels"]]
    k = found[0]
    assert k["duration_us"] > 0 and k["registers"] > 0
    assert k["grid"].startswith("(") and k["block"].startswith("(")
    for column in ("occupancy_pct", "dram_pct", "sm_pct", "l2_hit_pct"):
        assert k[column] is not None and 0 <= k[column] <= 100.5, (column, k[column])
    assert k["smem_bytes"] is not None and k["local_bytes"] is not None
    assert 1 <= len(k["stalls"]) <= 3 and all(v > 0 for _, v in k["stalls"])
    return k


def test_matmul_of_an_nvcc_tu(lib: Any, cache_dir: Path, tmp_path: Path) -> None:
    (run,) = _profile(cache_dir, tmp_path, "matmul", "--size", "4096")["runs"]
    assert run["size"] == "4096x4096x4096" and run["dtype"] == "float32"
    _one_kernel_named(run, "simt_kernel")  # float32 takes the SIMT path


def test_scale_of_a_device_only_tu(lib: Any, cache_dir: Path, tmp_path: Path) -> None:
    (run,) = _profile(cache_dir, tmp_path, "scale", "--size", "16Mi")["runs"]
    k = _one_kernel_named(run, "scale_kernel")
    assert k["dram_pct"] > 30  # a copy-like kernel of 128 MiB streams from DRAM


def test_every_path_of_matmul(lib: Any, cache_dir: Path, tmp_path: Path) -> None:
    import torch

    runs = _profile(
        cache_dir, tmp_path, "matmul", "--size", "4096", "--dtype", "bfloat16", "--path", "all"
    )["runs"]
    paths = [r["path"] for r in runs]
    expected = ["simt", "mma", "wgmma"][: len(runs[0]["paths"])]
    assert paths == runs[0]["paths"] == expected
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) == (9, 0):
        assert paths == ["simt", "mma", "wgmma"]
    for run in runs:
        assert run["called"] == "matmul_path"
        k = _one_kernel_named(run, f"{run['path']}_kernel")
        if run["path"] != "simt":  # the tensor pipes' metrics, named for the message
            named = {n: m["value"] for n, m in k["metrics"].items() if "tensor" in n}
            assert k["tensor_pct"] is not None and k["tensor_pct"] > 10, named


def test_an_error_in_the_profiled_process_is_one_line(
    lib: Any, cache_dir: Path, tmp_path: Path
) -> None:
    _ncu()
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "profile", "matmul", "--size", "512"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "WB_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)},
        timeout=900,
    )
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith("wb profile: error: matmul: no size '512' in its sweep; sizes: 4096x")
