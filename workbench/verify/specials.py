"""The special-values sample: NaN, +Inf, -Inf, -0.0, subnormals and the largest finite values.

A spec's own samples are finite normal numbers, so a kernel that maps NaN to 0 (an fmax-style
bug) or clamps +Inf to a large finite value would pass them all. For every floating dtype the
check adds one sample, derived from one of the spec's own non-empty samples: the same arguments,
with each floating tensor copied and special values written at scattered positions. Non-tensor
arguments and tensors of other dtypes are kept as they are, so this works for any op without
knowing it; the reference decides what each output element must be (see :mod:`oracle` for how
NaN, Inf and -0.0 are compared). A spec opts out with ``specials=False, why="..."``.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import OpSpec, Sample

LABEL = "specials"
# The base sample: the non-empty sample with the most elements up to this many per tensor
# (enough room to scatter every value several times), else the smallest non-empty one.
BASE_NUMEL = 1 << 14
# One special value per this many elements of a tensor (and each value at least once).
DENSITY = 32


def values(dtype: torch.dtype, exclude: tuple[str, ...] = ()) -> torch.Tensor:
    """The special values of ``dtype``: NaN, +-Inf, -0.0, two subnormals, +-largest finite,
    less the kinds in ``exclude`` (names from KINDS)."""
    info = torch.finfo(dtype)
    smallest_subnormal = info.tiny * info.eps  # 2**-149 in float32
    kinds = {
        "nan": [float("nan")],
        "inf": [float("inf"), float("-inf")],
        "-0": [-0.0],
        "subnormal": [info.tiny / 2, -smallest_subnormal],
        "max": [info.max, info.min],
    }
    chosen = [v for kind, vs in kinds.items() if kind not in exclude for v in vs]
    return torch.tensor(chosen, dtype=torch.float64).to(dtype)


def _floating(s: Sample) -> list[torch.Tensor]:
    return [a for a in s.args if isinstance(a, torch.Tensor) and a.is_floating_point()]


def base_sample(found: list[Sample]) -> Sample | None:
    """The sample to derive from: every floating tensor non-empty, the largest that fits."""
    usable = [s for s in found if _floating(s) and all(t.numel() for t in _floating(s))]
    if not usable:
        return None

    def size(s: Sample) -> int:
        return max(t.numel() for t in _floating(s))

    fitting = [s for s in usable if size(s) <= BASE_NUMEL]
    return max(fitting, key=size) if fitting else min(usable, key=size)


def sprinkle(t: torch.Tensor, gen: torch.Generator, exclude: tuple[str, ...] = ()) -> torch.Tensor:
    """A contiguous copy of ``t`` with special values at scattered positions.

    Each of the values appears at least once where the tensor has room, at positions drawn from
    ``gen`` over the whole tensor (not only its first elements).
    """
    out = t.detach().contiguous().clone()
    flat = out.view(-1)
    specials = values(t.dtype, exclude)
    count = min(flat.numel(), max(len(specials), flat.numel() // DENSITY))
    where = torch.randperm(flat.numel(), generator=gen)[:count]
    order = torch.randperm(len(specials), generator=gen)
    picked = specials[order.repeat(count // len(specials) + 1)[:count]]
    flat[where.to(flat.device)] = picked.to(flat.device)
    return out


def special_sample(
    spec: OpSpec, dtype: torch.dtype, found: list[Sample], gen: torch.Generator
) -> Sample | None:
    """The special-values sample for ``dtype``, or None (opted out, no floating dtype or input)."""
    if not spec.specials or not dtype.is_floating_point:
        return None
    base = base_sample(found)
    if base is None:
        return None
    args: list[Any] = [
        sprinkle(a, gen, tuple(spec.specials_exclude))
        if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a
        for a in base.args
    ]
    return Sample(tuple(args), LABEL)
