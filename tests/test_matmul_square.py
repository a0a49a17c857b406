"""The wgmma matmul's square tiles: the whole-k loop on a fixed tile of 128 columns and 128 rows
(two consumer warpgroups, 6 stages), 192 (three, 4 stages) or 256 (four, 4 stages, the staged
epilogue in 64-byte chunks: 128-byte ones do not fit beside the ring): wgmma_square_kernel in
kernels/matmul/matmul_wgmma.kernel.cu, a block a tile (WB_WGMMA_CLUSTER=2: in clusters of two one
above the other that share b's tile). cuBLAS runs 128 x 128 on shapes whose 128 x 256 tiles fill
about half the SMs (2048 x 1024 x 2048: 64 of them, 128 of 128 x 128), 192 x 96 at 1536^3.
WB_WGMMA_FEW=square | square192 | square256 runs any few shape (fewer 128 x 256 tiles than SMs) on
one, WB_WGMMA_SQUARE=square | square192 | square256 any shape. The
square rule (matmul_wgmma_narrow.cu's square_route; WB_WGMMA_SQUARE=on, the default, or off): a
few shape of more than 256 rows (a row-major) and more than 128 columns whose 128 x 128 tiles make
more than half a wave and at most one takes that tile, else, past a wave of those, the 192 x 128
one where its tiles make that; past a wave of 128 x 256 tiles, the wave rule takes the 192 x 128
or 256 x 128 tile where its waves take a twentieth less time (3072^2; 4096 x 4160); unless a route
switch is set.

Without a GPU: the kernels compile for sm_90a without spills (384, 512 and 640 threads, 6, 4 and 4
stages' mbarriers, m64n128k16, multicast, the staged epilogue's 16-byte stores); the rules' reach
on an
H100's 132 SMs (the mirror in test_matmul_midsize.py, which the GPU test below holds to the kernels
run).
On a Hopper GPU (marked cuda): forced, it runs that kernel, and its c is within the family's bound
of the float64 product at tiles and tails (m, n and k not multiples of 128, 128 and 64), both
layouts of b and both dtypes; paired and alone give the same bits; a CUDA graph replays it. The
rules run it where the mirror says (a few shape with the bits the switch forces), and not on the
shapes past their reach, for a column-major a, with a route switch set or with WB_WGMMA_SQUARE=off;
a bad value is refused by name.
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
    cuda_kernels_run,
    hopper,
    matmul_operands,
    nvcc_sm90a,
    whole_k_instances,
    whole_k_line,
)
from tests.test_matmul_midsize import H100_SMS, _route, on_132_sms

DTYPES = [torch.bfloat16, torch.float16]
# (m, n, k, b column-major): one wave of tiles (2048 x 1024 x 2048: 128), tails in every size, a
# single tile, an odd number of rows of tiles (the last pair's lower tile lies past m), n odd with
# b column-major (the epilogue stores from registers).
SHAPES = [
    (2048, 1024, 2048, False),
    (1536, 1536, 1536, True),
    (1000, 1200, 3000, False),
    (130, 250, 72, True),
    (100, 100, 100, False),
    (1152, 1152, 1152, False),
    (777, 1001, 520, True),
]


@pytest.mark.nvcc
def test_the_square_tiles_compile_for_sm90a_without_spills(tmp_path: Path) -> None:
    lines = [
        whole_k_line("wgmma_square_kernel", (t, kmajor, consumers, mmajor))
        for t in ("f16", "bf16")
        for kmajor in ("true", "false")
        for consumers in ("2", "3", "4")
        for mmajor in ("true", "false")
    ]
    source = whole_k_instances(tmp_path, "square_instances.cu", lines)
    done = nvcc_sm90a(tmp_path, "--ptx", "-o", "square.ptx", source=source)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", (tmp_path / "square.ptx").read_text())[1:]
    assert len(entries) == 24
    threads = []
    for entry in entries:
        assert entry.startswith("_ZN2wb6matmul19wgmma_square_kernel")
        assert "wgmma.mma_async.sync.aligned.m64n128k16" in entry
        found = re.search(r"\.maxntid (\d+), 1, 1", entry)
        assert found is not None
        threads.append(int(found.group(1)))
        stages = 6 if threads[-1] == 384 else 4  # a producer and two, three or four consumers
        assert re.search(rf"E4full\[{8 * stages}\];", entry), threads[-1]
        assert ".multicast::cluster" in entry and "st.global.v4" in entry  # pairs, staged stores
    assert sorted(threads) == [384] * 8 + [512] * 8 + [640] * 8
    done = nvcc_sm90a(tmp_path, "-cubin", "-Xptxas", "-v", "-o", "square.cubin", source=source)
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert spills == [("0", "0")] * 24, done.stderr


def _kernel_of(consumers: int, mmajor: bool = False) -> str:
    """The profiler's name of the square kernel of ``consumers`` warpgroups (any dtype and layout
    of b; a m-major where ``mmajor``): wgmma_square_kernel<wb::bf16, false, 3, false>."""
    a = "true" if mmajor else r"\w+"
    return rf"wgmma_square_kernel<[^,]+,\s*\w+,\s*(?:\(int\))?{consumers},\s*{a}>"


def _square(monkeypatch: pytest.MonkeyPatch, route: str) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    monkeypatch.setenv("WB_WGMMA_FEW", route)


CONSUMERS = {"square": 2, "square192": 3, "square256": 4}


@pytest.mark.cuda
@pytest.mark.parametrize("route", list(CONSUMERS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k", "col"), SHAPES)
def test_the_square_tiles_are_right(
    lib: Any,
    monkeypatch: pytest.MonkeyPatch,
    m: int,
    n: int,
    k: int,
    col: bool,
    dtype: Any,
    route: str,
) -> None:
    _square(monkeypatch, route)
    a, b = matmul_operands(m, n, k, col, dtype)
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert re.search(_kernel_of(CONSUMERS[route]), names), names
    alone = lib.matmul(a, b)
    assert_within_matmul_bound(lib, alone, a, b)
    monkeypatch.setenv("WB_WGMMA_CLUSTER", "2")
    paired = lib.matmul(a, b)
    assert torch.equal(paired.view(torch.int16), alone.view(torch.int16))


@pytest.mark.cuda
@pytest.mark.parametrize("route", list(CONSUMERS))
def test_a_cuda_graph_replays_the_square_tiles(
    lib: Any, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    _square(monkeypatch, route)
    assert_matmul_graph_replays(lib, *matmul_operands(1000, 1200, 3000, True))


# (m, n, k): the rule's shapes on 132 SMs (81 to 128 square tiles) and the shapes past its reach:
# at most half a wave (1024^3: 64), past one (1536^2: 144), few rows (256 x 8192: the 256-row split
# tile's), few columns (the tall rule's 2048 x 128).
RULE = [(1152, 1152, 1152), (2048, 1024, 2048), (4096, 384, 4096), (1024, 2048, 8192),
        (3000, 300, 1000), (1000, 1200, 3000)]  # fmt: skip
# Past a wave of 128 x 128 tiles, about one of 192 x 128: 1536^2 (144 and 96), 768 x 3072 (144
# and 96), 1024 x 2560 (160 and 120).
RULE192 = [(1536, 1536, 1536), (1536, 1536, 2048), (768, 3072, 768), (1024, 2560, 1024)]
# Past a wave of 128 x 256 tiles (the wave rule): 192 x 128 where its waves beat theirs, 3072^2
# (3 waves of 288 tiles; 3 of 384), 2304^2 (2; 2), 3072 x 2048 (2; 2), 3000^2 with tails, 4160^2
# (5 of 561; 6 of 726, 0.58 us a wave and k step against 0.76).
WAVES = [(3072, 3072, 3072), (2304, 2304, 2304), (3072, 2048, 2048), (3000, 3000, 2500),
         (4160, 4160, 512)]  # fmt: skip
# 256 x 128 where its waves beat both: 4096 x 4160 (5 waves of 544; 4 of 528), 2048 x 4160 (3 of
# 272; 2 of 264), and 4096 x 4104 (n a tail past 16 tiles of 256 columns, b's rows 8208 bytes).
WAVES256 = [(4096, 4160, 512), (2048, 4160, 1024), (4096, 4104, 512)]
PAST = [(1024, 1024, 1024), (2048, 2048, 2048), (1792, 1792, 1792), (256, 8192, 8192),
        (2048, 128, 4096), (4096, 4096, 1024), (2560, 2560, 2560)]  # fmt: skip


def test_the_rule_reaches_half_a_wave_to_one_of_square_tiles_on_an_h100() -> None:
    for shapes, tile in [(RULE, "square 128x128"), (RULE192, "square 192x128")]:
        for m, n, k in shapes:
            route, tiles = _route(m, n, k, True)
            assert route == tile and H100_SMS < 2 * tiles <= 2 * H100_SMS, (m, n, k)
            assert _route(m, n, k, True, square=False)[0] != route
    for shapes, tile in [(WAVES, "square 192x128"), (WAVES256, "square 256x128")]:
        for m, n, k in shapes:
            assert _route(m, n, k, True) == (tile, H100_SMS), (m, n, k)
            assert _route(m, n, k, True, square=False)[0] == "whole-k 128x256"
    for m, n, k in PAST:
        assert _route(m, n, k, True)[0] != "square 128x128", (m, n, k)
    assert _route(1152, 1152, 1152, False)[0] != "square 128x128"  # WB_WGMMA_MID=off


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize(
    ("m", "n", "k", "route"),
    [(*s, "square") for s in RULE]
    + [(*s, "square192") for s in RULE192 + WAVES]
    + [(*s, "square256") for s in WAVES256],
)
def test_the_rule_runs_the_square_tiles(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, route: str, col: bool
) -> None:
    on_132_sms(monkeypatch, {})
    a, b = matmul_operands(m, n, k, col)
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert re.search(_kernel_of(CONSUMERS[route]), names), names
    got = lib.matmul(a, b)
    assert_within_matmul_bound(lib, got, a, b)
    # The switch forces the same tile (the same bits): WB_WGMMA_FEW on a few shape.
    few = (m, n, k) not in WAVES + WAVES256
    on_132_sms(monkeypatch, {"WB_WGMMA_FEW" if few else "WB_WGMMA_SQUARE": route})
    assert torch.equal(got.view(torch.int16), lib.matmul(a, b).view(torch.int16))
    for switches in ({"WB_WGMMA_SQUARE": "off"}, {"WB_WGMMA_FEW": "mid"}, {"WB_WGMMA_MID": "off"}):
        on_132_sms(monkeypatch, switches)  # the rule stands aside
        names = cuda_kernels_run(lambda: lib.matmul(a, b))
        assert "wgmma_square_kernel" not in names, (switches, names)
        assert_within_matmul_bound(lib, lib.matmul(a, b), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize(("m", "n", "k"), PAST)
def test_shapes_past_its_reach_keep_their_route(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int
) -> None:
    on_132_sms(monkeypatch, {})
    a, b = matmul_operands(m, n, k, False)
    assert "wgmma_square_kernel" not in cuda_kernels_run(lambda: lib.matmul(a, b))
    assert_within_matmul_bound(lib, lib.matmul(a, b), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("m", "n", "k", "consumers"), [(2048, 1024, 2048, 2), (3072, 3072, 1024, 3)]
)
def test_a_column_major_a_is_read_in_place_by_the_square_tiles(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, consumers: int
) -> None:
    """x^T @ dy (the weight gradient) of a rule shape and of a wave-rule shape: the square tile
    reads x in place (no copy of a first), with the bits of a row-major copy of it."""
    on_132_sms(monkeypatch, {})
    x = torch.randn(k, m, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    names = cuda_kernels_run(lambda: lib.matmul(x.t(), dy))
    assert re.search(_kernel_of(consumers, mmajor=True), names), names
    assert not re.search(r"copy|elementwise", names), names
    got = lib.matmul(x.t(), dy)
    assert_within_matmul_bound(lib, got, x.t(), dy)
    assert torch.equal(got.view(torch.int16), lib.matmul(x.t().contiguous(), dy).view(torch.int16))


@pytest.mark.cuda
@pytest.mark.parametrize("route", list(CONSUMERS))
@pytest.mark.parametrize(("m", "n", "k"), [(1000, 1200, 3000), (4096, 4096, 256), (130, 4000, 200)])
def test_the_square_switch_runs_its_tile_on_any_shape(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, route: str
) -> None:
    """WB_WGMMA_SQUARE=<tile>: a few shape, one past a wave of built tiles, one of few rows."""
    on_132_sms(monkeypatch, {"WB_WGMMA_SQUARE": route})
    a, b = matmul_operands(m, n, k, False)
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert re.search(_kernel_of(CONSUMERS[route]), names), names
    assert_within_matmul_bound(lib, lib.matmul(a, b), a, b)


@pytest.mark.cuda
def test_a_bad_square_switch_is_refused_by_name(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    on_132_sms(monkeypatch, {"WB_WGMMA_SQUARE": "yes"})
    a, b = matmul_operands(1152, 1152, 1152, False)
    with pytest.raises(RuntimeError, match="WB_WGMMA_SQUARE must be on"):
        lib.matmul(a, b)
