"""layer_norm and layer_norm_backward: against the reference, the op contract, bad input, and a
dweight/dbias reduction that is bit for bit the same for any thread count."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import DEVICES
from tests.op_contract import (
    assert_contract,
    assert_gradcheck,
    assert_matches_reference,
    assert_opcheck,
)
from workbench.verify import contract

OPS = ["layer_norm", "layer_norm_backward"]


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
    """layer_norm through layer_norm_backward's kernels; layer_norm_backward through its own
    formula (a double backward), each against finite differences of the kernels."""
    assert_gradcheck(lib, name, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_compiles_with_no_graph_break(lib: Any, name: str, device: str) -> None:
    assert_contract(lib, name, device, "compile")


@pytest.mark.cuda
@pytest.mark.parametrize("check", ["stream", "graph"])
@pytest.mark.parametrize("name", OPS)
def test_cuda_stream_and_graph(lib: Any, name: str, check: str) -> None:
    """Launched on the caller's stream, and capturable (the backward allocates its workspace
    and picks its grid from the occupancy, both of which must work inside a capture)."""
    assert_contract(lib, name, "cuda", check)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward(lib: Any, device: str) -> None:
    """Differentiating layer_norm's backward sees mean and rstd depend on x."""
    x = torch.randn(3, 24, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(24, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(24, dtype=torch.float64, device=device, requires_grad=True)
    torch.autograd.gradgradcheck(lambda *a: lib.layer_norm(*a, 1e-5)[0], (x, w, b))


@pytest.mark.parametrize("device", DEVICES)
def test_traces_forward_and_backward_under_torch_compile(lib: Any, device: str) -> None:
    """The fakes and the autograd formula (which calls layer_norm_backward) trace as one graph."""

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y, mean, rstd = lib.layer_norm(x, w, b, 1e-5)
        return lib.muladd(y, x, 0.5) * rstd.unsqueeze(-1) + mean.unsqueeze(-1)

    x = torch.randn(6, 40, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(40, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(40, dtype=torch.float64, device=device, requires_grad=True)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    expected, got = f(x, w, b), compiled(x, w, b)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got.sum(), (x, w, b))
    want = torch.autograd.grad(expected.sum(), (x, w, b))
    for g, e in zip(grads, want, strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("shape", [(1000, 64), (40, 4099), (3, 2, 700)])
def test_backward_is_bitwise_the_same_for_any_thread_count(
    lib: Any, shape: tuple[int, ...]
) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    w, b = torch.randn(shape[-1], generator=gen), torch.randn(shape[-1], generator=gen)
    g = torch.randn(shape, generator=gen)
    _, mean, rstd = lib.layer_norm(x, w, b, 1e-5)
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            runs.append(lib.layer_norm_backward(g, x, mean, rstd, w))
    finally:
        torch.set_num_threads(threads)
    for run in runs[1:]:
        for a, c in zip(runs[0], run, strict=True):
            assert contract.bitwise_equal(a, c)


_X, _W = torch.randn(4, 8), torch.randn(8)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (
            (_X, torch.randn(7), _W, 1e-5),
            RuntimeError,
            r"layer_norm: expected weight.size\(0\) \(7\) to equal x.size\(-1\) \(8\)",
        ),
        (
            (_X, _W, torch.randn(8, 1), 1e-5),
            RuntimeError,
            r"layer_norm: expected bias to be 1-d \[hidden\], got shape \[8, 1\]",
        ),
        (
            (_X, _W.double(), _W, 1e-5),
            TypeError,
            r"layer_norm: expected weight to have the same dtype as x \(Float\), got Double",
        ),
        (
            (_X, _W, _W.half(), 1e-5),
            TypeError,
            r"layer_norm: expected bias to have the same dtype as x \(Float\), got Half",
        ),
        ((_X, _W, _W, -1.0), RuntimeError, r"layer_norm: expected eps >= 0, got -1"),
        (
            (torch.tensor(1.0), torch.randn(1), torch.randn(1), 1e-5),
            RuntimeError,
            r"layer_norm: expected x to have at least 1 dimension",
        ),
        (
            (torch.randn(3, 0), torch.randn(0), torch.randn(0), 1e-5),
            RuntimeError,
            r"layer_norm: expected x.size\(-1\) >= 1",
        ),
        (
            (_X.int(), _W.int(), _W.int(), 1e-5),
            TypeError,
            r"layer_norm: x has dtype Int, which is not supported",
        ),
    ],
)
def test_bad_input_is_named(lib: Any, args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        lib.layer_norm(*args)


_M = torch.randn(4)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (
            (torch.randn(4, 7), _X, _M, _M, _W),
            RuntimeError,
            r"layer_norm_backward: expected grad to have the same shape as x \[4, 8\], "
            r"got \[4, 7\]",
        ),
        (
            (_X, _X, _M.double(), _M, _W),
            TypeError,
            r"layer_norm_backward: expected mean to have dtype Float \(the accumulation type of "
            r"x's Float\), got Double",
        ),
        (
            (_X.half(), _X.half(), _M, _M.half(), _W.half()),
            TypeError,
            r"layer_norm_backward: expected rstd to have dtype Float",
        ),
        (
            (_X, _X, _M, torch.randn(4, 1), _W),
            RuntimeError,
            r"layer_norm_backward: expected rstd to have shape x.shape\[:-1\] \[4\], got \[4, 1\]",
        ),
        (
            (_X, _X, _M, _M, torch.randn(9)),
            RuntimeError,
            r"layer_norm_backward: expected weight.size\(0\) \(9\) to equal x.size\(-1\) \(8\)",
        ),
    ],
)
def test_backward_bad_input_is_named(lib: Any, args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        lib.layer_norm_backward(*args)


@pytest.mark.cuda
def test_device_mismatch_is_named(lib: Any) -> None:
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"layer_norm: expected weight on cuda:0, got weight on"):
        lib.layer_norm(x, _W, _W.cuda(), 1e-5)
    with pytest.raises(RuntimeError, match=r"layer_norm_backward: expected mean on cuda:0, got"):
        lib.layer_norm_backward(x, x, _M, _M.cuda(), _W.cuda())


@pytest.mark.parametrize("hidden", [1024, 4096])
def test_cpu_float32_rows_with_a_large_mean_keep_their_digits(lib: Any, hidden: int) -> None:
    """Rows around 1e4 with a spread of 1: y and the saved rstd within 2x of torch's own error
    against a float64 truth (the first mean alone was up to 2.9x for y)."""
    g = torch.Generator().manual_seed(hidden)
    x = 1e4 + torch.randn(64, hidden, generator=g)
    w, b = torch.randn(hidden, generator=g), torch.randn(hidden, generator=g)
    shape = (hidden,)
    truth = torch.ops.aten.native_layer_norm(x.double(), shape, w.double(), b.double(), 1e-5)
    theirs = torch.ops.aten.native_layer_norm(x, shape, w, b, 1e-5)
    y, _, rstd = lib.layer_norm(x, w, b, 1e-5)

    def err(got: torch.Tensor, want: torch.Tensor) -> float:
        return (got.double().reshape(want.shape) - want).abs().max().item()

    assert err(y, truth[0]) <= 2 * err(theirs[0], truth[0])
    assert err(rstd, truth[2]) <= 2 * max(err(theirs[2], truth[2]), 1e-12)
    rows = torch.randn(3, hidden, generator=g)
    rows[0, 0], rows[1, 5] = float("inf"), float("nan")  # rows that are not finite
    got = lib.layer_norm(rows, w, b, 1e-5)[0]
    assert got[:2].isnan().all() and got[2].isfinite().all()
