"""softmax's variants for timing (issue 37): the held block path (WB_SOFTMAX_BLOCK=held|held64,
kernels/softmax/softmax_held.cuh) against torch.softmax and torch._softmax_backward_data at the
goal sizes and odd lengths, special rows included, and its bad values named; and the wide path's
push exchange across thousands of clusters. The switches' parsing runs on the CPU in
tests/test_softmax_paths.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.test_softmax_paths import (
    assert_exp_mode_softmax,
    exp_mode_rows,
    kernels_run,
    special_rows,
)


def _check_both(lib: Any, x: torch.Tensor, grad: torch.Tensor) -> None:
    """softmax(x) and its backward at y = torch's softmax against torch in float32."""
    half = x.dtype != torch.float32
    want_y = torch.softmax(x.float(), -1)
    rtol = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}[x.dtype]
    tol = {"rtol": rtol, "atol": 6e-8 if half else 1e-9}
    torch.testing.assert_close(lib.softmax(x, -1).float(), want_y, equal_nan=True, **tol)
    y = want_y.nan_to_num(0.0).to(x.dtype)
    want_dx = torch._softmax_backward_data(grad.float(), y.float(), -1, torch.float32)
    scale = float(want_dx.abs().max())
    tol = {"rtol": 1.6e-2, "atol": 1e-2 * scale} if half else {"rtol": 1e-4, "atol": 1e-6 * scale}
    torch.testing.assert_close(lib.softmax_backward(grad, y, -1).float(), want_dx, **tol)


def _held_runs(mode: str, dtype: torch.dtype, cols: int) -> bool:
    """Whether the forward takes held_kernel: rows of 16-byte vectors on the block path (more
    than 32 and at most 512 of its K = 32 / N vectors a thread) whose held blocks (8 or 4
    vectors a thread) stay within 512 threads."""
    n = 16 // torch.empty(0, dtype=dtype).element_size()
    nvec, k = cols // n, 32 // n
    held = 8 if mode == "held" else 4
    return cols % n == 0 and 32 * k < nvec <= 512 * k and -(-nvec // (32 * held)) * 32 <= 512


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["held", "held64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("rows", "cols"), [(256, 16384), (33, 8200), (9, 1032), (5, 4100), (3, 16392), (7, 131)]
)
def test_the_held_block_variants_match_torch(
    lib: Any,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    dtype: torch.dtype,
    rows: int,
    cols: int,
) -> None:
    """WB_SOFTMAX_BLOCK=held or held64: the block path's rows held as loaded, forward and
    backward against torch (special rows included); rows the variant does not take (too long,
    or not of 16-byte vectors) run the default paths."""
    monkeypatch.setenv("WB_SOFTMAX_BLOCK", mode)
    gen = torch.Generator().manual_seed(rows * cols)
    x = special_rows(torch.randn(rows, cols, generator=gen) * 3).to(dtype).cuda()
    grad = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert any("held_kernel" in n for n in names) == _held_runs(mode, dtype, cols), names
    _check_both(lib, x, grad)


def _held_backward_runs(dtype: torch.dtype, cols: int) -> bool:
    """Whether the backward takes held_kernel at 64 bytes a thread: rows of 16-byte vectors on the
    block path (more than 32 and at most 512 of its K = 16 / N vectors a thread, two tensors)
    whose held blocks (2 vectors of each tensor a thread) stay within 512 threads."""
    n = 16 // torch.empty(0, dtype=dtype).element_size()
    nvec, k = cols // n, 16 // n
    return cols % n == 0 and 32 * k < nvec <= 512 * k and -(-nvec // (32 * 2)) * 32 <= 512


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cols", [2048, 4104, 16384])
def test_the_block_paths_default_kernel(
    lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, cols: int
) -> None:
    """Unset, a 2-byte dtype on the block path's rows takes held_kernel (the forward 128 bytes a
    thread, the backward 64), float32 block_kernel; WB_SOFTMAX_BLOCK=convert gives block_kernel
    back. Each against torch, special rows included."""
    monkeypatch.delenv("WB_SOFTMAX_BLOCK", raising=False)
    gen = torch.Generator().manual_seed(cols)
    x = special_rows(torch.randn(96, cols, generator=gen)).to("cuda", dtype)
    grad = torch.randn(96, cols, generator=gen).to("cuda", dtype)
    _check_both(lib, x, grad)
    forward = kernels_run(lambda: lib.softmax(x, -1))
    held = dtype != torch.float32 and _held_runs("held", dtype, cols)
    assert any("held_kernel" in n for n in forward) == held, forward
    y = torch.softmax(x.float(), -1).nan_to_num(0.0).to(dtype)
    backward = kernels_run(lambda: lib.softmax_backward(grad, y, -1))
    held_b = dtype != torch.float32 and _held_backward_runs(dtype, cols)
    assert any("held_kernel" in n for n in backward) == held_b, backward
    monkeypatch.setenv("WB_SOFTMAX_BLOCK", "convert")
    _check_both(lib, x, grad)
    assert not any("held_kernel" in n for n in kernels_run(lambda: lib.softmax(x, -1)))


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["keep", "fma", "poly", "twice", ""])
@pytest.mark.parametrize("held", ["held", "held64"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_held_variants_take_the_exp_modes(
    lib: Any, monkeypatch: pytest.MonkeyPatch, mode: str, held: str, dtype: torch.dtype
) -> None:
    """The held variants' 2-byte forward with each WB_SOFTMAX_EXP mode: torch's softmax within
    the dtype's rounding, a row of float16 values near 60000 (where the fma formula would cost 8
    ulps: it takes twice's) and, in bfloat16, a row holding +-3e38 among them; -Inf gives 0."""
    monkeypatch.setenv("WB_SOFTMAX_BLOCK", held)
    monkeypatch.setenv("WB_SOFTMAX_EXP", mode)
    x = exp_mode_rows(6, 16384, dtype, seed=16384)
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert any("held_kernel" in n for n in names), names
    assert_exp_mode_softmax(x, lib.softmax(x, -1))


def _sm90() -> None:
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the cluster paths need sm_90")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "cols"), [(3, 65536), (2000, 16392), (600, 32776)])
def test_the_push_exchange_across_thousands_of_clusters(
    lib: Any,
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
    rows: int,
    cols: int,
) -> None:
    """The wide path pushes a row's partials into every block of its cluster (softmax_rows.cuh,
    Inbox): thousands of rows, a cluster each, many resident at once; every row against torch,
    forward and backward, special rows included, run twice for the same bits (a partial read
    before it had landed would differ from run to run)."""
    _sm90()
    monkeypatch.setenv("WB_SOFTMAX_PATH", "wide")
    gen = torch.Generator().manual_seed(rows + cols)
    x = special_rows(torch.randn(rows, cols, generator=gen)).to(dtype).cuda()
    grad = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert any("wide_kernel" in n for n in names), names
    first = lib.softmax(x, -1)
    assert torch.equal(first.nan_to_num(7.0), lib.softmax(x, -1).nan_to_num(7.0))
    _check_both(lib, x, grad)


def _ragged_kernels(dtype: torch.dtype, cols: int) -> list[str | None]:
    """The ragged kernel the forward and the backward take, for rows of a length that is no
    multiple of a vector, by their aligned middle's vectors (k = 8 a thread forward, 4 of each
    tensor backward): from 4 up to a warp's 32 k, ragged_warp_kernel; up to a block's 512 k,
    ragged_block_kernel (both on any arch); past it ragged_kernel (sm_90); else neither."""
    n = 16 // torch.empty(0, dtype=dtype).element_size()
    middle = (cols - n + 1) // n
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    if cols % n == 0 or middle < 4:
        return [None, None]
    return [
        "ragged_warp_kernel"
        if middle <= 32 * k
        else "ragged_block_kernel"
        if middle <= 512 * k
        else ("ragged_kernel" if hopper else None)
        for k in (8, 4)
    ]


def _ragged_names(names: list[str]) -> str | None:
    """The ragged kernel among a run's kernel names (None for neither)."""
    for kernel in ("ragged_warp_kernel", "ragged_block_kernel", "ragged_kernel"):
        if any(f"{kernel}<" in n for n in names):
            return kernel
    return None


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("rows", "cols"), [(64, 50257), (3, 262147), (130, 16391), (9, 65543), (1, 24577)]
)
def test_ragged_rows_match_torch(lib: Any, dtype: torch.dtype, rows: int, cols: int) -> None:
    """Long rows whose length is no multiple of a 16-byte vector take the ragged path on sm_90
    (softmax_ragged.cuh: the wide path on each row's aligned middle, its ends an element a thread
    of the first block), forward and backward, where the middle passes a block; every row starts
    at another offset from a 16-byte boundary (rows * cols runs through them), and the special
    rows put NaN and +Inf into a row's ends (element 5 of row 1, the last of row 2)."""
    _sm90()
    _check_ragged(lib, dtype, rows, cols)


def _check_ragged(lib: Any, dtype: torch.dtype, rows: int, cols: int) -> None:
    """The ragged kernels each direction takes (_ragged_kernels), both against torch, and the
    forward's bits the same twice."""
    gen = torch.Generator().manual_seed(rows * cols)
    x = special_rows(torch.randn(rows, cols, generator=gen)).to(dtype).cuda()
    grad = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    y = torch.softmax(x.float(), -1).nan_to_num(0.0).to(dtype)
    lib.softmax(x, -1)
    forward = kernels_run(lambda: lib.softmax(x, -1))
    backward = kernels_run(lambda: lib.softmax_backward(grad, y, -1))
    got = [_ragged_names(names) for names in (forward, backward)]
    assert got == _ragged_kernels(dtype, cols), (forward, backward)
    _check_both(lib, x, grad)
    first = lib.softmax(x, -1)
    assert torch.equal(first.nan_to_num(7.0), lib.softmax(x, -1).nan_to_num(7.0))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("rows", "cols"),
    [
        (300, 18),
        (300, 19),
        (300, 38),
        (300, 39),
        (300, 67),
        (300, 135),
        (257, 263),
        (77, 1001),
        (40, 4097),
        (33, 8199),
        (21, 16389),
        (5, 20001),
        (3, 32765),
    ],
)
def test_shorter_ragged_rows_take_a_block_or_a_warp_a_row(
    lib: Any, dtype: torch.dtype, rows: int, cols: int
) -> None:
    """Rows of a length that is no multiple of a vector, whose aligned middle a block of 512
    threads holds, take ragged_block_kernel, or ragged_warp_kernel where a warp holds it (groups
    of 8, 16 or 32 lanes a row, a lane of 8 taking two of a 2-byte row's ends where it has more
    than 8 (67 bfloat16: 11), rows past the last in a block's last groups), on any arch: the middle
    held as loaded, the ends an element a thread, every offset of a row's start, special values in
    its ends, the longest middle a block holds (32765 bfloat16, 4095 vectors), middles of 4 to 32
    vectors (19 float32 and 39 bfloat16, 4; 67 bfloat16, 7; 67 float32 and 135 bfloat16, 16; 263
    bfloat16, 32); shorter ones stay element by element (18 float32 and 38 bfloat16, 3)."""
    _check_ragged(lib, dtype, rows, cols)


@pytest.mark.cuda
def test_a_path_asked_for_takes_ragged_rows_element_by_element(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WB_SOFTMAX_PATH other than wide keeps ragged rows on the element paths (stream here)."""
    _sm90()
    monkeypatch.setenv("WB_SOFTMAX_PATH", "stream")
    x = torch.randn(4, 50257, device="cuda")
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert any("stream_kernel" in n for n in names) and not any("ragged" in n for n in names)
    torch.testing.assert_close(lib.softmax(x, -1), torch.softmax(x, -1), rtol=2e-5, atol=1e-9)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("env", "value", "shape"),
    [
        ("WB_SOFTMAX_BLOCK", "fast", (4, 16384)),
        ("WB_SOFTMAX_BLOCK", "held128", (4, 4096)),
    ],
)
def test_a_bad_variant_value_is_named(
    lib: Any, monkeypatch: pytest.MonkeyPatch, env: str, value: str, shape: tuple[int, int]
) -> None:
    monkeypatch.setenv(env, value)
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=env):
        lib.softmax(x, -1)
        torch.cuda.synchronize()
