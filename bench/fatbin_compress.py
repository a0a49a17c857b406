"""nvcc's fat binary compression (its default) against none (the build's flag): compile seconds,
object bytes, and the seconds the driver takes to load the fat binary and find a kernel in it.

Each bundled CUDA TU named is compiled with the build's flags for ``--arch``, once a mode a round,
the modes alternating; on a GPU host each object's ``.nv_fatbin`` is then loaded with
``cuModuleLoadData`` and one kernel looked up (``cuModuleGetFunction``), the modes alternating
again, in this process (the context made once, before the first load). Prints a markdown table.

Usage: python -m bench fatbin_compress [--arch sm_90a] [--repeats 3] [--loads 20]
       [--sources softmax/softmax.cu matmul/matmul.cu ...]
"""

from __future__ import annotations

import ctypes
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import environment, markdown_table, nvcc, parser, run
from workbench import cubin, toolchain
from workbench.config import NO_COMPRESS, cuda_flags
from workbench.project import BUNDLED_KERNELS, WB_KERNEL_INCLUDE

MODES = ("default", "none")
SOURCES = ("softmax/softmax.cu", "softmax/softmax_backward.cu", "matmul/matmul_mma.cu")


def kernel_names(data: bytes, plain: bytes, arch: str) -> list[str]:
    """The kernels of an object, from its own cubin where this Python reads it (a compressed one
    needs zstd), else the plain object's (the same source: :func:`a_kernel` keeps a name both
    hold)."""
    sm = f"sm_{cubin.sm_of(arch)}"
    own = cubin.fatbin_cubins(data).get(sm) or cubin.fatbin_cubins(plain)[sm]
    return sorted(cubin.read(own, arch))


def a_kernel(driver: ctypes.CDLL, image: bytes, names: list[str]) -> str | None:
    """A kernel of ``names`` the driver finds by name in ``image`` (one of internal linkage it may
    not); None where it finds none."""
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    buf = ctypes.create_string_buffer(image, len(image))
    if driver.cuModuleLoadData(ctypes.byref(module), buf) != 0:
        raise RuntimeError("the driver refused the fat binary")
    try:
        for name in names:
            if driver.cuModuleGetFunction(ctypes.byref(function), module, name.encode()) == 0:
                return name
    finally:
        driver.cuModuleUnload(module)
    return None


def load_seconds(driver: ctypes.CDLL, image: bytes, kernel: str) -> float | str:
    """cuModuleLoadData of ``image`` and cuModuleGetFunction of ``kernel``, then unload; the
    driver's error where it refuses either."""
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    buf = ctypes.create_string_buffer(image, len(image))
    start = time.perf_counter()
    code = driver.cuModuleLoadData(ctypes.byref(module), buf)
    step = "cuModuleLoadData"
    if code == 0:
        step = "cuModuleGetFunction"
        code = driver.cuModuleGetFunction(ctypes.byref(function), module, kernel.encode())
    seconds = time.perf_counter() - start
    if module.value:
        driver.cuModuleUnload(module)
    return seconds if code == 0 else f"{step}: CUresult {code}"


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--loads", type=int, default=20)
    p.add_argument("--sources", nargs="+", default=list(SOURCES))
    args = p.parse_args(argv)
    exe = nvcc()
    flags = [f for f in cuda_flags(toolchain.compiler_version(exe)) if f not in NO_COMPRESS]
    inc = [f"-I{WB_KERNEL_INCLUDE}", f"-I{BUNDLED_KERNELS}"]
    arch = toolchain.gencode_flags((args.arch,))
    driver = None
    try:
        import torch

        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")  # the primary context, current on this thread
            driver = ctypes.CDLL("libcuda.so.1")
    except ImportError:
        pass
    rows = []
    with tempfile.TemporaryDirectory(prefix="wb-fatbin-compress-") as tmp:
        for source in args.sources:
            compile_s: dict[str, list[float]] = {m: [] for m in MODES}
            objects: dict[str, bytes] = {}
            for r in range(args.repeats):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    out = Path(tmp) / f"{mode}.o"
                    cmd = [str(exe), "-c", *flags, f"--compress-mode={mode}", *arch, *inc]
                    cmd += [str(BUNDLED_KERNELS / source), "-o", str(out)]
                    compile_s[mode].append(run(cmd, cwd=None, what=source).wall)
                    objects[mode] = out.read_bytes()
            load_s: dict[str, list[float | str]] = {m: [] for m in MODES}
            if driver is not None:
                images = {m: cubin.fatbin_section(objects[m]) for m in MODES}
                kernel = {
                    m: a_kernel(
                        driver, images[m], kernel_names(objects[m], objects["none"], args.arch)
                    )
                    for m in MODES
                }
                for i in range(args.loads):
                    for mode in MODES if i % 2 == 0 else MODES[::-1]:
                        name = kernel[mode]
                        if name is not None:
                            load_s[mode].append(load_seconds(driver, images[mode], name))
            for mode in MODES:
                entries = list(cubin.fatbin_entries(objects[mode]))
                packed = sum(p[:4] == cubin.ZSTD_MAGIC for _, _, p in entries)
                times = [t for t in load_s[mode] if isinstance(t, float)]
                refused = [t for t in load_s[mode] if isinstance(t, str)]
                load = f"{statistics.median(times) * 1e3:.2f}" if times else "-"
                load += f" (refused: {refused[0]})" if refused else ""
                rows.append(
                    (
                        source,
                        mode,
                        f"{statistics.median(compile_s[mode]):.2f}",
                        f"{len(objects[mode]) / 2**20:.2f}",
                        f"{packed} of {len(entries)}",
                        load,
                    )
                )
    print(environment().line("cuda" if driver is not None else "cpu"))
    head = (
        f"TU ({args.arch})",
        "--compress-mode",
        "nvcc s (median)",
        "object MiB",
        "entries compressed",
        "load + get ms (median)",
    )
    print(markdown_table(head, rows))
