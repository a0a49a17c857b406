"""Spec of the inplace family: ops that write into tensors the caller passes.

    add_out(a, b, *, out) -> ()         out = a + b          (a, b, out: one shape and dtype)
    scale_(x, s) -> x                   x = x * s, in place

The check reads the schema: it compares the arguments marked ``Tensor(a!)`` (as they are after
the call) with the reference's, which writes into its own copies of them; every other argument
must keep every byte, and a written one every byte outside its view.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import OpSpec, Sample, bench_numels, elementwise_shapes, randn, size_label

# Not exactly representable in any dtype, so the rounding of s to the compute type is exercised.
_S = 0.3


def _nan_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer of NaN: an element the kernel leaves unwritten stays NaN and fails."""
    return torch.full_like(t, float("nan"))


def add_out_reference(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    torch.add(a, b, out=out)


def add_out_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    samples = []
    for label, shape, strided in elementwise_shapes():
        a = randn(shape, dtype, device, gen, strided=strided)
        b = randn(shape, dtype, device, gen)
        samples.append(Sample((a, b, _nan_like(b)), label))
    # out a strided view into a larger buffer (the bytes between its elements must stay), and
    # a broadcast row as a.
    buf = randn((9, 40), dtype, device, gen)
    a, b = randn((9, 20), dtype, device, gen), randn((9, 20), dtype, device, gen)
    samples.append(Sample((a, b, buf[:, ::2]), "strided_out"))
    row = randn((1, 97), dtype, device, gen)
    b = randn((16, 97), dtype, device, gen)
    samples.append(Sample((row.expand(16, 97), b, _nan_like(b)), "expanded"))
    return samples


def add_out_fake(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    torch._check(b.shape == a.shape, lambda: "add_out: b must have a's shape")
    torch._check(out.shape == a.shape, lambda: "add_out: out must have a's shape")
    torch._check(b.dtype == a.dtype, lambda: "add_out: b must have a's dtype")
    torch._check(out.dtype == a.dtype, lambda: "add_out: out must have a's dtype")


def add_out_bytes(args: tuple[Any, ...], out: Any) -> int:
    """a and b read, out written (out is not read)."""
    a = args[0]
    return 3 * a.numel() * a.element_size()


def add_out_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    samples = []
    for n in bench_numels(device):
        a, b = randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)
        samples.append(Sample((a, b, torch.empty_like(a)), size_label(n)))
    return samples


def scale__reference(x: torch.Tensor, s: float) -> torch.Tensor:
    return x.mul_(s)


def scale__samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    samples = [
        Sample((randn(shape, dtype, device, gen, strided=strided), _S), label)
        for label, shape, strided in elementwise_shapes()
    ]
    # x a column slice of a larger buffer: the other columns must stay as they were.
    samples.append(Sample((randn((12, 30), dtype, device, gen)[:, 3:17], -_S), "sliced"))
    return samples


def scale__fake(x: torch.Tensor, s: float) -> torch.Tensor:
    return x


def scale__bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """s = -1: the timing repeats the op on one buffer, and -1 keeps its values exactly."""
    return [
        Sample((randn((n,), dtype, device, gen), -1.0), size_label(n)) for n in bench_numels(device)
    ]


def _numel_flops(args: tuple[Any, ...], out: Any) -> int:
    return int(args[0].numel())


OPS = [
    OpSpec(
        name="add_out",
        signed_zeros=True,  # elementwise: a -0.0 input carries its sign
        reference=add_out_reference,
        samples=add_out_samples,
        fake=add_out_fake,
        bytes_moved=add_out_bytes,
        flops=_numel_flops,
        bench_sizes=add_out_bench_sizes,
    ),
    OpSpec(
        name="scale_",
        signed_zeros=True,  # elementwise: a -0.0 input carries its sign (x * s)
        reference=scale__reference,
        samples=scale__samples,
        fake=scale__fake,
        flops=_numel_flops,
        bench_sizes=scale__bench_sizes,
    ),
]
