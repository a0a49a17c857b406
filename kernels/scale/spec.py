"""Spec of the scale family: scale(x, s) = x * s.

Its backward is the op itself: d(x * s)/dx = s, so grad_x = scale(grad, s).
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import OpSpec, Sample, bench_numels, elementwise_shapes, randn, size_label

# Not exactly representable in any dtype, so the rounding of s to the compute type is exercised.
_S = 0.3


def scale_reference(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


def scale_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    samples = [
        Sample((randn(shape, dtype, device, gen, strided=strided), _S), label)
        for label, shape, strided in elementwise_shapes()
    ]
    row = randn((1, 97), dtype, device, gen)
    samples.append(Sample((row.expand(16, 97), -_S), "expanded"))
    return samples


def scale_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    return [
        Sample((randn((n,), dtype, device, gen), _S), size_label(n)) for n in bench_numels(device)
    ]


def scale_flops(args: tuple[Any, ...], out: torch.Tensor) -> int:
    return out.numel()


def scale_fake(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def scale_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.s = inputs[1]


def scale_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    grad_x = ctx.ops.scale(grad, ctx.s) if ctx.needs_input_grad[0] else None
    return grad_x, None


OPS = [
    OpSpec(
        name="scale",
        reference=scale_reference,
        samples=scale_samples,
        fake=scale_fake,
        backward=scale_backward,
        setup_context=scale_setup_context,
        flops=scale_flops,
        bench_sizes=scale_bench_sizes,
    ),
]
