"""A bundled kernel TU compiled to a cubin with the build's CUDA flags (no GPU needed): its
kernels as :mod:`workbench.cubin` reads them, with the spills ptxas reported."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from workbench import cubin
from workbench.config import CUDA_FLAGS
from workbench.project import BUNDLED_KERNELS


def compile_cubin(tmp: Path, source: Path, arch: str) -> dict[str, cubin.Kernel]:
    """The kernels of ``source`` (a TU of the bundled kernels) compiled for ``arch``."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = tmp / f"{source.stem}.{arch}.cubin"
    includes = [f"-I{BUNDLED_KERNELS}", f"-I{BUNDLED_KERNELS / 'include'}"]
    cmd = [nvcc, "-cubin", f"-arch={arch}", *CUDA_FLAGS, *includes, "-Xptxas", "-v"]
    done = subprocess.run([*cmd, "-o", str(out), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return cubin.with_spills(cubin.read(out.read_bytes(), arch), done.stderr)
