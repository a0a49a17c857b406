"""``wb bench --backward``: forward and backward timed together, gradients verified first."""

from __future__ import annotations

import math
import re
import statistics
import time
from typing import Any

import pytest
import torch

import workbench
from workbench.benchmark import training
from workbench.errors import WorkbenchError

FAST = dict(compile=False, min_time=0.01, roofline=False, save=False)


def test_backward_times_the_training_step_of_every_candidate(lib: Any) -> None:
    result = workbench.bench(
        "rms_norm", lib=lib, device="cpu", sizes=["1x4096"], backward=True, **FAST
    )
    (r,) = result.ops
    assert r.op == "rms_norm+backward"
    (s,) = r.sizes
    assert set(s.times) == {"kernel", "kernel (A/A)", "eager"}
    assert all(m.method.startswith("wall clock") for m in s.times.values())
    assert s.bytes == 0 and s.roofline(r.calibration) is None
    assert "rms_norm+backward" in result.table()


def test_a_step_timing_rests_on_many_short_blocks() -> None:
    """Each sample is one block of back-to-back steps divided by its step count.

    The step notes when it starts. A block of ``number`` steps lasts at least from its first
    step's start to its last's, and at most from the start of the step before it (the block
    begins after that one) to the start of the step after it (it ends before that one), so
    each sample lies between those spans over ``number``, and the median between their
    medians: an order of readings of one clock, true however slow or loaded the machine is.
    """
    starts: list[float] = []

    def fn() -> None:
        starts.append(time.perf_counter())
        time.sleep(0.001)

    m = training.time_steps(fn, (), torch.device("cpu"), min_time=0.0)
    starts.append(time.perf_counter())  # after the last block
    found = re.match(r"wall clock, (\d+) blocks x (\d+) steps", m.method)
    assert found is not None, m.method
    blocks, number = int(found[1]), int(found[2])
    assert blocks == m.stats.n == training.MIN_BLOCKS  # min_time=0: the fewest blocks
    # a step sleeps at least 1 ms, so a block of about BLOCK_SECONDS holds at most this many
    assert 1 <= number <= math.ceil(training.BLOCK_SECONDS / 0.001)
    first = len(starts) - 1 - blocks * number  # the warm-up's steps come before
    assert first >= 3
    heads = [first + i * number for i in range(blocks)]
    low = [(starts[h + number - 1] - starts[h]) / number for h in heads]
    high = [(starts[h + number] - starts[h - 1]) / number for h in heads]
    assert statistics.median(low) <= m.stats.median <= statistics.median(high)
    assert m.stats.median >= 0.001  # every step of a block slept at least 1 ms


def test_the_step_returns_the_input_gradients_of_the_op(lib: Any) -> None:
    spec = lib.specs["rms_norm"]
    found = spec.bench_sizes(torch.float64, torch.device("cpu"), torch.Generator())[:1]
    (sample,) = training.samples(spec, found, seed=0)
    x, w, eps, grad = sample.args
    got = training.step(lib.rms_norm)(*sample.args)
    want = torch.autograd.grad(spec.reference(x, w, eps), (x, w), grad)
    assert len(got) == 2
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)
    training.verify(training.step(lib.rms_norm), spec, sample, torch.float64)


def test_a_wrong_gradient_is_not_timed(lib: Any) -> None:
    from workbench.benchmark.check import VerificationError

    spec = lib.specs["rms_norm"]
    found = spec.bench_sizes(torch.float32, torch.device("cpu"), torch.Generator())[:1]
    (sample,) = training.samples(spec, found, seed=0)

    def doubled(*args: Any) -> tuple[torch.Tensor, ...]:
        return tuple(2 * g for g in training.step(lib.rms_norm)(*args))

    with pytest.raises(VerificationError, match=r"rms_norm backward .* gradients"):
        training.verify(doubled, spec, sample, torch.float32)


def test_an_op_without_backward_is_refused_with_the_reason(lib: Any) -> None:
    with pytest.raises(WorkbenchError, match=r"add_out has no backward in its spec"):
        workbench.bench("add_out", lib=lib, device="cpu", backward=True, **FAST)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_on_cuda_each_step_is_also_timed_by_graph_replay(lib: Any) -> None:
    fast = dict(FAST, compile=True)
    result = workbench.bench(
        "layer_norm", lib=lib, device="cuda", sizes=["4096x1024"], backward=True, **fast
    )
    wall, graph = result.ops
    assert (wall.op, graph.op) == ("layer_norm+backward", "layer_norm+backward (graph)")
    (w,), (g,) = wall.sizes, graph.sizes
    assert set(g.times) == {"kernel", "kernel (A/A)", "eager", "compiled", "anchor"}
    for name, m in g.times.items():  # every candidate, torch.compile's too, was captured
        assert m.method.startswith("CUDA graph"), (name, m.method, m.warnings)
    assert set(w.times) == set(g.times)  # the same candidates, by wall clock too
    assert all(m.method.startswith("wall clock") for m in w.times.values())
    assert "layer_norm+backward (graph)" in result.table()
