"""The wgmma matmul's staged epilogue (issue 37): c leaves through shared memory instead of
scattered stores from registers, so that the consumers go on to the next tile while c drains
(kernels/matmul/matmul_wgmma.kernel.cu, store_staged). By default the whole-k kernel copies the
buffer out with one bulk tensor copy a chunk through c's tensor map (=tensor) and the split-k
slices store from registers (=direct), the fastest of each on an H100. WB_WGMMA_STORE, read at each
call, picks another epilogue for A/B (the launch's dynamic shared memory tells the kernel):
=direct (no buffer: scattered stores from registers), =vector (16-byte stores by all the
consumer's threads), =bulk (asynchronous bulk copies, a row each), =tensor;
WB_WGMMA_CLUSTER=2 runs the whole-k kernel in clusters of two blocks that share b's tile (other
values than these are refused, naming the variable); WB_WGMMA_SPLITS=S forces the split-k
route's number of slices (for timing that choice); WB_WGMMA_SPLIT_SUM=launch sums the slices in a
second launch instead of in clusters, WB_WGMMA_SPLIT_TILE=64 | 128 the cluster sum's tile rows
(tests/test_matmul_splitk.py); WB_WGMMA_FEW=split | narrow | narrow1 a few-rows shape's route
(tests/test_matmul_narrow.py).

Without a GPU: the kernels compile for sm_90a with all three epilogues, without spills.
On a Hopper GPU (marked cuda): the default route is right against torch.mm at odd shapes (m, n
and k tails, m = 1, n not a multiple of 8 where the staged epilogue stands aside, b column-major),
gives the same bits as the other epilogues and clusters (all round the same float32 sums once),
replays in a CUDA graph, and runs on two streams at once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import (
    assert_matmul_graph_replays,
    assert_within_matmul_bound,
    hopper,
    matmul_operands,
    nvcc_wgmma,
)

# (m, n, k, b column-major): the built tile whole (many tiles) and the split-k route (few).
SHAPES = [
    (4096, 4096, 1024, False),
    (1000, 1032, 520, False),  # m, n (8 past a tile) and k (8 past a step) tails
    (1000, 1032, 520, True),
    (300, 1032, 520, False),  # 3 rows of tiles: in clusters of two, one pair half past m
    (385, 2056, 4136, True),
    (1, 4096, 4096, False),  # split-k, one row
    (16, 4104, 4096, True),
    (128, 4096, 4096, False),
    (200, 1001, 4096, False),  # n odd: both epilogues store from registers
]


@pytest.mark.nvcc
def test_both_kernels_stage_c_and_compile_for_sm90a_without_spills(tmp_path: Path) -> None:
    """Each kernel has the bulk copies out and reads its dynamic shared memory's size (a launch
    without the buffer stores from registers); none spills."""
    ptx = tmp_path / "wgmma.ptx"
    done = nvcc_wgmma(tmp_path, "--ptx", "-o", str(ptx))
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", ptx.read_text())[1:]
    assert len(entries) == 4
    for entry in entries:
        assert "cp.async.bulk.global.shared::cta.bulk_group" in entry
        assert "cp.async.bulk.wait_group.read 0;" in entry
        assert "%dynamic_smem_size" in entry
        assert "st.global.b32" in entry or "st.global.b64" in entry  # the direct epilogue
        assert "st.global.v4.u32" in entry  # the vector epilogue
        assert ".multicast::cluster" in entry and "mapa.shared::cluster" in entry  # pairs
        # The tensor-copy epilogue: the whole-k kernel's (c of 16 bits), not the split slices'.
        tensor = "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in entry
        assert tensor == ("wgmma_kernel" in entry.split("(")[0]), entry[:80]
    done = nvcc_wgmma(tmp_path, "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "wgmma.cubin"))
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == 4 and all(s == ("0", "0") for s in spills), done.stderr


# --- on a Hopper GPU ------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n", "k", "col"), SHAPES)
def test_the_default_route_is_right(
    lib: Any, m: int, n: int, k: int, col: bool, dtype: Any
) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, n, k, col, dtype)
    got = lib.matmul(a, b)
    assert_within_matmul_bound(lib, got, a, b)
    torch.testing.assert_close(got.float(), torch.mm(a, b).float(), rtol=2e-2, atol=0.5)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "variant",
    [
        {"WB_WGMMA_STORE": "direct"},
        {"WB_WGMMA_STORE": "vector"},
        {"WB_WGMMA_STORE": "bulk"},
        {"WB_WGMMA_STORE": "tensor"},
        {"WB_WGMMA_STORE": "tensor", "WB_WGMMA_CLUSTER": "2"},
        {"WB_WGMMA_CLUSTER": "2"},
    ],
)
def test_the_default_gives_the_variants_bits(
    lib: Any, monkeypatch: pytest.MonkeyPatch, variant: dict[str, str]
) -> None:
    """The other epilogues, and clusters of two sharing b: every shape's c, bit for bit (the same
    sums in the same order)."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    default = [lib.matmul(*matmul_operands(*shape)) for shape in SHAPES]
    for name, value in variant.items():
        monkeypatch.setenv(name, value)
    for shape, ours in zip(SHAPES, default, strict=True):
        theirs = lib.matmul(*matmul_operands(*shape))
        assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16)), (shape, variant)


@pytest.mark.cuda
@pytest.mark.parametrize("splits", ["2", "4", "16", "64"])
def test_a_forced_split_count_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, splits: str
) -> None:
    """WB_WGMMA_SPLITS=S: S slices (more units than SMs included), right on the split shapes."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    monkeypatch.setenv("WB_WGMMA_SPLITS", splits)
    monkeypatch.setenv("WB_WGMMA_FEW", "split")  # the route that reads it
    monkeypatch.setenv("WB_MATMUL_GEMV", "0")  # m <= 8 would take the GEMV route (matmul_gemv.cu)
    for m, n, k, col in [(1, 4096, 4096, False), (16, 4104, 4096, True), (128, 4096, 4136, False)]:
        a, b = matmul_operands(m, n, k, col)
        assert_within_matmul_bound(lib, lib.matmul(a, b), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "name",
    [
        "WB_WGMMA_STORE",
        "WB_WGMMA_CLUSTER",
        "WB_WGMMA_SPLITS",
        "WB_WGMMA_SPLIT_SUM",
        "WB_WGMMA_SPLIT_TILE",
        "WB_WGMMA_FEW",  # a few-rows shape's route (tests/test_matmul_narrow.py)
    ],
)
def test_a_bad_variant_is_refused_by_name(
    lib: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    if name != "WB_WGMMA_FEW":
        monkeypatch.setenv("WB_WGMMA_FEW", "split")  # the route that reads the split switches
    monkeypatch.setenv(name, "fast")
    a, b = (
        matmul_operands(16, 4096, 4096, False)
        if name.startswith("WB_WGMMA_SPLIT")
        else matmul_operands(256, 256, 256, False)
    )
    with pytest.raises(RuntimeError, match=name):
        lib.matmul(a, b)


@pytest.mark.cuda
def test_a_cuda_graph_replays_the_whole_tile_route(lib: Any) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    assert_matmul_graph_replays(lib, *matmul_operands(1000, 1032, 520, False))


@pytest.mark.cuda
def test_two_streams_at_once(lib: Any) -> None:
    """The whole-tile and split routes on two streams, overlapping: each its own c."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    big = matmul_operands(2048, 2048, 1024, True)
    small = matmul_operands(16, 4096, 4096, False)
    expected = [lib.matmul(*big), lib.matmul(*small)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    got: list[list[torch.Tensor]] = [[], []]
    for _ in range(4):
        for i, (s, ops) in enumerate(zip(streams, (big, small), strict=True)):
            with torch.cuda.stream(s):
                got[i].append(lib.matmul(*ops))
    torch.cuda.synchronize()
    for i in range(2):
        for c in got[i]:
            assert torch.equal(c.view(torch.int16), expected[i].view(torch.int16))
