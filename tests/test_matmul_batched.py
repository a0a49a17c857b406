"""The whole-batch route's kernels beyond test_matmul.py's: a batch of float16 / bfloat16 matrices
in one launch on Hopper (matmul_wgmma_batched.cu: the 3-D tensor maps' slices, both tiles, the
rule that picks it over the mma path's batch), the SIMT batch's float32 tiles, and their
switches' errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import cuda_kernel_names

pytestmark = pytest.mark.cuda

HOPPER = "wgmma_batched_kernel"
MMA = "::mma_kernel<"  # the mma path's (not wgmma_kernel, whose name ends alike)


def _hopper() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the batched wgmma kernel needs sm_90a")


def _launches(fn: Any) -> list[str]:
    """The workbench's kernels one call of fn launched (torch's copies of padded rows left out)."""
    fn()  # the launch's one-time queries outside the profile
    return [n for n in cuda_kernel_names(fn) if "wb::" in n]


def _grids(fn: Any, tmp: Path) -> list[int]:
    """The grid (blocks along x) of each launch of the Hopper batch kernel one call of fn made,
    from the profiler's trace: a batch in S slices of k launches S blocks a tile."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    trace = tmp / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    return [e["args"]["grid"][0] for e in events if HOPPER in e.get("name", "") and "args" in e]


def _close(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    want = torch.matmul(a.double(), b.double())
    assert c.shape == want.shape and c.dtype == a.dtype and c.is_contiguous()
    # Rounded once from float32 sums: two ulps of the dtype, and a floor for cancellation.
    ulp = 2.0**-7 if a.dtype == torch.bfloat16 else 2.0**-10
    torch.testing.assert_close(c.double(), want, rtol=2 * ulp, atol=1e-3 * float(want.abs().max()))


def _rand(gen: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device="cuda", dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tile", ["128x256", "192x128", "128x128"])
def test_hopper_batch_matches_float64(
    lib: Any, dtype: torch.dtype, tile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced onto the Hopper kernel and each tile: tails of m, n and k in every slice (a box
    past a slice's edge is zeros, never the next slice's rows), rows padded to 16 bytes, columns of
    c that are not a multiple of 8 (stored from registers), a batch given as a strided view,
    more tiles than SMs (the persistent blocks walk into later slices), and a 3-d call of one
    slice. Each in one launch of the kernel."""
    _hopper()
    monkeypatch.setenv("WB_MATMUL_BATCH", "wgmma")
    monkeypatch.setenv("WB_WGMMA_BATCH_TILE", tile)
    gen = torch.Generator().manual_seed(21)
    cases = [
        (_rand(gen, dtype, 3, 200, 136), _rand(gen, dtype, 3, 136, 264)),  # tails, k past 2 steps
        (_rand(gen, dtype, 4, 131, 77), _rand(gen, dtype, 4, 77, 75)),  # padded rows, n % 8 != 0
        (_rand(gen, dtype, 300, 130, 64), _rand(gen, dtype, 300, 64, 136)),  # 600+ tiles
    ]
    big_a, big_b = _rand(gen, dtype, 6, 144, 96), _rand(gen, dtype, 6, 96, 160)
    cases.append((big_a[::2], big_b[1::2]))  # slices further apart than a matrix
    rows, cols = tile.split("x")
    for a, b in cases:
        names = _launches(lambda a=a, b=b: lib.matmul(a, b))
        assert len(names) == 1 and HOPPER in names[0], (a.shape, b.shape, names)
        assert f", {rows}, {cols}, false, false, false>" in names[0], names
        _close(lib.matmul(a, b), a, b)
    # Large values summed long (bfloat16's range; float16 would overflow): the float32
    # accumulator, rounded once.
    scale = 30.0 if dtype == torch.bfloat16 else 1.0
    a, b = _rand(gen, dtype, 2, 256, 1024) * scale, _rand(gen, dtype, 2, 1024, 256) * scale
    _close(lib.matmul(a, b), a, b)


@pytest.mark.parametrize("tile", ["128x256", "192x128", "128x128"])
def test_hopper_batch_reads_column_major_slices_in_place(
    lib: Any, tile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b = x.transpose(-1, -2) (column-major slices, as k^T in q @ k^T), a so (as in a gradient
    a^T @ g), or both: the Hopper kernel reads them in place on each tile (no copy: one launch
    in all), tails of m, n and k included; columns that are not 16-byte aligned, or
    WB_WGMMA_BATCH_TRANSPOSED=copy, copy them to row-major first."""
    _hopper()
    monkeypatch.setenv("WB_MATMUL_BATCH", "wgmma")
    monkeypatch.setenv("WB_WGMMA_BATCH_TILE", tile)
    rows, cols = tile.split("x")
    gen = torch.Generator().manual_seed(25)
    for dtype in (torch.bfloat16, torch.float16):
        a = _rand(gen, dtype, 3, 200, 136)
        b = _rand(gen, dtype, 3, 264, 136).transpose(1, 2)  # [3, 136, 264], columns contiguous
        a_t = _rand(gen, dtype, 3, 136, 200).transpose(1, 2)  # [3, 200, 136], columns contiguous
        b_rows = _rand(gen, dtype, 3, 136, 264)
        for x, y, layout in ((a, b, "true, false"), (a_t, b_rows, "false, true"),
                             (a_t, b, "true, true")):  # fmt: skip
            lib.matmul(x, y)
            names = cuda_kernel_names(lambda x=x, y=y: lib.matmul(x, y))
            assert len(names) == 1 and f"{HOPPER}<" in names[0], names
            assert f", {rows}, {cols}, {layout}, false>" in names[0], names
            _close(lib.matmul(x, y), x, y)
    odd_a = _rand(gen, torch.bfloat16, 4, 131, 77)
    odd_b = _rand(gen, torch.bfloat16, 4, 75, 77).transpose(1, 2)  # columns of 77: copied
    names = _launches(lambda: lib.matmul(odd_a, odd_b))
    assert len(names) == 1 and ", false, false, false>" in names[0], names
    _close(lib.matmul(odd_a, odd_b), odd_a, odd_b)
    monkeypatch.setenv("WB_WGMMA_BATCH_TRANSPOSED", "copy")
    a, b = _rand(gen, torch.bfloat16, 3, 200, 136), _rand(gen, torch.bfloat16, 3, 264, 136)
    names = _launches(lambda: lib.matmul(a, b.transpose(1, 2)))
    assert len(names) == 1 and ", false, false, false>" in names[0], names
    _close(lib.matmul(a, b.transpose(1, 2)), a, b.transpose(1, 2))


def test_attention_scores_read_k_transposed_in_place(lib: Any) -> None:
    """Unset, q @ k^T over 96 heads of 512 x 64 runs the Hopper kernel on k as it lies: one kernel
    launched, no copy; and k^T where the mma path's batch runs (slices of 64 columns, k short) is
    copied for it, and right."""
    _hopper()
    gen = torch.Generator().manual_seed(26)
    q, key = _rand(gen, torch.bfloat16, 96, 512, 64), _rand(gen, torch.bfloat16, 96, 512, 64)
    lib.matmul(q, key.transpose(1, 2))
    names = cuda_kernel_names(lambda: lib.matmul(q, key.transpose(1, 2)))
    assert len(names) == 1 and f"{HOPPER}<" in names[0] and ", true, false, false>" in names[0], (
        names
    )
    _close(lib.matmul(q, key.transpose(1, 2)), q, key.transpose(1, 2))
    small_q, small_k = (
        _rand(gen, torch.bfloat16, 96, 64, 64),
        _rand(gen, torch.bfloat16, 96, 64, 64),
    )
    names = _launches(lambda: lib.matmul(small_q, small_k.transpose(1, 2)))
    assert len(names) == 1 and MMA in names[0], names
    _close(lib.matmul(small_q, small_k.transpose(1, 2)), small_q, small_k.transpose(1, 2))


def test_hopper_batch_leaves_overlapping_slices_to_the_mma_path(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An a shared through a zero batch stride is no 3-D map's: even forced, the mma path's batch
    runs it, and right. (A b shared so is one product of a's rows: test_matmul.py.)"""
    _hopper()
    monkeypatch.setenv("WB_MATMUL_BATCH", "wgmma")
    gen = torch.Generator().manual_seed(22)
    shared = _rand(gen, torch.bfloat16, 256, 128).expand(8, -1, -1)
    b = _rand(gen, torch.bfloat16, 8, 128, 192)
    names = _launches(lambda: lib.matmul(shared, b))
    assert len(names) == 1 and MMA in names[0] and HOPPER not in names[0], names
    _close(lib.matmul(shared, b), shared, b)


@pytest.mark.parametrize("tile", ["128x256", "128x128"])
@pytest.mark.parametrize("splits", [2, 3, 8])
def test_hopper_batch_in_slices_of_k_matches_float64(
    lib: Any, tile: str, splits: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Forced onto the Hopper kernel in clusters of S blocks, each a slice of k, summed in the
    cluster: S blocks a tile in one launch; tails of m, n and k in every slice, slices of unequal
    steps (16 steps in 3), columns of c that are not a multiple of 4, column-major a and b, a
    strided batch, and more clusters than fit at once."""
    _hopper()
    monkeypatch.setenv("WB_MATMUL_BATCH", "wgmma")
    monkeypatch.setenv("WB_WGMMA_BATCH_TILE", tile)
    monkeypatch.setenv("WB_WGMMA_BATCH_SPLITS", str(splits))
    rows, cols = (int(x) for x in tile.split("x"))
    gen = torch.Generator().manual_seed(27)
    big_a, big_b = _rand(gen, torch.bfloat16, 6, 144, 520), _rand(gen, torch.bfloat16, 6, 520, 160)
    a_t, b_t = _rand(gen, torch.bfloat16, 3, 1000, 200), _rand(gen, torch.bfloat16, 3, 136, 1000)
    cases = [
        (_rand(gen, torch.bfloat16, 3, 200, 1000), _rand(gen, torch.bfloat16, 3, 1000, 264)),
        (_rand(gen, torch.float16, 2, 131, 1000), _rand(gen, torch.float16, 2, 1000, 74)),
        (a_t.transpose(1, 2), b_t.transpose(1, 2)),
        (big_a[::2], big_b[1::2]),
        (_rand(gen, torch.float16, 40, 256, 512), _rand(gen, torch.float16, 40, 512, 256)),
    ]
    for a, b in cases:
        batch, m, n = a.shape[0], a.shape[1], b.shape[2]
        tiles = batch * -(-m // rows) * -(-n // cols)
        assert _grids(lambda a=a, b=b: lib.matmul(a, b), tmp_path) == [tiles * splits], (a.shape,)
        _close(lib.matmul(a, b), a, b)
    # Large values summed long (bfloat16's range): the slices' float32 sums, rounded once.
    a, b = _rand(gen, torch.bfloat16, 2, 256, 2048) * 30, _rand(gen, torch.bfloat16, 2, 2048, 256)
    _close(lib.matmul(a, b), a, b)


def test_batch_slices_the_tile_has_no_kernel_for_are_an_error(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """192 x 128 has no kernel in slices of k, and k of 3 steps cannot be cut in 4: each forced is
    an error naming the switch, not a wrong answer."""
    _hopper()
    monkeypatch.setenv("WB_MATMUL_BATCH", "wgmma")
    monkeypatch.setenv("WB_WGMMA_BATCH_SPLITS", "4")
    a, b = torch.randn(2, 256, 1024, device="cuda"), torch.randn(2, 1024, 256, device="cuda")
    monkeypatch.setenv("WB_WGMMA_BATCH_TILE", "192x128")
    with pytest.raises(RuntimeError, match="WB_WGMMA_BATCH_SPLITS"):
        lib.matmul(a.bfloat16(), b.bfloat16())
    monkeypatch.delenv("WB_WGMMA_BATCH_TILE")
    with pytest.raises(RuntimeError, match="WB_WGMMA_BATCH_SPLITS"):
        lib.matmul(a[:, :, :192].bfloat16(), b[:, :192].bfloat16())


@pytest.mark.parametrize(
    ("shape", "split"),
    [
        ((16, 128, 128, 8192), True),  # 16 tiles (a slice at a time before)
        ((4, 512, 512, 4096), True),  # 64 tiles of 128 x 128 (the mma path's batch before)
        ((8, 512, 512, 512), False),  # 128 tiles, k short: k whole
        ((96, 512, 512, 64), False),  # one k step
    ],
)
def test_the_batch_rule_cuts_a_long_k_where_tiles_are_few(
    lib: Any, shape: tuple[int, int, int, int], split: bool, tmp_path: Path
) -> None:
    """Unset, a batch whose tiles leave most SMs idle and whose k is long runs on the Hopper
    kernel in slices of k, 2 to 8 blocks a tile, one launch, where before it went to the mma
    path's batch or a slice at a time; a batch that fills the SMs keeps k whole (a block an SM at
    most). Judged on a GPU of 132 SMs (an H100 SXM) or near it."""
    _hopper()
    batch, m, n, k = shape
    gen = torch.Generator().manual_seed(28)
    a, b = _rand(gen, torch.bfloat16, batch, m, k), _rand(gen, torch.bfloat16, batch, k, n)
    names = _launches(lambda: lib.matmul(a, b))
    assert len(names) == 1 and HOPPER in names[0], (shape, names)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if 120 <= sms <= 144:
        rows, cols = (int(x) for x in re.findall(rf"{HOPPER}<[^,]+, (\d+), (\d+),", names[0])[0])
        tiles = batch * -(-m // rows) * -(-n // cols)
        (grid,) = _grids(lambda: lib.matmul(a, b), tmp_path)
        if split:
            assert grid % tiles == 0 and 2 <= grid // tiles <= 8 and grid <= sms, (names, grid)
        else:
            assert grid <= min(tiles, sms), (names, grid)
    _close(lib.matmul(a, b), a, b)


@pytest.mark.parametrize(
    ("shape", "tile"),
    [
        ((8, 512, 512, 512), "128, 128"),  # 128 tiles of 128 x 128: past half the SMs
        ((4, 1024, 1024, 1024), "128, 256"),  # one wave of 128 x 256, two of 128 x 128
        ((16, 384, 384, 384), "192, 128"),  # tiles that end where the slices do
        ((96, 512, 512, 64), "128, 256"),  # attention's scores, q @ k^T of 64 features
        ((96, 512, 64, 512), "128, 128"),  # its p @ v: 64 columns, but k long enough
        ((96, 512, 64, 128), None),  # 64 columns of a short k: the mma path's 64 x 64 tile
        ((32, 16, 1024, 1024), None),  # 16 rows: the mma path's 64 x 64 tile
        ((2, 256, 256, 256), None),  # 8 tiles: the mma path's 64 x 64 tiles fill more SMs
        ((2, 256, 256, 1024), None),  # 8 tiles, k too short for slices of 16 steps: the same
    ],
)
def test_the_batch_rule_picks_the_kernel(
    lib: Any, shape: tuple[int, int, int, int], tile: str | None
) -> None:
    """Unset, slices of at least 64 rows and columns, past 64 in both or of k >= 512, whose
    128 x 128 tiles fill half the SMs (or a quarter, times the slices of k that k allows) take
    the Hopper kernel; others the mma path's batch
    (matmul_tensor_core_batched's rule), on the tile of fewest waves times a tile's work. The
    tiles named are those of a GPU of 132 SMs (an H100 SXM) or near it."""
    _hopper()
    batch, m, n, k = shape
    gen = torch.Generator().manual_seed(23)
    a, b = _rand(gen, torch.float16, batch, m, k), _rand(gen, torch.float16, batch, k, n)
    names = _launches(lambda: lib.matmul(a, b))
    want = HOPPER if tile else MMA
    assert len(names) == 1 and want in names[0], (shape, names)
    if tile and 120 <= torch.cuda.get_device_properties(0).multi_processor_count <= 144:
        assert f", {tile}, false, false, false>" in names[0], (shape, names)
    _close(lib.matmul(a, b), a, b)


@pytest.mark.parametrize("tile", ["64", "128"])
def test_simt_float32_batch_tiles_match_float64(
    lib: Any, tile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 batches on each SIMT batch tile (64 x 64 for small slices, 128 x 128), one launch
    each: tails of every slice, more slices than a wave, a strided batch view."""
    monkeypatch.setenv("WB_SIMT_BATCH_TILE", tile)
    gen = torch.Generator().manual_seed(24)
    big_a, big_b = _rand(gen, torch.float32, 6, 144, 96), _rand(gen, torch.float32, 6, 96, 160)
    cases = [
        (_rand(gen, torch.float32, 3, 200, 136), _rand(gen, torch.float32, 3, 136, 264)),
        (_rand(gen, torch.float32, 300, 70, 64), _rand(gen, torch.float32, 300, 64, 36)),
        (big_a[::2], big_b[1::2]),
    ]
    for a, b in cases:
        names = _launches(lambda a=a, b=b: lib.matmul(a, b))
        assert len(names) == 1 and "simt_kernel" in names[0], names
        assert ("Small" in names[0]) == (tile == "64"), names
        c, want = lib.matmul(a, b), torch.matmul(a.double(), b.double())
        torch.testing.assert_close(c.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("WB_MATMUL_BATCH", "hopper"),
        ("WB_WGMMA_BATCH_TILE", "192"),
        ("WB_WGMMA_BATCH_SPLITS", "9"),
        ("WB_WGMMA_BATCH_SPLITS", "two"),
        ("WB_WGMMA_BATCH_TRANSPOSED", "transpose"),
        ("WB_SIMT_BATCH_TILE", "32"),
    ],
)
def test_a_bad_batch_switch_is_an_error_naming_it(
    lib: Any, name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = torch.float32 if name == "WB_SIMT_BATCH_TILE" else torch.bfloat16
    if dtype == torch.bfloat16:
        _hopper()
    monkeypatch.setenv(name, value)
    if name.startswith("WB_WGMMA_BATCH_"):
        monkeypatch.setenv("WB_MATMUL_BATCH", "wgmma")
    a = torch.randn(4, 256, 128, device="cuda", dtype=dtype)
    b = torch.randn(4, 128, 256, device="cuda", dtype=dtype)
    with pytest.raises(RuntimeError, match=name):
        lib.matmul(a, b)
