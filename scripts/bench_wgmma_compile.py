"""The wgmma matmul's four kernels compiled four ways, for one arch: NVRTC against nvcc.

- NVRTC, one program per kernel, side by side (what ``workbench.device`` does);
- NVRTC, one program of all four;
- ``nvcc -cubin`` of the same kernels (the build's CUDA flags, nvcc's own split compile);
- ``nvcc -c`` of the kernels and their host launcher in one TU (the family before its kernels
  moved into a device-only TU).

Each run compiles new programs (a -D option the kernels do not read); run it with
``CUDA_CACHE_DISABLE=1`` where the driver's compute cache would hand NVRTC an earlier cubin.
Prints a markdown table. Needs NVRTC and nvcc, no GPU.

Usage: CUDA_CACHE_DISABLE=1 python scripts/bench_wgmma_compile.py [--arch sm_90a] [--repeats 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_tune_compile import NAMES, nvcc_tu  # noqa: E402
from workbench import device, nvrtc, toolchain  # noqa: E402
from workbench.config import cuda_flags  # noqa: E402
from workbench.project import BUNDLED_KERNELS, WB_KERNEL_INCLUDE  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    home = toolchain.find_cuda_home()
    if home is None:
        raise SystemExit("no CUDA toolkit found: set CUDA_HOME or put nvcc on PATH")
    nvcc = home / "bin" / "nvcc"
    flags = list(cuda_flags(toolchain.compiler_version(nvcc)))
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
                start = time.perf_counter()
                cmd = [str(nvcc), mode, *fl, *arch, *inc, str(file), "-o", f"{tmp}/out"]
                subprocess.run(cmd, check=True, capture_output=True)
                rows[label].append(time.perf_counter() - start)
    print(f"| compile of the four wgmma kernels, {args.arch} | seconds, each run |")
    print("| --- | --- |")
    for label, seconds in rows.items():
        print(f"| {label} | {', '.join(f'{s:.2f}' for s in seconds)} |")


if __name__ == "__main__":
    main()
