"""The wgmma matmul's split-k route (issue 37): a c of few tiles (a short a: m = 1 .. 200 against
n = 4096) splits k across blocks on a 64 x 256 tile, each slice's float32 partial sums summed in
slice order into c (kernels/matmul/matmul_wgmma.cu).

Without a GPU: the split kernel compiles for sm_90a beside the tuned tile's, without spills.
On a Hopper GPU (marked cuda): the default route takes it, right against a float64 product
within the family's tolerance for bfloat16 and float16, k tails included; the same bits every
call; and a CUDA graph replays it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import toolchain
from workbench.config import cuda_flags
from workbench.project import BUNDLED_KERNELS, WB_KERNEL_INCLUDE

WGMMA = BUNDLED_KERNELS / "matmul" / "matmul_wgmma.kernel.cu"
DTYPES = [torch.bfloat16, torch.float16]
# (n, k): whole k tiles; n a tile and a bit (a partial tile of columns); k tails (not a multiple
# of the 64-long k step, and slices of unequal length); a small c with a short k.
SIZES = [(4096, 4096), (4104, 8192), (4096, 4136), (1032, 2056)]
ROWS = [1, 16, 64, 128, 200]


def _instantiated(folder: Path) -> Path:
    """The device-only TU with both kernel templates instantiated for each dtype and layout of b
    (the workbench names them to NVRTC; nvcc compiles only what a TU instantiates)."""
    maps = "const __grid_constant__ wb::matmul::TensorMap"
    lines = [f'#include "{WGMMA}"']
    for t in ("f16", "bf16"):
        for kmajor in ("true", "false"):
            lines.append(
                f"template __global__ void wb::matmul::wgmma_kernel<wb::{t}, {kmajor}>("
                f"{maps}, {maps}, wb::{t}*, int, int, int);"
            )
            lines.append(
                f"template __global__ void wb::matmul::wgmma_split_kernel<wb::{t}, {kmajor}>("
                f"{maps}, {maps}, float*, int, int, int, int);"
            )
    path = folder / "wgmma_instances.cu"
    path.write_text("\n".join(lines) + "\n")
    return path


def _nvcc(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = toolchain.find_cuda_home()
    assert home is not None
    nvcc = home / "bin" / "nvcc"
    cmd = [
        str(nvcc),
        *cuda_flags(toolchain.compiler_version(nvcc)),
        "-gencode=arch=compute_90a,code=sm_90a",
        f"-I{WB_KERNEL_INCLUDE}",
        f"-I{BUNDLED_KERNELS}",
        *args,
        str(_instantiated(folder)),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.nvcc
def test_the_split_kernel_compiles_for_sm90a_without_spills(tmp_path: Path) -> None:
    """Eight kernels (two templates, two dtypes, two layouts of b); the split ones on the 64 x 256
    tile (256 threads, wgmma m64n256k16, 5 stages of mbarriers), none spilling."""
    ptx = tmp_path / "wgmma.ptx"
    done = _nvcc(tmp_path, "--ptx", "-o", str(ptx))
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", ptx.read_text())[1:]
    split = [e for e in entries if e.startswith("_ZN2wb6matmul18wgmma_split_kernel")]
    assert len(entries) == 8 and len(split) == 4
    for kernel in split:
        assert ".maxntid 256, 1, 1" in kernel
        assert "wgmma.mma_async.sync.aligned.m64n256k16" in kernel
        assert re.search(r"E4full\[40\];", kernel)  # 5 stages
        assert "setmaxnreg.dec.sync.aligned.u32 40;" in kernel  # the producer's share
    done = _nvcc(tmp_path, "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "wgmma.cubin"))
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == 8 and all(s == ("0", "0") for s in spills), done.stderr


# --- on a Hopper GPU ------------------------------------------------------------------------


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _within_tolerance(lib: Any, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """The family's bound (workbench.verify.oracle): atol * max(1, max|ref|) + rtol * |ref|,
    against the float64 product."""
    ref = a.double() @ b.double()
    rtol, atol = lib.specs["matmul"].tolerances[got.dtype]
    bound = atol * max(1.0, ref.abs().max().item()) + rtol * ref.abs()
    err = (got.double() - ref).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{tuple(a.shape)} @ {tuple(b.shape)} {got.dtype}: err/tol {worst:.2f}"


def _kernels_run(fn: Any) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), SIZES)
@pytest.mark.parametrize("m", ROWS)
def test_a_short_a_is_right(lib: Any, m: int, n: int, k: int, dtype: torch.dtype) -> None:
    """b row-major and column-major (x @ w.t()), through the default route."""
    if not _hopper():
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
    if not _hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a = torch.randn(15, 4096, device="cuda", dtype=dtype)
    w = torch.randn(1001, 4096, device="cuda", dtype=dtype)
    assert "wgmma_split_kernel" in _kernels_run(lambda: lib.matmul(a, w.t()))
    _within_tolerance(lib, lib.matmul(a, w.t()), a, w.t())


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_the_default_route_splits_a_short_a(lib: Any, m: int) -> None:
    """m x 4096 x 4096 is at most 32 tiles of 64 x 256: the split kernel and the sum run, and
    forcing the wgmma path (matmul_path 3) takes the same route."""
    if not _hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    names = _kernels_run(lambda: lib.matmul(a, b))
    assert "wgmma_split_kernel" in names and "sum_slices_kernel" in names, names
    assert "wgmma_split_kernel" in _kernels_run(lambda: lib.matmul_path(a, b, 3))
    # A c of many tiles keeps the built tile whole.
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    names = _kernels_run(lambda: lib.matmul(big, b))
    assert "wgmma_kernel" in names and "wgmma_split_kernel" not in names, names


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_split_route_gives_the_same_bits_every_call(lib: Any, dtype: torch.dtype) -> None:
    """The slices are summed in slice order, not by atomics: two calls agree bit for bit."""
    if not _hopper():
        pytest.skip("the wgmma path runs on sm_90")
    for m, (n, k) in [(16, (4096, 4096)), (200, (4096, 4136)), (1, (4104, 8192))]:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        first, second = lib.matmul(a, b), lib.matmul(a, b)
        assert torch.equal(first.view(torch.int16), second.view(torch.int16)), (m, n, k)


@pytest.mark.cuda
def test_a_cuda_graph_replays_the_split_route(lib: Any) -> None:
    """Captured once (its workspace from the graph's pool), replayed on new values of a: the
    replay's c is the eager call's, bit for bit."""
    if not _hopper():
        pytest.skip("the wgmma path runs on sm_90")
    a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    lib.matmul(a, b)  # loads the modules before the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lib.matmul(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = lib.matmul(a, b)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        expected = lib.matmul(a, b)
        assert torch.equal(c.view(torch.int16), expected.view(torch.int16))
