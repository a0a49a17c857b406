"""The wgmma matmul's stream-K schedule (WB_WGMMA_SCHEDULE=streamk, read at each call): the
whole-k route runs wgmma_streamk_kernel where c has at least two waves of tiles and not a whole
number of them; the partial wave and one whole wave before it are shared out as equal runs of k
steps, and a tile cut between two runs is summed in k order through a float32 workspace
(kernels/matmul/wgmma_streamk.cuh; the launcher's schedule_choice and streamk_blocks in
matmul_wgmma.cu). Off by default: the whole-k kernel keeps its whole tiles.

Without a GPU: the stream-K kernels (two dtypes, two layouts of b) compile for sm_90a without
spills, each with its flags' release and acquire at GPU scope, and the whole-k kernel holds none of
that code (its own instantiation, not a branch); the launcher compiles.
On a Hopper GPU (marked cuda): the switch runs the kernel it names on the shapes it applies to
and the whole-k kernel on the others (with the default's bits); the stream-K c matches the
float64 product and torch.mm at m, n and k tails, both layouts of b and both dtypes; the same bits
every call; a CUDA graph replays it; two streams run it at once; a bad value is refused by name.
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
    cuda_kernels_run,
    hopper,
    matmul_operands,
    nvcc_sm90a,
)
from workbench.project import BUNDLED_KERNELS

DTYPES = [torch.bfloat16, torch.float16]
MAPS = "const __grid_constant__ wb::matmul::TensorMap"
# The plain build's tile: 128 x 256.
BM, BN = 128, 256


def _instances(folder: Path) -> Path:
    """The device-only TU with the stream-K and whole-k kernels instantiated (both dtypes, both
    layouts of b), as the workbench names them to NVRTC."""
    lines = [f'#include "{WGMMA}"']
    for t in ("bf16", "f16"):
        for kmajor in ("true", "false"):
            lines.append(
                f"template __global__ void wb::matmul::wgmma_streamk_kernel<wb::{t}, {kmajor}>("
                f"{MAPS}, {MAPS}, wb::{t}*, float*, int, int, int);"
            )
            lines.append(
                f"template __global__ void wb::matmul::wgmma_kernel<wb::{t}, {kmajor}>("
                f"{MAPS}, {MAPS}, wb::{t}*, int, int, int);"
            )
    path = folder / "streamk_instances.cu"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.nvcc
def test_the_streamk_kernel_compiles_for_sm90a_without_spills(tmp_path: Path) -> None:
    source = _instances(tmp_path)
    done = nvcc_sm90a(tmp_path, "--ptx", "-o", "streamk.ptx", source=source)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", (tmp_path / "streamk.ptx").read_text())[1:]
    streamk = [e for e in entries if e.startswith("_ZN2wb6matmul20wgmma_streamk_kernel")]
    whole = [e for e in entries if e.startswith("_ZN2wb6matmul12wgmma_kernel")]
    assert len(streamk) == 4 and len(whole) == 4
    for entry in streamk:
        assert ".maxntid 384, 1, 1" in entry
        assert "wgmma.mma_async.sync.aligned.m64n256k16" in entry
        assert "%gridid" in entry  # the launch's token
        assert "st.release.gpu.global.u64" in entry and "ld.acquire.gpu.global.u64" in entry
        assert "ld.global.cg.v4.f32" in entry  # the later pieces' sums, read from L2
    for entry in whole:  # none of the stream-K code in the whole-k kernel
        assert "%gridid" not in entry and ".gpu.global" not in entry and "nanosleep" not in entry
    done = nvcc_sm90a(tmp_path, "-cubin", "-Xptxas", "-v", "-o", "streamk.cubin", source=source)
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == 8 and all(s == ("0", "0") for s in spills), done.stderr


@pytest.mark.nvcc
def test_the_launcher_compiles(tmp_path: Path) -> None:
    source = BUNDLED_KERNELS / "matmul" / "matmul_wgmma.cu"
    done = nvcc_sm90a(tmp_path, "-c", "-o", "matmul_wgmma.o", source=source)
    assert done.returncode == 0, done.stderr


# --- on a Hopper GPU ------------------------------------------------------------------------


def _sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _takes_streamk(m: int, n: int) -> bool:
    """The launcher's rule (streamk_blocks): two waves of tiles or more, not a whole number."""
    tiles, sms = -(-m // BM) * -(-n // BN), _sms()
    return tiles >= 2 * sms and tiles % sms != 0


# (m, n, k, b column-major), each with at least two waves of 128 x 256 tiles on 132 SMs and a
# partial one: 4096^2 (512 tiles, 3.88 waves); m, n and k tails (3000 x 3000: 288 tiles, k 39
# steps and 4 past); n odd (the epilogue stores from registers) with a k of 12.1 steps; a k of
# three steps (pieces of one step); a 16-step k on 289 tiles.
SHAPES = [
    (4096, 4096, 4096, False),
    (3000, 3000, 2500, True),
    (3100, 3001, 776, True),
    (2304, 4096, 136, False),
    (2056, 4104, 1000, False),
]


def _streamk(monkeypatch: pytest.MonkeyPatch) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    monkeypatch.setenv("WB_WGMMA_SCHEDULE", "streamk")


def _within_tolerance(lib: Any, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """The family's bound against the float64 product."""
    ref = a.double() @ b.double()
    rtol, atol = lib.specs["matmul"].tolerances[got.dtype]
    bound = atol * max(1.0, ref.abs().max().item()) + rtol * ref.abs()
    worst = ((got.double() - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"{tuple(a.shape)} @ {tuple(b.shape)} {got.dtype}: err/tol {worst:.2f}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k", "col"), SHAPES)
def test_the_streamk_schedule_is_right(
    lib: Any, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, col: bool, dtype: Any
) -> None:
    _streamk(monkeypatch)
    a, b = matmul_operands(m, n, k, col, dtype)
    assert ("wgmma_streamk_kernel" in cuda_kernels_run(lambda: lib.matmul(a, b))) == (
        _takes_streamk(m, n)
    )
    got = lib.matmul(a, b)
    _within_tolerance(lib, got, a, b)
    torch.testing.assert_close(got.float(), torch.mm(a, b).float(), rtol=2e-2, atol=0.5)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_same_bits_every_call(lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: Any) -> None:
    """The pieces of a tile are added in k order, whichever block finishes first."""
    _streamk(monkeypatch)
    for shape in SHAPES[:3]:
        a, b = matmul_operands(*shape, dtype)
        first = lib.matmul(a, b)
        for _ in range(3):
            again = lib.matmul(a, b)
            assert torch.equal(first.view(torch.int16), again.view(torch.int16)), shape


@pytest.mark.cuda
def test_shapes_it_does_not_apply_to_keep_the_whole_k_kernel(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer than two waves of tiles (1.94 on 132 SMs), or a whole number of waves (two, on this
    GPU's SMs): the whole-k kernel, with the default's bits. A c of fewer tiles than SMs keeps
    its own route (split-k or narrow)."""
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    whole_k = [(4096, 2048, 1024, True), (BM * _sms(), 2 * BN, 1024, False)]
    shapes = [*whole_k, (1000, 1032, 520, False)]
    default = [lib.matmul(*matmul_operands(*shape)) for shape in shapes]
    monkeypatch.setenv("WB_WGMMA_SCHEDULE", "streamk")
    for shape, expected in zip(shapes, default, strict=True):
        assert not _takes_streamk(shape[0], shape[1])
        a, b = matmul_operands(*shape)
        names = cuda_kernels_run(lambda a=a, b=b: lib.matmul(a, b))
        assert "wgmma_streamk_kernel" not in names, shape
        assert ("wgmma_kernel" in names) == (shape in whole_k), shape
        assert torch.equal(lib.matmul(a, b).view(torch.int16), expected.view(torch.int16)), shape
    monkeypatch.setenv("WB_WGMMA_SCHEDULE", "tiles")  # the default, by name
    a, b = matmul_operands(*SHAPES[0])
    assert "wgmma_streamk_kernel" not in cuda_kernels_run(lambda: lib.matmul(a, b))


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
def test_a_cuda_graph_replays_the_streamk_schedule(
    lib: Any, monkeypatch: pytest.MonkeyPatch, col: bool
) -> None:
    """The flags a launch waits on are lowered by their waiters: each replay finds them as the
    eager calls do."""
    _streamk(monkeypatch)
    assert_matmul_graph_replays(lib, *matmul_operands(3000, 3000, 2500, col))


@pytest.mark.cuda
def test_two_streams_at_once(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stream-K calls overlapping on two streams, each with its own workspace: each its c."""
    _streamk(monkeypatch)
    ops = [matmul_operands(3000, 3000, 2500, True), matmul_operands(4096, 4096, 1024, False)]
    expected = [lib.matmul(*o) for o in ops]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    got: list[list[torch.Tensor]] = [[], []]
    for _ in range(4):
        for i, (s, o) in enumerate(zip(streams, ops, strict=True)):
            with torch.cuda.stream(s):
                got[i].append(lib.matmul(*o))
    torch.cuda.synchronize()
    for i in range(2):
        for c in got[i]:
            assert torch.equal(c.view(torch.int16), expected[i].view(torch.int16))


@pytest.mark.cuda
def test_a_bad_schedule_is_refused_by_name(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a, b = matmul_operands(256, 256, 256, False)
    monkeypatch.setenv("WB_WGMMA_SCHEDULE", "fast")
    with pytest.raises(RuntimeError, match="WB_WGMMA_SCHEDULE"):
        lib.matmul(a, b)
    monkeypatch.setenv("WB_WGMMA_SCHEDULE", "streamk")
    monkeypatch.setenv("WB_WGMMA_CLUSTER", "2")  # stream-K runs without clusters
    with pytest.raises(RuntimeError, match="WB_WGMMA_CLUSTER"):
        lib.matmul(a, b)
