"""The GPU timing protocol: graph replay for short kernels, flushed events for long ones, the
wall-clock cross-check that catches work on a side stream."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import workbench
from workbench.benchmark.timer_cuda import flush_bytes, method_for, probe, time_cuda

pytestmark = pytest.mark.cuda
FAST = {"device": "cuda", "compile": False, "save": False}


def test_flush_buffer_is_twice_the_l2() -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert flush_bytes(torch.device("cuda")) == 2 * l2


def test_short_kernel_is_timed_by_graph_replay_over_copies_past_l2(lib: Any) -> None:
    s = workbench.bench("muladd", lib=lib, sizes=["4Ki"], **FAST).ops[0].sizes[0]
    for name, m in s.times.items():
        assert m.method.startswith("CUDA graph"), (name, m.method)
        span = re.search(r"input copies \(([0-9.]+)x L2\)", m.method)
        assert span is not None and float(span.group(1)) >= 2.0, m.method
        assert m.stats.n >= 30 and not m.warnings


def test_long_kernel_is_timed_by_flushed_events_with_roofline(lib: Any) -> None:
    r = workbench.bench("muladd", lib=lib, sizes=["64Mi"], **FAST).ops[0]
    s = r.sizes[0]
    assert s.times["kernel"].method.startswith("events, L2 flushed")
    assert s.times["kernel"].stats.n >= 30
    roof = s.roofline(r.calibration)
    assert roof is not None and 0.05 < roof < 1.2


def test_work_on_a_side_stream_is_reported() -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def escaped(x: torch.Tensor) -> torch.Tensor:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return x @ x

    m = time_cuda(escaped, (a,), torch.device("cuda"), "events")
    assert any("escaped the timed stream" in w for w in m.warnings), m.warnings
    honest = time_cuda(torch.matmul, (a, a), torch.device("cuda"), "events")
    assert not honest.warnings


def _double(t: torch.Tensor) -> torch.Tensor:
    return t * 2  # a ~2 us kernel on 64 Ki floats


def test_a_host_that_is_slow_to_launch_does_not_pick_the_method() -> None:
    """Three probe calls in four wait 0.3 ms on the host before the kernel: the method is the
    one the same kernel gets from a prompt host."""
    import time

    x = torch.randn(1 << 16, device="cuda")
    calls = iter(range(1000))

    def slow_host(t: torch.Tensor) -> torch.Tensor:
        if next(calls) % 4:
            time.sleep(300e-6)
        return _double(t)

    prompt = method_for(probe(_double, (x,), x.device))
    assert method_for(probe(slow_host, (x,), x.device)) == prompt == "graph"


def test_a_host_slow_on_every_call_does_not_pick_the_method() -> None:
    """Every call waits 0.3 ms on the host: per-call events would read the host, not the
    kernel, and pick events for it."""
    import time

    x = torch.randn(1 << 16, device="cuda")

    def slow_host(t: torch.Tensor) -> torch.Tensor:
        time.sleep(300e-6)
        return _double(t)

    prompt = method_for(probe(_double, (x,), x.device))
    assert method_for(probe(slow_host, (x,), x.device)) == prompt == "graph"


def test_a_callable_that_cannot_be_captured_is_probed_by_events() -> None:
    x = torch.randn(1 << 16, device="cuda")

    def syncs(t: torch.Tensor) -> torch.Tensor:
        y = t * 2
        torch.cuda.synchronize()  # not allowed while a graph is captured
        return y

    state = torch.cuda.get_rng_state()
    assert probe(syncs, (x,), x.device) > 0
    assert (syncs(x) == x * 2).all()  # the stream works after the failed capture
    # and so does the device's random generator, from where it was (torch leaves it in capture
    # mode after a failed capture: randn raised until the harness took it out)
    assert torch.equal(torch.cuda.get_rng_state(), state)
    first = torch.randn(8, device="cuda")
    torch.cuda.set_rng_state(state)
    assert torch.equal(torch.randn(8, device="cuda"), first)
