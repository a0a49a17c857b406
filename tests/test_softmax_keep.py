"""softmax's keep mode (WB_SOFTMAX_EXP=keep, the default; kernels/softmax/softmax_exp.cuh): on the
wide path a bfloat16 thread takes each exponential once and keeps it as float16 for the output.
On a GPU of sm_90 or later: the output within 0.625 ulp of a float64 softmax, and not fma's at
every element (the kept rounding shows, so the mode ran); a thread whose values span more than
the kept float16 holds still gives its tiny outputs to bfloat16's precision; special rows and
float16 (which keeps nothing) as torch gives them. float32 keeps exp(x - m) in place of x."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.test_softmax_paths import assert_exp_mode_softmax, exp_mode_rows, kernels_run


def _wide(lib: Any, monkeypatch: pytest.MonkeyPatch, x: torch.Tensor, mode: str) -> torch.Tensor:
    """softmax(x) on the wide path with WB_SOFTMAX_EXP=mode; checks wide_kernel ran."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wide path needs sm_90")
    monkeypatch.setenv("WB_SOFTMAX_PATH", "wide")
    monkeypatch.setenv("WB_SOFTMAX_EXP", mode)
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert any("wide_kernel" in n for n in names), names
    return lib.softmax(x, -1)


def _ulps(got: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """|got - softmax(x)| in ulps of bfloat16 at the float64 softmax's value (normal values;
    0 where the float64 softmax is below bfloat16's smallest normal)."""
    want = torch.softmax(x.double(), -1)
    tiny = torch.finfo(torch.bfloat16).tiny
    ulp = torch.exp2(torch.floor(torch.log2(want.clamp_min(tiny))) - 7)
    err = (got.double() - want).abs() / ulp
    return torch.where(want >= tiny, err, torch.zeros_like(err))


@pytest.mark.cuda
@pytest.mark.parametrize(("rows", "cols", "scale"), [(4, 262144, 1.0), (9, 65536, 3.0)])
def test_keep_is_within_its_bound_and_rounds_where_fma_does_not(
    lib: Any, monkeypatch: pytest.MonkeyPatch, rows: int, cols: int, scale: float
) -> None:
    gen = torch.Generator().manual_seed(cols + rows)
    x = (torch.randn(rows, cols, generator=gen) * scale).to(torch.bfloat16).cuda()
    kept = _wide(lib, monkeypatch, x, "keep")
    fma = _wide(lib, monkeypatch, x, "fma")
    assert float(_ulps(kept, x).max()) <= 0.625 + 1e-3
    assert float(_ulps(fma, x).max()) <= 0.5 + 1e-3
    # The kept float16 rounding moves some outputs by an ulp: the mode took its own formula.
    differ = kept != fma
    assert 0 < int(differ.sum()) < kept.numel() // 4
    assert float((kept.float() - fma.float()).abs().max() / fma.float().max()) < 2**-6


@pytest.mark.cuda
def test_a_thread_past_the_kept_span_keeps_its_tiny_outputs_precise(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values 25 below their row's max (36 binades: a float16 of e * 2^15 would be subnormal,
    2^-3 apart) in the first half of each row, 12 below (kept) in the second: every output
    within 0.625 ulp, the tiny ones included."""
    gen = torch.Generator().manual_seed(7)
    rows, cols = 5, 131072
    x = torch.randn(rows, cols, generator=gen)
    x[:, : cols // 2 : 61] = x.max() - 25
    x[:, cols // 2 :: 59] = x.max() - 12
    x = x.to(torch.bfloat16).cuda()
    got = _wide(lib, monkeypatch, x, "keep")
    ulps = _ulps(got, x)
    assert float(ulps.max()) <= 0.625 + 1e-3
    far = torch.zeros_like(ulps, dtype=torch.bool)
    far[:, : cols // 2 : 61] = True
    assert float(got[far].float().max()) < 1e-12  # the tiny outputs themselves, checked above


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "cols"), [(6, 65536), (5, 131081)])
def test_keep_gives_special_rows_as_torch(
    lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int, cols: int
) -> None:
    """-Inf, NaN, +Inf, a row of -Inf, values near 60000 and +-3e38 (special rows of
    exp_mode_rows) through keep: torch's softmax; float16 takes fma's formula."""
    x = exp_mode_rows(rows, cols, dtype, seed=rows * cols)
    if cols % 8:  # the ragged middle: the wide path's, not wide_kernel
        monkeypatch.setenv("WB_SOFTMAX_PATH", "wide")
        monkeypatch.setenv("WB_SOFTMAX_EXP", "keep")
        got = lib.softmax(x, -1)
    else:
        got = _wide(lib, monkeypatch, x, "keep")
    assert_exp_mode_softmax(x, got)
    if dtype == torch.float16 and cols % 8 == 0:
        fma = _wide(lib, monkeypatch, x, "fma")
        torch.testing.assert_close(got, fma, rtol=0, atol=0, equal_nan=True)


@pytest.mark.cuda
@pytest.mark.parametrize(("rows", "cols"), [(6, 65536), (5, 262144)])
def test_float32_keeps_its_exponentials_and_gives_special_rows_as_torch(
    lib: Any, monkeypatch: pytest.MonkeyPatch, rows: int, cols: int
) -> None:
    """float32 on the wide path keeps exp(x - m) in x's registers (keep, the default) or takes it
    twice (twice): both within float32 rounding of a float64 softmax, not equal at every element
    (each mode ran its formula), and special rows as torch gives them. The last row's first 20000
    values are -Inf and the rest near -200: every thread of the first block holds only -Inf (its
    exp(m - M) underflows to 0, not to 0 * Inf), so its outputs are 0. Tolerances as
    test_softmax_paths' float32 rows."""
    x = exp_mode_rows(rows, cols, torch.float32, seed=rows + cols)
    gen = torch.Generator().manual_seed(cols)
    x[rows - 1] = torch.randn(cols, generator=gen).cuda() - 200
    x[rows - 1, :20000] = float("-inf")
    kept = _wide(lib, monkeypatch, x, "keep")
    twice = _wide(lib, monkeypatch, x, "twice")
    want = torch.softmax(x.double(), -1)
    for got in (kept, twice):
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=1e-30, equal_nan=True)
        masked = (x == float("-inf")) & ~want.isnan()
        assert (got[masked] == 0).all()
    torch.testing.assert_close(kept, torch.softmax(x, -1), rtol=2e-5, atol=1e-30, equal_nan=True)
    finite = want.isfinite()
    assert int((kept != twice)[finite].sum()) > 0
