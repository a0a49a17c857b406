"""Timing and checking on a GPU that is not the current one (cuda:1 while cuda:0 is current).

The events, CUDA graphs and side streams the timer and the checker make must be the operands'
device's: made on the current device they time none of the op's work, and the stream and graph
checks pass whatever the kernel does. Needs a host with two GPUs.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch

from workbench.benchmark.timer_cuda import probe, time_cuda
from workbench.verify import contract

pytestmark = pytest.mark.cuda


@pytest.fixture
def second() -> torch.device:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this host has {torch.cuda.device_count()}")
    torch.cuda.set_device(0)
    return torch.device("cuda:1")


def _busy(x: torch.Tensor) -> torch.Tensor:
    for _ in range(20):  # about a millisecond of work on an H100 at 32 Mi elements
        x.mul_(1.0000001)
    return x


@pytest.mark.parametrize("method", ["events", "graph"])
def test_the_timer_times_the_work_on_the_second_gpu(second: torch.device, method: str) -> None:
    x = torch.ones(1 << 25, device=second)
    _busy(x)
    torch.cuda.synchronize(second)
    start, n = time.perf_counter(), 20
    for _ in range(n):
        _busy(x)
    torch.cuda.synchronize(second)
    wall = (time.perf_counter() - start) / n
    m = time_cuda(_busy, (x,), second, method)
    assert torch.cuda.current_device() == 0  # the timer leaves the current device as it was
    # Events of cuda:0 would time a few microseconds of nothing; the work takes ~1 ms.
    assert m.stats.median > 0.5 * wall, (m.stats.median, wall, m.method)


def test_the_probe_times_the_work_on_the_second_gpu(second: torch.device) -> None:
    # The probe picks the timing method; a graph captured on the current device's stream holds
    # none of cuda:1's work (torch warns "The CUDA Graph is empty") and would estimate ~0 s.
    x = torch.ones(1 << 25, device=second)
    m = time_cuda(_busy, (x,), second, "events")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        estimate = probe(_busy, (x,), second, calls=4)
    assert torch.cuda.current_device() == 0
    assert estimate > 0.5 * m.stats.median, (estimate, m.stats.median)


def test_a_graph_replay_on_the_second_gpu_replays_the_op(second: torch.device) -> None:
    calls = []

    def op(x: torch.Tensor) -> torch.Tensor:
        calls.append(torch.cuda.current_device())
        return x * 2

    x = torch.arange(8.0, device=second)
    out = contract.run_graph(op, (x,))
    assert calls and set(calls) == {1}, calls  # warm-up and capture ran with cuda:1 current
    assert torch.equal(out, x * 2)
    side = contract.run_on_side_stream(op, (x,))
    assert torch.equal(side, x * 2) and calls[-1] == 1
