"""The oracle is never unfair: plain PyTorch ops used as kernels pass on every dtype.

Each op is wrapped with torch.library.custom_op (so it runs through the dispatcher like a
workbench op, with a fake function for opcheck and torch.compile) and checked with a spec whose
reference is the same math written plainly. Matrix products and long reductions are where fixed
fp32 tolerances fail PyTorch itself against a float64 truth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import workbench
from workbench.spec import FLOATING, OpSpec, Sample, randn

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _like(x: torch.Tensor, *_: Any) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _mm_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


def _rows_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[:-1])


@torch.library.custom_op("wbfair::add", mutates_args=())
def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.add(a, b)


@torch.library.custom_op("wbfair::mm", mutates_args=())
def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b)


@torch.library.custom_op("wbfair::softmax", mutates_args=())
def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


@torch.library.custom_op("wbfair::row_sum", mutates_args=())
def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1)


@torch.library.custom_op("wbfair::cumsum", mutates_args=())
def cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, -1)


def _add_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.add keeps a permuted input's layout (the check's layout:transposed sample), so its
    fake must say so: the check holds an output's strides to the fake's."""
    return torch.empty_like(a)


add.register_fake(_add_fake)
mm.register_fake(_mm_fake)
softmax.register_fake(_like)
row_sum.register_fake(_rows_fake)
cumsum.register_fake(_like)


def _unary(shapes: list[tuple[str, tuple[int, ...], bool]]) -> Callable[..., list[Sample]]:
    def samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
        return [
            Sample((randn(shape, dtype, device, gen, strided=strided),), label)
            for label, shape, strided in shapes
        ]

    return samples


_ROWS = [("empty", (0, 8), False), ("one", (1, 1), False), ("odd", (5, 1001), False),
         ("strided", (6, 96), True), ("long", (4, 16384), False)]  # fmt: skip


def _add_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    return [
        Sample((randn(shape, dtype, device, gen, strided=st), randn(shape, dtype, device, gen)), lb)
        for lb, shape, st in [("empty", (0,), False), ("one", (1,), False),
                              ("odd", (7, 131), False), ("strided", (33, 65), True)]
    ]  # fmt: skip


def _mm_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    out = []
    for label, (m, k, n) in [("one", (1, 1, 1)), ("odd", (17, 33, 9)), ("deep", (8, 4096, 8))]:
        out.append(
            Sample((randn((m, k), dtype, device, gen), randn((k, n), dtype, device, gen)), label)
        )
    a = randn((16, 64), dtype, device, gen, strided=True)
    out.append(Sample((a, randn((64, 16), dtype, device, gen)), "strided"))
    return out


FAIR: dict[str, tuple[Any, OpSpec]] = {
    "add": (add, OpSpec("add", lambda a, b: a + b, _add_samples, _add_fake)),
    "mm": (mm, OpSpec("mm", lambda a, b: a @ b, _mm_samples, _mm_fake)),
    "softmax": (softmax, OpSpec("softmax", lambda x: x.softmax(-1), _unary(_ROWS), _like)),
    "row_sum": (row_sum, OpSpec("row_sum", lambda x: x.sum(-1), _unary(_ROWS), _rows_fake)),
    "cumsum": (cumsum, OpSpec("cumsum", lambda x: x.cumsum(-1), _unary(_ROWS), _like)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(FAIR))
def test_a_pytorch_op_as_kernel_passes_on_every_dtype(name: str, device: str) -> None:
    op, spec = FAIR[name]
    report = workbench.check(op, spec, device=device, trials=2)
    assert report.passed, str(report)
    assert {r.dtype for r in report.rows} >= {str(d).removeprefix("torch.") for d in FLOATING}
