"""The wgmma matmul's narrow route on its 256-row split tile (kNarrowSplitKind, Kind 24): one row
of 256-row tiles over an a of 129 to 256 rows (b read from L2 once), four consumer warpgroups and
a producer warp, stages of 64 k, BN 64 or 128, k cut into 1, 2 or 4 slices run by a cluster of
blocks and summed in slice order through distributed shared memory (kernels/matmul/
wgmma_narrow.cuh's narrow_split_tile; its launcher matmul_wgmma_narrow.cu's narrow_split).
WB_WGMMA_NARROW_ROWS=256 picks it, WB_WGMMA_NARROW_BN=64 | 128 its columns,
WB_WGMMA_NARROW_SPLIT=1 | 2 | 4 its slices; WB_WGMMA_FEW=narrow1 forces the narrow route.

Without a GPU: the split kernels (two dtypes, two layouts of b, BN 64 and 128) compile for sm_90a
without spills within 120 registers, 544 threads, 5 or 4 stages, the cluster sum's distributed
shared memory reads and no multicast.
On a Hopper GPU (marked cuda): c within the family's bound against the float64 product at m = 129
to 256 with n and k tails, both layouts of b and both dtypes, for every slice count and BN; the
same bits every call; one slice gives the 64-row tile's bits; a CUDA graph replays it; the switch
runs the kernel it names; bad values are refused by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import (
    assert_matmul_graph_replays,
    cuda_kernels_run,
    hopper,
    matmul_operands,
    narrow_instances,
    nvcc_sm90a,
)

SPLIT = 24  # kNarrowTall | kNarrowSplit (NarrowKind, wgmma_narrow.h): in the kernels' names
KNOBS = (
    "WB_WGMMA_FEW",
    "WB_WGMMA_NARROW_BN",
    "WB_WGMMA_NARROW_PAIR",
    "WB_WGMMA_NARROW_ROWS",
    "WB_WGMMA_NARROW_SPLIT",
)
DTYPES = [torch.bfloat16, torch.float16]
ROWS = [129, 160, 192, 224, 256]
# The variants of the split tile: its defaults, each slice count, each BN.
VARIANTS = [
    {},
    {"WB_WGMMA_NARROW_SPLIT": "1"},
    {"WB_WGMMA_NARROW_SPLIT": "2", "WB_WGMMA_NARROW_BN": "64"},
    {"WB_WGMMA_NARROW_SPLIT": "4", "WB_WGMMA_NARROW_BN": "128"},
    {"WB_WGMMA_NARROW_SPLIT": "2", "WB_WGMMA_NARROW_BN": "128"},
]


@pytest.mark.nvcc
def test_the_split_kernels_compile_for_sm90a_without_spills(tmp_path: Path) -> None:
    shapes = [(64, SPLIT), (128, SPLIT)]
    source = narrow_instances(tmp_path, shapes, "split_instances.cu")
    done = nvcc_sm90a(tmp_path, "--ptx", "-o", "split.ptx", source=source)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", (tmp_path / "split.ptx").read_text())[1:]
    assert len(entries) == 2 * 2 * 2
    for entry in entries:
        assert entry.startswith("_ZN2wb6matmul19wgmma_narrow_kernel")
        bn, kind = map(int, re.findall(r"Li(\d+)E", entry.split("(")[0]))
        assert kind == SPLIT
        assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16" in entry
        assert ".maxntid 544, 1, 1" in entry  # four consumer warpgroups and a producer warp
        # Stages of 64 k: a's 256 rows and b's BN columns of 128 bytes, 40 or 48 KiB: 5 or 4.
        stages = 5 if bn == 64 else 4
        assert re.search(rf"E4full\[{8 * stages}\];", entry)
        assert "ld.shared::cluster.v4.f32" in entry and "barrier.cluster.arrive" in entry
        assert ".multicast::cluster" not in entry and "setmaxnreg" not in entry
    done = nvcc_sm90a(tmp_path, "-cubin", "-Xptxas", "-v", "-o", "split.cubin", source=source)
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == 2 * 2 * 2, done.stderr
    assert all(s == ("0", "0") for s in spills), done.stderr
    # 544 threads at one block an SM: 65536 / 544, in units of 8, is 120 registers a thread.
    used = [int(r) for r in re.findall(r"Used (\d+) registers", done.stderr)]
    assert len(used) == 8 and max(used) <= 120, done.stderr
    assert "serialized" not in done.stderr, done.stderr  # wgmma kept asynchronous


# --- on a Hopper GPU ------------------------------------------------------------------------


def _use(monkeypatch: pytest.MonkeyPatch, variant: dict[str, str]) -> None:
    """The split tile (narrow1, 256 rows) under `variant`'s switches, every other one unset."""
    monkeypatch.setenv("WB_MATMUL_GEMV", "0")
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WB_WGMMA_FEW", "narrow1")
    monkeypatch.setenv("WB_WGMMA_NARROW_ROWS", "256")
    for name, value in variant.items():
        monkeypatch.setenv(name, value)


def _bound(lib: Any, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 product and the family's bound on each element's error (once per operands)."""
    ref = a.double() @ b.double()
    rtol, atol = lib.specs["matmul"].tolerances[a.dtype]
    return ref, atol * max(1.0, ref.abs().max().item()) + rtol * ref.abs()


def _within(got: torch.Tensor, ref_bound: tuple[torch.Tensor, torch.Tensor], what: Any) -> None:
    ref, bound = ref_bound
    worst = ((got.double() - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"{tuple(ref.shape)} {got.dtype} {what}: err/tol {worst:.2f}"


def _bits(c: torch.Tensor) -> torch.Tensor:
    return c.view(torch.int16)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("m", ROWS)
def test_every_slice_count_is_right_and_repeats_its_bits(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, col: bool, dtype: Any
) -> None:
    """m x 4096 x 4096: each variant within the bound, the same bits on a second call."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, 4096, 4096, col, dtype)
    ref_bound = _bound(lib, a, b)
    for variant in VARIANTS:
        _use(monkeypatch, variant)
        first = lib.matmul(a, b)
        _within(first, ref_bound, variant)
        assert torch.equal(_bits(first), _bits(lib.matmul(a, b))), variant


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(131, 4104, 4104), (200, 1000, 72), (250, 8192, 4096), (256, 4160, 1000), (300, 4096, 264)],
)
def test_the_tails_are_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, col: bool
) -> None:
    """n and k tails (a last tile part past n, a last step part past k, k of one step and 8,
    slices of 4 steps), and an a of more than 256 rows (two rows of tiles), on every variant (k
    and n multiples of 8: the wgmma path's rows are 16-byte aligned)."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, n, k, col, torch.bfloat16)
    ref_bound = _bound(lib, a, b)
    for variant in VARIANTS:
        _use(monkeypatch, variant)
        _within(lib.matmul(a, b), ref_bound, variant)


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("m", [160, 256])
def test_one_slice_gives_the_64_row_tiles_bits(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, col: bool
) -> None:
    """One slice on BN 64 adds each row's k16 products in the 64-row tile's order: its bits."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, 4096, 4104, col, torch.bfloat16)
    _use(monkeypatch, {"WB_WGMMA_NARROW_SPLIT": "1", "WB_WGMMA_NARROW_BN": "64"})
    split = lib.matmul(a, b)
    _use(monkeypatch, {"WB_WGMMA_NARROW_ROWS": "64", "WB_WGMMA_NARROW_BN": "64"})
    assert torch.equal(_bits(split), _bits(lib.matmul(a, b)))


@pytest.mark.cuda
@pytest.mark.parametrize("slices", ["1", "2", "4"])
@pytest.mark.parametrize(("m", "col"), [(160, False), (256, True)])
def test_a_cuda_graph_replays_the_split_tile(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, col: bool, slices: str
) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    _use(monkeypatch, {"WB_WGMMA_NARROW_SPLIT": slices})
    assert_matmul_graph_replays(lib, *matmul_operands(m, 4096, 4096, col, torch.bfloat16))


@pytest.mark.cuda
@pytest.mark.parametrize("route", ["narrow", "narrow1"])
def test_the_rows_switch_runs_the_split_kernel(
    lib: Any, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """WB_WGMMA_NARROW_ROWS=256 runs the split tile's kernel (Kind 24) alone, paired or not."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(192, 4096, 4096, False, torch.bfloat16)
    _use(monkeypatch, {"WB_WGMMA_FEW": route})
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert re.search(rf"wgmma_narrow_kernel<[^>]*,\s*(?:\(int\))?{SPLIT}>", names), names
    assert "split_kernel" not in names and "sum_slices" not in names, names


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("WB_WGMMA_NARROW_SPLIT", "fast"),
        ("WB_WGMMA_NARROW_SPLIT", "3"),
        ("WB_WGMMA_NARROW_BN", "32"),
        ("WB_WGMMA_NARROW_ROWS", "512"),
    ],
)
def test_a_bad_value_is_refused_by_name(
    lib: Any, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    _use(monkeypatch, {name: value})
    a, b = matmul_operands(160, 4096, 4096, False, torch.bfloat16)
    with pytest.raises(RuntimeError, match=name):
        lib.matmul(a, b)
