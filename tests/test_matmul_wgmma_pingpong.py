"""The wgmma matmul's ping-pong schedule (issue 37), WB_WGMMA_SCHEDULE=pingpong, read by the
launcher at each call (kernels/matmul/matmul_wgmma.cu, schedule_choice): each consumer warpgroup
of the whole-k kernel computes a 128 x 128 tile of its own, the two taking the block's tiles in
turn, so that one's epilogue runs under the other's MMAs (matmul_wgmma.kernel.cu,
wgmma_pingpong_units). The default (unset, or =cooperative) is the 128 x 256 tile both consumers
share; other values, and pingpong with WB_WGMMA_CLUSTER=2, are refused by name.

Without a GPU: the kernel compiles for sm_90a (both dtypes, both layouts of b) without spills,
with its two m64n128k16 a k16 and its order barrier. On a Hopper GPU (marked cuda): right against
torch.mm at the whole-k shapes and their tails (m, n, k past a tile, n odd where c is stored from
registers), with b either way, and replayed in a CUDA graph.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import (
    WGMMA,
    assert_matmul_graph_replays,
    hopper,
    matmul_operands,
    nvcc_sm90a,
)

# (m, n, k): every one has at least as many 128 x 256 tiles as an H100 has SMs (132), so the
# launcher takes the whole-k route that the schedule applies to.
SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 1024),
    (3000, 2500, 1000),  # m, n and k tails
    (1000, 4100, 4100),  # k 4 past a step, n 4 past a tile
    (200, 17000, 520),  # m = 200: the second 128-row tile mostly past m
    (5000, 1001, 600),  # n odd: stored from registers
]


@pytest.mark.nvcc
def test_the_pingpong_kernel_compiles_for_sm90a_without_spills(tmp_path: Path) -> None:
    maps = "const __grid_constant__ wb::matmul::TensorMap"
    lines = [f'#include "{WGMMA}"']
    for t in ("bf16", "f16"):
        for kmajor in ("true", "false"):
            lines.append(
                f"template __global__ void wb::matmul::wgmma_pingpong_kernel<wb::{t}, {kmajor}>("
                f"{maps}, {maps}, wb::{t}*, int, int, int);"
            )
    source = tmp_path / "pingpong.cu"
    source.write_text("\n".join(lines) + "\n")
    ptx = tmp_path / "pingpong.ptx"
    done = nvcc_sm90a(tmp_path, "--ptx", "-o", str(ptx), source=source)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", ptx.read_text())[1:]
    assert len(entries) == 4
    for entry in entries:
        # two m64 halves x 4 k16 a stage, none of the cooperative kernel's n256
        assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16", entry)) == 8
        assert "m64n256k16" not in entry
        assert "bar.arrive" in entry  # the order barrier between the consumers
        assert "setmaxnreg.inc.sync.aligned.u32 232;" in entry
        assert "st.global.v4.u32" in entry  # the staged epilogue
    cubin = tmp_path / "pingpong.cubin"
    done = nvcc_sm90a(tmp_path, "-cubin", "-Xptxas", "-v", "-o", str(cubin), source=source)
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == 4 and all(s == ("0", "0") for s in spills), done.stderr


# --- on a Hopper GPU ------------------------------------------------------------------------


def within_tolerance(lib: Any, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """got against a float64 truth, within the matmul family's bound (as tests/test_matmul*.py)."""
    ref = a.double() @ b.double()
    rtol, atol = lib.specs["matmul"].tolerances[got.dtype]
    bound = atol * max(1.0, ref.abs().max().item()) + rtol * ref.abs()
    worst = ((got.double() - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"{tuple(a.shape)} @ {tuple(b.shape)}: err/tol {worst:.2f}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_pingpong_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, col: bool, dtype: Any
) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(m, n, k, col, dtype)
    monkeypatch.setenv("WB_WGMMA_SCHEDULE", "pingpong")
    got = lib.matmul(a, b)
    within_tolerance(lib, got, a, b)
    torch.testing.assert_close(got.float(), torch.mm(a, b).float(), rtol=2e-2, atol=0.5)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "env",
    [
        {"WB_WGMMA_SCHEDULE": "fast"},
        {"WB_WGMMA_SCHEDULE": "pingpong", "WB_WGMMA_CLUSTER": "2"},
    ],
)
def test_a_bad_schedule_is_refused_by_name(
    lib: Any, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    a, b = matmul_operands(4096, 4096, 256, False)
    with pytest.raises(RuntimeError, match="WB_WGMMA_SCHEDULE"):
        lib.matmul(a, b)


@pytest.mark.cuda
def test_cooperative_is_the_default(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(4096, 4096, 1024, False)
    default = lib.matmul(a, b)
    monkeypatch.setenv("WB_WGMMA_SCHEDULE", "cooperative")
    assert torch.equal(default.view(torch.int16), lib.matmul(a, b).view(torch.int16))


@pytest.mark.cuda
def test_a_cuda_graph_replays_pingpong(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    monkeypatch.setenv("WB_WGMMA_SCHEDULE", "pingpong")
    assert_matmul_graph_replays(lib, *matmul_operands(3000, 2500, 1000, False))
