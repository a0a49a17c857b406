"""The mma.sync path (``kernels/matmul/matmul_mma.cu``): on every arch that runs it (sm_80, sm_86,
sm_89; sm_90 when forced) nvcc compiles its kernels without spills, in registers that leave room
for two blocks an SM (a batch's kernels too), and the ring of shared-memory stages the launcher
picks there fits two blocks too. On a GPU: path 2 against torch on shapes that are not multiples
of its tile.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import compile_cubin
from workbench import cubin
from workbench.project import BUNDLED_KERNELS

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")
SOURCE = BUNDLED_KERNELS / "matmul" / "matmul_mma.cu"
BLOCKS_PER_SM = 2  # MmaTile::kBlocksPerSm
# MmaTile<BM, BN, BK, WM, WN, STAGES> as cubin.short_name reads it, and the kernel's Batch.
TILE = re.compile(r"MmaTile<(\d+), (\d+), (\d+), (\d+), (\d+), (\d+)>, (true|false)")


def ring_bytes(tile: tuple[int, ...]) -> int:
    """MmaTile::kSmemBytes: STAGES stages of a's BM x BK and b's BK x BN 2-byte elements."""
    bm, bn, bk, _, _, stages = tile
    return stages * (bm * bk + bk * bn) * 2


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_the_mma_kernels_fit_two_blocks_an_sm_without_spills(tmp_path: Path, arch: str) -> None:
    kernels = compile_cubin(tmp_path, SOURCE, arch)
    tiles: dict[tuple[int, ...], list[cubin.Kernel]] = {}
    batch: dict[tuple[int, ...], list[cubin.Kernel]] = {}  # matmul_mma_batched's kernels
    for k in kernels.values():
        found = TILE.search(cubin.short_name(k.name))
        assert found, cubin.short_name(k.name)
        into = batch if found.group(7) == "true" else tiles
        into.setdefault(tuple(int(g) for g in found.groups()[:6]), []).append(k)
    # float16 and bfloat16 of each; a batch runs the one-matrix tiles and a 64 x 64 one
    assert tiles and all(len(ks) == 2 for ks in (*tiles.values(), *batch.values()))
    assert set(batch) - set(tiles) == {(64, 64, 32, 2, 2, 4)} and set(tiles) < set(batch)
    for tile, ks in (*tiles.items(), *batch.items()):
        threads = 32 * tile[3] * tile[4]
        for k in ks:
            shown = f"{cubin.short_name(k.name)} [{arch}]: {k.registers} registers"
            assert k.spills == 0 and k.frame == 0, f"{shown}, {k.spills} bytes spilled"
            assert k.launch_bound == threads, shown
            by_registers = cubin.occupancy(arch, k.registers, 0, threads)
            assert by_registers.blocks >= BLOCKS_PER_SM, f"{shown}: {by_registers}"
    # The launcher's ring for one matrix: the deepest whose two blocks fit this arch's SM (4
    # stages on sm_80 and sm_90, 3 on the 100 KiB SMs of sm_86 and sm_89).
    fits = [
        t
        for t in tiles
        if cubin.occupancy(arch, 0, ring_bytes(t), 32 * t[3] * t[4]).blocks >= BLOCKS_PER_SM
    ]
    deepest = max(fits, key=lambda t: t[5])
    assert deepest[5] == (3 if arch in ("sm_86", "sm_89") else 4), tiles.keys()


# m, n, k: one element of a tile; partial tiles in every dimension (k not a multiple of 32); the
# timed size; a wide n with a partial column tile and a k of partial steps.
SHAPES = [(1, 8, 8), (127, 136, 72), (4096, 4096, 4096), (333, 4104, 1000)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_path_2_matches_torch_on_partial_tiles(
    lib: Any, dtype: torch.dtype, shape: tuple[int, int, int]
) -> None:
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the mma path needs sm_80")
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
    got = lib.matmul_path(a, b, 2)
    ref = (a.float() @ b.float()).to(dtype)
    # float32 sums in another order, each rounded once: within two ulps of the dtype.
    torch.testing.assert_close(got, ref, rtol=8e-3, atol=1e-3 * ref.abs().max().item())
