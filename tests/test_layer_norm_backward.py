"""layer_norm_backward on CUDA: one launch whose last blocks sum dweight and dbias from every
block's partial sums (kernels/layer_norm/reduce_last.cuh), with an arrival counter each launch
leaves at zero, or, for fewer rows than SMs, column blocks beside the row blocks that sum them
from grad and x: against torch's kernel and a float64 truth, bit for bit the same run to run,
back to back, on two streams at once, under CUDA graph capture and replay, and once every
counter slot is taken (the launcher's own zeroed counter). Its kernels compile without spills.

Shapes with at least 132 rows (an H100's or H200's SMs) take the counter; fewer, column blocks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

EPS = 1e-5
# rows x hidden: one row; one element; rows not a multiple of a block's rows (8 groups of one
# warp at hidden 64, 4 groups at 1024 float32); fewer rows than SMs; the launch-bound bench size;
# a large one; rows too long for registers (the two-read path, float32 and bfloat16).
SHAPES = [(1, 4096), (1, 1), (1001, 64), (257, 1024), (7, 1000), (32, 4096), (8192, 4096)]
LONG = (3, 20000)
DTYPES = [torch.float32, torch.bfloat16]


def _inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed * 7919 + rows * 31 + hidden)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    return randn(rows, hidden), randn(rows, hidden), randn(hidden), randn(hidden)


def _backward_args(lib: Any, rows: int, hidden: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    """(grad, x, mean, rstd, weight), with the statistics of the op's own forward."""
    x, g, w, b = _inputs(rows, hidden, dtype, seed)
    _, mean, rstd = lib.layer_norm(x, w, b, EPS)
    return g, x, mean, rstd, w


def _torch_backward(
    g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    stats = (x.shape[0], 1)
    out = torch.ops.aten.native_layer_norm_backward(
        g, x, [x.shape[-1]], mean.reshape(stats), rstd.reshape(stats), w, w, [True, True, True]
    )
    return tuple(out)


def _max_error(got: torch.Tensor, truth: torch.Tensor) -> float:
    return (got.double() - truth).abs().max().item()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [*SHAPES, LONG], ids=lambda s: f"{s[0]}x{s[1]}")
def test_matches_torch_within_twice_its_error(
    lib: Any, shape: tuple[int, int], dtype: torch.dtype
) -> None:
    """dx, dweight and dbias within twice the error of torch's own kernel (same inputs and
    statistics) against float64, plus a few ulps of the largest value."""
    args = _backward_args(lib, *shape, dtype)
    ours = lib.layer_norm_backward(*args)
    theirs = _torch_backward(*args)
    truth = _torch_backward(*(a.double() for a in args))
    ulp = torch.finfo(dtype).eps
    for name, o, t, e in zip(("dx", "dweight", "dbias"), ours, theirs, truth, strict=True):
        assert o.dtype == dtype and o.shape == e.shape
        ours_err, their_err = _max_error(o, e), _max_error(t, e)
        floor = 4 * ulp * e.abs().max().item()
        assert ours_err <= 2 * their_err + floor, (name, ours_err, their_err)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_two_calls_are_bitwise_the_same(lib: Any, dtype: torch.dtype) -> None:
    for shape in [(1001, 64), (32, 4096), (8192, 4096), LONG]:
        args = _backward_args(lib, *shape, dtype)
        first, second = lib.layer_norm_backward(*args), lib.layer_norm_backward(*args)
        for a, b in zip(first, second, strict=True):
            assert torch.equal(a, b), shape


@pytest.mark.cuda
def test_back_to_back_calls_each_find_the_counter_at_zero(lib: Any) -> None:
    """Calls of different grids queued with no synchronization between them: each needs the
    counter the last one left at zero (a stale count would pick the wrong reducers, or hang)."""
    shapes = [(32, 4096), (1001, 64), (1, 4096), (8192, 4096), LONG, (257, 1024)]
    calls = [_backward_args(lib, *s, torch.float32) for s in shapes]
    torch.cuda.synchronize()
    expected = [lib.layer_norm_backward(*a) for a in calls]
    got = [lib.layer_norm_backward(*a) for _ in range(3) for a in calls]
    torch.cuda.synchronize()
    for i, out in enumerate(got):
        for a, b in zip(out, expected[i % len(calls)], strict=True):
            assert torch.equal(a, b), shapes[i % len(calls)]


@pytest.mark.cuda
def test_two_streams_at_once_keep_their_own_counters(lib: Any) -> None:
    main = torch.cuda.current_stream()
    work = [
        _backward_args(lib, 257, 1024, torch.float32),
        _backward_args(lib, 1001, 64, torch.float32),
    ]
    expected = [lib.layer_norm_backward(*a) for a in work]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]  # type: ignore[no-untyped-call]
    got: list[list[tuple[torch.Tensor, ...]]] = [[], []]
    for s in streams:
        s.wait_stream(main)
    for _ in range(20):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                got[i].append(lib.layer_norm_backward(*work[i]))
    torch.cuda.synchronize()
    for i in range(2):
        for out in got[i]:
            for a, b in zip(out, expected[i], strict=True):
                assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_graph_replays_match_eager_calls(lib: Any, dtype: torch.dtype) -> None:
    """Two backward calls captured in one graph and replayed over fresh inputs, with eager calls
    in between: every replay equals the eager call on the same inputs, bit for bit."""
    shapes = [(32, 4096), (1001, 64), (257, 1024)]
    static = [_backward_args(lib, *s, dtype) for s in shapes]
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for a in static:
            lib.layer_norm_backward(*a)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [lib.layer_norm_backward(*a) for a in static]
    for seed in range(1, 5):
        fresh = [_backward_args(lib, *s, dtype, seed) for s in shapes]
        for dst, src in zip(static, fresh, strict=True):
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)
        graph.replay()
        replayed = [tuple(t.clone() for t in out) for out in outs]
        eager = [lib.layer_norm_backward(*a) for a in fresh]
        for r, e in zip(replayed, eager, strict=True):
            for a, b in zip(r, e, strict=True):
                assert torch.equal(a, b), seed


# Run in a child process: it takes every counter slot (one per graph capture) for good.
SLOTS_SCRIPT = """
import torch, workbench
lib = workbench.load()
x = torch.randn(1024, 1024, device="cuda")  # rows enough for the arrival counter
g, w, b = torch.randn_like(x), torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
_, mean, rstd = lib.layer_norm(x, w, b, 1e-5)
args = (g, x, mean, rstd, w)
want = lib.layer_norm_backward(*args)
for _ in range(1100):  # more captures than slots (1024)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lib.layer_norm_backward(*args)
graph.replay()
fresh = torch.cuda.Stream(priority=-1)  # a stream the process has not used: no slot is left
fresh.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(fresh):
    eager = [lib.layer_norm_backward(*args) for _ in range(3)]
torch.cuda.synchronize()
for got in [out, *eager]:
    assert all(torch.equal(a, b) for a, b in zip(got, want)), "wrong past the slots"
print("ok")
"""


@pytest.mark.cuda
def test_past_the_counter_slots_the_launcher_zeroes_its_own(lib: Any, cache_dir: Path) -> None:
    env = {**os.environ, "WB_CACHE_DIR": str(cache_dir), "WB_QUIET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SLOTS_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@pytest.mark.nvcc
def test_cuda_kernels_compile_for_every_smoke_arch_without_spills() -> None:
    """With ``wb smoke``'s archs and config: the objects test_cli_smoke and CI's smoke stage build
    in the same cache, so the TUs compile once for all three."""
    from tests.bundled_cubin import SMOKE_ARCHS
    from workbench.cli.smoke import compile_rows
    from workbench.project import discover

    project = discover()
    (family,) = [f for f in project.families if f.name == "layer_norm"]
    rows = [r for r in compile_rows(project, family, SMOKE_ARCHS, None) if ".cu" in r.tu]
    assert {(r.tu, r.arch) for r in rows} == {
        (f"layer_norm/{cu}", arch)
        for cu in ("layer_norm.cu", "layer_norm_backward.cu")
        for arch in ("sm_80", "sm_86", "sm_89", "sm_90a")
    }
    for r in rows:
        assert not r.failed and r.regs and r.spills == 0, (r.tu, r.arch, r.spills, r.detail)
