"""The wgmma matmul's four kernels compiled four ways, for one arch: NVRTC against nvcc.

- NVRTC, one program per kernel, side by side (what ``workbench.device`` does);
- NVRTC, one program of all four;
- ``nvcc -cubin`` of the same kernels (the build's CUDA flags, nvcc's own split compile);
- ``nvcc -c`` of the kernels and their host launcher in one TU (the family before its kernels
  moved into a device-only TU).

Each run compiles new programs (a -D option the kernels do not read); run it with
``CUDA_CACHE_DISABLE=1`` where the driver's compute cache would hand NVRTC an earlier cubin.
Prints a markdown table. Needs NVRTC and nvcc, no GPU.

Usage: CUDA_CACHE_DISABLE=1 python -m bench wgmma_compile [--arch sm_90a] [--repeats 3]
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import environment, markdown_table, nvcc, parser, run
from bench.tune_compile import NAMES, nvcc_tu
from workbench import device, nvrtc, toolchain
from workbench.config import cuda_flags
from workbench.project import BUNDLED_KERNELS, WB_KERNEL_INCLUDE


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    exe = nvcc()
    flags = list(cuda_flags(toolchain.compiler_version(exe)))
    src = BUNDLED_KERNELS / "matmul" / "matmul_wgmma.kernel.cu"
    names = [f"wb::matmul::wgmma_kernel<wb::{t},{k}>" for t, k in NAMES]
    opts = [*device.NVRTC_FLAGS, f"-I{WB_KERNEL_INCLUDE}", f"-I{BUNDLED_KERNELS}"]
    inc = [f"-I{WB_KERNEL_INCLUDE}", f"-I{BUNDLED_KERNELS}"]
    arch = [*toolchain.gencode_flags((args.arch,))]
    rows: dict[str, list[float]] = {
        "NVRTC, one program per kernel, side by side": [],
        "NVRTC, one program of all four": [],
        "nvcc -cubin of the same kernels": [],
        "nvcc -c of the kernels and their launcher in one TU": [],
    }
    with tempfile.TemporaryDirectory(prefix="wb-wgmma-compile-") as tmp:
        combined = nvcc_tu(Path(tmp), BUNDLED_KERNELS)
        kernels_only = Path(tmp) / "kernels_only.cu"  # the same TU without its launcher
        kernels_only.write_text("\n".join(combined.read_text().splitlines()[:-1]) + "\n")
        device_flags = [f for f in flags if not f.startswith("-Xcompiler")]
        for r in range(args.repeats):
            new = [f"-DWB_BENCH_RUN={r}"]
            start = time.perf_counter()
            with ThreadPoolExecutor(len(names)) as pool:
                list(pool.map(lambda n, o=opts + new: nvrtc.compile(src, args.arch, [n], o), names))
            rows["NVRTC, one program per kernel, side by side"].append(time.perf_counter() - start)
            new = [f"-DWB_BENCH_RUN={r + args.repeats}"]
            start = time.perf_counter()
            nvrtc.compile(src, args.arch, names, opts + new)
            rows["NVRTC, one program of all four"].append(time.perf_counter() - start)
            for label, mode, file, fl in (
                ("nvcc -cubin of the same kernels", "-cubin", kernels_only, device_flags),
                ("nvcc -c of the kernels and their launcher in one TU", "-c", combined, flags),
            ):
                cmd = [str(exe), mode, *fl, *arch, *inc, str(file), "-o", f"{tmp}/out"]
                rows[label].append(run(cmd, cwd=None, what=label).wall)
    print(environment().line("cpu"))
    head = (f"compile of the four wgmma kernels, {args.arch}", "seconds, each run")
    print(markdown_table(head, [(k, ", ".join(f"{s:.2f}" for s in v)) for k, v in rows.items()]))
