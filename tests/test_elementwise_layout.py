"""The elementwise families (muladd, mul, scale; add_out, scale_) on inputs of any layout.

Operands that share one non-overlapping dense layout (transposed, permuted, channels-last) are
walked in memory order with no copy, and the result takes that layout, as PyTorch's own ops give
it (bindings/include/wb/layout.h). Other layouts are copied first and must still be right. The
specs' fakes give the real result's strides (torch.library.opcheck compares them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tests.conftest import DEVICES

C = 0.5  # muladd's addend
S = 0.3  # scale's factor: not exact in any dtype


def make(layout: str, shape: tuple[int, ...], device: str) -> torch.Tensor:
    """Values of ``shape`` stored in ``layout``."""
    if layout == "contiguous":
        return torch.randn(shape, device=device)
    if layout in ("transposed", "offset"):  # dimensions stored in reverse order
        order = list(range(len(shape)))[::-1]
        stored = [shape[d] for d in order]
        if layout == "offset":  # one element into its buffer: off every vector alignment
            n = torch.Size(stored).numel()
            return torch.randn(n + 1, device=device)[1:].view(stored).permute(order)
        return torch.randn(stored, device=device).permute(order)
    if layout == "permuted":  # stored as [d2, d0, d1]
        d0, d1, d2 = shape
        return torch.randn(d2, d0, d1, device=device).permute(1, 2, 0)
    if layout == "channels_last":
        return torch.randn(shape, device=device).to(memory_format=torch.channels_last)
    if layout == "sliced":  # a window of a wider buffer: gaps between rows
        return torch.randn(*shape[:-1], shape[-1] + 5, device=device)[..., 2 : 2 + shape[-1]]
    if layout == "strided":  # every other element
        return torch.randn(*shape[:-1], 2 * shape[-1], device=device)[..., ::2]
    if layout == "expanded":  # one row read for every row: overlapping, read-only
        return torch.randn(1, *shape[1:], device=device).expand(shape)
    raise AssertionError(layout)


# (shape, a's layout, b's layout)
PAIRS = {
    "transposed": ((17, 33), "transposed", "transposed"),
    "offset": ((17, 33), "offset", "offset"),
    "permuted_3d": ((7, 5, 6), "permuted", "permuted"),
    "channels_last": ((2, 3, 5, 7), "channels_last", "channels_last"),
    "contiguous": ((17, 33), "contiguous", "contiguous"),
    "sliced": ((17, 33), "sliced", "sliced"),
    "strided": ((17, 33), "strided", "strided"),
    "mixed_transposed_contiguous": ((17, 33), "transposed", "contiguous"),
    "mixed_contiguous_transposed": ((17, 33), "contiguous", "transposed"),
    "mixed_channels_last_contiguous": ((2, 3, 5, 7), "channels_last", "contiguous"),
    "mixed_sliced_transposed": ((17, 33), "sliced", "transposed"),
    "mixed_expanded_contiguous": ((16, 97), "expanded", "contiguous"),
}
# The pairs whose operands share one dense layout: nothing is copied.
SHARED = ["transposed", "offset", "permuted_3d", "channels_last", "contiguous"]

SINGLES = {
    "transposed": (17, 33),
    "offset": (17, 33),
    "permuted": (7, 5, 6),
    "channels_last": (2, 3, 5, 7),
    "sliced": (17, 33),
    "strided": (17, 33),
    "expanded": (16, 97),
}
DENSE_SINGLES = ["transposed", "offset", "permuted", "channels_last"]


def pair(case: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    shape, la, lb = PAIRS[case]
    return make(la, shape, device), make(lb, shape, device)


def pair_call(
    lib: Any, name: str
) -> tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...]]:
    """The op, PyTorch's own expression of it, and the scalar arguments after a and b."""
    if name == "muladd":
        return lib.muladd, lambda a, b: a * b + C, (C,)
    return lib.mul, lambda a, b: a * b, ()


def copies(op: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """How many aten::copy_ calls ``op(*args, **kwargs)`` makes (the binding's layout copies)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        op(*args, **kwargs)
    return sum(e.name == "aten::copy_" for e in prof.events())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["muladd", "mul"])
@pytest.mark.parametrize("case", list(PAIRS))
def test_pair_ops_give_pytorchs_values_and_strides(
    lib: Any, name: str, case: str, device: str
) -> None:
    a, b = pair(case, device)
    op, ref, extra = pair_call(lib, name)
    got, want = op(a, b, *extra), ref(a, b)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride(), f"{case}: {got.stride()} vs torch's {want.stride()}"
    torch.library.opcheck(op, (a, b, *extra), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", list(SINGLES))
def test_scale_gives_pytorchs_values_and_strides(lib: Any, layout: str, device: str) -> None:
    x = make(layout, SINGLES[layout], device)
    got, want = lib.scale(x, S), x * S
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride(), f"{layout}: {got.stride()} vs torch's {want.stride()}"
    torch.library.opcheck(lib.scale, (x, S), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("case", ["transposed", "channels_last", "mixed_transposed_contiguous"])
def test_full_opcheck_on_other_layouts(lib: Any, case: str) -> None:
    """Schema, autograd registration, fake and the AOT-dispatched (dynamic-shape) graph."""
    a, b = pair(case, "cpu")
    torch.library.opcheck(lib.muladd, (a, b, C))
    torch.library.opcheck(lib.scale, (a, S))


def test_a_non_dense_input_gives_a_contiguous_result(lib: Any) -> None:
    """Where the first operand has gaps or overlaps the result is contiguous; PyTorch may pick
    another dense layout there (the other operand's), with the same values."""
    shape = (17, 33)
    a = make("transposed", shape, "cpu")[:, ::2]  # a column-major view with gaps
    b = make("transposed", (17, 17), "cpu")
    got = lib.muladd(a, b, C)
    assert got.is_contiguous()
    torch.testing.assert_close(got, a * b + C)
    e = make("expanded", shape, "cpu")
    got = lib.mul(e, make("transposed", shape, "cpu"))
    assert got.is_contiguous()
    torch.library.opcheck(lib.muladd, (a, b, C), test_utils=("test_faketensor",))


def test_shared_layouts_are_read_where_they_lie(lib: Any) -> None:
    """No copy for operands of one dense layout; one copy per operand in another."""
    for case in SHARED:
        a, b = pair(case, "cpu")
        assert copies(lib.muladd, a, b, C) == 0, case
        assert copies(lib.scale, a, S) == 0, case
    a, b = pair("mixed_transposed_contiguous", "cpu")
    assert copies(lib.muladd, a, b, C) == 1  # b, into a's layout
    a, b = pair("sliced", "cpu")
    assert copies(lib.mul, a, b) == 2


def test_compiled_with_dynamic_shapes(lib: Any) -> None:
    """The fakes' layout rule traces with symbolic sizes and strides."""
    f = torch.compile(
        lambda a, b: lib.scale(lib.muladd(a, b, C), S), dynamic=True, backend="aot_eager"
    )
    for shape in [(17, 33), (20, 40)]:
        a, b = make("transposed", shape, "cpu"), make("transposed", shape, "cpu")
        got = f(a, b)
        torch.testing.assert_close(got, (a * b + C) * S)
        assert got.stride() == a.stride()


# (a, b and out's shape, layouts of a, b and out)
OUTS = {
    "all_transposed": ((17, 33), "transposed", "transposed", "transposed"),
    "all_permuted_3d": ((7, 5, 6), "permuted", "permuted", "permuted"),
    "all_channels_last": ((2, 3, 5, 7), "channels_last", "channels_last", "channels_last"),
    "contiguous_out": ((17, 33), "transposed", "transposed", "contiguous"),
    "transposed_out": ((17, 33), "contiguous", "contiguous", "transposed"),
    "mixed_inputs": ((17, 33), "transposed", "contiguous", "transposed"),
    "sliced_out": ((17, 33), "transposed", "transposed", "sliced"),
    "strided_out": ((17, 33), "sliced", "contiguous", "strided"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(OUTS))
def test_add_out_writes_any_out(lib: Any, case: str, device: str) -> None:
    shape, la, lb, lo = OUTS[case]
    a, b, out = make(la, shape, device), make(lb, shape, device), make(lo, shape, device)
    buf = out.as_strided((out.untyped_storage().nbytes() // 4,), (1,), 0)
    outside = buf.clone()
    mask = torch.ones_like(buf, dtype=torch.bool)
    mask.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(False)
    strides = out.stride()
    lib.add_out(a, b, out=out)
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    assert out.stride() == strides
    assert torch.equal(buf[mask], outside[mask]), f"{case}: bytes outside out were written"
    torch.library.opcheck(lib.add_out, (a, b), {"out": out}, test_utils=("test_faketensor",))


def test_add_out_copies_only_what_differs(lib: Any) -> None:
    for case in ["all_transposed", "all_permuted_3d", "all_channels_last"]:
        shape, la, lb, lo = OUTS[case]
        a, b, out = make(la, shape, "cpu"), make(lb, shape, "cpu"), make(lo, shape, "cpu")
        assert copies(lib.add_out, a, b, out=out) == 0, case
        assert copies(lib.add_out, out, b, out=out) == 0, case  # out is a itself
    shape, la, lb, lo = OUTS["transposed_out"]
    a, b, out = make(la, shape, "cpu"), make(lb, shape, "cpu"), make(lo, shape, "cpu")
    assert copies(lib.add_out, a, b, out=out) == 1  # the result, copied into out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["transposed", "offset", "permuted", "channels_last", "sliced"])
def test_scale__writes_x_in_place_in_any_layout(lib: Any, layout: str, device: str) -> None:
    x = make(layout, SINGLES[layout], device)
    base = x._base if x._base is not None else x
    before = base.clone()
    want = x * S
    assert lib.scale_(x, S) is x
    torch.testing.assert_close(x, want, rtol=0, atol=0)
    view = torch.zeros_like(base, dtype=torch.bool)
    view.as_strided(x.shape, x.stride(), x.storage_offset() - base.storage_offset()).fill_(True)
    assert torch.equal(base[~view], before[~view]), f"{layout}: elements outside x were written"


def test_scale__copies_nothing_for_a_dense_x(lib: Any) -> None:
    for layout in DENSE_SINGLES:
        x = make(layout, SINGLES[layout], "cpu")
        assert copies(lib.scale_, x, S) == 0, layout
    x = make("sliced", SINGLES["sliced"], "cpu")
    assert copies(lib.scale_, x, S) == 2  # into a contiguous buffer and back


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_transposed_on_cuda(lib: Any, dtype: torch.dtype) -> None:
    """8191 x 8192 transposed views: the memory-order path at size, with vector loads."""
    a = torch.randn(8192, 8191, device="cuda", dtype=dtype).t()
    b = torch.randn(8192, 8191, device="cuda", dtype=dtype).t()
    got = lib.muladd(a, b, C)
    want = (a.double() * b.double() + C).to(dtype)
    assert got.stride() == (a * b + C).stride() == a.stride()
    torch.testing.assert_close(got, want)
    got = lib.scale(a, S)
    assert got.stride() == a.stride()
    torch.testing.assert_close(got, (a.double() * S).to(dtype))
