"""Checks every op test runs, driven by the op's spec: nothing about an op is written twice."""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import Sample
from workbench.verify import check_op

# gradcheck perturbs every input element: keep it to samples of modest size.
_GRADCHECK_MAX_NUMEL = 4096


def assert_matches_reference(lib: Any, name: str, device: str) -> None:
    """Every sample, every dtype of the spec, against the float64 reference."""
    rows = check_op(getattr(lib, name), lib.specs[name], device)
    assert rows, f"{name} has no samples"
    failed = [
        f"{r.dtype} {r.label}: {r.detail} (err/tol {r.ratio:.3g})" for r in rows if not r.passed
    ]
    assert not failed, "\n".join(failed)
    labels = {r.label for r in rows}
    assert {"empty", "one", "strided"} <= labels, f"{name} lacks awkward samples: {labels}"


def _samples(lib: Any, name: str, dtype: torch.dtype, device: str) -> list[Sample]:
    gen = torch.Generator().manual_seed(1)
    return lib.specs[name].samples(dtype, torch.device(device), gen)


def _small(sample: Sample) -> bool:
    tensors = [a for a in sample.args if isinstance(a, torch.Tensor)]
    return all(0 < t.numel() <= _GRADCHECK_MAX_NUMEL for t in tensors)


def assert_opcheck(lib: Any, name: str, device: str) -> None:
    """torch.library.opcheck with its default tests on every small sample (float32, float64)."""
    op = getattr(lib, name).default
    for dtype in (torch.float32, torch.float64):
        for sample in filter(_small, _samples(lib, name, dtype, device)):
            torch.library.opcheck(op, sample.args)


def assert_gradcheck(lib: Any, name: str, device: str) -> None:
    """float64 gradcheck of the registered backward on every small sample."""
    op = getattr(lib, name)
    checked = 0
    for sample in filter(_small, _samples(lib, name, torch.float64, device)):
        args = tuple(
            a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) else a
            for a in sample.args
        )
        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        assert torch.autograd.gradcheck(lambda *xs, args=args: op(*_fill(args, xs)), tensors)
        checked += 1
    assert checked > 0


def _fill(args: tuple[Any, ...], tensors: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    it = iter(tensors)
    return tuple(next(it) if isinstance(a, torch.Tensor) else a for a in args)
