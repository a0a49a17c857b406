"""Adopted families on a GPU: the ops right against their references, and a kernel edit that
reloads through the device-only path (one NVRTC compile, a module swap, no host compile, link or
dlopen), as ``wb new``'s device-only layout does (tests/test_device_cuda.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import workbench
from tests.reliability_helpers import edit
from workbench import knobs, loader
from workbench.adopt import adopt

pytestmark = pytest.mark.cuda

DATA = Path(__file__).parent / "data" / "adopt"
NS = f"wbadopt{os.getpid()}"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    kernels = tmp_path_factory.mktemp("adopt") / "kernels"
    sys.path.insert(0, str(DATA / "references"))
    refs = [f"{op}=adopt_refs:{op}" for op in ("mymuladd", "mymul", "myadd_out")]
    adopt([DATA / "tutorial" / "muladd.cpp", DATA / "tutorial" / "muladd.cu"], "tut", kernels, refs)
    adopt([DATA / "cuda_only" / "scale_rows.cu"], "rows", kernels, ["adopt_refs:scale_rows"])
    adopt([DATA / "cuda_split" / "ops.cpp", DATA / "cuda_split" / "ops.cu"], "split", kernels)
    yield kernels
    sys.path.remove(str(DATA / "references"))


@pytest.fixture(scope="module")
def loaded(registry: Path, cache_dir: Path) -> workbench.Library:
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        return workbench.load(registry, namespace=NS)


@pytest.fixture
def lib(loaded: workbench.Library, registry: Path) -> Iterator[workbench.Library]:
    root = registry.parent
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    yield loaded
    for p, data in before.items():
        if p.read_bytes() != data:
            p.write_bytes(data)
    loaded.reload(on_error="warn")


def test_the_adopted_ops_compute_what_the_extension_did(lib: workbench.Library) -> None:
    for n in (0, 1, 255, 1000, (1 << 20) + 3):  # 0: an empty grid launches nothing
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        torch.testing.assert_close(lib.mymuladd(a, b, 0.5), a * b + 0.5)
        torch.testing.assert_close(lib.mymul(a, b), a * b)
        out = torch.empty_like(a)
        lib.myadd_out(a, b, out)
        torch.testing.assert_close(out, a + b)
        torch.testing.assert_close(lib.square(a), a * a)
    for dtype in (torch.float32, torch.float64):  # the template kernel, both instantiations
        x = torch.randn(37, 129, device="cuda", dtype=dtype)
        rows = torch.arange(1, 38, device="cuda", dtype=torch.float64)[:, None]
        torch.testing.assert_close(lib.scale_rows(x, 0.3), (x.double() * 0.3 * rows).to(dtype))


def test_wb_check_passes_on_the_gpu(lib: workbench.Library) -> None:
    for op in ("mymuladd", "mymul"):
        report = workbench.check(op, lib=lib, device="cuda")
        assert report.passed, (op, [str(r) for r in report.failures])


def test_a_kernel_edit_reloads_through_the_device_only_path(
    lib: workbench.Library, registry: Path, compiled: list[str]
) -> None:
    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    op = torch.ops.__getattr__(NS).mymuladd  # held across the reload, as user code would
    library = loader.live_handles(NS)["tut"].built.library
    edit(
        registry / "tut" / "tut.kernel.cu",
        "result[idx] = a[idx] * b[idx] + c;",
        "result[idx] = a[idx] * b[idx] + 2.0f * c;",
    )
    report = lib.reload()
    assert compiled == ["tut/tut.kernel.cu"]  # NVRTC alone: no host TU, no link
    assert report.swapped == ["tut"] and report.device_only == ["tut"]
    assert loader.live_handles(NS)["tut"].built.library == library  # no dlopen
    torch.testing.assert_close(op(a, b, 0.5), a * b + 1.0)
    torch.testing.assert_close(lib.mymuladd(a.cpu(), b.cpu(), 0.5), (a * b + 0.5).cpu())


def test_a_template_kernel_edit_reloads_both_instantiations(
    lib: workbench.Library, registry: Path, compiled: list[str]
) -> None:
    edit(registry / "rows" / "rows.kernel.cu", "out[i] = scaled(", "out[i] = -scaled(")
    report = lib.reload()
    assert compiled == ["rows/rows.kernel.cu"] and report.device_only == ["rows"]
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(4, 8, device="cuda", dtype=dtype)
        rows = torch.arange(1, 5, device="cuda", dtype=torch.float64)[:, None]
        torch.testing.assert_close(lib.scale_rows(x, 2.0), (-x.double() * 2.0 * rows).to(dtype))
