"""Spec of the rms_norm family: rms_norm(x, weight, eps) over the last dimension.

    y = x * rsqrt(mean(x^2, -1) + eps) * weight      x: [..., hidden], weight: [hidden]

Accumulated in float32 (float64 for float64 inputs) and cast back to the input dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import OpSpec, Sample, randn

_EPS = 1e-6

# (label, x shape, strided): the awkward cases first.
_SHAPES: list[tuple[str, tuple[int, ...], bool]] = [
    ("empty", (0, 64), False),
    ("one", (1, 1), False),
    ("odd", (5, 1000), False),
    ("unaligned", (3, 4099), False),  # hidden not a multiple of any vector width
    ("strided", (8, 96), True),
    ("3d", (2, 3, 256), False),
    ("large", (64, 8192), False),
    # The CUDA launch paths by row length (float32): 4 and 8 vectors a thread in registers (the
    # widest block), then rows too long for registers, read twice, by vectors and by elements.
    ("mid", (4, 2000), False),
    ("wide", (2, 16384), False),
    ("long", (2, 16388), False),
    ("long_odd", (2, 8193), False),
]


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight; x: [..., hidden], weight: [hidden]."""
    xf = x.to(_acc(x.dtype))
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(xf.dtype)
    return y.to(x.dtype)


def rms_norm_samples(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    samples = [
        Sample(
            (
                randn(shape, dtype, device, gen, strided=strided),
                randn(shape[-1:], dtype, device, gen),
                _EPS,
            ),
            label,
        )
        for label, shape, strided in _SHAPES
    ]
    # One row broadcast to 12 (stride 0 across rows), and a weight that is a view of a scalar.
    row = randn((1, 384), dtype, device, gen)
    weight = randn((1,), dtype, device, gen).expand(384)
    samples.append(Sample((row.expand(12, 384), weight, _EPS), "expanded"))
    return samples


def rms_norm_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """Rows of hidden size 4096: one row (launch-bound) up to 256 MiB of float32 on a GPU."""
    hidden = 4096
    rows = (1, 16, 256, 1024, 4096, 16384) if device.type == "cuda" else (1, 16, 256, 1024)
    return [
        Sample(
            (randn((r, hidden), dtype, device, gen), randn((hidden,), dtype, device, gen), _EPS),
            f"{r}x{hidden}",
        )
        for r in rows
    ]


def rms_norm_flops(args: tuple[Any, ...], out: torch.Tensor) -> int:
    """Per element: square, sum, scale by the row's rsqrt, multiply by the weight."""
    return 4 * out.numel()


def rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    torch._check(x.dim() >= 1, lambda: "rms_norm: x must have at least 1 dimension")
    torch._check(weight.dim() == 1, lambda: "rms_norm: weight must be 1-d [hidden]")
    torch._check(
        weight.shape[0] == x.shape[-1],
        lambda: f"rms_norm: weight.size(0) ({weight.shape[0]}) != x.size(-1) ({x.shape[-1]})",
    )
    torch._check(weight.dtype == x.dtype, lambda: "rms_norm: weight must have x's dtype")
    torch._check(weight.device == x.device, lambda: "rms_norm: weight must be on x's device")
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def rms_norm_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def rms_norm_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    """With r = rsqrt(mean(x^2) + eps) and u = grad * weight, per row:

    grad_x = r * u - x * r^3 * mean(u * x),    grad_weight = sum over rows of grad * x * r.
    """
    x, weight = ctx.saved_tensors
    acc = _acc(x.dtype)
    xf, wf, g = x.to(acc), weight.to(acc), grad.to(acc)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        u = g * wf
        grad_x = (r * u - xf * r.pow(3) * (u * xf).mean(-1, keepdim=True)).to(x.dtype)
    if ctx.needs_input_grad[1]:
        grad_w = (g * xf * r).sum_to_size(weight.shape).to(weight.dtype)
    return grad_x, grad_w, None


OPS = [
    OpSpec(
        name="rms_norm",
        reference=rms_norm_reference,
        samples=rms_norm_samples,
        fake=rms_norm_fake,
        backward=rms_norm_backward,
        setup_context=rms_norm_setup_context,
        flops=rms_norm_flops,
        bench_sizes=rms_norm_bench_sizes,
    ),
]
