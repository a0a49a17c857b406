"""Samples the check derives from a spec's own, for the bugs a spec's samples may let through.

A spec lists the shapes its author thought of; a kernel can still be wrong on a layout, a size or
a range of values that none of them has. For every dtype the check derives, from one of the
spec's own samples (the base: the one the special values are scattered over, see
:mod:`~workbench.verify.specials`), samples of these classes, each labelled ``<class>:<what>``:

- **layout** (``layout:transposed``, ``layout:padded``): the same values in other strides. Every
  tensor argument of two or more dimensions stored with its dimensions in reverse order, or in
  a buffer wider in every dimension (rows further apart than their length, the last dimension
  still of stride 1); a 1-d one every other element; each starting an odd number of elements
  past its buffer's start (off any vector alignment). A kernel that reads or writes as if
  contiguous, or that trusts one stride to give the others, reads other values.
- **tails** (``tail:<n>``): the last dimension narrowed to 0, to 1, and to each of 32 lengths
  next to the base's own (every residue modulo 32, so modulo 4, 8 and 16 too), on every tensor
  argument whose last dimension has that length (weights of the row, outputs passed in), each
  made contiguous. A kernel wrong only for some remainder of its vector or block width fails
  one of them.
- **scalar** (``scalar``): every tensor argument shaped like the first one as a 0-d tensor.
- **grown** (``grown``): where the base has at most 64Ki elements, fresh values with the first
  dimension grown past 64Ki elements (more than one thread's chunk, more than one block's grid).
- **long** (``long``): fresh values with the last dimension 16Ki + 7 long (fewer rows, at most
  128Ki elements): a sum over a row accumulated in float16 or bfloat16 drifts past the floor.
- **range** (``range``): the base's floating values scaled by powers of ten from 1e-3 up to
  past 1e4 (2e4 in float16, 1e5 in bfloat16, 1e6 in float32 and float64), signs kept: an
  intermediate that overflows a narrow type (a bfloat16 computed through float16) gives Inf.

A derived sample is kept only where the spec's ``fake`` and ``reference`` both accept it (a
narrowed weight that no longer matches, an index past a narrowed size: the op need not take
it). The layout and range samples run on every trial; the tails, scalar, grown and long ones on
the first trial only (their sizes do not change with the seed), so the check's cost grows by a
few dozen small calls a dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from workbench.spec import OpSpec, Sample
from workbench.verify.schema import Signature

LAYOUT = "layout"
TAIL = "tail"
SCALAR = "scalar"
GROWN = "grown"
RANGE = "range"
LONG = "long"

# The tail sweep: lengths next to the base's own covering every residue modulo this.
TAIL_MODULUS = 32
# A derived sample grown past this many elements (a CPU kernel's thread chunk, a GPU grid).
GROWN_NUMEL = (1 << 16) + 1
# The long sample's last dimension (odd, past the register paths of row kernels) and its most
# elements: a sum over a row accumulated in a 2-byte type drifts far past the floor by then.
LONG_LENGTH = (1 << 14) + 7
LONG_NUMEL = 1 << 17
# The largest magnitude of the range sample, per dtype: past 1e4, under what the dtype holds.
_RANGE_TOP = {
    torch.float16: 2e4,
    torch.bfloat16: 1e5,
    torch.float32: 1e6,
    torch.float64: 1e6,
}
_RANGE_BOTTOM = 1e-3


def _tensors(s: Sample) -> list[torch.Tensor]:
    return [a for a in s.args if isinstance(a, torch.Tensor)]


# The base: the sample with the most elements up to this many per tensor, every tensor non-empty.
BASE_NUMEL = 1 << 14


def base_sample(found: list[Sample]) -> Sample | None:
    """The sample to derive from: every tensor non-empty and the first one of at least one
    dimension, the largest up to ``BASE_NUMEL`` elements a tensor (else the smallest)."""
    usable = [
        s
        for s in found
        if _tensors(s) and all(t.numel() for t in _tensors(s)) and _tensors(s)[0].dim()
    ]
    if not usable:
        return None

    def size(s: Sample) -> int:
        return max(t.numel() for t in _tensors(s))

    fitting = [s for s in usable if size(s) <= BASE_NUMEL]
    return max(fitting, key=size) if fitting else min(usable, key=size)


def relaid(t: torch.Tensor, how: str) -> torch.Tensor:
    """``t``'s values in another layout: ``transposed`` (dimensions stored in reverse order; a
    1-d tensor every other element) or ``padded`` (a buffer wider in every dimension), both an
    odd number of elements past the start of their buffer (off every vector alignment). A 0-d
    or empty tensor is returned as it is."""
    if t.dim() == 0 or t.numel() == 0:
        return t
    if how == "transposed" and t.dim() >= 2:
        order = list(range(t.dim()))[::-1]
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
        stored = buf.view([t.shape[d] for d in order])
        stored.copy_(t.permute(order))
        return stored.permute(order)  # the inverse of a reversal is itself
    if how == "transposed":
        buf = torch.empty(2 * t.numel() + 1, dtype=t.dtype, device=t.device)
        view = buf[1::2]
        view.copy_(t)
        return view
    wide = [n + 2 for n in t.shape]
    inner = sum(math.prod(wide[d + 1 :]) for d in range(len(wide)))  # the view's offset in buf
    start = 1 + inner % 2  # so that the view starts an odd number of elements in
    buf = torch.empty(math.prod(wide) + start, dtype=t.dtype, device=t.device)[start:]
    view = buf.view(wide)[tuple(slice(1, n + 1) for n in t.shape)]
    view.copy_(t)
    return view


def _layouts(base: Sample) -> list[Sample]:
    out = []
    for how in ("transposed", "padded"):
        args = tuple(relaid(a, how) if isinstance(a, torch.Tensor) else a for a in base.args)
        if any(a is not b for a, b in zip(args, base.args, strict=True)):
            out.append(Sample(args, f"{LAYOUT}:{how}"))
    return out


def tail_lengths(n: int) -> list[int]:
    """0, 1, and lengths next to ``n`` (at most ``n``) covering every residue modulo 32 (all the
    lengths from 2 up where ``n`` is shorter)."""
    near = range(max(2, n - TAIL_MODULUS + 1), n + 1) if n > TAIL_MODULUS else range(2, n + 1)
    return [0, 1, *near]


def _narrowed(base: Sample, length: int, last: int) -> Sample:
    def cut(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.dim() and a.shape[-1] == last:
            return a.narrow(-1, 0, length).contiguous()  # sizes only: layouts come apart
        return a

    return Sample(tuple(cut(a) for a in base.args), f"{TAIL}:{length}")


def _tails(base: Sample) -> list[Sample]:
    first = _tensors(base)[0]
    if first.dim() == 0:
        return []
    last = first.shape[-1]
    return [_narrowed(base, n, last) for n in tail_lengths(last) if n != last]


def _scalar(base: Sample) -> list[Sample]:
    shape = _tensors(base)[0].shape
    if len(shape) == 0:
        return []
    args = tuple(
        a.reshape(-1)[0].clone() if isinstance(a, torch.Tensor) and a.shape == shape else a
        for a in base.args
    )
    return [Sample(args, SCALAR)]


def _fresh_like(t: torch.Tensor, shape: list[int], gen: torch.Generator) -> torch.Tensor:
    """New values of ``shape`` like ``t``'s: normal for a floating tensor, else ``t`` repeated
    along its first dimension (integer arguments such as indices stay valid)."""
    if t.is_floating_point():
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        return x.to(device=t.device, dtype=t.dtype)
    reps = [-(-shape[0] // t.shape[0]), *([1] * (t.dim() - 1))]
    return t.repeat(reps)[: shape[0]].clone()


def _grown(base: Sample, gen: torch.Generator, written: tuple[int, ...]) -> list[Sample]:
    first = _tensors(base)[0]
    if first.dim() == 0 or first.numel() == 0 or first.numel() >= GROWN_NUMEL:
        return []
    rows = first.shape[0]
    factor = -(-GROWN_NUMEL // first.numel())

    def grow(i: int, a: Any) -> Any:
        if not (isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == rows):
            return a
        grown = _fresh_like(a, [rows * factor, *a.shape[1:]], gen)
        if i in written and grown.is_floating_point():
            grown.fill_(float("nan"))  # an out= buffer: what the op leaves unwritten stays NaN
        return grown

    return [Sample(tuple(grow(i, a) for i, a in enumerate(base.args)), GROWN)]


def _long(base: Sample, gen: torch.Generator, written: tuple[int, ...]) -> list[Sample]:
    """Fresh values with the last dimension ``LONG_LENGTH`` long (on every tensor whose last
    dimension is the first one's), and at most ``LONG_NUMEL`` elements: fewer rows."""
    first = _tensors(base)[0]
    if first.dim() == 0 or first.shape[-1] >= LONG_LENGTH:
        return []
    last, rows = first.shape[-1], first.shape[0]
    keep = max(1, LONG_NUMEL // LONG_LENGTH) if first.dim() >= 2 else rows

    def grow(i: int, a: Any) -> Any:
        if not (isinstance(a, torch.Tensor) and a.dim() and a.shape[-1] == last):
            return a
        shape = [*a.shape[:-1], LONG_LENGTH]
        if a.dim() >= 2 and a.shape[0] == rows:
            shape[0] = min(rows, keep)
        if a.is_floating_point():
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(a.device, a.dtype)
            return t.fill_(float("nan")) if i in written else t
        reps = -(-LONG_LENGTH // last)
        return (
            a[tuple(slice(0, n) for n in shape[:-1])]
            .repeat_interleave(reps, -1)[..., :LONG_LENGTH]
            .contiguous()
        )

    return [Sample(tuple(grow(i, a) for i, a in enumerate(base.args)), LONG)]


def ranged(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``t`` with each element scaled by a power of ten from 1e-3 to the dtype's range top."""
    top = _RANGE_TOP.get(t.dtype, 1e4)
    u = torch.rand(t.shape, generator=gen, dtype=torch.float64)
    mag = torch.pow(10.0, math.log10(_RANGE_BOTTOM) + u * math.log10(top / _RANGE_BOTTOM))
    x = t.detach().to("cpu", torch.float64)
    scaled = torch.where(torch.isfinite(x) & (x != 0), x.sign() * mag, x)  # NaN stays NaN
    return scaled.to(t.dtype).to(t.device)


def _range(base: Sample, gen: torch.Generator) -> list[Sample]:
    args = tuple(
        ranged(a, gen) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in base.args
    )
    return [Sample(args, RANGE)]


def _on_cpu(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu()
    if isinstance(a, (list, tuple)):
        return type(a)(_on_cpu(x) for x in a)
    return a


def accepted(spec: OpSpec, sig: Signature, s: Sample) -> bool:
    """Whether the spec's fake and reference both take the sample (the op need not otherwise).
    Asked of CPU copies of the arguments: a reference that refuses a sample on a GPU may do so by
    a device-side assert (index_add's index past a narrowed size), which ends the process's CUDA
    context, where on the CPU it raises."""
    args = _on_cpu(s.args)
    try:
        for fn in (spec.fake, spec.reference):
            sig.call(fn, sig.fresh(args))
    except Exception:
        return False
    return True


def derived(
    spec: OpSpec,
    sig: Signature,
    base: Sample | None,
    gen: torch.Generator,
    first_trial: bool,
) -> list[Sample]:
    """The derived samples of one trial (see the module's docstring), those the spec accepts."""
    if base is None or not _tensors(base):
        return []
    makers: list[Callable[[], list[Sample]]] = [lambda: _layouts(base)]
    if any(t.is_floating_point() for t in _tensors(base)):
        makers.append(lambda: _range(base, gen))
    if first_trial:
        makers += [
            lambda: _tails(base),
            lambda: _scalar(base),
            lambda: _grown(base, gen, sig.written),
            lambda: _long(base, gen, sig.written),
        ]
    return [s for make in makers for s in make() if accepted(spec, sig, s)]
