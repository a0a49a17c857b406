"""A bundled kernel TU compiled to a cubin with the build's CUDA flags (no GPU needed): its
kernels as :mod:`workbench.cubin` reads them, with the spills ptxas reported; and the wgmma
matmul's device-only TU compiled by nvcc with its kernel templates instantiated."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from workbench import cubin, toolchain
from workbench.config import CUDA_FLAGS, cuda_flags
from workbench.project import BUNDLED_KERNELS, WB_KERNEL_INCLUDE

WGMMA = BUNDLED_KERNELS / "matmul" / "matmul_wgmma.kernel.cu"


def compile_cubin(tmp: Path, source: Path, arch: str) -> dict[str, cubin.Kernel]:
    """The kernels of ``source`` (a TU of the bundled kernels) compiled for ``arch``."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = tmp / f"{source.stem}.{arch}.cubin"
    includes = [f"-I{BUNDLED_KERNELS}", f"-I{BUNDLED_KERNELS / 'include'}"]
    cmd = [nvcc, "-cubin", f"-arch={arch}", *CUDA_FLAGS, *includes, "-Xptxas", "-v"]
    done = subprocess.run([*cmd, "-o", str(out), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return cubin.with_spills(cubin.read(out.read_bytes(), arch), done.stderr)


def wgmma_instances(folder: Path, dtypes: tuple[str, ...], cluster: bool) -> Path:
    """The wgmma TU with its whole-k and split-k kernels instantiated for each of ``dtypes``
    (wb:: type names) and layout of b, and with ``cluster`` the cluster-sum kernels on both tiles
    (the workbench names them to NVRTC; nvcc compiles only what a TU instantiates)."""
    maps = "const __grid_constant__ wb::matmul::TensorMap"
    lines = [f'#include "{WGMMA}"']
    for t in dtypes:
        for kmajor in ("true", "false"):
            lines.append(
                f"template __global__ void wb::matmul::wgmma_kernel<wb::{t}, {kmajor}>("
                f"{maps}, {maps}, wb::{t}*, int, int, int);"
            )
            lines.append(
                f"template __global__ void wb::matmul::wgmma_split_kernel<wb::{t}, {kmajor}>("
                f"{maps}, {maps}, float*, int, int, int, int);"
            )
            for wide in ("true", "false") if cluster else ():
                lines.append(
                    "template __global__ void "
                    f"wb::matmul::wgmma_cluster_split_kernel<wb::{t}, {kmajor}, {wide}>("
                    f"{maps}, {maps}, wb::{t}*, int, int, int);"
                )
    path = folder / "wgmma_instances.cu"
    path.write_text("\n".join(lines) + "\n")
    return path


def nvcc_wgmma(
    folder: Path, *args: str, dtypes: tuple[str, ...] = ("bf16",), cluster: bool = False
) -> subprocess.CompletedProcess[str]:
    """nvcc with the build's flags for sm_90a on :func:`wgmma_instances`, and ``args``."""
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
        str(wgmma_instances(folder, dtypes, cluster)),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def host_program(folder: Path, source: str) -> Path:
    """``source`` (a main() over the bundled kernels' host-side headers) built by nvcc into
    ``folder``; it calls no CUDA API, so it runs without a GPU."""
    from workbench import knobs

    (folder / "main.cu").write_text(source)
    home = knobs.cuda_home()
    nvcc = str(Path(home) / "bin" / "nvcc") if home else shutil.which("nvcc") or "nvcc"
    includes = [f"-I{BUNDLED_KERNELS / 'include'}", f"-I{BUNDLED_KERNELS}"]
    subprocess.run(
        [nvcc, "-std=c++17", *includes, "main.cu", "-o", "main"],
        cwd=folder, check=True, capture_output=True,
    )  # fmt: skip
    return folder / "main"
