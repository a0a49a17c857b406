"""muladd(a, b, c) = a * b + c and mul(a, b) = a * b: against the reference, and the op contract."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import DEVICES
from tests.op_contract import assert_gradcheck, assert_matches_reference, assert_opcheck

OPS = ["muladd", "mul"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_matches_reference(lib: Any, name: str, device: str) -> None:
    assert_matches_reference(lib, name, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_opcheck(lib: Any, name: str, device: str) -> None:
    assert_opcheck(lib, name, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_gradcheck(lib: Any, name: str, device: str) -> None:
    assert_gradcheck(lib, name, device)


def test_backward_uses_the_family_mul(lib: Any) -> None:
    a = torch.randn(5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    lib.muladd(a, b, 2.0).sum().backward()
    assert torch.equal(a.grad, b.detach()) and torch.equal(b.grad, a.detach())


def test_is_reachable_under_torch_ops(lib: Any) -> None:
    a, b = torch.randn(3), torch.randn(3)
    assert torch.equal(torch.ops.wb.muladd(a, b, 1.0), lib.muladd(a, b, 1.0))


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (
            (torch.randn(3), torch.randn(4), 1.0),
            RuntimeError,
            r"muladd: expected b to have the same shape as a \[3\], got \[4\]",
        ),
        (
            (torch.randn(3), torch.randn(3, dtype=torch.float64), 1.0),
            TypeError,
            r"muladd: expected b to have the same dtype as a \(Float\), got Double",
        ),
        (
            (torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32), 1.0),
            TypeError,
            r"muladd: a has dtype Int, which is not supported; expected one of Float, Double, Half",
        ),
    ],
)
def test_bad_input_is_named(lib: Any, args: tuple[Any, ...], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        lib.muladd(*args)


@pytest.mark.cuda
def test_mixed_devices_are_rejected(lib: Any) -> None:
    with pytest.raises(RuntimeError, match="muladd: expected b on cuda:0, got b on cpu"):
        lib.muladd(torch.randn(3, device="cuda"), torch.randn(3), 1.0)
