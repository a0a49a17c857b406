"""The roofline picture: `wb bench --plot roofline` draws every op and size that counts FLOPs as
a point under the device's measured roofs (SVG or PNG), says plainly when matplotlib is missing,
and shows inline in a notebook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from workbench import knobs
from workbench.benchmark import roofs
from workbench.benchmark.result import EAGER, KERNEL, BenchResult, Cache, OpResult, SizeResult
from workbench.benchmark.roofline import Roofline
from workbench.benchmark.roofs import PeakInfo
from workbench.benchmark.stats import Measurement, summarize

ROOT = Path(__file__).resolve().parent.parent
SVG = "{http://www.w3.org/2000/svg}"


def _wb(
    *args: str, cache: Path, pythonpath: str = str(ROOT), cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, WB_CACHE_DIR=str(cache), WB_QUIET="1", PYTHONPATH=pythonpath)
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env, cwd=cwd
    )


def _points(svg: Path | str) -> list[str]:
    root = ET.fromstring(svg.read_text() if isinstance(svg, Path) else svg)
    assert root.tag == f"{SVG}svg"
    return [g.get("id", "") for g in root.iter(f"{SVG}g") if g.get("id", "").startswith("wb-point")]


def test_wb_bench_draws_a_point_per_row_under_the_cpu_roofs(lib: Any, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out, data = tmp_path / "roof.svg", tmp_path / "r.json"
    proc = _wb(
        *("bench", "muladd", "scale", "softmax", "--device", "cpu", "--no-compile"),
        *("--min-time", "0.02", "--no-save", "--json", str(data), "--plot", "roofline"),
        *("--out", str(out)),
        cache=Path(str(knobs.cache_dir())),
    )
    assert proc.returncode == 0, proc.stderr
    ops = json.loads(data.read_text())["ops"]
    counted = [(o["op"], s["label"]) for o in ops for s in o["sizes"] if s["flops"] > 0]
    assert {op for op, _ in counted} == {"muladd", "scale"}  # softmax declares no FLOP count
    ids = _points(out)
    assert len(ids) == len(counted)
    for i, (op, label) in enumerate(counted):
        assert ids[i] == f"wb-point-{i}-{op}-{label}"
    text = out.read_text()
    assert "cpu fp32" in text and "arithmetic intensity" in text and "not drawn" in text
    said = " ".join(proc.stdout.split())
    assert f"roofline: {out} ({len(counted)} points under 1 roof; not drawn" in said
    assert "softmax 1024x128" in said

    # The saved run drawn again without timing (a GPU host's JSON drawn on a laptop): the same
    # points, and the same picture apart from matplotlib's date stamp.
    again = tmp_path / "again.svg"
    drawn = _wb(
        *("bench", "--plot", "roofline", "--from", str(data), "--out", str(again)),
        cache=tmp_path / "empty-cache",
    )
    assert drawn.returncode == 0, drawn.stderr
    assert _points(again) == ids
    shares = [pt.share for pt in Roofline.from_json(json.loads(data.read_text())).points]
    assert shares == [s["limit"]["share"] for o in ops for s in o["sizes"] if s["flops"] > 0]
    assert not (tmp_path / "empty-cache").exists()  # nothing was built or timed
    bad = _wb("bench", "--plot", "roofline", "--from", str(out), cache=tmp_path / "c")
    assert bad.returncode == 2 and "not a bench's JSON" in bad.stderr


def _result(device: str, dtype: str, peak: PeakInfo, bw: float, sheet_bw: float | None) -> Any:
    m = Measurement(summarize([1e-3]), "events")
    sizes = []
    for label, flops, nbytes in (("big", 2 * 4096**3, 3 * 4096**2 * 2), ("thin", 10**9, 10**8)):
        lim = roofs.limit(flops, nbytes, 1e-3, bw, peak, sheet_bw)
        sizes.append(SizeResult(label, nbytes, flops, {KERNEL: m, EAGER: m}, limit=lim))
    sizes.append(SizeResult("step", 0, 0, {KERNEL: m, EAGER: m}))  # a row that counts nothing
    op = OpResult("matmul", device, "cuda", dtype, "k" * 64, sizes, None)
    op.cache = Cache("L2", 50 << 20)  # as an H100 has: this host has no GPU to ask
    return op


def _two_roofs() -> BenchResult:
    h100 = "NVIDIA H100 80GB HBM3 (sm_90, 50 MiB L2)"
    tc = PeakInfo("bf16 tensor core", "TC", 756e12, 989.5e12, "cuBLAS")
    fp32 = PeakInfo("fp32 CUDA core", "FP32", 51e12, 66.9e12, "cuBLAS")
    return BenchResult(
        [
            _result(h100, "bfloat16", tc, 3.0e12, 3.35e12),
            _result(h100, "float32", fp32, 3.0e12, 3.35e12),
        ]
    )


def test_each_roof_group_is_drawn_and_png_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    picture = _two_roofs().roofline()
    assert [r.unit for r in picture.roofs] == ["bf16 tensor core", "fp32 CUDA core"]
    assert len(picture.points) == 4 and picture.skipped == ["matmul step", "matmul step"]
    assert picture.roofs[0].ridge == pytest.approx(252)
    svg = picture.svg()
    assert svg is not None and len(_points(svg)) == 4
    for text in ("bf16 tensor core: 756 TFLOP/s", "989.5 TFLOP/s (datasheet)", "copy 3000 GB/s"):
        assert text in svg
    assert "fp32 CUDA core: 51 TFLOP/s" in svg and "copy 3350 GB/s (datasheet)" in svg
    picture.save(tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    data = picture.to_dict()
    assert {p["roof"] for p in data["points"]} == {r["key"] for r in data["roofs"]}


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path: Path) -> None:
    """matplotlib made unimportable by a package of that name first on the path: one line, exit
    2, no traceback, before anything is built or timed."""
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    path = f"{shim.parent}{os.pathsep}{ROOT}"
    proc = _wb("bench", "muladd", "--plot", "roofline", cache=tmp_path / "c", pythonpath=path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "wb bench: error: --plot roofline needs matplotlib, which is not installed here: "
        "pip install matplotlib (or pip install 'workbench[plot]')"
    ]
    assert not (tmp_path / "c").exists()  # nothing built, nothing timed
    hidden = subprocess.run(
        [sys.executable, "-c", "from workbench.benchmark.result import BenchResult as B; "
         "print(repr(B().roofline()))"],
        capture_output=True, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=path),
    )  # fmt: skip
    assert hidden.returncode == 0, hidden.stderr
    assert "pip install matplotlib" in hidden.stdout


def test_bad_plot_arguments_are_named(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    out = _wb("bench", "muladd", "--plot", "roofline", "--out", "r.gif", cache=cache)
    assert out.returncode == 2 and "--out r.gif must end in .png or .svg" in out.stderr
    alone = _wb("bench", "muladd", "--out", "r.svg", cache=cache)
    assert alone.returncode == 2 and "--out names the file of --plot roofline" in alone.stderr
    bad = _wb("bench", "muladd", "--plot", "r.gif", cache=cache)
    assert bad.returncode == 2 and "must end in .png or .svg (or be 'roofline')" in bad.stderr


def test_a_notebook_shows_the_roofline_inline() -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    result = _two_roofs()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "workbench")
    try:
        shown, _ = ip.display_formatter.format(result.roofline())
    finally:
        ip.run_line_magic("unload_ext", "workbench")
    assert len(_points(shown["image/svg+xml"])) == 4
    page = result._repr_html_()  # the result's own display: its table, its plot, its roofline
    assert page.count("<svg") == 2 and "wb-point-3" in page
    assert repr(Roofline()).startswith("<workbench roofline: 0 points under 0 roofs")


@pytest.mark.cuda
def test_a_gpu_run_draws_under_the_tensor_core_roof(lib: Any, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import workbench

    fast = {"device": "cuda", "dtype": "bfloat16", "compile": False, "save": False}
    result = workbench.bench(["matmul", "muladd"], lib=lib, **fast)
    picture = result.roofline()
    (roof,) = picture.roofs
    assert roof.unit == "bf16 tensor core" and roof.peak and roof.ridge
    assert len(picture.points) == sum(len(r.sizes) for r in result.ops)
    bounds = {(p.op, p.bound) for p in picture.points}
    assert ("muladd", "memory") in bounds and ("matmul", "compute") in bounds
    picture.save(tmp_path / "gpu.svg")
    assert len(_points(tmp_path / "gpu.svg")) == len(picture.points)
