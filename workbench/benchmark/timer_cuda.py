"""Timing on a CUDA GPU: warm-up, L2 flush, CUDA events, graph replay, a wall-clock check.

The traps this protocol avoids, each seen on a Hopper GPU:
- per-call events around a sub-microsecond kernel measure the launch rate, not the kernel:
  kernels under ``GRAPH_BELOW_S`` are timed by replaying a CUDA graph of many calls;
- repeated calls over one buffer that fits in L2 measure L2, not memory: every event sample is
  preceded by a write of a buffer twice the device's L2 size, and a graph rotates over enough
  copies of the inputs to span twice the L2 size (capped at ``MAX_COPIES``, said in the method);
- events time only their own stream: a batch of calls is also timed by synchronized wall
  clock, and a wall time well above the event time is reported as work that escaped the stream.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from workbench.benchmark.stats import Measurement, summarize

WARMUP_S = 0.2  # wall time of warm-up calls before any sample
MEASURE_S = 0.1  # device time of the samples, at least
MIN_SAMPLES = 30
MAX_SAMPLES = 10_000
GRAPH_BELOW_S = 20e-6  # per-call time under which a graph replay replaces per-call events
GRAPH_REPLAY_S = 1e-3  # work per graph replay, roughly
MAX_GRAPH_CALLS = 8192
MAX_COPIES = 4096
CHECK_BATCH_S = 0.02  # length of the wall-clock cross-check batch
# The cross-check warns when wall > WALL_RATIO * events + WALL_SLACK_S (per batch): the slack
# covers the launch and synchronize latency around the batch.
WALL_RATIO = 1.25
WALL_SLACK_S = 300e-6

Fn = Callable[..., Any]
_flushers: dict[int, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer of twice the device's L2 size, which :func:`_flush` writes and reads."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _flushers:
        l2 = torch.cuda.get_device_properties(index).L2_cache_size
        _flushers[index] = torch.empty(2 * l2, dtype=torch.int8, device=f"cuda:{index}")
    return _flushers[index]


def _flush(buffer: torch.Tensor) -> None:
    """Evict L2 and leave it clean: write the buffer (the lines L2 held go), then read it (its
    own dirty lines are written back now, not during the timed call). After a write alone, a
    call that reads pays for writing those lines back: on an H100, x.sum() at 64 MB reached 57%
    of the copy bandwidth after a write and 71% after a write and a read."""
    buffer.zero_()
    buffer.view(torch.int32).max()


def flush_l2(device: torch.device) -> None:
    """Evict ``device``'s L2 and leave it clean, before a call timed by the caller's own events."""
    _flush(_flush_buffer(device))


def flush_bytes(device: torch.device) -> int:
    return _flush_buffer(device).numel()


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def _timed_calls(
    fn: Fn, args: tuple[Any, ...], n: int, flush: torch.Tensor | None
) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
    pairs = []
    for _ in range(n):
        if flush is not None:
            _flush(flush)
        start, end = _event(), _event()
        start.record()
        fn(*args)
        end.record()
        pairs.append((start, end))
    return pairs


def _seconds(pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]], per: int = 1) -> list[float]:
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 / per for s, e in pairs]


def _capture(fn: Fn, sets: list[tuple[Any, ...]], calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` calls of ``fn``, rotating over the argument sets."""
    graph = torch.cuda.CUDAGraph()
    try:
        # A capture stream of the current device: torch.cuda.graph's default is one stream for
        # the process, made on whichever device was current at the first capture.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):  # type: ignore[no-untyped-call]
            for i in range(calls):
                fn(*sets[i % len(sets)])
    except RuntimeError:
        _end_generator_capture()
        raise
    return graph


def _end_generator_capture() -> None:
    """Take the CUDA generators out of capture mode after a capture that failed.

    torch puts each device's default generator in capture mode when a capture begins and takes
    it out only once the capture has ended cleanly; when the capture fails (the callable
    synchronized, say), the generator stays in it, and every later random op on the device
    raises "Offset increment outside graph capture". A copy of a generator's state (same seed,
    same offset) is not in capture mode, so each generator gets one.
    """
    for gen in torch.cuda.default_generators:
        if hasattr(gen, "clone_state") and hasattr(gen, "graphsafe_set_state"):
            gen.graphsafe_set_state(gen.clone_state())


def _replays(graph: torch.cuda.CUDAGraph, n: int, calls: int) -> list[float]:
    """Seconds per call of each of ``n`` event-timed replays of a graph of ``calls`` calls."""
    pairs = []
    for _ in range(n):
        start, end = _event(), _event()
        start.record()
        graph.replay()
        end.record()
        pairs.append((start, end))
    return _seconds(pairs, per=calls)


def probe(fn: Fn, args: tuple[Any, ...], device: torch.device, calls: int = 20) -> float:
    """A quick per-call estimate of the GPU time, to choose the method.

    Timed by one replay of a CUDA graph of ``calls`` calls: the host takes no part in a replay,
    so a host that is slow to launch (a busy CPU, e.g. torch.compile's worker processes
    starting) cannot make a short kernel look long, as it can with per-call events, where the
    GPU waits between the two events. The inputs are not rotated, so the estimate can be low for
    a kernel whose data fits in L2; such a kernel is then timed by graph replay over copies,
    which is right at any length. A callable that cannot be captured (one that synchronizes or
    uses another stream) is probed by flushed per-call events, taking the fastest: a slow host
    only ever adds time.
    """
    with torch.cuda.device(device):  # the capture stream and the events: the operands' GPU
        fn(*args)
        torch.cuda.synchronize()
        try:
            graph = _capture(fn, [args], calls)
            graph.replay()
            return _replays(graph, 1, calls)[0]
        except RuntimeError:
            torch.cuda.synchronize()
            return min(_seconds(_timed_calls(fn, args, calls, _flush_buffer(device))))


def method_for(estimate: float) -> str:
    return "graph" if estimate < GRAPH_BELOW_S else "events"


def warm_up(fn: Fn, args: tuple[Any, ...], device: torch.device) -> tuple[float, float]:
    """Run flushed calls for at least WARMUP_S of wall time, in growing synchronized chunks.

    Returns (median event time per call, wall time per call including the flush).
    """
    flush = _flush_buffer(device)
    samples: list[float] = []
    calls, chunk, start = 0, 1, time.perf_counter()
    while time.perf_counter() - start < WARMUP_S:
        samples += _seconds(_timed_calls(fn, args, chunk, flush))
        calls += chunk
        chunk = min(2 * chunk, 1024)
    wall = (time.perf_counter() - start) / calls
    return summarize(samples).median, wall


def _events_samples(
    fn: Fn, args: tuple[Any, ...], device: torch.device, estimate: float
) -> tuple[list[float], str]:
    n = min(max(MIN_SAMPLES, math.ceil(MEASURE_S / max(estimate, 1e-9))), MAX_SAMPLES)
    flush = _flush_buffer(device)
    samples = _seconds(_timed_calls(fn, args, n, flush))
    return samples, f"events, L2 flushed ({flush.numel() >> 20} MiB), {n} calls"


def _copies(args: tuple[Any, ...], device: torch.device) -> list[tuple[Any, ...]]:
    """The inputs themselves, then clones, until they span twice the L2 size (or MAX_COPIES).

    A clone of an input that requires grad (a training step's) is a leaf of its own: a plain
    clone would tie each copy's graph to the original's gradient accumulator, made on another
    stream than the capture's (torch warns of the mismatch and may synchronize)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    per_set = sum(t.numel() * t.element_size() for t in tensors)
    count = min(max(1, math.ceil(flush_bytes(device) / max(per_set, 1))), MAX_COPIES)
    sets = [args]
    for _ in range(count - 1):
        sets.append(tuple(_leaf_copy(a) if isinstance(a, torch.Tensor) else a for a in args))
    return sets


def _leaf_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


def _graph_samples(
    fn: Fn, args: tuple[Any, ...], device: torch.device, estimate: float
) -> tuple[list[float], str]:
    sets = _copies(args, device)
    calls = max(len(sets), math.ceil(GRAPH_REPLAY_S / max(estimate, 1e-9)))
    calls = min(math.ceil(calls / len(sets)) * len(sets), max(MAX_GRAPH_CALLS, len(sets)))
    for s in sets:  # each copy runs once outside capture (lazy initialisation, allocator)
        fn(*s)
    torch.cuda.synchronize()
    graph = _capture(fn, sets, calls)
    for _ in range(3):
        graph.replay()
    replay = calls * max(estimate, 1e-9)
    n = min(max(MIN_SAMPLES, math.ceil(MEASURE_S / replay)), MAX_SAMPLES)
    samples = _replays(graph, n, calls)
    span = len(sets) * sum(
        a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)
    )
    l2 = flush_bytes(device) / 2
    method = (
        f"CUDA graph, {calls} calls per replay over {len(sets)} input copies "
        f"({span / l2:.1f}x L2), {n} replays"
    )
    return samples, method


def wall_check(
    fn: Fn, args: tuple[Any, ...], per_call_guess: float
) -> tuple[float, float, str | None]:
    """(event s/call, wall s/call, warning) over a synchronized batch of unflushed calls."""
    n = min(max(1, math.ceil(CHECK_BATCH_S / max(per_call_guess, 1e-9))), MAX_SAMPLES)
    torch.cuda.synchronize()
    start, end = _event(), _event()
    t0 = time.perf_counter()
    start.record()
    for _ in range(n):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = start.elapsed_time(end) / 1e3
    warning = None
    if wall > WALL_RATIO * events + WALL_SLACK_S:
        ratio = wall / max(events, 1e-9)
        warning = (
            f"synchronized wall time ({wall / n * 1e6:.1f} us/call) is {ratio:.1f}x "
            f"the event time ({events / n * 1e6:.2f} us/call): work escaped the timed stream "
            "(a side stream?), so the event figure undercounts"
        )
    return events / n, wall / n, warning


def time_cuda(fn: Fn, args: tuple[Any, ...], device: torch.device, method: str) -> Measurement:
    """Warm up, sample by ``method`` ('events' or 'graph'), then cross-check against the wall.

    The events, the graph and every synchronize are ``device``'s: it is made the current device
    for the timing (on cuda:1 under a current cuda:0, events on cuda:0's stream would time none
    of the op's work)."""
    if method not in ("events", "graph"):
        raise ValueError(f"method must be 'events' or 'graph', got {method!r}")
    with torch.cuda.device(device):
        return _time_on_device(fn, args, device, method)


def _time_on_device(
    fn: Fn, args: tuple[Any, ...], device: torch.device, method: str
) -> Measurement:
    estimate, wall_guess = warm_up(fn, args, device)
    notes: list[str] = []
    if method == "graph":
        try:
            samples, how = _graph_samples(fn, args, device, estimate)
        except RuntimeError as e:  # e.g. a callable that synchronizes or uses another stream
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            notes.append(f"graph capture failed ({first}); timed by per-call events instead")
            samples, how = _events_samples(fn, args, device, estimate)
    else:
        samples, how = _events_samples(fn, args, device, estimate)
    _, wall, warning = wall_check(fn, args, max(estimate, wall_guess))
    if warning:
        notes.append(warning)
    return Measurement(summarize(samples), how, notes, wall)
