"""A bundled kernel TU compiled to a cubin with the build's CUDA flags (no GPU needed): its
kernels as :mod:`workbench.cubin` reads them, with the spills ptxas reported; the wgmma matmul's
device-only TU compiled by nvcc with its kernel templates instantiated; and the check that a
CUDA graph of the matmul replays the eager call's bits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from workbench import cubin, toolchain
from workbench.cli.smoke import DEFAULT_ARCHS, smoke_config
from workbench.config import CUDA_FLAGS, cuda_flags
from workbench.project import BUNDLED_KERNELS, WB_KERNEL_INCLUDE

WGMMA = BUNDLED_KERNELS / "matmul" / "matmul_wgmma.kernel.cu"
# The narrow route's device-only TU (wgmma_narrow_kernel), a module of its own.
WGMMA_NARROW = BUNDLED_KERNELS / "matmul" / "matmul_wgmma_narrow.kernel.cu"


def compile_cubin(tmp: Path, source: Path, arch: str) -> dict[str, cubin.Kernel]:
    """The kernels of ``source`` (a TU of the bundled kernels) compiled for ``arch``: for one of
    ``wb smoke``'s default archs, from the object its build keeps (:func:`smoke_kernels`), else
    by nvcc alone into ``tmp``."""
    if arch in SMOKE_ARCHS and source.parent.parent == BUNDLED_KERNELS:
        kernels = smoke_kernels(source, arch)
        assert kernels, f"the reload's reader found no {arch} kernel in {source.name}'s object"
        return kernels
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = tmp / f"{source.stem}.{arch}.cubin"
    includes = [f"-I{BUNDLED_KERNELS}", f"-I{BUNDLED_KERNELS / 'include'}"]
    cmd = [nvcc, "-cubin", f"-arch={arch}", *CUDA_FLAGS, *includes, "-Xptxas", "-v"]
    done = subprocess.run([*cmd, "-o", str(out), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return cubin.with_spills(cubin.read(out.read_bytes(), arch), done.stderr)


SMOKE_ARCHS = toolchain.parse_arch_list(DEFAULT_ARCHS)


def smoke_kernels(source: Path, arch: str) -> dict[str, cubin.Kernel]:
    """The kernels of bundled TU ``source`` for ``arch`` as ``wb smoke`` compiles them: its family
    built with smoke's config (every default arch in one nvcc call, ptxas's report kept) in the
    session's cache, then the arch's cubin read from the object's fat binary, with the spills the
    report gives. test_cli_smoke and CI's smoke stage build the same objects in the same cache,
    so the TU compiles once for all of them. {} where the object holds no readable cubin for
    ``arch``."""
    from workbench import build, resources
    from workbench.project import discover

    project = discover()
    family = project.family(source.parent.name)
    built = build.ensure(project, family, smoke_config(SMOKE_ARCHS))
    (tu,) = [t for t in built.manifest["tus"] if Path(t["source"]).resolve() == source.resolve()]
    # The reload's reader of an object's kernels (cubin and spills): {} where none is readable.
    return {name: k for name, (k, _) in resources._read_object(str(tu["key"]), arch).items()}


def whole_k_line(kernel: str, args: tuple[str, ...], out: str | None = None) -> str:
    """The explicit instantiation of the wgmma module's ``kernel`` (the tensor maps of a and b, and
    of c for the whole-k kernels, the output, then its ints: m, n, k) at template arguments
    ``args``, the first a wb:: type name; ``out``: the output's type where it is not that type
    (the split kernel's float workspace)."""
    map_ = "const __grid_constant__ wb::matmul::TensorMap"
    maps = ", ".join([map_] * (2 if "split" in kernel else 3))
    t = args[0]
    ints = "int, int, int, int" if out == "float" else "int, int, int"
    return (
        f"template __global__ void wb::matmul::{kernel}<wb::{', '.join(args)}>("
        f"{maps}, {out or f'wb::{t}'}*, {ints});"
    )


def whole_k_instances(folder: Path, name: str, lines: list[str]) -> Path:
    """A TU (folder/name) of the wgmma module with ``lines`` (:func:`whole_k_line`): nvcc
    compiles only what a TU instantiates (the workbench names them to NVRTC)."""
    path = folder / name
    path.write_text("\n".join([f'#include "{WGMMA}"', *lines]) + "\n")
    return path


def wgmma_instances(folder: Path, dtypes: tuple[str, ...], cluster: bool) -> Path:
    """The wgmma TU with its whole-k and split-k kernels instantiated for each of ``dtypes``
    (wb:: type names) and layout of b, and with ``cluster`` the cluster-sum kernels on both
    tiles."""
    lines = []
    for t in dtypes:
        for kmajor in ("true", "false"):
            lines.append(whole_k_line("wgmma_kernel", (t, kmajor)))
            lines.append(whole_k_line("wgmma_split_kernel", (t, kmajor), out="float"))
            for wide in ("true", "false") if cluster else ():
                lines.append(whole_k_line("wgmma_cluster_split_kernel", (t, kmajor, wide)))
    return whole_k_instances(folder, "wgmma_instances.cu", lines)


def narrow_instances(folder: Path, shapes: list[tuple[int, int]], name: str) -> Path:
    """A TU (folder/name) of explicit instantiations of wgmma_narrow.cuh's kernel at each (BN,
    Kind) of ``shapes``, for both 2-byte dtypes and both layouts of b: for nvcc's PTX."""
    maps = "const __grid_constant__ wb::matmul::TensorMap"
    lines = [f'#include "{WGMMA_NARROW}"']
    for t in ("bf16", "f16"):
        for kmajor in ("true", "false"):
            for bn, kind in shapes:
                lines.append(
                    "template __global__ void wb::matmul::wgmma_narrow_kernel<"
                    f"wb::{t}, {kmajor}, {bn}, {kind}>({maps}, {maps}, wb::{t}*, int, int, "
                    "int, int);"
                )
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def nvcc_sm90a(folder: Path, *args: str, source: Path) -> subprocess.CompletedProcess[str]:
    """nvcc with the build's flags for sm_90a on ``source`` (in ``folder``), and ``args``."""
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
        str(source),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=folder)


def nvcc_wgmma(
    folder: Path, *args: str, dtypes: tuple[str, ...] = ("bf16",), cluster: bool = False
) -> subprocess.CompletedProcess[str]:
    """nvcc with the build's flags for sm_90a on :func:`wgmma_instances`, and ``args``."""
    return nvcc_sm90a(folder, *args, source=wgmma_instances(folder, dtypes, cluster))


def hopper() -> bool:
    """Whether a CUDA GPU of compute capability 9.0 (the wgmma kernels' sm_90a) is here."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def matmul_operands(m: int, n: int, k: int, col: bool, dtype: Any = None) -> tuple[Any, Any]:
    """a [m, k] and b [k, n] on the GPU (bfloat16 by default), seeded by the shape; b column-major
    (a transposed [n, k]) where ``col``."""
    import torch

    dtype = dtype or torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    if col:
        return a, torch.randn(n, k, device="cuda", dtype=dtype, generator=gen).t()
    return a, torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)


def assert_within_matmul_bound(lib: Any, got: Any, a: Any, b: Any) -> None:
    """c = a @ b within the matmul family's bound (its spec's tolerances for c's dtype) of the
    float64 product, at every element."""
    ref = a.double() @ b.double()
    rtol, atol = lib.specs["matmul"].tolerances[got.dtype]
    bound = atol * max(1.0, ref.abs().max().item()) + rtol * ref.abs()
    worst = ((got.double() - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"{tuple(a.shape)} @ {tuple(b.shape)} {got.dtype}: err/tol {worst:.2f}"


def _cuda_events(fn: Any) -> list[Any]:
    """The profiler's CUDA events of one call of ``fn``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return list(prof.events())


def cuda_kernels_run(fn: Any) -> str:
    """The names of the CUDA events (kernels and runtime calls) one call of ``fn`` made."""
    return " ".join(e.name for e in _cuda_events(fn))


def cuda_kernel_names(fn: Any) -> list[str]:
    """The names of what one call of ``fn`` ran on the GPU (kernels, copies, memsets), in order."""
    import torch

    gpu = torch.autograd.DeviceType.CUDA
    return [e.name for e in _cuda_events(fn) if e.device_type == gpu]


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


def assert_matmul_graph_replays(lib: Any, a: Any, b: Any) -> None:
    """``lib.matmul(a, b)`` captured once in a CUDA graph (after an eager call and one on a side
    stream, so that modules and workspaces exist), then replayed on new values of a: each
    replay's c is the eager call's, bit for bit."""
    import torch

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


def nvrtc_entries(file: Path, arch: str, names: list[str]) -> list[tuple[str, int]]:
    """NVRTC's build of ``names`` from the device-only TU ``file`` for ``arch``, as the workbench
    compiles it: each entry's mangled name and registers, every name lowered, none spilling."""
    import re

    from workbench import device, nvrtc
    from workbench.project import discover

    options = [*device.NVRTC_FLAGS, *(f"-I{d}" for d in discover().include_dirs)]
    result = nvrtc.compile(file, arch, names, options)
    assert set(result.lowered) == set(names)
    entries = result.log.split("Compiling entry function")[1:]
    assert len(entries) == len(names), result.log
    found = []
    for entry in entries:
        assert "0 bytes spill stores, 0 bytes spill loads" in entry, entry
        found.append((entry.split("'")[1], int(re.findall(r"Used (\d+) registers", entry)[0])))
    return found
