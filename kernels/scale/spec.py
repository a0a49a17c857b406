"""Spec of the scale family: scale(x, s) = x * s.

Its backward is the op itself: d(x * s)/dx = s, so grad_x = scale(grad, s).
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
    """The binding's result (bindings/include/wb/layout.h): x's strides when x is non-overlapping
    and dense (transposed, channels-last, ...), as ``x * s`` gives them, else contiguous."""
    return empty_elementwise(x)


def scale_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.s = inputs[1]


def scale_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    grad_x = ctx.ops.scale(grad, ctx.s) if ctx.needs_input_grad[0] else None
    return grad_x, None


# The elementwise launcher's tuning space (kernels/include/wb/elementwise.cuh reads each parameter
# as WB_TUNE_<NAME>; kernels/muladd declares the same): THREADS per block, VECS 16-byte vectors
# per thread and input, and L1, the L1 policy of the vector loads (0: skip L1 while a launch
# moves at most 1.5x the L2's size, 1: always skip it, 2: never). It holds the shapes tried by
# hand (bench/results/elementwise-variants.md: k1_t128, k2_t128, the default, k4_t128, k1_t256,
# k2_t256) and k1_t512, one step on from k1_t256, the best of them there, each under the three
# policies (the fixed ones were l1_always and no_l1_always in bench/results/kernels.md): 18
# points. A block moves at most 512 vectors of each input, as k4_t128 and k2_t256 did (k4_t128
# was the slowest shape). Blocks of 64 threads are left out: they fill an SM of sm_80 or sm_90
# (2048 threads) only at its limit of 32 resident blocks.
TUNE = TuneSpace(
    {"THREADS": [128, 256, 512], "VECS": [1, 2, 4], "L1": [0, 1, 2]},
    where=lambda p: p["THREADS"] * p["VECS"] <= 512,
    default={"THREADS": 128, "VECS": 2, "L1": 0},
)


OPS = [
    OpSpec(
        name="scale",
        signed_zeros=True,  # elementwise: a -0.0 input carries its sign (x * s)
        reference=scale_reference,
        samples=scale_samples,
        fake=scale_fake,
        backward=scale_backward,
        setup_context=scale_setup_context,
        flops=scale_flops,
        bench_sizes=scale_bench_sizes,
    ),
]
