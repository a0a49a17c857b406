"""The wgmma matmul's narrow route for an a of few rows (issue 37): k whole on 64 x 32 or 64 x 64
tiles, a block a tile, in clusters of two that share a's tile (tiles side by side) or b's (one
above the other) by TMA multicast (kernels/matmul/wgmma_narrow.cuh in the device-only TU
matmul_wgmma_narrow.kernel.cu; its launcher matmul_wgmma_narrow.cu).
WB_WGMMA_FEW, read at each call, picks a few-rows shape's route: split (the split-k route), narrow
(clusters of two) or narrow1 (no clusters); WB_WGMMA_NARROW_BN=32 | 64 and WB_WGMMA_NARROW_PAIR=m
| n force the tile and the clusters' direction, WB_WGMMA_NARROW_ROWS=64 | 128 | 256 the tile's
rows (128: the 128-row tile, two consumer warpgroups; 256: the split tile, with
WB_WGMMA_NARROW_SPLIT, tested in test_matmul_narrow_tall.py). A bad value of any is an error
naming it (WB_WGMMA_NARROW_SPLIT's whichever tile runs).

Without a GPU: the narrow kernels (two dtypes, two layouts of b, BN 32 and 64, 64 and 128 rows)
compile for sm_90a without spills, each its own entry with its wgmma.m64nBNk16, its multicast
copies and its remote releases, a ring of 9 (BN 32) or 7 (BN 64) stages of 128 k, 256 threads, no
L2 cache hints; the 128-row tile 384 threads and 5 or 4 stages of 128 k; the host launchers
compile.
On a Hopper GPU (marked cuda): every variant matches torch.matmul and the float64 product at m, n
and k tails, both layouts of b and both dtypes; the clustered and unclustered variants give the
same bits; a CUDA graph replays it; the route switch runs the kernel it names.
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
    narrow_instances,
    nvcc_sm90a,
)
from workbench.project import BUNDLED_KERNELS

DTYPES = [torch.bfloat16, torch.float16]
ROWS = [1, 16, 63, 64, 65, 128, 200]
# (n, b column-major): a square b both ways, n not a multiple of the tiles (1000: b column-major,
# as x @ w.t()), and n 8 past a multiple of 64 (a last pair half past n).
COLUMNS = [(4096, False), (4096, True), (1000, True), (4104, False), (4104, True)]
DEPTHS = [4096, 72, 4100]  # whole k steps, one step and 8, a step and 4 past
# The variants: the clusters both ways and both tiles, and no clusters.
VARIANTS = [
    {"WB_WGMMA_FEW": "narrow"},
    {"WB_WGMMA_FEW": "narrow1"},
    {"WB_WGMMA_FEW": "narrow", "WB_WGMMA_NARROW_BN": "32", "WB_WGMMA_NARROW_PAIR": "m"},
    {"WB_WGMMA_FEW": "narrow", "WB_WGMMA_NARROW_BN": "64", "WB_WGMMA_NARROW_PAIR": "n"},
    {"WB_WGMMA_FEW": "narrow1", "WB_WGMMA_NARROW_BN": "64"},
]
KNOBS = (
    "WB_WGMMA_FEW",
    "WB_WGMMA_NARROW_BN",
    "WB_WGMMA_NARROW_PAIR",
    "WB_WGMMA_NARROW_ROWS",
    "WB_WGMMA_NARROW_SPLIT",  # the 256-row split tile's (tests/test_matmul_narrow_tall.py)
)
# The kernels' Kind template arguments (NarrowKind, wgmma_narrow.h), in their names.
DEEP = 4  # kNarrowDeep: the 64-row tile, stages of 128 k
TALL = 12  # kNarrowDeep | kNarrowTall: the 128-row tile (WB_WGMMA_NARROW_ROWS=128)
SPLIT = 24  # kNarrowTall | kNarrowSplit: the 256-row split tile (WB_WGMMA_NARROW_ROWS=256)


@pytest.mark.nvcc
def test_the_narrow_kernels_compile_for_sm90a_without_spills(tmp_path: Path) -> None:
    shapes = [(bn, kind) for bn in (32, 64) for kind in (DEEP, TALL)]
    source = narrow_instances(tmp_path, shapes, "narrow_instances.cu")
    done = nvcc_sm90a(tmp_path, "--ptx", "-o", "narrow.ptx", source=source)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", (tmp_path / "narrow.ptx").read_text())[1:]
    assert len(entries) == 8 * 2
    for entry in entries:
        assert entry.startswith("_ZN2wb6matmul19wgmma_narrow_kernel")
        bn, kind = map(int, re.findall(r"Li(\d+)E", entry.split("(")[0]))
        assert kind in (DEEP, TALL)
        tall = kind == TALL
        assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16" in entry
        assert f".maxntid {384 if tall else 256}, 1, 1" in entry
        # The stages, two mbarriers each: (64 + BN) rows of 256 bytes, 24 or 32 KiB: 9 (BN 32) or
        # 7 (BN 64) of 227 KiB; the 128-row tile's (128 + BN) rows, 40 or 48 KiB: 5 or 4.
        stages = (5 if bn == 32 else 4) if tall else (9 if bn == 32 else 7)
        assert re.search(rf"E4full\[{8 * stages}\];", entry)
        # a's half, or b's, for each of a stage's two boxes of 64 k
        assert entry.count(".multicast::cluster") == 4
        # the remote release, at CTA scope: `.release.cluster` costs a GPU-wide barrier an arrive
        assert "mbarrier.arrive.shared::cluster.b64" in entry
        assert "mbarrier.arrive.release.cluster" not in entry
        assert "setmaxnreg" not in entry  # no register split: the accumulators fit the cap
        assert entry.count("bar.sync") == 1  # __syncthreads only
        assert ".L2::cache_hint" not in entry and "createpolicy" not in entry
    done = nvcc_sm90a(tmp_path, "-cubin", "-Xptxas", "-v", "-o", "narrow.cubin", source=source)
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == 8 * 2, done.stderr
    assert all(s == ("0", "0") for s in spills), done.stderr
    # The 128-row tile's 384 threads start with 168 registers (no setmaxnreg): ptxas fits them.
    tall = [f for f in done.stderr.split("Compiling entry function")[1:] if "Li12E" in f[:120]]
    assert len(tall) == 8, done.stderr
    assert all(int(re.findall(r"Used (\d+) registers", f)[0]) <= 168 for f in tall), tall


@pytest.mark.nvcc
def test_the_launchers_compile(tmp_path: Path) -> None:
    """The narrow launcher and the wgmma launcher that routes to it (host TUs, sm_90a)."""
    for name in ("matmul_wgmma_narrow.cu", "matmul_wgmma.cu"):
        source = BUNDLED_KERNELS / "matmul" / name
        done = nvcc_sm90a(tmp_path, "-c", "-o", f"{name}.o", source=source)
        assert done.returncode == 0, done.stderr


# --- on a Hopper GPU ------------------------------------------------------------------------


def _within_tolerance(lib: Any, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """The family's bound against the float64 product (not torch.matmul's c: two correct 16-bit
    roundings of one sum differ by an ulp, 1.0 at |c| = 200, as k = 4100 gives)."""
    ref = a.double() @ b.double()
    rtol, atol = lib.specs["matmul"].tolerances[got.dtype]
    bound = atol * max(1.0, ref.abs().max().item()) + rtol * ref.abs()
    worst = ((got.double() - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"{tuple(a.shape)} @ {tuple(b.shape)} {got.dtype}: err/tol {worst:.2f}"


def _use(monkeypatch: pytest.MonkeyPatch, variant: dict[str, str]) -> None:
    monkeypatch.setenv("WB_MATMUL_GEMV", "0")  # m <= 8 would take the GEMV route (matmul_gemv.cu)
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    for name, value in variant.items():
        monkeypatch.setenv(name, value)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", DEPTHS)
@pytest.mark.parametrize(("n", "col"), COLUMNS)
@pytest.mark.parametrize("m", ROWS)
def test_every_variant_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, col: bool, k: int, dtype: Any
) -> None:
    """Each variant's c is within the family's bound; the clustered and unclustered runs of one
    tile (the same sums in the same order) give the same bits."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, n, k, col, dtype)
    got = {}
    for i, variant in enumerate(VARIANTS):
        _use(monkeypatch, variant)
        got[i] = lib.matmul(a, b)
        _within_tolerance(lib, got[i], a, b)
    assert torch.equal(got[0].view(torch.int16), got[1].view(torch.int16))  # narrow, narrow1
    assert torch.equal(got[3].view(torch.int16), got[4].view(torch.int16))  # BN 64


TALL_ROWS = [65, 128, 160, 192, 200, 256]
TALL_COLUMNS = [(n, col) for n in (4096, 4104, 8192) for col in (False, True)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", DEPTHS)
@pytest.mark.parametrize(("n", "col"), TALL_COLUMNS)
@pytest.mark.parametrize("m", TALL_ROWS)
def test_the_128_row_tile_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, col: bool, k: int, dtype: Any
) -> None:
    """WB_WGMMA_NARROW_ROWS=128 (its own BN) is within the family's bound; on one BN its two
    consumer warpgroups give the 64-row tile's bits (each row's sums in the same order)."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, n, k, col, dtype)
    _use(monkeypatch, {"WB_WGMMA_FEW": "narrow1", "WB_WGMMA_NARROW_ROWS": "128"})
    _within_tolerance(lib, lib.matmul(a, b), a, b)
    got = {}
    for rows in ("64", "128"):
        _use(monkeypatch, {"WB_WGMMA_FEW": "narrow1", "WB_WGMMA_NARROW_ROWS": rows,
                           "WB_WGMMA_NARROW_BN": "64"})  # fmt: skip
        got[rows] = lib.matmul(a, b).view(torch.int16)
    assert torch.equal(got["64"], got["128"])


@pytest.mark.cuda
@pytest.mark.parametrize("pair", ["", "m", "n"])
@pytest.mark.parametrize(("m", "n", "col"), [(128, 4096, False), (200, 4104, True),
                                             (256, 8192, False)])  # fmt: skip
def test_the_128_row_tile_in_clusters_gives_the_same_bits(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, col: bool, pair: str
) -> None:
    """Paired (WB_WGMMA_FEW=narrow), the 128-row tile shares half of a's 128 rows or of b's tile
    by multicast, and gives the unpaired tile's bits."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, n, 4100, col, torch.bfloat16)
    got = {}
    for route in ("narrow1", "narrow"):
        variant = {"WB_WGMMA_FEW": route, "WB_WGMMA_NARROW_ROWS": "128"}
        _use(monkeypatch, {**variant, "WB_WGMMA_NARROW_PAIR": pair} if pair else variant)
        got[route] = lib.matmul(a, b)
        _within_tolerance(lib, got[route], a, b)
    assert torch.equal(got["narrow1"].view(torch.int16), got["narrow"].view(torch.int16))


@pytest.mark.cuda
@pytest.mark.parametrize(("rows", "kind"), [("64", DEEP), ("128", TALL)])
def test_the_rows_switch_runs_its_kernel(
    lib: Any, monkeypatch: pytest.MonkeyPatch, rows: str, kind: int
) -> None:
    """WB_WGMMA_NARROW_ROWS=64 runs the 64-row tile's kernel (Kind 4), 128 the 128-row tile's
    (Kind 12)."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(192, 4096, 4096, False, torch.bfloat16)
    _use(monkeypatch, {"WB_WGMMA_FEW": "narrow1", "WB_WGMMA_NARROW_ROWS": rows})
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    assert re.search(rf"wgmma_narrow_kernel<[^>]*,\s*(?:\(int\))?{kind}>", names), names


@pytest.mark.cuda
@pytest.mark.parametrize("m", [16, 64, 128])
def test_the_switch_runs_the_kernel_it_names(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int
) -> None:
    """WB_WGMMA_FEW=narrow and narrow1 run wgmma_narrow_kernel alone; split the cluster-summed
    split-k kernel; a c of many tiles keeps the built tile whatever it says."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, 4096, 4096, False, torch.bfloat16)
    for route, kernel in [("narrow", "wgmma_narrow_kernel"), ("narrow1", "wgmma_narrow_kernel"),
                          ("split", "wgmma_cluster_split_kernel")]:  # fmt: skip
        _use(monkeypatch, {"WB_WGMMA_FEW": route})
        names = cuda_kernels_run(lambda: lib.matmul(a, b))
        assert kernel in names and "sum_slices_kernel" not in names, (route, names)
    _use(monkeypatch, {"WB_WGMMA_FEW": "narrow"})
    big, _ = matmul_operands(4096, 4096, 4096, False, torch.bfloat16)
    names = cuda_kernels_run(lambda: lib.matmul(big, b))
    assert "wgmma_kernel" in names and "narrow" not in names, names


def narrow_tiles(m: int, n: int, rows: int, sms: int) -> tuple[int, int]:
    """narrow_tiles: (BN, tiles) of the rows x BN tile, BN 32 where rows x 64 tiles would fill at
    most half the SMs, else 64."""
    bn = 32 if 2 * -(-m // rows) * -(-n // 64) <= sms else 64
    return bn, -(-m // rows) * -(-n // bn)


def default_rows(m: int, n: int, sms: int) -> int:
    """few_rows_route's rule (default_rows): 64 where the 64-row tiles make one wave at least half
    full (a of 32 rows or more on the 32-column tile); 128 where they pass one wave but the 128-row
    tiles make one, the last more than half full; 64 for more than 128 rows up to a wave and a
    half; 256 (the split tile) past that for 129 to 256 rows; else 0, split-k."""
    bn64, t64 = narrow_tiles(m, n, 64, sms)
    t128 = narrow_tiles(m, n, 128, sms)[1]
    last = m - (m - 1) // 128 * 128
    if sms <= 2 * t64 <= 2 * sms and (bn64 == 64 or m >= 32):
        return 64
    if t64 > sms and sms <= 2 * t128 <= 2 * sms and last > 64:
        return 128
    if sms < t64 and 2 * t64 <= 3 * sms and m > 128:
        return 64
    return 256 if 2 * t64 > 3 * sms and 128 < m <= 256 else 0


def test_the_default_rule_on_an_h100() -> None:
    """The shapes the rule was measured at (132 SMs): each where it ran fastest."""
    want = {64: [(32, 4096), (48, 4096), (64, 4096), (100, 4104), (128, 4096), (1, 8192),
                 (64, 8192), (128, 2048), (256, 2048), (160, 4096), (192, 4096)],
            128: [(224, 4096), (256, 4096), (96, 8192), (128, 8192)],
            256: [(160, 8192), (192, 8192), (224, 8192), (256, 8192)],
            0: [(1, 4096), (16, 4096), (64, 1024), (48, 2048), (384, 4096)]}  # fmt: skip
    for rows, shapes in want.items():
        assert [(default_rows(m, n, 132), m, n) for m, n in shapes] == [
            (rows, m, n) for m, n in shapes
        ]


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("m", "n"),
    [(1, 4096), (16, 4096), (32, 4096), (33, 4096), (64, 4096), (100, 4104), (128, 4096),
     (129, 4096), (200, 4096), (64, 1024), (1, 8192), (256, 2048), (160, 4096), (256, 4096),
     (96, 8192), (224, 4096), (160, 8192), (256, 8192), (384, 4096)],
)  # fmt: skip
def test_the_default_route_of_a_few_rows_shape(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int
) -> None:
    """Unset, a few-rows shape runs the narrow tile unpaired where the rule says
    (_default_rows, at this GPU's SM count), else the split-k route's kernel; c within
    the family's bound either way."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    _use(monkeypatch, {})
    a, b = matmul_operands(m, n, 4096, False, torch.bfloat16)
    names = cuda_kernels_run(lambda: lib.matmul(a, b))
    rows = default_rows(m, n, torch.cuda.get_device_properties(0).multi_processor_count)
    if rows:
        assert "wgmma_narrow_kernel" in names and "split_kernel" not in names, names
        kind = {64: DEEP, 128: TALL, 256: SPLIT}[rows]
        assert f"Li{kind}EEE" in names or f", {kind}>" in names, names
    else:  # the split-k route, or the built tile where it finds no split worth it
        assert "narrow" not in names and "wgmma_" in names, names
    _within_tolerance(lib, lib.matmul(a, b), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", ["64", "128"])
@pytest.mark.parametrize("route", ["narrow", "narrow1"])
@pytest.mark.parametrize(("m", "col"), [(64, False), (128, True), (200, False), (256, True)])
def test_a_cuda_graph_replays_the_narrow_route(
    lib: Any, monkeypatch: pytest.MonkeyPatch, route: str, m: int, col: bool, rows: str
) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    _use(monkeypatch, {"WB_WGMMA_FEW": route, "WB_WGMMA_NARROW_ROWS": rows})
    assert_matmul_graph_replays(lib, *matmul_operands(m, 4096, 4096, col, torch.bfloat16))


@pytest.mark.cuda
@pytest.mark.parametrize("name", KNOBS)
def test_a_bad_value_is_refused_by_name(
    lib: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    _use(monkeypatch, {"WB_WGMMA_FEW": "narrow"})
    monkeypatch.setenv(name, "fast")
    a, b = matmul_operands(64, 4096, 4096, False, torch.bfloat16)
    with pytest.raises(RuntimeError, match=name):
        lib.matmul(a, b)
