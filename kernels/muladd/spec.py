"""Spec of the muladd family: muladd(a, b, c) = a * b + c and mul(a, b) = a * b.

The PyTorch custom-op tutorial's op; its backward uses the family's own ``mul``.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench import TuneSpace
from workbench.spec import (
    OpSpec,
    Sample,
    bench_numels,
    elementwise_shapes,
    empty_elementwise,
    randn,
    size_label,
)


def muladd_reference(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    return a * b + c


def mul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b


def _pairs(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    samples = [
        Sample(
            (
                randn(shape, dtype, device, gen, strided=strided),
                randn(shape, dtype, device, gen, strided=strided),
            ),
            label,
        )
        for label, shape, strided in elementwise_shapes()
    ]
    row = randn((1, 97), dtype, device, gen)
    samples.append(Sample((row.expand(16, 97), randn((16, 97), dtype, device, gen)), "expanded"))
    return samples


def muladd_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    return [Sample((*s.args, -0.75), s.label) for s in _pairs(dtype, device, gen)]


def _bench_pairs(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    return [
        Sample((randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)), size_label(n))
        for n in bench_numels(device)
    ]


def muladd_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    return [Sample((*s.args, -0.75), s.label) for s in _bench_pairs(dtype, device, gen)]


def muladd_flops(args: tuple[Any, ...], out: torch.Tensor) -> int:
    return 2 * out.numel()  # one multiply, one add


def mul_flops(args: tuple[Any, ...], out: torch.Tensor) -> int:
    return out.numel()


def muladd_fake(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    torch._check(a.shape == b.shape, lambda: "muladd: a and b must have the same shape")
    return empty_elementwise(a)


def mul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch._check(a.shape == b.shape, lambda: "mul: a and b must have the same shape")
    return empty_elementwise(a)


def _save_a_b(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b = inputs[0], inputs[1]
    ctx.save_for_backward(
        a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None
    )


def muladd_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    a, b = ctx.saved_tensors
    grad_a = ctx.ops.mul(grad, b) if ctx.needs_input_grad[0] else None
    grad_b = ctx.ops.mul(grad, a) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None


def mul_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    grad_a, grad_b, _ = muladd_backward(ctx, grad)
    return grad_a, grad_b


# The elementwise launcher's tuning space, as kernels/scale/spec.py declares it (the same
# launcher; the reasons for its bounds are there), tuned on its own: muladd and mul read two
# inputs, and so have twice scale's loads in flight per thread.
TUNE = TuneSpace(
    {"THREADS": [128, 256, 512], "VECS": [1, 2, 4], "L1": [0, 1, 2]},
    where=lambda p: p["THREADS"] * p["VECS"] <= 512,
    default={"THREADS": 128, "VECS": 2, "L1": 0},
)


OPS = [
    OpSpec(
        name="muladd",
        signed_zeros=True,  # elementwise: a -0.0 input carries its sign
        reference=muladd_reference,
        samples=muladd_samples,
        fake=muladd_fake,
        backward=muladd_backward,
        setup_context=_save_a_b,
        flops=muladd_flops,
        bench_sizes=muladd_bench_sizes,
    ),
    OpSpec(
        name="mul",
        signed_zeros=True,  # elementwise: a -0.0 input carries its sign
        reference=mul_reference,
        samples=_pairs,
        fake=mul_fake,
        backward=mul_backward,
        setup_context=_save_a_b,
        flops=mul_flops,
        bench_sizes=_bench_pairs,
    ),
]
