"""The matmul family's tuning space (issue 17): the Hopper path's tile, declared in
kernels/matmul/spec.py and read by matmul_wgmma.kernel.cu as WB_TUNE_<NAME> macros.

No GPU: the space against the kernel's source (its #ifndef defaults and its limits, parsed so
the two cannot drift apart), and one point compiled to PTX to show it reaches the kernel.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import types
from pathlib import Path

import pytest

from tests.bundled_cubin import whole_k_instances, whole_k_line
from workbench import toolchain
from workbench.config import cuda_flags
from workbench.project import BUNDLED_KERNELS, WB_KERNEL_INCLUDE
from workbench.tuning.space import MACRO_PREFIX, TuneSpace, defines, space_of

FAMILY = BUNDLED_KERNELS / "matmul"
WGMMA = FAMILY / "matmul_wgmma.kernel.cu"


def _spec() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("matmul_spec_under_test", FAMILY / "spec.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _space() -> TuneSpace:
    space = space_of(SPEC)
    assert space is not None, "kernels/matmul/spec.py declares no TUNE"
    return space


SPEC = _spec()
SPACE = _space()


def _ifndef_defaults(text: str) -> dict[str, int]:
    """{NAME: value} of each `#ifndef WB_TUNE_NAME / #define WB_TUNE_NAME value` in a source."""
    pattern = rf"#ifndef {MACRO_PREFIX}(\w+)\s*\n#define {MACRO_PREFIX}(\w+) (-?\d+)"
    found = {}
    for name, again, value in re.findall(pattern, text):
        assert name == again, f"#ifndef {name} defines {again}"
        found[name] = int(value)
    return found


def _kernel_constant(name: str) -> int:
    """A `constexpr int name = a * b;` of wgmma_module.cuh (the limits both wgmma modules' kernels
    are built within), evaluated."""
    text = (WGMMA.parent / "wgmma_module.cuh").read_text()
    (expr,) = re.findall(rf"constexpr int {name} = ([0-9 *]+);", text)
    value = 1
    for factor in expr.split("*"):
        value *= int(factor)
    return value


def test_the_space_is_a_tune_space_of_about_sixteen_points() -> None:
    points = SPACE.points()
    assert 12 <= len(points) <= 16, points  # each point rebuilds the family: keep it small
    assert defines(SPACE.default) == (
        "-DWB_TUNE_BLOCKS=1",
        "-DWB_TUNE_BN=256",
        "-DWB_TUNE_CONSUMERS=2",
        "-DWB_TUNE_STAGES=4",
    )


def test_the_default_point_is_the_kernels_plain_build() -> None:
    """The #ifndef defaults of matmul_wgmma.kernel.cu are the space's default, name for name, and no
    other matmul source reads a WB_TUNE_ macro that the space does not set."""
    assert _ifndef_defaults(WGMMA.read_text()) == SPACE.default
    for source in sorted(FAMILY.glob("*.c*")) + sorted(FAMILY.glob("*.h")):
        used = set(re.findall(rf"\b{MACRO_PREFIX}(\w+)", source.read_text()))
        assert used <= set(SPACE.params), (source.name, used - set(SPACE.params))


def test_every_point_fits_the_kernels_limits() -> None:
    """Shared memory and registers as WgmmaTile computes them, with the kernel's own limits."""
    per_block, per_sm = _kernel_constant("kSmemPerBlock"), _kernel_constant("kSmemPerSm")
    reserved, regs_per_sm = _kernel_constant("kSmemReserved"), _kernel_constant("kRegsPerSm")
    assert (per_block, per_sm, reserved, regs_per_sm) == (232448, 233472, 1024, 65536)
    for p in SPACE.points():
        bm, threads = 64 * p["CONSUMERS"], 128 * (1 + p["CONSUMERS"])
        smem = p["STAGES"] * (bm + p["BN"]) * 128 + 1024  # kSmemBytes
        assert SPEC.wgmma_smem_bytes(p) == smem
        block = smem + 16 * p["STAGES"]  # + the full and empty mbarriers
        assert block <= per_block, p
        assert p["BLOCKS"] * (block + reserved) <= per_sm, p
        entry = min(regs_per_sm // (threads * p["BLOCKS"]) // 8 * 8, 255)  # kEntryRegs
        assert SPEC.wgmma_entry_regs(p) == entry
        assert entry >= p["BN"] // 2 + 32, p  # the consumer's accumulators and addresses
    # What the limits prune: one stage more than the default does not fit a block.
    assert {**SPACE.default, "STAGES": 5} not in SPACE.points()


def _instantiated(folder: Path) -> Path:
    """The device-only TU with the four kernels the launcher names instantiated (NVRTC gets
    them as name expressions; nvcc compiles only what a TU instantiates)."""
    lines = [
        whole_k_line("wgmma_kernel", (t, kmajor))
        for t in ("f16", "bf16")
        for kmajor in ("true", "false")
    ]
    return whole_k_instances(folder, "wgmma_instances.cu", lines)


def _nvcc_ptx(point: dict, out: Path) -> subprocess.CompletedProcess[str]:
    home = toolchain.find_cuda_home()
    assert home is not None
    nvcc = home / "bin" / "nvcc"
    version = toolchain.compiler_version(nvcc)
    cmd = [
        str(nvcc),
        *cuda_flags(version),
        "-arch=sm_90a",
        "--ptx",
        *defines(point),
        f"-I{WB_KERNEL_INCLUDE}",
        f"-I{BUNDLED_KERNELS}",
        str(_instantiated(out.parent)),
        "-o",
        str(out),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.nvcc
def test_a_point_reaches_the_kernel(tmp_path: Path) -> None:
    """64 x 128 tiles, one consumer, 3 stages, 2 blocks an SM, in the PTX of each kernel."""
    point = {"BN": 128, "CONSUMERS": 1, "STAGES": 3, "BLOCKS": 2}
    assert point in SPACE.points() and point != SPACE.default
    ptx = tmp_path / "wgmma.ptx"
    done = _nvcc_ptx(point, ptx)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", ptx.read_text())[1:]
    assert len(entries) == 4  # float16 and bfloat16, b n-major and k-major
    for kernel in entries:
        assert ".maxntid 256, 1, 1" in kernel  # 128 * (1 + CONSUMERS) threads
        assert ".minnctapersm 2" in kernel  # BLOCKS
        assert "wgmma.mma_async.sync.aligned.m64n128k16" in kernel  # BN
        assert re.search(r"E4full\[24\];", kernel)  # STAGES mbarriers of 8 bytes
        # The register split: 128 at entry; the producer gives back 104, the consumer takes them.
        assert "setmaxnreg.dec.sync.aligned.u32 24;" in kernel
        assert "setmaxnreg.inc.sync.aligned.u32 232;" in kernel


@pytest.mark.nvcc
def test_a_point_the_space_prunes_stops_the_compile(tmp_path: Path) -> None:
    """The default tile with 5 stages (241 KiB): the kernel's static_assert names the limit."""
    done = _nvcc_ptx({**SPACE.default, "STAGES": 5}, tmp_path / "wgmma.ptx")
    assert done.returncode != 0
    assert "exceed a block's 227 KiB" in done.stderr
