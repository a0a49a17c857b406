"""Spec of the softmax family: softmax(x, dim) and its backward, softmax_backward(grad, y, dim).

    y  = exp(x - max(x, dim)) / sum(exp(x - max(x, dim)), dim)       x, y: any shape
    dx = y * (grad - sum(grad * y, dim))                              grad, y, dx: one shape

Accumulated in float32 (float64 for float64 inputs) and rounded once to the input dtype. The
kernels work on the last dimension; for another ``dim`` the input is copied with ``dim`` moved
last and the output is that layout moved back (the fake functions give the same strides). A row
holding NaN or +Inf, or only -Inf, comes out all NaN, as torch.softmax gives. The references are
PyTorch's own kernels (``torch.softmax``, ``torch._softmax_backward_data``), so ``wb bench``
times these ops against PyTorch's softmax and its backward; dx is computed in the form PyTorch's
kernel on the same device uses (CPU ``y * (grad - D)``, CUDA ``grad * y - y * D``), which decides
where NaN and Inf land when y holds an Inf.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import FLOATING, OpSpec, Sample, randn

# (label, x shape, dim, strided): the awkward cases first. The comments name the CUDA path a
# float32 row takes (kernels/softmax/softmax_rows.cuh; float16 and float64 cross at other
# lengths): "vec" reads 16-byte vectors, "elem" single elements (a length not a multiple of 4).
_SHAPES: list[tuple[str, tuple[int, ...], int, bool]] = [
    ("empty", (0, 64), -1, False),
    ("one", (1, 1), -1, False),
    ("scalar", (), 0, False),  # a 0-d tensor: one row of one element
    ("odd", (7, 131), -1, False),  # elem, a warp per row
    ("tiny_rows", (300, 3), -1, False),  # elem, a warp per row of 3
    ("strided", (8, 96), -1, True),
    ("dim0", (64, 33), 0, False),  # dim not last: moved last, and back
    ("dim_mid", (4, 50, 6), 1, False),
    ("neg_dim", (3, 5, 7), -2, False),
    ("rows16", (1024, 16), -1, False),  # vec, 4 lanes a row; the special-values base sample
    ("short", (100, 60), -1, False),  # vec, 16 lanes a row
    ("warp", (4, 1024), -1, False),  # vec, a warp per row, 8 vectors a lane
    ("block", (3, 4096), -1, False),  # vec, a block of 128 per row
    ("block_max", (2, 16384), -1, False),  # vec, a block of 512
    ("split", (2, 16388), -1, False),  # float32 vec: cluster (sm_90+), else split; 2-byte: split
    ("split_odd", (2, 65537), -1, False),  # elem, split
    ("long", (1, 262144), -1, False),  # vec: cluster (float32) or wide (2-byte) on sm_90+
    ("stream", (1, 600000), -1, False),  # vec, sm_90+: float32 stream; 2-byte wide, split (bwd)
    # Large logits, where exp(x) overflows float32 but exp(x - max) cannot: values of about
    # +-300, and values near 86 (each exp(x) finite, their row sum past float32's largest).
    ("wide_range", (32, 256), -1, False),
    ("shifted", (32, 256), -1, False),
]
# label -> (scale, offset) of its normal values
_AFFINE = {"wide_range": (80.0, 0.0), "shifted": (0.5, 86.0)}


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _wrap(dim: int, ndim: int, op: str) -> int:
    n = max(ndim, 1)
    torch._check(
        -n <= dim < n,
        lambda: (
            f"{op}: expected dim in [{-n}, {n - 1}] for a tensor of {ndim} dimension(s), got {dim}"
        ),
    )
    return dim % n


def _moved_like(t: torch.Tensor, dim: int) -> torch.Tensor:
    """An empty tensor shaped like ``t`` with the strides the op's output has: contiguous with
    ``dim`` last, moved back to ``dim``."""
    if t.dim() == 0:
        return torch.empty((), dtype=t.dtype, device=t.device)
    shape = [s for i, s in enumerate(t.shape) if i != dim] + [t.shape[dim]]
    return torch.empty(shape, dtype=t.dtype, device=t.device).movedim(-1, dim)


# --- softmax -----------------------------------------------------------------------------------


def softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """y = exp(x - max(x, dim)) / sum(exp(x - max(x, dim)), dim): PyTorch's own kernel."""
    return torch.softmax(x, dim)


def _softmax_x(
    label: str, shape: tuple[int, ...], strided: bool, dtype: torch.dtype, device: Any, gen: Any
) -> torch.Tensor:
    x = randn(shape, dtype, device, gen, strided=strided)
    if label not in _AFFINE:
        return x
    scale, offset = _AFFINE[label]
    return x * scale + offset


def softmax_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    samples = [
        Sample((_softmax_x(label, shape, strided, dtype, device, gen), dim), label)
        for label, shape, dim, strided in _SHAPES
    ]
    # One row broadcast to 12 rows (stride 0 across rows).
    row = randn((1, 384), dtype, device, gen)
    samples.insert(6, Sample((row.expand(12, 384), -1), "expanded"))
    return samples


def _bench_shapes(device: torch.device) -> list[tuple[int, int]]:
    """(rows, cols): on a GPU 64 MiB of float32 per size (far past L2) for rows of 128 to
    262144, one small launch-bound size first, and 1024 rows of 65536 (256 MiB: many long rows,
    the long-row path's rounds); on a CPU a few small ones."""
    if device.type != "cuda":
        return [(1024, 128), (256, 1024), (64, 4096), (16, 16384)]
    big = [(1 << 24) // cols for cols in (128, 1024, 4096, 16384, 65536, 262144)]
    cols = [128, 1024, 4096, 16384, 65536, 262144]
    return [(32, 1024), *zip(big, cols, strict=True), (1024, 65536)]


def softmax_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    return [
        Sample((randn((r, c), dtype, device, gen), -1), f"{r}x{c}")
        for r, c in _bench_shapes(device)
    ]


def softmax_fake(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    d = _wrap(dim, x.dim(), "softmax")
    torch._check(x.dtype in FLOATING, lambda: f"softmax: x must be floating point, got {x.dtype}")
    return _moved_like(x, d)


def softmax_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, dim = inputs
    ctx.save_for_backward(output)
    ctx.dim = dim


def softmax_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    """dx = y * (grad - sum(grad * y, dim)), through the family's own softmax_backward op."""
    (y,) = ctx.saved_tensors
    return ctx.ops.softmax_backward(grad, y, ctx.dim), None


# --- softmax_backward --------------------------------------------------------------------------


def softmax_backward_reference(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """dx = y * (grad - sum(grad * y, dim)): PyTorch's own softmax backward kernel."""
    return torch._softmax_backward_data(grad, y, dim, y.dtype)


def softmax_backward_samples(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """grad: normal values; y: a softmax of normal values (rows in (0, 1) summing to 1)."""
    samples = []
    for label, shape, dim, strided in _SHAPES:
        grad = randn(shape, dtype, device, gen, strided=strided)
        logits = _softmax_x(label, shape, strided, torch.float32, device, gen)
        samples.append(Sample((grad, torch.softmax(logits, dim).to(dtype), dim), label))
    # The gradient of a sum: one row broadcast to 12 (stride 0 across rows).
    grad = randn((1, 384), dtype, device, gen).expand(12, 384)
    y = torch.softmax(randn((12, 384), torch.float32, device, gen), -1).to(dtype)
    samples.insert(6, Sample((grad, y, -1), "expanded"))
    return samples


def softmax_backward_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    out = []
    for r, c in _bench_shapes(device):
        grad = randn((r, c), dtype, device, gen)
        y = torch.softmax(randn((r, c), torch.float32, device, gen), -1).to(dtype)
        out.append(Sample((grad, y, -1), f"{r}x{c}"))
    return out


def softmax_backward_fake(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    torch._check(
        grad.shape == y.shape,
        lambda: (
            f"softmax_backward: expected grad to have the same shape as y {list(y.shape)}, "
            f"got {list(grad.shape)}"
        ),
    )
    torch._check(grad.dtype == y.dtype, lambda: "softmax_backward: grad must have y's dtype")
    torch._check(grad.device == y.device, lambda: "softmax_backward: grad must be on y's device")
    torch._check(
        y.dtype in FLOATING, lambda: f"softmax_backward: y must be floating point, got {y.dtype}"
    )
    return _moved_like(y, _wrap(dim, y.dim(), "softmax_backward"))


def softmax_backward_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    grad, y, dim = inputs
    ctx.save_for_backward(grad, y)
    ctx.dim = dim


def softmax_backward_grad(ctx: Any, u: torch.Tensor) -> tuple[Any, ...]:
    """With D = sum(grad * y) and E = sum(u * y) over dim, for dx = y * (grad - D):

    d grad = y * (u - E)  (softmax_backward(u, y) itself),    d y = u * (grad - D) - grad * E.
    """
    grad, y = ctx.saved_tensors
    dim = ctx.dim
    d_grad = d_y = None
    if ctx.needs_input_grad[0]:
        d_grad = ctx.ops.softmax_backward(u, y, dim)
    if ctx.needs_input_grad[1]:
        acc = _acc(y.dtype)
        g, p, uf = grad.to(acc), y.to(acc), u.to(acc)
        dot_g = (g * p).sum(dim, keepdim=True)
        dot_u = (uf * p).sum(dim, keepdim=True)
        d_y = (uf * (g - dot_g) - g * dot_u).to(y.dtype)
    return d_grad, d_y, None


OPS = [
    OpSpec(
        name="softmax",
        reference=softmax_reference,
        samples=softmax_samples,
        fake=softmax_fake,
        backward=softmax_grad,
        setup_context=softmax_setup_context,
        bench_sizes=softmax_bench_sizes,
    ),
    OpSpec(
        name="softmax_backward",
        reference=softmax_backward_reference,
        samples=softmax_backward_samples,
        fake=softmax_backward_fake,
        backward=softmax_backward_grad,
        setup_context=softmax_backward_setup_context,
        bench_sizes=softmax_backward_bench_sizes,
        # Seen on an H200: grad holding +-largest finite values makes D = sum(grad * y) overflow
        # partway or not by the order of the sum (+max and -max products cancel first, or one
        # reaches Inf first), in float64 for the truth itself; NaN and Inf stay in the sample.
        specials_exclude=("max",),
        why="D = sum(grad * y) of the largest finite values overflows partway or not by the "
        "order of the sum, whether the truth is finite or not",
    ),
]
