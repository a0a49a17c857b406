"""Forward and backward timed together (``wb bench OP --backward``).

A kernel engineer who writes a backward kernel wants the training step timed, not the forward
alone: for layer_norm, what counts is ``F.layer_norm`` forward plus its backward against the
op's forward plus its backward. Each candidate (the op through its autograd kernel, the spec's
Python formula or the binding's C++ one; the spec's reference in eager PyTorch; ``torch.compile``
of the reference) becomes one step: the forward on inputs that require grad, then
``torch.autograd.grad`` of its first output with a fixed upstream gradient (random, drawn once
per size). The step returns the input gradients, which are checked against the reference's in
float64 before anything is timed.

A step is timed as a user's eager training loop runs it: back to back, by wall clock over blocks
of steps (the GPU synchronized at each block's ends). The host's work (Python autograd, dispatch)
overlaps the GPU's as it does in a real loop, and counts where it is the longer of the two. On
CUDA the bench also times each step by CUDA graph replay (``<op>+backward (graph)``): the GPU's
time alone, which is what the op costs inside a model whose host runs ahead of the GPU, and which
a single op's step hides wherever its host share (``torch.autograd.grad``'s engine, Python) is
the longer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from workbench.benchmark.stats import Measurement, summarize
from workbench.errors import WorkbenchError
from workbench.spec import OpSpec, Sample

Step = Callable[..., Any]


def _first(out: Any) -> torch.Tensor:
    first: torch.Tensor = out[0] if isinstance(out, (tuple, list)) else out
    return first


def _leaves(args: tuple[Any, ...]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def step(fn: Callable[..., Any]) -> Step:
    """``fn`` as a training step: ``step(*args, grad)`` returns the gradients of its inputs."""

    def run(*args_and_grad: Any) -> tuple[torch.Tensor, ...]:
        *args, grad = args_and_grad
        out = _first(fn(*args))
        return torch.autograd.grad(out, _leaves(tuple(args)), grad)

    return run


def samples(spec: OpSpec, found: list[Sample], seed: int) -> list[Sample]:
    """The sweep's samples with floating inputs that require grad and the upstream gradient
    appended (the shape of the reference's first output)."""
    if not spec.differentiable:
        raise WorkbenchError(
            f"{spec.name} has no backward in its spec: --backward times forward and backward "
            "together, so the op needs a backward formula (OpSpec.backward) or a C++ autograd "
            "kernel (WB_AUTOGRAD in its binding, OpSpec.cpp_autograd=True)"
        )
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in found:
        args = tuple(
            a.detach().clone().requires_grad_(True)
            if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a
            for a in s.args
        )
        with torch.no_grad():
            first = _first(spec.reference(*args))
        grad = torch.randn(first.shape, generator=gen, dtype=torch.float32)
        out.append(Sample((*args, grad.to(first.dtype).to(first.device)), s.label))
    return out


def verify(kernel: Step, spec: OpSpec, sample: Sample, dtype: torch.dtype) -> None:
    """Raise unless the kernel's input gradients match the float64 reference's (the check's
    oracle, allowing twice PyTorch's own error in ``dtype``)."""
    from workbench.benchmark.check import VerificationError
    from workbench.verify.oracle import compare_outputs

    where = f"{spec.name} backward [{sample.label}, {str(dtype).removeprefix('torch.')}]"
    try:
        got = kernel(*sample.args)
    except Exception as e:
        raise VerificationError(f"{where} raised before timing: {type(e).__name__}: {e}") from e
    args64 = tuple(
        a.detach().to(torch.float64).requires_grad_(a.requires_grad)
        if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a
        for a in sample.args
    )
    want = step(spec.reference)(*args64)
    theirs = step(spec.reference)(*sample.args)
    names = [f"gradient {i}" for i in range(len(want))]
    verdict = compare_outputs(tuple(got), tuple(want), dtype, spec, tuple(theirs), names)
    if not verdict.passed:
        raise VerificationError(
            f"{where} does not match the reference's gradients ({verdict.reason}, err/tol "
            f"{verdict.ratio:.3g}, {verdict.detail}); not timed"
        )


# A block of back-to-back steps lasts about this long (so that a synchronization at its ends is
# noise), and a timing takes at least this many blocks (so that the median and the quartiles the
# verdicts compare rest on enough of them: one or two long blocks gave A/A spreads of 6-55%).
BLOCK_SECONDS = 0.01
MIN_BLOCKS = 25


def time_steps(
    fn: Step, args: tuple[Any, ...], device: torch.device, min_time: float
) -> Measurement:
    """Median and IQR of one step's wall time over blocks of back-to-back steps: at least
    MIN_BLOCKS blocks of about BLOCK_SECONDS each, and at least ``min_time`` in all."""

    def synchronized() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    start = synchronized()
    warm = 0
    while time.perf_counter() - start < 0.2 or warm < 3:  # caches, allocator, compiled graphs
        fn(*args)
        warm += 1
    per_step = (synchronized() - start) / warm
    number = max(1, math.ceil(BLOCK_SECONDS / per_step))
    blocks = max(MIN_BLOCKS, math.ceil(min_time / (number * per_step)))
    times = []
    for _ in range(blocks):
        begin = synchronized()
        for _ in range(number):
            fn(*args)
        times.append((synchronized() - begin) / number)
    where = "GPU synchronized per block" if device.type == "cuda" else "CPU"
    method = f"wall clock, {blocks} blocks x {number} steps back to back, {where}"
    return Measurement(summarize(times), method)
