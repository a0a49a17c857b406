"""add_out and scale_, the ops that write into the caller's tensors: against the reference, the
op contract (opcheck, torch.compile, on CUDA stream and graph), aliasing and bad input."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import DEVICES
from tests.op_contract import assert_contract, assert_matches_reference, assert_opcheck

OPS = ["add_out", "scale_"]


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(lib: Any, name: str, device: str) -> None:
    assert_matches_reference(lib, name, device)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(lib: Any, name: str, device: str) -> None:
    assert_opcheck(lib, name, device)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("device", DEVICES)
def test_compiles_to_the_same_result(lib: Any, name: str, device: str) -> None:
    assert_contract(lib, name, device, "compile")


@pytest.mark.cuda
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("check", ["stream", "graph"])
def test_cuda_stream_and_graph(lib: Any, name: str, check: str) -> None:
    assert_contract(lib, name, "cuda", check)


@pytest.mark.parametrize("device", DEVICES)
def test_out_may_be_an_input_itself(lib: Any, device: str) -> None:
    a = torch.randn(5, 300, device=device)
    b = torch.randn(5, 300, device=device)
    want = a + b
    lib.add_out(a, b, out=a)
    torch.testing.assert_close(a, want, rtol=0, atol=0)
    c = torch.randn(40, 30, device=device).t()  # non-contiguous, and both input and output
    want = c + c
    lib.add_out(c, c, out=c)
    torch.testing.assert_close(c, want, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_scale__returns_its_argument_and_writes_only_its_view(lib: Any, device: str) -> None:
    buf = torch.randn(6, 10, device=device)
    before = buf.clone()
    view = buf[:, 2:7]
    returned = lib.scale_(view, 2.0)
    assert returned is view
    torch.testing.assert_close(buf[:, 2:7], before[:, 2:7] * 2, rtol=0, atol=0)
    torch.testing.assert_close(buf[:, :2], before[:, :2], rtol=0, atol=0)
    torch.testing.assert_close(buf[:, 7:], before[:, 7:], rtol=0, atol=0)


def test_scale__traces_inside_a_compiled_function(lib: Any) -> None:
    """A compiled function that scales a slice in place and reads it back, with no graph break."""

    def f(x: torch.Tensor) -> torch.Tensor:
        lib.scale_(x[1:], 3.0)
        out = torch.empty_like(x)
        lib.add_out(x, x, out=out)
        return out

    x = torch.randn(4, 8)
    eager, compiled = x.clone(), x.clone()
    want = f(eager)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(compiled)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda lib: lib.add_out(torch.randn(3), torch.randn(4), out=torch.empty(3)),
            RuntimeError,
            r"add_out: expected b to have the same shape as a",
        ),
        (
            lambda lib: lib.add_out(torch.randn(3), torch.randn(3), out=torch.empty(4)),
            RuntimeError,
            r"add_out: expected out to have the same shape as a",
        ),
        (
            lambda lib: lib.add_out(
                torch.randn(3), torch.randn(3), out=torch.empty(3, dtype=torch.float64)
            ),
            TypeError,
            r"add_out: expected out to have the same dtype as a",
        ),
        (
            lambda lib: lib.add_out(
                torch.randn(1, 3).expand(2, 3), torch.randn(2, 3),
                out=torch.empty(1, 3).expand(2, 3),
            ),
            RuntimeError,
            r"add_out: out has elements that share memory",
        ),
        (
            lambda lib: (lambda buf: lib.add_out(buf[:4], torch.randn(4), out=buf[1:5]))(
                torch.randn(6)
            ),
            RuntimeError,
            r"add_out: out overlaps a partially",
        ),
        (
            lambda lib: lib.scale_(torch.randn(1, 3).expand(4, 3), 2.0),
            RuntimeError,
            r"scale_: x has elements that share memory",
        ),
        (
            lambda lib: lib.scale_(torch.arange(4), 2.0),
            TypeError,
            r"scale_: x has dtype Long, which is not supported",
        ),
    ],
)  # fmt: skip
def test_bad_input_is_named(lib: Any, call: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        call(lib)
