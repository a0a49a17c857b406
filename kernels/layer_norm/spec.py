"""Spec of the layer_norm family: layer_norm(x, weight, bias, eps) over the last dimension, and
layer_norm_backward, its backward as an op of its own.

    mean = mean(x, -1);  rstd = 1 / sqrt(var(x, -1, biased) + eps)
    y = (x - mean) * rstd * weight + bias       x: [..., hidden], weight, bias: [hidden]
    layer_norm(x, weight, bias, eps) -> (y, mean, rstd)      mean, rstd: x.shape[:-1]

    xhat = (x - mean) * rstd;  u = grad * weight
    dx = rstd * (u - mean(u, -1) - xhat * mean(u * xhat, -1))
    dweight = sum over rows of grad * xhat;  dbias = sum over rows of grad
    layer_norm_backward(grad, x, mean, rstd, weight) -> (dx, dweight, dbias)

Accumulated in float32 (float64 for float64 inputs); mean and rstd have that accumulation type
(float32 for float16 and bfloat16 inputs), as torch.ops.aten.native_layer_norm returns them. The
references call PyTorch's own fused kernels (native_layer_norm and native_layer_norm_backward),
so ``wb bench`` times the kernels against what F.layer_norm runs forward and backward.

Autograd: layer_norm's is C++ (``cpp_autograd=True``: ``LayerNormFunction`` in
bindings/layer_norm.cpp), so a training step runs no Python of its own. Its forward saves x,
weight, mean and rstd; mean and rstd are not differentiable; its backward calls
layer_norm_backward. When that backward is itself differentiated (create_graph), it recomputes
mean and rstd from x with differentiable ops (the saved ones carry no dependence on x) and goes
through layer_norm_backward's autograd formula below, in Python: the double backward.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import OpSpec, Sample, randn

_EPS = 1e-5
_HALF = (torch.float16, torch.bfloat16)

# (label, x shape, strided): the awkward cases first (the expanded sample follows them).
_AWKWARD: list[tuple[str, tuple[int, ...], bool]] = [
    ("empty", (0, 64), False),
    ("one", (1, 1), False),  # hidden 1: var 0, y = bias
    ("odd", (5, 1000), False),
    ("unaligned", (3, 4095), False),  # hidden not a multiple of any vector width
    ("strided", (8, 96), True),
]
_LARGE: list[tuple[str, tuple[int, ...], bool]] = [
    ("3d", (2, 3, 256), False),
    # Many short rows: several rows per block, several rows per group on a GPU (partials).
    ("rows", (16384, 24), False),
    # The CUDA forward's paths by row length (float32 loads of 4): a warp per row (odd, 250
    # loads); 128 threads of 8 loads (block, the largest sample the special values are
    # scattered over); 256 and 512 threads of 8 single elements (mid, unaligned); 512 threads
    # (wide); then too long for registers, by vectors (long; long_half for 2-byte types) and by
    # elements (long_odd). The backward holds 4 loads a thread up to 2048 loads, 8 beyond, and
    # its register path stops at 16384 (8192 for float64); long's 40 rows are two chunks of
    # its two-read path's partial sums.
    ("block", (4, 4096), False),
    ("mid", (4, 2001), False),
    ("large", (64, 8192), False),
    ("wide", (2, 16384), False),
    ("long", (40, 16388), False),
    ("long_odd", (2, 8193), False),
    ("long_half", (1, 32776), False),
]


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _params(x: torch.Tensor, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The parameters as native_layer_norm takes them. On a CPU, float16/bfloat16 parameters
    give float16/bfloat16 statistics; float32 ones take its mixed-type path, whose statistics are
    float32 (as on a GPU, where they always are)."""
    if x.device.type == "cpu" and x.dtype in _HALF:
        return tuple(p.float() for p in params)
    return params


def _stats(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """mean and rstd of x's rows in the accumulation type (the backward samples' statistics)."""
    xf = x.to(_acc(x.dtype))
    mean = xf.mean(-1)
    return mean, torch.rsqrt((xf - mean.unsqueeze(-1)).square().mean(-1) + eps)


# ---- layer_norm ----------------------------------------------------------------------------


def layer_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd) of x: [..., hidden]; mean and rstd: x.shape[:-1] in the accumulation type."""
    w, b = _params(x, weight, bias)
    y, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, eps)
    acc = _acc(x.dtype)
    return y.to(x.dtype), mean.squeeze(-1).to(acc), rstd.squeeze(-1).to(acc)


def layer_norm_anchor(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """What a user calls instead: ``F.layer_norm`` (y alone; its statistics stay inside ATen's
    kernel and autograd node). ``wb bench`` times it as "vs anchor", forward and, with
    ``--backward``, forward and backward together."""
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _layer_norm_sample(
    label: str, shape: tuple[int, ...], strided: bool, dtype: torch.dtype, device: Any, gen: Any
) -> Sample:
    x = randn(shape, dtype, device, gen, strided=strided)
    weight, bias = randn(shape[-1:], dtype, device, gen), randn(shape[-1:], dtype, device, gen)
    return Sample((x, weight, bias, _EPS), label)


def _expanded_inputs(
    dtype: torch.dtype, device: Any, gen: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row broadcast to 12 (stride 0 across rows), a weight that is a view of a scalar, and
    a bias."""
    row = randn((1, 320), dtype, device, gen)
    weight = randn((1,), dtype, device, gen).expand(320)
    return row.expand(12, 320), weight, randn((320,), dtype, device, gen)


def layer_norm_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list:
    samples = [_layer_norm_sample(*s, dtype, device, gen) for s in _AWKWARD]
    samples.append(Sample((*_expanded_inputs(dtype, device, gen), _EPS), "expanded"))
    samples += [_layer_norm_sample(*s, dtype, device, gen) for s in _LARGE]
    return samples


def _bench_shapes(device: torch.device) -> list[tuple[int, int]]:
    """rows x hidden: common transformer widths, 32 rows (launch-bound) and 16384-wide rows."""
    if device.type == "cuda":
        return [(4096, 1024), (16384, 1024), (4096, 4096), (8192, 4096), (1024, 16384), (32, 4096)]
    return [(256, 1024), (1024, 1024), (64, 4096)]


def layer_norm_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    return [
        _layer_norm_sample(f"{r}x{h}", (r, h), False, dtype, device, gen)
        for r, h in _bench_shapes(device)
    ]


def layer_norm_flops(args: tuple[Any, ...], out: Any) -> int:
    """Per element: add to the mean; subtract, square and add; subtract, scale, weight, bias."""
    return 8 * args[0].numel()


def _check_param(name: str, t: torch.Tensor, x: torch.Tensor, op: str) -> None:
    torch._check(t.dim() == 1, lambda: f"{op}: expected {name} to be 1-d [hidden]")
    torch._check(
        t.shape[0] == x.shape[-1],
        lambda: f"{op}: expected {name}.size(0) ({t.shape[0]}) to equal x.size(-1) ({x.shape[-1]})",
    )
    torch._check(t.dtype == x.dtype, lambda: f"{op}: expected {name} to have the same dtype as x")
    torch._check(t.device == x.device, lambda: f"{op}: expected {name} on {x.device}")


def _check_x(x: torch.Tensor, op: str, name: str = "x") -> None:
    torch._check(x.dim() >= 1, lambda: f"{op}: expected {name} to have at least 1 dimension")
    torch._check(x.shape[-1] >= 1, lambda: f"{op}: expected {name}.size(-1) >= 1")


def layer_norm_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_x(x, "layer_norm")
    _check_param("weight", weight, x, "layer_norm")
    _check_param("bias", bias, x, "layer_norm")
    acc = _acc(x.dtype)
    return (
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        torch.empty(x.shape[:-1], dtype=acc, device=x.device),
        torch.empty(x.shape[:-1], dtype=acc, device=x.device),
    )


# ---- layer_norm_backward -------------------------------------------------------------------


def layer_norm_backward_reference(
    grad: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias) of layer_norm at x given its mean and rstd, by PyTorch's kernel."""
    (w,) = _params(x, weight)
    stats = (*x.shape[:-1], 1)
    mean, rstd = mean.reshape(stats).contiguous(), rstd.reshape(stats).contiguous()
    # w stands in for the bias too: the kernel reads only whether a bias is given.
    dx, dweight, dbias = torch.ops.aten.native_layer_norm_backward(
        grad.contiguous(), x, [x.shape[-1]], mean, rstd, w, w, [True, True, True]
    )
    return dx.to(x.dtype), dweight.to(x.dtype), dbias.to(x.dtype)


def _backward_args(x: torch.Tensor, gen: Any, *, grad: torch.Tensor | None = None) -> tuple:
    """(grad, x, mean, rstd, weight) for x, with the statistics layer_norm gives for x."""
    hidden = x.shape[-1]
    if grad is None:
        grad = randn(x.shape, x.dtype, x.device, gen, strided=not x.is_contiguous())
    mean, rstd = _stats(x, _EPS)
    return grad, x, mean, rstd, randn((hidden,), x.dtype, x.device, gen)


def layer_norm_backward_samples(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    samples = [
        Sample(_backward_args(randn(shape, dtype, device, gen, strided=strided), gen), label)
        for label, shape, strided in _AWKWARD
    ]
    # Every input broadcast: grad and x one row over 12 rows, their statistics too, and a weight
    # that is a view of a scalar.
    x, weight, _ = _expanded_inputs(dtype, device, gen)
    grad = randn((1, 320), dtype, device, gen).expand(12, 320)
    mean, rstd = _stats(x[:1], _EPS)
    expanded = (grad, x, mean.expand(12), rstd.expand(12), weight)
    samples.append(Sample(expanded, "expanded"))
    samples += [
        Sample(_backward_args(randn(shape, dtype, device, gen, strided=strided), gen), label)
        for label, shape, strided in _LARGE
    ]
    return samples


def layer_norm_backward_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    return [
        Sample(_backward_args(randn((r, h), dtype, device, gen), gen), f"{r}x{h}")
        for r, h in _bench_shapes(device)
    ]


def layer_norm_backward_flops(args: tuple[Any, ...], out: Any) -> int:
    """Per element: xhat (2), u (1), the two row sums (3), dx (4), dweight and dbias (3)."""
    return 13 * args[0].numel()


def _check_stat(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    op, acc = "layer_norm_backward", _acc(x.dtype)
    torch._check(
        t.shape == x.shape[:-1], lambda: f"{op}: expected {name} to have shape x.shape[:-1]"
    )
    torch._check(t.dtype == acc, lambda: f"{op}: expected {name} to have dtype {acc}")
    torch._check(t.device == x.device, lambda: f"{op}: expected {name} on {x.device}")


def layer_norm_backward_fake(
    grad: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "layer_norm_backward"
    _check_x(x, op)
    torch._check(grad.shape == x.shape, lambda: f"{op}: expected grad to have the same shape as x")
    torch._check(grad.dtype == x.dtype, lambda: f"{op}: expected grad to have the same dtype as x")
    for name, t in (("mean", mean), ("rstd", rstd)):
        _check_stat(name, t, x)
    _check_param("weight", weight, x, op)
    hidden = x.shape[-1]
    return (
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        torch.empty((hidden,), dtype=x.dtype, device=x.device),
        torch.empty((hidden,), dtype=x.dtype, device=x.device),
    )


def layer_norm_backward_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs)


def layer_norm_backward_vjp(ctx: Any, g_dx: Any, g_dweight: Any, g_dbias: Any) -> tuple[Any, ...]:
    """The backward of layer_norm_backward (a double backward of layer_norm), in plain PyTorch.

    With h = rstd * g_dx and n = hidden, per row:
        g_u    = h - sum(h) / n - xhat * sum(h * xhat) / n
        g_xhat = -h * mean(u * xhat) - u * sum(h * xhat) / n + g_dweight * grad
        g_grad = g_u * weight + g_dweight * xhat + g_dbias;   g_weight = sum_rows g_u * grad
        g_x = g_xhat * rstd;   g_mean = -sum(g_x);
        g_rstd = sum(g_dx * (u - mean(u) - xhat * mean(u * xhat))) + sum(g_xhat * (x - mean))
    """
    grad, x, mean, rstd, weight = ctx.saved_tensors
    acc = _acc(x.dtype)
    n = x.shape[-1]
    g, xf, w = grad.to(acc), x.to(acc), weight.to(acc)
    m, r = mean.to(acc).unsqueeze(-1), rstd.to(acc).unsqueeze(-1)
    gx = g_dx.to(acc) if g_dx is not None else torch.zeros_like(xf)
    gw = g_dweight.to(acc) if g_dweight is not None else torch.zeros_like(w)
    gb = g_dbias.to(acc) if g_dbias is not None else torch.zeros_like(w)
    d = xf - m
    xhat = d * r
    u = g * w
    a = u.mean(-1, keepdim=True)
    b = (u * xhat).mean(-1, keepdim=True)
    h = r * gx
    h_sum, hx_sum = h.sum(-1, keepdim=True), (h * xhat).sum(-1, keepdim=True)
    g_u = h - (h_sum + xhat * hx_sum) / n
    g_xhat = -h * b - u * hx_sum / n + gw * g
    g_x = g_xhat * r
    needs = ctx.needs_input_grad
    out: list[Any] = [None] * 5
    if needs[0]:
        out[0] = (g_u * w + gw * xhat + gb).to(grad.dtype)
    if needs[1]:
        out[1] = g_x.to(x.dtype)
    if needs[2]:
        out[2] = (-g_x.sum(-1)).to(mean.dtype)
    if needs[3]:
        g_r = (gx * (u - a - xhat * b)).sum(-1) + (g_xhat * d).sum(-1)
        out[3] = g_r.to(rstd.dtype)
    if needs[4]:
        out[4] = (g_u * g).reshape(-1, n).sum(0).to(weight.dtype)
    return tuple(out)


OPS = [
    OpSpec(
        name="layer_norm",
        reference=layer_norm_reference,
        anchor=layer_norm_anchor,
        samples=layer_norm_samples,
        fake=layer_norm_fake,
        cpp_autograd=True,  # LayerNormFunction in bindings/layer_norm.cpp
        flops=layer_norm_flops,
        bench_sizes=layer_norm_bench_sizes,
    ),
    OpSpec(
        name="layer_norm_backward",
        reference=layer_norm_backward_reference,
        samples=layer_norm_backward_samples,
        fake=layer_norm_backward_fake,
        backward=layer_norm_backward_vjp,
        setup_context=layer_norm_backward_setup_context,
        flops=layer_norm_backward_flops,
        bench_sizes=layer_norm_backward_bench_sizes,
    ),
]
