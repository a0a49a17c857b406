"""The matmul's GEMV route on an n-major b whose rows are not 16-byte aligned, read in place
(gemv_unaligned_kernel: kernels/matmul/gemv_unaligned.cuh, launched by matmul_gemv.cu), where
the binding used to copy b into padded rows first (at 1 x 4095^2 the copy cost twice the GEMV).

Each lane loads the aligned 16-byte chunk at its place in the row and takes its 8 columns from
its chunk and the next lane's; the rows, their order and the sums are the aligned kernels', so c
has the same bits as the route gives for a padded copy of b. WB_MATMUL_GEMV_UNALIGNED=0 leaves
such a b to the binding's copy (the route as before); a bad value is an error naming it. An a of
one row that is off 16 bytes is still copied (a few KiB).

Without a GPU: the kernels compile for sm_80 and sm_90a within their launch bounds and without
spills. On a GPU (marked cuda): c within 8e-3 of the largest |c| of a float64 product at m = 1
(the default route) and m = 2..8 (WB_MATMUL_GEMV=1), b row-major or a slice of a wider tensor
(odd row stride, odd base), both dtypes; the same bits as the route on a padded copy of b (by
either sum at forced splits) and every call; no copy kernel runs for b; a CUDA graph replays it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from tests.bundled_cubin import assert_matmul_graph_replays, cuda_kernels_run, nvrtc_entries
from workbench import nvrtc
from workbench.project import BUNDLED_KERNELS

FILE = BUNDLED_KERNELS / "matmul" / "matmul_gemv.kernel.cu"
TIERS = (1, 4, 8)  # gemv_unaligned_kernel's M: m = 1, 2..4, 5..8
NAMES = [f"wb::matmul::gemv_unaligned_kernel<wb::{t},{m}>" for t in ("f16", "bf16") for m in TIERS]
KNOBS = (
    "WB_MATMUL_GEMV",
    "WB_MATMUL_GEMV_ROWS",
    "WB_MATMUL_GEMV_SPLITS",
    "WB_MATMUL_GEMV_SUM",
    "WB_MATMUL_GEMV_KIND",
    "WB_MATMUL_GEMV_UNALIGNED",
)
DTYPES = [torch.bfloat16, torch.float16]
# A copy of an operand, as a profile names torch's copy_ (direct_copy_kernel_cuda inside an
# elementwise_kernel)
COPY = re.compile(r"copy_kernel|elementwise_kernel")
# (n, k): odd squares, an odd n, both small, and b's rows aligned (n = 4096: only its slice is not)
SHAPES = [(4095, 4095), (4097, 4096), (1001, 999), (7, 13), (4096, 4095)]
LAYOUTS = ("row-major", "slice")


@pytest.mark.nvcc
@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_kernels_compile_within_their_launch_bounds(arch: str) -> None:
    """gemv_kernel's blocks an SM for the m each tier serves: two (128 registers) for M = 1 and
    4, one for M = 8; no spills."""
    for mangled, regs in nvrtc_entries(FILE, arch, NAMES):
        tier = re.search(r"gemv_unaligned_kernelINS_\w+?ELi(\d)E", mangled)
        assert tier is not None, mangled
        assert regs <= (255 if tier.group(1) == "8" else 128), (mangled, regs)


# --- on a GPU ---------------------------------------------------------------------------------


def _use(monkeypatch: pytest.MonkeyPatch, variant: dict[str, str]) -> None:
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    for name, value in variant.items():
        monkeypatch.setenv(name, value)


def _rows(m: int) -> dict[str, str]:
    """The switches that put an a of m rows on the route: none for one row (the default)."""
    return {} if m == 1 else {"WB_MATMUL_GEMV": "1"}


def _operands(m: int, n: int, k: int, layout: str, dtype: Any) -> tuple[Any, Any]:
    """a [m, k] with 16-byte aligned rows (so that only b is off), and b [k, n]: row-major, or
    columns 1..n of a [k, n + 3] tensor (row stride n + 3, base one element in)."""
    gen = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(m, (k + 7) // 8 * 8, device="cuda", dtype=dtype, generator=gen)[:, :k]
    if layout == "row-major":
        b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
    else:
        b = torch.randn(k, n + 3, device="cuda", dtype=dtype, generator=gen)[:, 1 : n + 1]
    return a, b


def _padded(b: torch.Tensor) -> torch.Tensor:
    """b copied into rows padded to 8 elements: what the aligned kernels read."""
    out = torch.empty(b.shape[0], (b.shape[1] + 7) // 8 * 8, device=b.device, dtype=b.dtype)
    return out[:, : b.shape[1]].copy_(b)


def _bits(c: torch.Tensor) -> torch.Tensor:
    return c.view(torch.int16)


def _assert_near_truth(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    ref = a.double() @ b.double()
    top = ref.abs().max().item()
    err = (got.double() - ref).abs().max().item()
    assert err <= 8e-3 * max(top, 1e-30), (tuple(a.shape), tuple(b.shape), got.dtype, err, top)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
def test_c_is_right_and_the_bits_of_a_padded_copy(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, layout: str, dtype: Any
) -> None:
    """Near the float64 product; the same bits twice, and as the route gives for b padded (the
    one-row kernel at m = 1, gemv_kernel's tier of m else)."""
    _use(monkeypatch, _rows(m))
    a, b = _operands(m, n, k, layout, dtype)
    got = lib.matmul(a, b)
    _assert_near_truth(got, a, b)
    assert torch.equal(_bits(got), _bits(lib.matmul(a, b)))
    assert torch.equal(_bits(got), _bits(lib.matmul(a, _padded(b))))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 4, 8])
def test_every_split_by_either_sum_gives_the_bits_of_a_padded_copy(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, dtype: Any
) -> None:
    """Forced splits of k (1 to 8: the last slice's group passes k's end; 16 and 64, the second
    launch's sum over the workspace), each sum: the padded copy's bits."""
    a, b = _operands(m, 4097, 4095, "slice", dtype)
    bp = _padded(b)
    for splits in ("1", "2", "3", "8", "16", "64"):
        for sum_by in ("cluster", "launch"):
            if sum_by == "cluster" and int(splits) > 8:
                continue
            variant = {**_rows(m), "WB_MATMUL_GEMV_SPLITS": splits, "WB_MATMUL_GEMV_SUM": sum_by}
            _use(monkeypatch, variant)
            got = lib.matmul(a, b)
            assert torch.equal(_bits(got), _bits(lib.matmul(a, bp))), (splits, sum_by)
            _assert_near_truth(got, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [1, 4])
def test_b_is_read_in_place_with_no_copy(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, layout: str
) -> None:
    """The profile of a call: gemv_unaligned_kernel and no copy kernel; with
    WB_MATMUL_GEMV_UNALIGNED=0 the binding's copy of b and the aligned kernels, the same bits."""
    a, b = _operands(m, 4095, 4095, layout, torch.bfloat16)
    _use(monkeypatch, _rows(m))
    run = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert "gemv_unaligned_kernel" in run and not COPY.search(run), run
    in_place = lib.matmul(a, b)
    _use(monkeypatch, {**_rows(m), "WB_MATMUL_GEMV_UNALIGNED": "0"})
    run = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert "gemv_unaligned_kernel" not in run and COPY.search(run), run
    assert re.search(r"gemv_(row_)?kernel", run), run
    assert torch.equal(_bits(in_place), _bits(lib.matmul(a, b)))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_an_a_of_one_row_off_16_bytes_is_copied_and_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: Any
) -> None:
    """a = a slice one element in (its base off 16 bytes): the binding copies it (a few KiB), b
    is still read in place."""
    _use(monkeypatch, {})
    _, b = _operands(1, 4095, 4095, "row-major", dtype)
    a = torch.randn(1, 4096, device="cuda", dtype=dtype)[:, 1:]
    got = lib.matmul(a, b)
    _assert_near_truth(got, a, b)
    assert torch.equal(_bits(got), _bits(lib.matmul(a.contiguous(), _padded(b))))
    if dtype == torch.bfloat16:  # the profiler is slow to start
        assert "gemv_unaligned_kernel" in cuda_kernels_run(lambda: lib.matmul(a, b))


@pytest.mark.cuda
@pytest.mark.parametrize("sum_by", ["cluster", "launch"])
@pytest.mark.parametrize("m", [1, 8])
def test_a_cuda_graph_replays_it(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, sum_by: str
) -> None:
    _use(monkeypatch, {**_rows(m), "WB_MATMUL_GEMV_SUM": sum_by})
    a, b = _operands(m, 4095, 4095, "slice", torch.bfloat16)
    assert_matmul_graph_replays(lib, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("value", ["2", "x", "-1"])
def test_a_bad_unaligned_switch_is_an_error_naming_it(
    lib: Any, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    _use(monkeypatch, {"WB_MATMUL_GEMV_UNALIGNED": value})
    a, b = _operands(1, 4095, 4095, "row-major", torch.bfloat16)
    with pytest.raises(RuntimeError, match="WB_MATMUL_GEMV_UNALIGNED must be 0"):
        lib.matmul(a, b)
