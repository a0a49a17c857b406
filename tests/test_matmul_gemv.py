"""The matmul's GEMV route for an a of 1 to 8 rows (kernels/matmul/matmul_gemv.kernel.cu, its
launcher matmul_gemv.cu): b read once by 16-byte loads, float32 sums, k's slices summed in slice
order (a cluster's shared memory on sm_90, else a workspace and a second launch).

Path::automatic takes it for an a of one row on b n-major (where it beat the split-k and narrow
routes), with a's and b's rows 16-byte aligned; WB_MATMUL_GEMV=1 for m up to WB_MATMUL_GEMV_ROWS
(unset: 8) on either layout of b (b's columns aligned), =0 never; the tests of its kernels force
it (=1); WB_MATMUL_GEMV_SPLITS=S and
WB_MATMUL_GEMV_SUM=cluster | launch force the split of k and its sum; an a of one row on b n-major
runs the one-row kernel (gemv_row_kernel: a software-pipelined k loop), or with
WB_MATMUL_GEMV_KIND=0 gemv_kernel as other rows do. A bad value of any is an error naming it.

Without a GPU: the kernels compile for sm_80 and sm_90a (every tier of rows, both dtypes, both
layouts of b) within their launch bounds and without spills; the host launcher and the entry that
routes to it compile.
On a GPU (marked cuda): c within the family's bound and as near the float64 product as cuBLAS's
at m = 1, 2, 3, 8, at n and k tails, both layouts of b and both dtypes; the route runs exactly
where its rule says (m = 9 does not); the same bits every call and for either sum; a CUDA graph
replays it. Both kernels of one row likewise: right at every shape (the rows the one-row kernel
does not take run gemv_kernel), the same bits every call and by either sum at every split, graph
replay.
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
    nvcc_sm90a,
    nvrtc_entries,
)
from workbench import nvrtc
from workbench.project import BUNDLED_KERNELS

FILE = BUNDLED_KERNELS / "matmul" / "matmul_gemv.kernel.cu"
TIERS = (1, 2, 4, 8)  # the kernels' M: the rows of sums a thread holds
NAMES = [
    f"wb::matmul::gemv_kernel<wb::{t},{m},{k}>"
    for t in ("f16", "bf16")
    for m in TIERS
    for k in ("false", "true")
] + [f"wb::matmul::gemv_sum_kernel<wb::{t}>" for t in ("f16", "bf16")]
# WB_MATMUL_GEMV_KIND: 1 (unset) the one-row kernel, 0 gemv_kernel for one row too
KINDS = ("0", "1")
ROW_NAMES = [f"wb::matmul::gemv_row_kernel<wb::{t}>" for t in ("f16", "bf16")]
# The GEMV route's kernels, as a profile names them (gemv_kernel, gemv_row_kernel)
RAN = re.compile(r"gemv_(row_|unaligned_)?kernel")
KNOBS = (
    "WB_MATMUL_GEMV",
    "WB_MATMUL_GEMV_ROWS",
    "WB_MATMUL_GEMV_SPLITS",
    "WB_MATMUL_GEMV_SUM",
    "WB_MATMUL_GEMV_KIND",
)
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.nvcc
@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_kernels_compile_within_their_launch_bounds(arch: str) -> None:
    """Two blocks of 256 threads an SM (at most 128 registers), but one for 8 rows of a on b
    n-major (gemv_blocks_per_sm); the one-row kernel two of 256; no spills."""
    for mangled, regs in nvrtc_entries(FILE, arch, NAMES + ROW_NAMES):
        if "gemv_row_kernel" in mangled:
            assert regs <= 128, (mangled, regs)
            continue
        tier = re.search(r"gemv_kernelINS_\w+?ELi(\d)ELb(\d)E", mangled)
        if tier is None:  # gemv_sum_kernel
            continue
        one_block = tier.group(1) == "8" and tier.group(2) == "0"
        assert regs <= (255 if one_block else 128), (mangled, regs)


@pytest.mark.nvcc
def test_the_launcher_and_the_entry_compile(tmp_path: Path) -> None:
    for name in ("matmul_gemv.cu", "matmul.cu"):
        done = nvcc_sm90a(tmp_path, "-c", "-o", f"{name}.o", source=FILE.parent / name)
        assert done.returncode == 0, done.stderr


# --- on a GPU ---------------------------------------------------------------------------------


def _use(monkeypatch: pytest.MonkeyPatch, variant: dict[str, str], forced: bool = True) -> None:
    """The switches of ``variant``; with ``forced``, the route on for m <= 8 and either layout
    (WB_MATMUL_GEMV=1) unless ``variant`` says otherwise."""
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**({"WB_MATMUL_GEMV": "1"} if forced else {}), **variant}.items():
        monkeypatch.setenv(name, value)


def _operands(m: int, n: int, k: int, col: bool, dtype: Any) -> tuple[Any, Any]:
    """a [m, k] and b [k, n] whose rows (b column-major: columns) are 16-byte aligned whatever n
    and k are: views of wider tensors, padded to 8 elements."""
    gen = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k + col)

    def padded(rows: int, cols: int) -> torch.Tensor:
        full = torch.randn(rows, (cols + 7) // 8 * 8, device="cuda", dtype=dtype, generator=gen)
        return full[:, :cols]

    a = padded(m, k)
    return a, padded(n, k).t() if col else padded(k, n)


def _check(lib: Any, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """Within the family's bound against the float64 product, and at most twice cuBLAS's largest
    error (or an ulp of c's largest value, where cuBLAS is exact on the sample)."""
    ref = a.double() @ b.double()
    rtol, atol = lib.specs["matmul"].tolerances[got.dtype]
    top = max(1.0, ref.abs().max().item())
    worst = ((got.double() - ref).abs() / (atol * top + rtol * ref.abs())).max().item()
    assert worst <= 1.0, f"{tuple(a.shape)} @ {tuple(b.shape)} {got.dtype}: err/tol {worst:.2f}"
    ours = (got.double() - ref).abs().max().item()
    cublas = (torch.matmul(a, b).double() - ref).abs().max().item()
    ulp = top * torch.finfo(got.dtype).eps
    assert ours <= max(2 * cublas, ulp), (tuple(a.shape), tuple(b.shape), ours, cublas)


# (n, k, b column-major): the goal's square both ways; n and k tails (k not a multiple of 8: the
# last group of a slice read element by element; n not a multiple of a tile or of 8); k short of
# a split; one element.
SHAPES = [
    (4096, 4096, False),
    (4096, 4096, True),
    (1000, 4100, True),
    (1001, 4100, False),
    (4104, 2056, False),
    (33, 4099, True),
    (40, 72, False),
    (1, 1, False),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k", "col"), SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_the_route_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, col: bool, dtype: Any
) -> None:
    _use(monkeypatch, {})
    a, b = _operands(m, n, k, col, dtype)
    if dtype == torch.bfloat16:  # the route ran (one dtype: the profiler is slow to start)
        assert RAN.search(cuda_kernels_run(lambda: lib.matmul(a, b)))
    _check(lib, lib.matmul(a, b), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
def test_the_route_runs_where_its_rule_says(
    lib: Any, monkeypatch: pytest.MonkeyPatch, col: bool
) -> None:
    """By default m = 1 on b n-major; WB_MATMUL_GEMV=1: m <= 8 (or WB_MATMUL_GEMV_ROWS) on either
    layout, not m = 9; not WB_MATMUL_GEMV=0, not a forced path; b's rows unaligned too (n = 1001
    contiguous: read in place, gemv_unaligned_kernel)."""

    def runs(m: int, variant: dict[str, str], n: int = 4096, path: int | None = None) -> bool:
        _use(monkeypatch, variant, forced=False)
        a = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, 4096, device="cuda", dtype=torch.bfloat16)
        b = w.t() if col else w.t().contiguous()
        call = (lambda: lib.matmul(a, b)) if path is None else (lambda: lib.matmul_path(a, b, path))
        _check(lib, call(), a, b)
        return RAN.search(cuda_kernels_run(call)) is not None

    on = {"WB_MATMUL_GEMV": "1"}
    assert runs(1, {}) == (not col) and not runs(2, {})  # the default rule
    assert runs(1, on) and runs(8, on) and not runs(9, on)
    two = {**on, "WB_MATMUL_GEMV_ROWS": "2"}
    assert runs(2, two) and not runs(3, two)
    assert runs(2, {"WB_MATMUL_GEMV_ROWS": "2"}) == (not col)
    assert not runs(1, {"WB_MATMUL_GEMV": "0"})
    assert runs(1, on, path=0) and not runs(1, on, path=1)
    if torch.cuda.get_device_capability() == (9, 0):
        assert not runs(1, on, path=3)  # matmul_path(..., wgmma) keeps the wgmma path
    if not col:
        assert runs(1, on, n=1001)


# (m, n, k, b column-major): one row; k tails (slices of unequal length); 8 rows, n wide.
def _assert_same_bits_by_either_sum(
    lib: Any, monkeypatch: pytest.MonkeyPatch, a: Any, b: Any, switches: dict[str, str]
) -> None:
    """Under ``switches``: each split of k (unset, forced 1 to 8, and 16 and 64 slices, which the
    second launch sums) is right and gives the same bits twice; a forced split gives the same
    bits by the cluster sum (where the GPU has clusters) as by the second launch (unset, a forced
    sum may plan other slices: the cluster sum holds at most 8)."""
    for splits in ("", "1", "2", "3", "8"):
        got = {}
        for sum_by in ("cluster", "launch"):
            variant = {**switches, "WB_MATMUL_GEMV_SUM": sum_by}
            _use(monkeypatch, {**variant, "WB_MATMUL_GEMV_SPLITS": splits} if splits else variant)
            got[sum_by] = lib.matmul(a, b).view(torch.int16)
            assert torch.equal(got[sum_by], lib.matmul(a, b).view(torch.int16)), (splits, sum_by)
        if splits:
            assert torch.equal(got["cluster"], got["launch"]), splits
        _check(lib, got["launch"].view(b.dtype), a, b)
    for splits in ("16", "64"):
        _use(monkeypatch, {**switches, "WB_MATMUL_GEMV_SPLITS": splits})
        first = lib.matmul(a, b)
        assert torch.equal(first.view(torch.int16), lib.matmul(a, b).view(torch.int16)), splits
        _check(lib, first, a, b)


SPLIT_SHAPES = [(1, 4096, 4096, False), (3, 1000, 4100, True), (8, 8192, 2056, False),
                (5, 4104, 4096, True)]  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k", "col"), SPLIT_SHAPES)
def test_the_same_bits_every_call_and_by_either_sum(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, col: bool, dtype: Any
) -> None:
    """Each split of k (forced, 1 to 64 slices) is right; two calls give the same bits, and the
    cluster sum (where the GPU has clusters, at most 8 slices) the second launch's."""
    _assert_same_bits_by_either_sum(lib, monkeypatch, *_operands(m, n, k, col, dtype), {})


@pytest.mark.cuda
def test_the_launch_sum_runs_its_second_kernel(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _operands(1, 4096, 4096, False, torch.bfloat16)
    _use(monkeypatch, {"WB_MATMUL_GEMV_SUM": "launch", "WB_MATMUL_GEMV_SPLITS": "4"})
    assert "gemv_sum_kernel" in cuda_kernels_run(lambda: lib.matmul(a, b))
    _use(monkeypatch, {"WB_MATMUL_GEMV_SPLITS": "1"})
    assert "gemv_sum_kernel" not in cuda_kernels_run(lambda: lib.matmul(a, b))


@pytest.mark.cuda
@pytest.mark.parametrize("sum_by", ["cluster", "launch"])
@pytest.mark.parametrize(("m", "col"), [(1, False), (1, True), (8, False), (4, True)])
def test_a_cuda_graph_replays_the_route(
    lib: Any, monkeypatch: pytest.MonkeyPatch, sum_by: str, m: int, col: bool
) -> None:
    """No state between calls: the workspace of the launch sum comes from the graph's pool."""
    _use(monkeypatch, {"WB_MATMUL_GEMV_SUM": sum_by})
    a, b = _operands(m, 4096, 4096, col, torch.bfloat16)
    assert_matmul_graph_replays(lib, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("name", "value"),
    [("WB_MATMUL_GEMV", "2"), ("WB_MATMUL_GEMV", "on"), ("WB_MATMUL_GEMV_ROWS", "9"),
     ("WB_MATMUL_GEMV_ROWS", "0"), ("WB_MATMUL_GEMV_SPLITS", "65"), ("WB_MATMUL_GEMV_SPLITS", "0"),
     ("WB_MATMUL_GEMV_SUM", "x")],
)  # fmt: skip
def test_a_bad_switch_is_an_error_naming_it(
    lib: Any, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    _use(monkeypatch, {name: value})
    a, b = _operands(1, 256, 256, False, torch.bfloat16)
    with pytest.raises(RuntimeError, match=name):
        lib.matmul(a, b)


@pytest.mark.cuda
def test_the_cluster_sum_of_more_than_8_slices_is_refused(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, {"WB_MATMUL_GEMV_SUM": "cluster", "WB_MATMUL_GEMV_SPLITS": "16"})
    a, b = _operands(1, 256, 4096, False, torch.bfloat16)
    with pytest.raises(RuntimeError, match="WB_MATMUL_GEMV_SUM=cluster sums at most 8 slices"):
        lib.matmul(a, b)


# --- one row: the one-row kernel and gemv_kernel (WB_MATMUL_GEMV_KIND) --------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k", "col"), SHAPES)
def test_each_one_row_kind_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, kind: str, n: int, k: int, col: bool, dtype: Any
) -> None:
    """At one row (the one-row kernel runs where b is n-major and the kind is 1, gemv_kernel
    else: seen at 4096 x 4096) and at 2 rows (gemv_kernel's tier); two calls give the same bits."""
    _use(monkeypatch, {"WB_MATMUL_GEMV_KIND": kind})
    for m in (1, 2):
        a, b = _operands(m, n, k, col, dtype)
        got = lib.matmul(a, b)
        assert torch.equal(got.view(torch.int16), lib.matmul(a, b).view(torch.int16)), m
        _check(lib, got, a, b)
    if dtype == torch.bfloat16 and n == k == 4096:  # the profiler is slow to start
        a, b = _operands(1, n, k, col, dtype)
        run = cuda_kernels_run(lambda: lib.matmul(a, b))
        assert ("gemv_row_kernel" in run) == (kind == "1" and not col), run


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (1000, 4100), (8192, 2056), (4104, 4099)])
def test_each_one_row_kind_gives_the_same_bits_at_every_split_and_by_either_sum(
    lib: Any, monkeypatch: pytest.MonkeyPatch, kind: str, n: int, k: int, dtype: Any
) -> None:
    a, b = _operands(1, n, k, False, dtype)
    _assert_same_bits_by_either_sum(lib, monkeypatch, a, b, {"WB_MATMUL_GEMV_KIND": kind})


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sum_by", ["cluster", "launch"])
def test_a_cuda_graph_replays_each_one_row_kind(
    lib: Any, monkeypatch: pytest.MonkeyPatch, kind: str, sum_by: str
) -> None:
    _use(monkeypatch, {"WB_MATMUL_GEMV_KIND": kind, "WB_MATMUL_GEMV_SUM": sum_by}, forced=False)
    a, b = _operands(1, 4096, 4096, False, torch.bfloat16)
    assert ("gemv_row_kernel" in cuda_kernels_run(lambda: lib.matmul(a, b))) == (kind == "1")
    assert_matmul_graph_replays(lib, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("value", ["2", "x", "-1"])
def test_a_bad_kind_is_an_error_naming_it(
    lib: Any, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    _use(monkeypatch, {"WB_MATMUL_GEMV_KIND": value}, forced=False)
    a, b = _operands(1, 256, 256, False, torch.bfloat16)
    with pytest.raises(RuntimeError, match="WB_MATMUL_GEMV_KIND must be 0"):
        lib.matmul(a, b)
