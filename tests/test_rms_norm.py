"""rms_norm(x, weight, eps) over the last dimension: against the reference, and the op contract."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import DEVICES
from tests.op_contract import assert_gradcheck, assert_matches_reference, assert_opcheck


@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(lib: Any, device: str) -> None:
    assert_matches_reference(lib, "rms_norm", device)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(lib: Any, device: str) -> None:
    assert_opcheck(lib, "rms_norm", device)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(lib: Any, device: str) -> None:
    assert_gradcheck(lib, "rms_norm", device)


@pytest.mark.parametrize(
    ("x", "weight", "eps", "error", "message"),
    [
        (
            torch.randn(4, 8),
            torch.randn(7),
            1e-6,
            RuntimeError,
            r"rms_norm: expected weight.size\(0\) \(7\) to equal x.size\(-1\) \(8\)",
        ),
        (
            torch.randn(4, 8),
            torch.randn(8, 1),
            1e-6,
            RuntimeError,
            r"rms_norm: expected weight to be 1-d \[hidden\], got shape \[8, 1\]",
        ),
        (
            torch.randn(4, 8),
            torch.randn(8, dtype=torch.float64),
            1e-6,
            TypeError,
            r"rms_norm: expected weight to have the same dtype as x \(Float\), got Double",
        ),
        (
            torch.randn(4, 8),
            torch.randn(8),
            -1.0,
            RuntimeError,
            r"rms_norm: expected eps >= 0, got -1",
        ),
        (
            torch.tensor(1.0),
            torch.randn(1),
            1e-6,
            RuntimeError,
            r"rms_norm: expected x to have at least 1 dimension",
        ),
    ],
)
def test_bad_input_is_named(
    lib: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        lib.rms_norm(x, weight, eps)


def test_traces_with_backward_under_torch_compile(lib: Any) -> None:
    """The fake functions and autograd formulas let the ops trace with no graph break."""

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return lib.scale(lib.muladd(lib.rms_norm(x, w, 1e-6), x, 0.5), 2.0)

    x = torch.randn(6, 40, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    expected = f(x, w)
    got = compiled(x, w)
    torch.testing.assert_close(got, expected)
    (gx, gw) = torch.autograd.grad(got.sum(), (x, w))
    (ex, ew) = torch.autograd.grad(expected.sum(), (x, w))
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gw, ew)
