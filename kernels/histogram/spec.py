"""Spec of the histogram family: histogram(x, bins, lo, hi) -> int64 counts [bins].

    counts[b] = #{ v in x : lo <= v <= hi and bin(v) == b }
    bin(v)    = clamp(floor(((v - lo) * bins) / (hi - lo)), 0, bins - 1)

Every element v of x (any shape and strides; float32, float64, float16, bfloat16, int32 or int64)
is first converted to float64: exactly, but for int64 values beyond 2^53, which round to nearest
(even). It counts only if lo <= v <= hi, so NaN, +-Inf and values outside the range are not
counted. Its bin is computed in float64 in exactly the order written, each operation rounded to
nearest (hi - lo is rounded first), then clamped: v == hi (bin == bins) falls in the last bin, as
in torch.histc, and so does a product (v - lo) * bins that overflows to +Inf. bins >= 1; lo, hi
and hi - lo finite; lo < hi. The CPU kernel, the CUDA kernel and the reference agree bit for bit
(the counts are integers and compared exactly), and every run gives the same counts.

The peer a user would pick is torch.histc, but it bins in the input's dtype, so it disagrees at
bin edges, and returns its counts in that dtype: it cannot be the reference. It is the spec's
``anchor`` (``histc_anchor``), which the bench times beside the op ("vs anchor").
"""

from __future__ import annotations

import math

import torch

from workbench.spec import FLOATING, OpSpec, Sample, bench_numels, size_label

DTYPES = (*FLOATING, torch.int32, torch.int64)
_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def histogram_reference(x: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor:
    """int64 counts [bins] of x's elements over [lo, hi], binned exactly as the kernels do."""
    v = x.detach().reshape(-1).to(torch.float64)
    v = v[(v >= lo) & (v <= hi)]
    # hi - lo as a tensor on v's device: on CUDA, dividing by a Python number multiplies by its
    # reciprocal instead, which is not always the rounded quotient.
    width = torch.tensor(hi - lo, dtype=torch.float64, device=v.device)
    t = (v - lo) * bins / width
    b = torch.floor(t).clamp_(0, bins - 1).to(torch.int64)
    return torch.bincount(b, minlength=bins)


def histc_anchor(x: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor:
    """torch.histc over the same range: not bit-exact (and float counts), but the PyTorch call
    histogram is timed against. It takes floating x only: integers go through float64."""
    return torch.histc(x if x.is_floating_point() else x.to(torch.float64), bins, lo, hi)


def _spread(
    shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, lo: float, hi: float
) -> torch.Tensor:
    """Values over [lo - w/4, hi + w/4] (w = hi - lo): most inside the range, some outside."""
    span = hi - lo
    if dtype.is_floating_point:
        u = torch.rand(shape, generator=gen, dtype=torch.float64)
        return (lo - span / 4 + u * (1.5 * span)).to(dtype)
    return torch.randint(
        int(lo - span / 4), int(hi + span / 4) + 1, shape, generator=gen, dtype=torch.int64
    ).to(dtype)


def _step(t: torch.Tensor, up: bool) -> torch.Tensor:
    """The next larger (up) or smaller value of t's floating dtype after each finite element."""
    ints = t.view(_INT_VIEW[t.element_size()])
    away = t > 0 if up else t < 0  # away from zero: one more in the magnitude bits
    moved = torch.where(away, ints + 1, ints - 1).view(t.dtype)
    info = torch.finfo(t.dtype)
    smallest = info.tiny * info.eps  # the smallest subnormal
    return torch.where(t == 0, torch.full_like(t, smallest if up else -smallest), moved)


def _edges(dtype: torch.dtype, bins: int, lo: float, hi: float) -> torch.Tensor:
    """x at lo, at hi and at every interior bin edge lo + k * (hi - lo) / bins (in double),
    rounded to the dtype, with the dtype's neighbours on either side (integers: the two
    integers on either side of the edge and the next ones out)."""
    edges = torch.tensor([lo + k * (hi - lo) / bins for k in range(bins + 1)], dtype=torch.float64)
    if dtype.is_floating_point:
        rounded = edges.to(dtype)
        return torch.cat([_step(rounded, False), rounded, _step(rounded, True)])
    below, above = edges.floor().to(torch.int64), edges.ceil().to(torch.int64)  # +-1 in int64
    return torch.cat([below - 1, below, above, above + 1]).to(dtype)


def _ends(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """x with some elements set to lo and to hi and, for a floating dtype, to NaN and +-Inf."""
    x = x.clone()
    x[::7], x[3::11] = lo, hi
    if x.dtype.is_floating_point:
        x[5::13], x[6::17], x[8::19] = math.nan, math.inf, -math.inf
    return x


def _sample(
    x: torch.Tensor, device: torch.device, bins: int, lo: float, hi: float, label: str
) -> Sample:
    return Sample((x.to(device), bins, lo, hi), label)


def histogram_samples(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """The awkward cases first; then the edges, the range's outside, bins=1, many bins, large."""
    lo, hi = (-3.0, 3.0) if dtype.is_floating_point else (-10.0, 10.0)

    def spread(shape: tuple[int, ...]) -> torch.Tensor:
        return _spread(shape, dtype, gen, lo, hi)

    out = [
        _sample(spread((0,)), device, 10, lo, hi, "empty"),
        _sample(spread((1,)), device, 10, lo, hi, "one"),
        _sample(spread((7, 131)), device, 7, lo, hi, "odd"),  # 917 elements: no vector multiple
        _sample(spread((33, 130))[:, ::2], device, 16, lo, hi, "strided"),
        _sample(spread((1, 97)).expand(16, 97), device, 12, lo, hi, "expanded"),
        _sample(spread((3, 5, 67)), device, 256, lo, hi, "3d"),
        # Views whose data start off a 16-byte boundary: the kernel's scalar head, then vectors,
        # then a tail (2003 and 2^20 + 4 elements: no whole vectors after the head). Both, and
        # "ends", are sized so that the check's special values still derive from edges256.
        _sample(spread((2004,))[1:], device, 256, lo, hi, "unaligned"),
        _sample(spread(((1 << 20) + 7,))[3:], device, 256, lo, hi, "unaligned_large"),
        _sample(_ends(spread((20011,)), lo, hi), device, 256, lo, hi, "ends"),
    ]
    if dtype.is_floating_point:
        edge_cases = [
            (7, lo, hi, "edges7"),
            (256, -4.0, 4.0, "edges256"),  # edges k / 32 - 4: exact in every dtype
            (6, 0.1, 0.7, "edges_frac"),  # lo, hi and the edges inexact in every dtype
            # Every edge of 65536 bins (the CUDA kernel's chunked path: each slice tells by a
            # float estimate which elements are another slice's, the edges between them included).
            (65536, -4.0, 4.0, "edges64k"),
        ]
    else:
        # int64: beyond 2^53, where the conversion to double rounds (2^62 + 1 becomes hi).
        big = float(2**62) if dtype == torch.int64 else float(2**31 - 2)
        edge_cases = [(7, lo, hi, "edges7"), (20, lo, hi, "edges20"), (3, -big, big, "edges_big")]
    for bins, elo, ehi, label in edge_cases:
        values = _edges(dtype, bins, elo, ehi).repeat(3)
        values = values[torch.randperm(values.numel(), generator=gen)]  # scatter across vectors
        out.append(_sample(values, device, bins, elo, ehi, label))
    out += [
        # A narrow range: most values outside, on both sides.
        _sample(spread((2000,)), device, 5, hi - 1.0, hi, "outside"),
        _sample(spread((1001,)), device, 1, lo, hi, "bins1"),
        # A histogram of 80 KB: shared memory beyond the 48 KiB a CUDA kernel gets unasked.
        _sample(spread(((1 << 17) + 1,)), device, 20000, lo, hi, "bins_mid"),
        # 4096 bins: the float path's margin (2^-9 of a bin over [-3, 3]) leaves more values near
        # an edge to the double path than 256 bins do.
        _sample(spread(((1 << 16) + 1,)), device, 4096, lo, hi, "bins_4k"),
        # More bins than fit in shared memory, fewer than x's elements: the CUDA kernel's chunked
        # path, each block counting one slice of the bins.
        _sample(spread(((1 << 18) + 3,)), device, 65536, lo, hi, "bins_64k"),
        _sample(
            _spread(((1 << 18) + 5,), dtype, gen, -50000, 50000),
            device,
            100000,
            -50000.0,
            50000.0,
            "bins_large",
        ),
        # More bins than elements: the CUDA kernel's global-atomics path.
        _sample(spread((40001,)), device, 100000, lo, hi, "bins_sparse"),
        _sample(spread(((1 << 20) + 3,)), device, 256, lo, hi, "large"),
    ]
    if dtype.is_floating_point:
        # (v - lo) * bins overflows to +Inf for float64 values: the last bin. Larger than the
        # check's special-values sample takes (16 Ki), which then derives from edges256.
        top = torch.finfo(torch.float64).max / 2
        x = torch.rand((20001,), generator=gen, dtype=torch.float64) * torch.finfo(dtype).max
        out.append(_sample(x.to(dtype), device, 1000, 0.0, top, "overflow"))
    return out


def histogram_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """256 bins over [-4, 4] of normal values (hot bins in the middle), 4Ki up to 64Mi on a GPU
    (16Mi is the size the op is measured at against torch.histc); then 65536 bins over the same
    values at 16Mi on a GPU, 1Mi on a CPU (labelled '16Mi_bins64Ki')."""
    many = 1 << 24 if device.type == "cuda" else 1 << 20
    out = []
    for n, bins in [*((n, 256) for n in bench_numels(device)), (many, 65536)]:
        if dtype.is_floating_point:
            x = torch.randn((n,), generator=gen, dtype=torch.float32).to(dtype)
        else:
            x = (torch.randn((n,), generator=gen) * 40).round().to(dtype)
        lo, hi = (-4.0, 4.0) if dtype.is_floating_point else (-128.0, 128.0)
        label = size_label(n) if bins == 256 else f"{size_label(n)}_bins{size_label(bins)}"
        out.append(Sample((x.to(device), bins, lo, hi), label))
    return out


def histogram_fake(x: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor:
    torch._check(bins >= 1, lambda: f"histogram: expected bins >= 1, got {bins}")
    torch._check(math.isfinite(lo), lambda: f"histogram: expected lo to be finite, got {lo}")
    torch._check(math.isfinite(hi), lambda: f"histogram: expected hi to be finite, got {hi}")
    torch._check(lo < hi, lambda: f"histogram: expected lo < hi, got lo = {lo} and hi = {hi}")
    torch._check(x.dtype in DTYPES, lambda: f"histogram: x has dtype {x.dtype}, not supported")
    return torch.empty((bins,), dtype=torch.int64, device=x.device)


OPS = [
    OpSpec(
        name="histogram",
        reference=histogram_reference,
        samples=histogram_samples,
        fake=histogram_fake,
        dtypes=DTYPES,
        bench_sizes=histogram_bench_sizes,
        anchor=histc_anchor,
    ),
]
