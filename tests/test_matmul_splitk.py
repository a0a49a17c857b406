"""The wgmma matmul's split-k route (issue 37): a c of few tiles (a short a: m = 1 .. 200 against
n = 4096) splits k across blocks on a 64 x 256 tile, each slice's float32 partial sums summed in
slice order into c (kernels/matmul/matmul_wgmma.cu). By default in one launch: clusters of S
blocks, the slices of a tile, sum through distributed shared memory (wgmma_cluster_split_kernel);
WB_WGMMA_SPLIT_SUM=launch writes the slices to a workspace and sums them in a second launch. The
cluster sum's tile has 128 rows where a has more than 64 (WB_WGMMA_SPLIT_TILE=64 | 128 forces one).

Without a GPU: the split kernels compile for sm_90a beside the tuned tile's, without spills.
On a Hopper GPU (marked cuda; WB_WGMMA_FEW=split throughout, the route these tests are of,
whatever the few-rows default picks): the route takes the cluster sum, right against a float64
product within the family's tolerance for bfloat16 and float16, k tails included; the same bits
every call, and the same bits as the two-launch sum for the same slices; a CUDA graph replays it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import (
    assert_matmul_graph_replays,
    cuda_kernels_run,
    hopper,
    matmul_operands,
    nvcc_wgmma,
)


@pytest.fixture(autouse=True)
def _split_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """This file tests the split-k route: a few-rows shape takes it whatever the default rule for
    such shapes says (WB_WGMMA_FEW; few_rows_route in kernels/matmul/matmul_wgmma_narrow.cu)."""
    monkeypatch.setenv("WB_WGMMA_FEW", "split")


DTYPES = [torch.bfloat16, torch.float16]
# (n, k): whole k tiles; n a tile and a bit (a partial tile of columns); k tails (not a multiple
# of the 64-long k step, and slices of unequal length); a small c with a short k.
SIZES = [(4096, 4096), (4104, 8192), (4096, 4136), (1032, 2056)]
ROWS = [1, 16, 64, 128, 200]


@pytest.mark.nvcc
def test_the_split_kernel_compiles_for_sm90a_without_spills(tmp_path: Path) -> None:
    """Sixteen kernels (three templates, two dtypes, two layouts of b, the cluster sum's on two
    tiles); the split ones on the 64 x 256 tile (256 threads, wgmma m64n256k16, 5 stages of
    mbarriers), the cluster sum's also on the 128 x 256 one (384 threads, 4 stages), reading
    distributed shared memory between two cluster barriers; none spilling."""
    ptx = tmp_path / "wgmma.ptx"
    done = nvcc_wgmma(tmp_path, "--ptx", "-o", str(ptx), dtypes=("f16", "bf16"), cluster=True)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", ptx.read_text())[1:]
    split = [e for e in entries if e.startswith("_ZN2wb6matmul18wgmma_split_kernel")]
    cluster = [e for e in entries if e.startswith("_ZN2wb6matmul26wgmma_cluster_split_kernel")]
    assert len(entries) == 16 and len(split) == 4 and len(cluster) == 8
    for kernel in cluster:
        assert "ld.shared::cluster.v4.f32" in kernel and "mapa.shared::cluster" in kernel
        assert kernel.count("barrier.cluster.wait.acquire;") >= 2
    wide = [e for e in cluster if ".maxntid 384, 1, 1" in e]
    assert len(wide) == 4 and all(re.search(r"E4full\[32\];", e) for e in wide)
    for kernel in split + [e for e in cluster if e not in wide]:
        assert ".maxntid 256, 1, 1" in kernel
        assert "wgmma.mma_async.sync.aligned.m64n256k16" in kernel
        assert re.search(r"E4full\[40\];", kernel)  # 5 stages
        assert "setmaxnreg.dec.sync.aligned.u32 40;" in kernel  # the producer's share
    done = nvcc_wgmma(
        tmp_path,
        "-cubin",
        "-Xptxas",
        "-v",
        "-o",
        str(tmp_path / "wgmma.cubin"),
        dtypes=("f16", "bf16"),
        cluster=True,
    )
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == 16 and all(s == ("0", "0") for s in spills), done.stderr


# --- on a Hopper GPU ------------------------------------------------------------------------


def _within_tolerance(lib: Any, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """The family's bound (workbench.verify.oracle): atol * max(1, max|ref|) + rtol * |ref|,
    against the float64 product."""
    ref = a.double() @ b.double()
    rtol, atol = lib.specs["matmul"].tolerances[got.dtype]
    bound = atol * max(1.0, ref.abs().max().item()) + rtol * ref.abs()
    err = (got.double() - ref).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{tuple(a.shape)} @ {tuple(b.shape)} {got.dtype}: err/tol {worst:.2f}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), SIZES)
@pytest.mark.parametrize("m", ROWS)
def test_a_short_a_is_right(lib: Any, m: int, n: int, k: int, dtype: torch.dtype) -> None:
    """b row-major and column-major (x @ w.t()), through the default route."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen)
    _within_tolerance(lib, lib.matmul(a, b), a, b)
    _within_tolerance(lib, lib.matmul(a, w.t()), a, w.t())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_an_odd_n_is_right(lib: Any, dtype: torch.dtype) -> None:
    """15 x 1001 (b column-major, as x @ w.t()): partial sums stored one float at a time (n odd),
    and a c whose size is not a multiple of 4 summed element by element."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a = torch.randn(15, 4096, device="cuda", dtype=dtype)
    w = torch.randn(1001, 4096, device="cuda", dtype=dtype)
    assert "wgmma_cluster_split_kernel" in cuda_kernels_run(lambda: lib.matmul(a, w.t()))
    _within_tolerance(lib, lib.matmul(a, w.t()), a, w.t())
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WB_WGMMA_SPLIT_SUM", "launch")
        assert "wgmma_split_kernel" in cuda_kernels_run(lambda: lib.matmul(a, w.t()))
        _within_tolerance(lib, lib.matmul(a, w.t()), a, w.t())


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_the_default_route_splits_a_short_a(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int
) -> None:
    """m x 4096 x 4096 is at most 32 tiles of 64 x 256: the cluster sum runs alone (one launch),
    and forcing the wgmma path (matmul_path 3) takes the same route; WB_WGMMA_SPLIT_SUM=launch runs
    the split kernel and the sum."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    monkeypatch.setenv("WB_MATMUL_GEMV", "0")  # m <= 8 would take the GEMV route (matmul_gemv.cu)
    a = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert "wgmma_cluster_split_kernel" in names and "sum_slices_kernel" not in names, names
    assert "wgmma_cluster_split_kernel" in cuda_kernels_run(lambda: lib.matmul_path(a, b, 3))
    monkeypatch.setenv("WB_WGMMA_SPLIT_SUM", "launch")
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert "wgmma_split_kernel" in names and "sum_slices_kernel" in names, names
    monkeypatch.delenv("WB_WGMMA_SPLIT_SUM")
    # A c of many tiles keeps the built tile whole.
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    names = cuda_kernels_run(lambda: lib.matmul(big, b))
    assert "wgmma_kernel" in names and "wgmma_split_kernel" not in names, names


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_split_route_gives_the_same_bits_every_call(lib: Any, dtype: torch.dtype) -> None:
    """The slices are summed in slice order, not by atomics: two calls agree bit for bit."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    for m, (n, k) in [(16, (4096, 4096)), (200, (4096, 4136)), (1, (4104, 8192))]:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        first, second = lib.matmul(a, b), lib.matmul(a, b)
        assert torch.equal(first.view(torch.int16), second.view(torch.int16)), (m, n, k)


# (m, n, k, b column-major) for the cluster sum against the two-launch one: m = 1; n a tile and a
# bit, b column-major; n odd (c stored an element at a time) with 4 rows of tiles, the last one
# partial; k tails (slices of unequal length).
CLUSTER_SHAPES = [
    (1, 4096, 4096, False),
    (16, 4104, 4096, True),
    (200, 1001, 4096, True),  # n odd: b column-major (a row-major b of 1001 columns is no TMA map)
    (64, 1032, 2056, True),
    (128, 4096, 4136, False),
    (15, 1001, 4096, True),
]


@pytest.mark.cuda
@pytest.mark.parametrize("rows", ["64", "128"])
@pytest.mark.parametrize("splits", ["2", "3", "4", "8"])
def test_the_cluster_sum_gives_the_two_launch_bits(
    lib: Any, monkeypatch: pytest.MonkeyPatch, splits: str, rows: str
) -> None:
    """WB_WGMMA_SPLITS=S (at most 8: one cluster of S blocks a tile), on either tile
    (WB_WGMMA_SPLIT_TILE): the cluster sum adds the same slices (each row's the same float32 sums,
    whichever tile holds it) in the same order as sum_slices_kernel, so c is the same bit for bit,
    and right."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    monkeypatch.setenv("WB_WGMMA_SPLITS", splits)
    monkeypatch.setenv("WB_WGMMA_SPLIT_TILE", rows)
    monkeypatch.setenv("WB_MATMUL_GEMV", "0")  # m <= 8 would take the GEMV route (matmul_gemv.cu)
    for m, n, k, col in CLUSTER_SHAPES:
        a, b = matmul_operands(m, n, k, col)
        assert "wgmma_cluster_split_kernel" in cuda_kernels_run(lambda: lib.matmul(a, b))  # noqa: B023
        ours = lib.matmul(a, b)
        _within_tolerance(lib, ours, a, b)
        monkeypatch.setenv("WB_WGMMA_SPLIT_SUM", "launch")
        theirs = lib.matmul(a, b)
        monkeypatch.delenv("WB_WGMMA_SPLIT_SUM")
        assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16)), (m, n, k, col)


@pytest.mark.cuda
@pytest.mark.parametrize("sum_by", ["cluster", "launch"])
def test_a_cuda_graph_replays_the_split_route(
    lib: Any, monkeypatch: pytest.MonkeyPatch, sum_by: str
) -> None:
    """Captured once (the two-launch sum's workspace from the graph's pool), replayed on new values
    of a: the replay's c is the eager call's, bit for bit."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    monkeypatch.setenv("WB_WGMMA_SPLIT_SUM", sum_by)
    a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    assert_matmul_graph_replays(lib, a, b)


@pytest.mark.cuda
def test_cluster_sums_on_two_streams_at_once(lib: Any) -> None:
    """Two split shapes on two streams, overlapping, each summed in its clusters: each its own c."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    ops = [matmul_operands(1, 4096, 4096, False), matmul_operands(128, 4104, 2056, True)]
    expected = [lib.matmul(*o) for o in ops]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    got: list[list[torch.Tensor]] = [[], []]
    for _ in range(4):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                got[i].append(lib.matmul(*ops[i]))
    torch.cuda.synchronize()
    for i in range(2):
        for c in got[i]:
            assert torch.equal(c.view(torch.int16), expected[i].view(torch.int16))
