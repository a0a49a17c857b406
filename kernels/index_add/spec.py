"""Spec of the index_add family: index_add(x, dim, index, source) -> x with source's slices added.

    out = x.clone();  out[..., index[k], ...] += source[..., k, ...]   (along dim, every k)

x: [..., size, ...] (at least 1-d); index: [count] int64 or int32, values in [0, size),
duplicates allowed; source: x's shape with size(dim) = count. Same as x.index_add(dim, index,
source). float16 / bfloat16 sum in float32 and round once. On CUDA the terms that land on one
element are added by atomics in an order that varies between runs (nondeterministic); the CPU
adds them in index order.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import OpSpec, Sample, bench_numels, randn, size_label


def index_add_reference(
    x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor
) -> torch.Tensor:
    return x.index_add(dim, index, source)


def _index(count: int, size: int, gen: torch.Generator, dtype: torch.dtype = torch.int64) -> Any:
    return torch.randint(0, size, (count,), generator=gen).to(dtype)


def _case(
    x_shape: tuple[int, ...],
    dim: int,
    index: torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    label: str,
    strided: bool = False,
) -> Sample:
    """x of x_shape, and a source of x's shape with size(dim) = index.numel()."""
    s_shape = list(x_shape)
    s_shape[dim] = index.numel()
    x = randn(x_shape, dtype, device, gen, strided=strided)
    source = randn(s_shape, dtype, device, gen, strided=strided)
    return Sample((x, dim, index.to(device), source), label)


def index_add_samples(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """The awkward cases first; then both ends of 2-d and 3-d, colliding indices, large."""

    def case(shape: tuple[int, ...], dim: int, index: torch.Tensor, label: str, **kw: Any) -> Any:
        return _case(shape, dim, index, dtype, device, gen, label, **kw)

    out = [
        case((5, 7), 0, torch.zeros(0, dtype=torch.int64), "empty"),
        case((1,), 0, torch.zeros(1, dtype=torch.int64), "one"),
        case((13, 131), 0, _index(29, 13, gen), "odd"),
        case((9, 65), -1, _index(40, 65, gen), "strided", strided=True),
    ]
    # One source row broadcast to all 20 (stride 0 along dim).
    row = randn((1, 33), dtype, device, gen)
    x = randn((6, 33), dtype, device, gen)
    out.append(Sample((x, 0, _index(20, 6, gen).to(device), row.expand(20, 33)), "expanded"))
    out += [
        case((7, 5, 9), 0, _index(16, 7, gen), "3d_dim0"),
        case((3, 8, 33), 1, _index(12, 8, gen), "3d_dim1"),
        case((4, 6, 37), -1, _index(50, 37, gen), "3d_dim_last"),
        case((10, 17), 0, _index(23, 10, gen, torch.int32), "index_int32"),
        # Many terms on one element, so that the atomics collide: 2000 rows into 4 (most into row
        # 0), and 1000 columns into column 3.
        case((4, 256), 0, (_index(2000, 8, gen) - 4).clamp_(min=0), "duplicates"),
        case((64, 8), -1, torch.full((1000,), 3, dtype=torch.int64), "duplicates_last"),
        case((4096, 256), 0, _index(8192, 4096, gen), "large"),
        # Along the last dimension, rows and index of 1024 or more and a block an SM (132): the
        # CUDA slice path, a row in one block's shared memory, or in two to four (70001 float32 or
        # float64 accumulators).
        case((2, 70, 3000), -1, _index(2000, 3000, gen), "slices_one"),
        case((70, 70001), -1, _index(3000, 70001, gen), "slices_several"),
    ]
    return out


def index_add_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """Rows of 256 from source sizes n (4Ki to 64Mi elements on a GPU) into a quarter as many
    rows of x, so that each row of x takes about four."""
    out = []
    for n in bench_numels(device):
        rows = max(1, n // 256)
        size = max(1, rows // 4)
        out.append(
            _case((size, 256), 0, _index(rows, size, gen), dtype, device, gen, size_label(n))
        )
    return out


def index_add_flops(args: tuple[Any, ...], out: torch.Tensor) -> int:
    """One add per source element."""
    return args[3].numel()


def index_add_fake(
    x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor
) -> torch.Tensor:
    nd = x.dim()
    torch._check(nd >= 1, lambda: "index_add: expected x to have at least 1 dimension")
    torch._check(-nd <= dim < nd, lambda: f"index_add: expected dim in [{-nd}, {nd - 1}]")
    d = dim % nd
    torch._check(index.dim() == 1, lambda: "index_add: expected index to be 1-d")
    torch._check(index.dtype in (torch.int64, torch.int32), lambda: "index_add: index dtype")
    torch._check(source.dtype == x.dtype, lambda: "index_add: source must have x's dtype")
    torch._check(source.dim() == nd, lambda: "index_add: source must have x's dimensions")
    for i in range(nd):
        want = index.shape[0] if i == d else x.shape[i]
        torch._check(
            source.shape[i] == want,
            lambda i=i, want=want: f"index_add: expected source.size({i}) == {want}",
        )
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def index_add_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, dim, index, _ = inputs
    ctx.save_for_backward(index)
    ctx.dim = dim


def index_add_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    """grad_x = grad; grad_source = grad.index_select(dim, index)."""
    (index,) = ctx.saved_tensors
    grad_x = grad if ctx.needs_input_grad[0] else None
    grad_source = grad.index_select(ctx.dim, index) if ctx.needs_input_grad[3] else None
    return grad_x, None, None, grad_source


OPS = [
    OpSpec(
        name="index_add",
        reference=index_add_reference,
        samples=index_add_samples,
        fake=index_add_fake,
        backward=index_add_backward,
        setup_context=index_add_setup_context,
        flops=index_add_flops,
        bench_sizes=index_add_bench_sizes,
        nondeterministic=True,
        specials_exclude=("max",),
        why=(
            "on CUDA the order of the atomic adds decides whether a partial sum of the largest "
            "finite values overflows to Inf before the terms that cancel it arrive"
        ),
    ),
]
