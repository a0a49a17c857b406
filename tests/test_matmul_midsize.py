"""The wgmma matmul on mid-size and small square-ish shapes (128^3 to 2048^3): the shapes whose
128 x 256 built tiles number fewer than the SMs, which the few-rows rule routes (kernels/matmul/
matmul_wgmma_narrow.cu's few_rows_route, matmul_wgmma.cu's plan_route). WB_WGMMA_MID, read at each
call: =on (the default) applies the mid-size rule, =off gives the few-rows rule alone:
  - a tiny shape (k whole on the built tile, its tiles at most a quarter of the SMs: 128^3, 256^3)
    takes the narrow route's 64-row tiles (narrow1), a block a tile, where it ran one or two
    blocks of the whole-k kernel; not for a column-major a, which the whole-k kernel reads in place;
  - an a of more than 256 rows, row-major, and more than 128 columns of c run on the whole-k
    kernel's 64 x 128 tile in pairs (wgmma_mid_kernel) where its tiles make half a wave to 1.85
    waves (768^3 to 1408^3 on 132 SMs); where they are fewer or more, the rules below;
  - =pairs (instead of the tile) the 128-row narrow tile of an a of more than 256 rows (768^3,
    1000^3, 1024^3) in clusters of two side by side that share a's tile (WB_WGMMA_FEW=narrow, pairs
    along n); they won at 1000^3 alone on an H100, so they are not the default.
=tile runs only those (768^3 to 1024^3) on the 64 x 128 tile (cuBLAS's tile there), in clusters of
two one above the other sharing b (WB_WGMMA_CLUSTER=1: not); WB_WGMMA_FEW=mid runs any few shape on
it.
The other shapes (384^3 and 512^3 on the 64-row tile, 1536^3 and 2048^3 on the whole-k kernel,
the few-rows goal shapes m = 1 .. 128 x 4096 x 4096) keep their routes.

Without a GPU: the rule's routes and block counts on an H100's 132 SMs (a mirror of the launcher's
arithmetic, which this file's GPU test holds to the kernels that run); the 64 x 128 tile's kernels
compile for sm_90a without spills, 256 threads at 255 registers, 8 stages, m64n128k16, multicast.
On a Hopper GPU (marked cuda): c within 8e-3 of the largest |c| against the float64 product for
every rule value, both dtypes and both layouts of b, at the square sizes and at tails
(130 x 250 x 72, 384 x 384 x 4096, 777 x 1000 x 520); the pairs along n on the 128-row tile and
the 64 x 128 tile (paired or not, the same bits) at those tails; the kernel each rule runs; an
m-major a kept in place on a tiny shape; the same bits with and without the pairs; a CUDA graph
replays the new routes; a bad WB_WGMMA_MID, and a bad whole-k switch on a shape the rule moved off
that kernel, refused by name.
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
    nvcc_sm90a,
    whole_k_instances,
    whole_k_line,
)
from tests.test_matmul_narrow import default_rows, narrow_tiles

DTYPES = [torch.bfloat16, torch.float16]
SQUARE = [128, 256, 384, 512, 768, 1000, 1024, 1536]
TAILS = [(1000, 1000, 1000), (130, 250, 72), (384, 384, 4096), (777, 1000, 520)]
KNOBS = (
    "WB_WGMMA_MID",
    "WB_WGMMA_TALL",
    "WB_MATMUL_SWAP",
    "WB_WGMMA_FEW",
    "WB_WGMMA_NARROW_BN",
    "WB_WGMMA_NARROW_PAIR",
    "WB_WGMMA_NARROW_ROWS",
    "WB_WGMMA_NARROW_SPLIT",
    "WB_WGMMA_SPLITS",
    "WB_WGMMA_SPLIT_SUM",
    "WB_WGMMA_SPLIT_TILE",
    "WB_WGMMA_STORE",
    "WB_WGMMA_CLUSTER",
    "WB_WGMMA_SQUARE",
)
DEEP, TALL = 4, 12  # the narrow kernels' Kind (wgmma_narrow.h): the 64- and 128-row tiles
H100_SMS = 132


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _splits(m: int, n: int, k: int, sms: int) -> int:
    """plan_split's slices of k where its clusters fit (the wide 128 x 256 tile past 64 rows of a,
    else the 64 x 256 one), else the two-launch sum's on the 64 x 256 tile (0 or 1: k whole)."""
    steps = _cdiv(k, 64)
    own = _cdiv(m, 128 if m > 64 else 64) * _cdiv(n, 256)
    cluster = min(sms // (2 * own), steps // 4, 8)
    if cluster >= 2:
        return cluster
    return min(sms // (_cdiv(m, 64) * _cdiv(n, 256)), steps // 4)


def _route(
    m: int,
    n: int,
    k: int,
    mid: bool,
    sms: int = H100_SMS,
    pairs: bool = False,
    square: bool = True,
) -> tuple[str, int]:
    """(the route and tile, its blocks) of an m x n x k call with a row-major a; ``square``:
    WB_WGMMA_SQUARE=on (the default), which applies under the mid-size rule (``mid``)."""
    built = _cdiv(m, 128) * _cdiv(n, 256)
    squares, squares192 = _cdiv(m, 128) * _cdiv(n, 128), _cdiv(m, 192) * _cdiv(n, 128)
    rule = mid and not pairs and square and m > 256 and n > 128
    if built >= sms:
        # The wave rule: of the built tile (a wave 0.76 us a k step), 192 x 128 (0.58) and
        # 256 x 128 (0.78), the one whose waves take the least time, another than the built tile
        # only where it saves a twentieth (ties: 192 x 128).
        cost = 76 * _cdiv(built, sms)
        costs = {"square 192x128": 58 * _cdiv(squares192, sms),
                 "square 256x128": 78 * _cdiv(_cdiv(m, 256) * _cdiv(n, 128), sms)}  # fmt: skip
        best = min(costs, key=lambda t: (costs[t], t))
        if rule and 20 * costs[best] < 19 * cost:
            return best, sms
        return "whole-k 128x256", sms
    # The square rule: more than 256 rows and 128 columns, 128 x 128 tiles in (half a wave, one];
    # past one wave of those, 192 x 128 ones in (half a wave, one].
    if rule:
        if sms < 2 * squares <= 2 * sms:
            return "square 128x128", squares
        if squares > sms and sms < 2 * squares192 <= 2 * sms:
            return "square 192x128", squares192
    # The mid-size rule's 64 x 128 tile, half a wave to 1.85 waves; past one wave with k long, two
    # slices of k on the wide tile where their blocks fill at most 4/5 of the SMs.
    mid_tiles = _cdiv(m, 64) * _cdiv(n, 128)
    reach = sms <= 2 * mid_tiles and 20 * mid_tiles <= 37 * sms
    if mid and not pairs and m > 256 and n > 128 and reach:
        wide = _cdiv(m, 128) * _cdiv(n, 256)
        if k >= 2048 and mid_tiles > sms and 5 * 2 * wide <= 4 * sms:
            return "split-k", 2
        return "mid 64x128", mid_tiles
    rows = default_rows(m, n, sms)
    splits = _splits(m, n, k, sms) if rows == 0 else 0
    if rows == 0 and splits < 2 and not (mid and 4 * built <= sms):
        if k >= 2048 and m > 256 and 2 * built <= sms:  # long k: two slices fill the wave
            return "split-k", 2
        return "whole-k 128x256", built
    if rows == 0 and splits >= 2:
        return "split-k", splits
    rows = rows or 64  # a tiny shape under the mid-size rule: the 64-row tile
    bn, tiles = narrow_tiles(m, n, rows, sms)
    if pairs and rows == 128 and m > 256:  # pairs side by side: a row of tiles rounds up to even
        return f"narrow {rows}x{bn} paired n", 2 * _cdiv(m, rows) * _cdiv(_cdiv(n, bn), 2)
    return f"narrow {rows}x{bn}", tiles


def test_the_routes_of_the_square_shapes_on_an_h100() -> None:
    """What each rule runs at s^3 on 132 SMs, and with how many blocks."""
    new = {s: _route(s, s, s, True) for s in [*SQUARE, 2048, 4096]}
    old = {s: _route(s, s, s, False) for s in [*SQUARE, 2048, 4096]}
    assert new == {
        128: ("narrow 64x32", 8),
        256: ("narrow 64x32", 32),
        384: ("narrow 64x32", 72),
        512: ("narrow 64x32", 128),
        768: ("mid 64x128", 72),
        1000: ("mid 64x128", 128),
        1024: ("mid 64x128", 128),
        1536: ("square 192x128", 96),
        2048: ("whole-k 128x256", 128),
        4096: ("whole-k 128x256", 132),
    }
    changed = {s: old[s] for s in old if old[s] != new[s]}
    assert changed == {128: ("whole-k 128x256", 1), 256: ("whole-k 128x256", 2),
                       768: ("narrow 128x64", 72), 1000: ("narrow 128x64", 128),
                       1024: ("narrow 128x64", 128), 1536: ("whole-k 128x256", 72)}  # fmt: skip
    pairs = {s: _route(s, s, s, True, pairs=True) for s in (768, 1000, 1024)}
    assert pairs == {768: ("narrow 128x64 paired n", 72), 1000: ("narrow 128x64 paired n", 128),
                     1024: ("narrow 128x64 paired n", 128)}  # fmt: skip


def test_the_few_rows_goal_shapes_keep_their_routes() -> None:
    for m in (1, 16, 64, 128):
        assert _route(m, 4096, 4096, True) == _route(m, 4096, 4096, False)


@pytest.mark.nvcc
def test_the_mid_tile_compiles_for_sm90a_without_spills(tmp_path: Path) -> None:
    lines = [
        whole_k_line("wgmma_mid_kernel", (t, kmajor))
        for t in ("f16", "bf16")
        for kmajor in ("true", "false")
    ]
    source = whole_k_instances(tmp_path, "mid_instances.cu", lines)
    done = nvcc_sm90a(tmp_path, "--ptx", "-o", "mid.ptx", source=source)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", (tmp_path / "mid.ptx").read_text())[1:]
    assert len(entries) == 4
    for entry in entries:
        assert entry.startswith("_ZN2wb6matmul16wgmma_mid_kernel")
        assert "wgmma.mma_async.sync.aligned.m64n128k16" in entry
        assert ".maxntid 256, 1, 1" in entry  # a producer and one consumer warpgroup
        assert re.search(r"E4full\[64\];", entry)  # 8 stages' mbarriers
        assert ".multicast::cluster" in entry and "st.global.v4" in entry  # pairs, staged stores
    done = nvcc_sm90a(tmp_path, "-cubin", "-Xptxas", "-v", "-o", "mid.cubin", source=source)
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert spills == [("0", "0")] * 4, done.stderr
    # The launcher's check_regs wants the entry count (255 at 256 threads) at least.
    assert re.findall(r"Used (\d+) registers", done.stderr) == ["255"] * 4, done.stderr
    assert "serialized" not in done.stderr, done.stderr


# --- on a Hopper GPU ------------------------------------------------------------------------


def _use(monkeypatch: pytest.MonkeyPatch, variant: dict[str, str]) -> None:
    """`variant`'s switches, every other wgmma one unset (and no GEMV route)."""
    monkeypatch.setenv("WB_MATMUL_GEMV", "0")
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    for name, value in variant.items():
        monkeypatch.setenv(name, value)


def _within(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: Any) -> None:
    """Within 8e-3 of the largest |c| of the float64 product, everywhere."""
    ref = a.double() @ b.double()
    worst = (got.double() - ref).abs().max().item() / ref.abs().max().item()
    assert worst <= 8e-3, f"{tuple(a.shape)} @ {tuple(b.shape)} {got.dtype} {what}: {worst:.2e}"


def _skip_off_hopper() -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")


def _kind(names: str) -> int | None:
    found = re.search(r"wgmma_narrow_kernel<[^>]*,\s*(?:\(int\))?(\d+)>", names)
    return int(found.group(1)) if found else None


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("mid", ["on", "off", "pairs", "tile"])
def test_every_square_size_and_tail_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, mid: str, col: bool, dtype: Any
) -> None:
    _skip_off_hopper()
    _use(monkeypatch, {"WB_WGMMA_MID": mid})
    for m, n, k in [(s, s, s) for s in SQUARE] + TAILS:
        a, b = matmul_operands(m, n, k, col, dtype)
        _within(lib.matmul(a, b), a, b, mid)


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), [*TAILS, (768, 768, 768), (300, 4104, 264)])
def test_the_pairs_along_n_on_the_128_row_tile_are_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, col: bool
) -> None:
    """The mid-size rule's clusters on any shape (a last row of tiles part past m, a last pair
    half past n, k of one step and 8), and the same bits as the tile unpaired."""
    _skip_off_hopper()
    a, b = matmul_operands(m, n, k, col)
    _use(monkeypatch, {"WB_WGMMA_FEW": "narrow1", "WB_WGMMA_NARROW_ROWS": "128"})
    alone = lib.matmul(a, b)
    _use(
        monkeypatch,
        {"WB_WGMMA_FEW": "narrow", "WB_WGMMA_NARROW_ROWS": "128", "WB_WGMMA_NARROW_PAIR": "n"},
    )
    paired = lib.matmul(a, b)
    _within(paired, a, b, "paired n")
    assert torch.equal(alone.view(torch.int16), paired.view(torch.int16))


# (size, the narrow kernel's Kind under the mid-size rule, under the few-rows rule; None: whole-k;
# MID: the whole-k kernel's 64 x 128 tile)
MID = -1
KERNELS = [(128, DEEP, None), (256, DEEP, None), (512, DEEP, DEEP), (1000, MID, TALL),
           (1536, None, None), (2048, None, None)]  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize(("size", "new", "old"), KERNELS)
def test_each_rule_runs_its_kernel(
    lib: Any, monkeypatch: pytest.MonkeyPatch, size: int, new: int | None, old: int | None
) -> None:
    """The narrow kernel of the rule's tile (its Kind) or, None, the whole-k kernel alone."""
    _skip_off_hopper()
    a, b = matmul_operands(size, size, size, False)
    for mid, kind in [("on", new), ("off", old)]:
        _use(monkeypatch, {"WB_WGMMA_MID": mid, "WB_WGMMA_SQUARE": "off"})  # 1536^3: 192 x 128
        names = cuda_kernels_run(lambda: lib.matmul(a, b))
        assert ("wgmma_mid_kernel" in names) == (kind == MID), (mid, names)
        assert _kind(names) == (None if kind == MID else kind), (mid, names)
        assert ("wgmma_kernel" in names) == (kind is None), (mid, names)
        assert "split_kernel" not in names, (mid, names)


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_mid_tile_is_right_paired_or_not(
    lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: Any, col: bool
) -> None:
    """WB_WGMMA_FEW=mid at every square size and tail (a last pair half past m, n and k tails),
    in clusters of two and without (WB_WGMMA_CLUSTER=1): right, and the same bits."""
    _skip_off_hopper()
    for m, n, k in [(s, s, s) for s in SQUARE] + TAILS + [(300, 4104, 264)]:
        a, b = matmul_operands(m, n, k, col, dtype)
        _use(monkeypatch, {"WB_WGMMA_FEW": "mid"})
        paired = lib.matmul(a, b)
        _within(paired, a, b, "mid")
        _use(monkeypatch, {"WB_WGMMA_FEW": "mid", "WB_WGMMA_CLUSTER": "1"})
        alone = lib.matmul(a, b)
        assert torch.equal(alone.view(torch.int16), paired.view(torch.int16)), (m, n, k)


@pytest.mark.cuda
@pytest.mark.parametrize("size", [768, 1000, 1024])
def test_the_tile_value_runs_the_mid_kernel(
    lib: Any, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    _skip_off_hopper()
    _use(monkeypatch, {"WB_WGMMA_MID": "tile"})
    a, b = matmul_operands(size, size, size, False)
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert "wgmma_mid_kernel" in names and "narrow" not in names, names
    a, b = matmul_operands(128, 128, 128, False)  # a tiny shape: the narrow tile, as =on
    assert _kind(cuda_kernels_run(lambda: lib.matmul(a, b))) == DEEP


@pytest.mark.cuda
def test_the_mid_rule_gives_the_pairs_the_bits_of_the_tile_alone(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _skip_off_hopper()
    a, b = matmul_operands(1000, 1000, 1000, True)
    _use(monkeypatch, {"WB_WGMMA_MID": "off"})
    old = lib.matmul(a, b)
    _use(monkeypatch, {"WB_WGMMA_MID": "pairs"})
    assert torch.equal(old.view(torch.int16), lib.matmul(a, b).view(torch.int16))


@pytest.mark.cuda
def test_an_mmajor_a_of_a_tiny_shape_is_read_in_place(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column-major a stays on the whole-k kernel (no copy), right; a row-major one moves."""
    _skip_off_hopper()
    _use(monkeypatch, {})
    x, b = matmul_operands(128, 128, 128, False)
    a = x.t().contiguous().t()  # column-major [128, 128]
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert "wgmma_kernel" in names and not re.search(r"copy|elementwise", names), names
    _within(lib.matmul(a, b), a, b, "m-major a")
    assert _kind(cuda_kernels_run(lambda: lib.matmul(x, b))) == DEEP


@pytest.mark.cuda
@pytest.mark.parametrize(("size", "mid"), [(128, "on"), (1000, "pairs"), (1000, "tile")])
def test_a_cuda_graph_replays_the_new_routes(
    lib: Any, monkeypatch: pytest.MonkeyPatch, size: int, mid: str
) -> None:
    _skip_off_hopper()
    _use(monkeypatch, {"WB_WGMMA_MID": mid})
    assert_matmul_graph_replays(lib, *matmul_operands(size, size, size, False))


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("name", "size"),
    [("WB_WGMMA_MID", 128), ("WB_WGMMA_MID", 1000), ("WB_WGMMA_MID", 4096),
     ("WB_WGMMA_STORE", 128), ("WB_WGMMA_CLUSTER", 128), ("WB_WGMMA_STORE", 1000)],
)  # fmt: skip
def test_a_bad_switch_is_refused_by_name(
    lib: Any, monkeypatch: pytest.MonkeyPatch, name: str, size: int
) -> None:
    """WB_WGMMA_MID where the rule is asked (a few shape), and the whole-k kernel's switches on
    shapes that the rule runs elsewhere; a c of many tiles never asks WB_WGMMA_MID."""
    _skip_off_hopper()
    _use(monkeypatch, {name: "fast"})
    a, b = matmul_operands(size, size, size, False)
    if name == "WB_WGMMA_MID" and size == 4096:
        _within(lib.matmul(a, b), a, b, "built tile")
        return
    with pytest.raises(RuntimeError, match=name):
        lib.matmul(a, b)


def _default_route_on_132_sms(
    lib: Any,
    monkeypatch: pytest.MonkeyPatch,
    m: int,
    n: int,
    k: int,
    col: bool,
    square: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """a and b of m x n x k, and the kernels the default route ran on them (``square``: with the
    square rule, else WB_WGMMA_SQUARE=off); skipped but on a Hopper GPU of 132 SMs (an H100's: the
    routes the tests name are those of its SM count)."""
    on_132_sms(monkeypatch, {} if square else {"WB_WGMMA_SQUARE": "off"})
    a, b = matmul_operands(m, n, k, col)
    return a, b, cuda_kernels_run(lambda: lib.matmul(a, b))


def on_132_sms(monkeypatch: pytest.MonkeyPatch, switches: dict[str, str]) -> None:
    """`switches` set, every other wgmma one unset (_use); skipped but on a Hopper GPU of 132 SMs
    (an H100's: the routes the tests name are those of its SM count)."""
    _skip_off_hopper()
    if torch.cuda.get_device_properties(0).multi_processor_count != H100_SMS:
        pytest.skip("the routes named are those of 132 SMs")
    _use(monkeypatch, switches)


# With the square rule off (it takes most of these shapes by default: test_matmul_square.py), the
# mid-size rule past one wave of its tiles with k of 2048 or more: two slices of k on the
# wide tile, summed in clusters (wgmma_cluster_split_kernel), where those blocks fill at most 4/5
# of the SMs (1408^2 x 4096: 132 blocks, the tile); at one wave or less, the tile. Past the
# tile's reach, a whole-k plan of more than 256 rows takes the slices where they fit one wave
# (1536^2 x 2048: 144 blocks, whole-k).
LONG_K = [(1152, 1152, 4096, "split"), (1536, 768, 4096, "split"), (1000, 1200, 3000, "split"),
          (1000, 1000, 4096, "mid"), (1152, 1152, 1152, "mid"), (1408, 1408, 4096, "mid"),
          (1024, 2048, 8192, "split"), (4096, 512, 4096, "split"),
          (1536, 1536, 2048, "whole")]  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize(("m", "n", "k", "route"), LONG_K)
def test_long_k_past_a_wave_of_mid_tiles_splits_k_on_the_wide_tile(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, route: str, col: bool
) -> None:
    named = {"split": "split-k", "mid": "mid 64x128", "whole": "whole-k 128x256"}
    assert _route(m, n, k, True, square=False)[0] == named[route]
    a, b, names = _default_route_on_132_sms(lib, monkeypatch, m, n, k, col, square=False)
    assert ("cluster_split_kernel" in names) == (route == "split"), names
    assert ("wgmma_mid_kernel" in names) == (route == "mid"), names
    _within(lib.matmul(a, b), a, b, route)
    _use(monkeypatch, {"WB_WGMMA_FEW": "mid"})  # a route switch set: the rule stands aside
    assert "cluster_split_kernel" not in cuda_kernels_run(lambda: lib.matmul(a, b))


# --- the tall rule: outputs of few columns and many rows --------------------------------------

TALL_SHAPES = [(1024, 16, 4096), (2048, 64, 4096), (8192, 32, 520), (3000, 40, 136)]


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), TALL_SHAPES)
def test_the_tall_rule_runs_the_narrow_tiles_unclustered_and_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, col: bool
) -> None:
    """n <= 64 and 1024 <= m <= 8192: the narrow kernel, no split-k (WB_WGMMA_TALL=on, the
    default), the same bits as WB_WGMMA_FEW=narrow1 forces; =off gives the few-rows rule's route,
    also right."""
    _skip_off_hopper()
    a, b = matmul_operands(m, n, k, col)
    _use(monkeypatch, {})
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert _kind(names) is not None and "split_kernel" not in names, names
    got = lib.matmul(a, b)
    _within(got, a, b, "tall rule")
    _use(monkeypatch, {"WB_WGMMA_FEW": "narrow1"})
    assert torch.equal(got.view(torch.int16), lib.matmul(a, b).view(torch.int16))
    _use(monkeypatch, {"WB_WGMMA_TALL": "off"})
    _within(lib.matmul(a, b), a, b, "tall rule off")


# n of 65 to 128: by the 64-row narrow tiles' count on the device's SMs (132 on an H100): at
# most half, narrow1; at most one wave, the pairs; past it, the 64 x 128 whole-k tile (mid).
TALL_WIDE = [(1024, 128, 4096, "narrow1"), (2048, 96, 4096, "narrow"), (8192, 128, 4096, "mid"),
             (6000, 72, 520, "mid")]  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize(("m", "n", "k", "route"), TALL_WIDE)
def test_the_tall_rule_takes_its_wider_outputs_by_the_narrow_tiles_count(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, route: str, col: bool
) -> None:
    """65 to 128 columns: the route the rule names gives the bits WB_WGMMA_FEW forces there."""
    a, b, names = _default_route_on_132_sms(lib, monkeypatch, m, n, k, col)
    assert "split_kernel" not in names, names
    assert ("wgmma_mid_kernel" in names) == (route == "mid"), names
    got = lib.matmul(a, b)
    _within(got, a, b, f"tall rule, {route}")
    _use(monkeypatch, {"WB_WGMMA_FEW": route})
    assert torch.equal(got.view(torch.int16), lib.matmul(a, b).view(torch.int16))


@pytest.mark.cuda
def test_a_bad_tall_switch_is_refused_by_name(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _skip_off_hopper()
    _use(monkeypatch, {"WB_WGMMA_TALL": "yes"})
    a, b = matmul_operands(2048, 64, 4096, False)
    with pytest.raises(RuntimeError, match="WB_WGMMA_TALL must be on"):
        lib.matmul(a, b)
