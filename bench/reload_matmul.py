"""Edit-to-result latency of the tensor-core matmul against the elementwise template, one run.

One process loads a registry holding a `wb new` template family and a copy of the bundled matmul
family, then alternates one-line edits of a kernel body: the template's kernel (a device-only TU,
``NAME.kernel.cu``), the wgmma kernel on an sm_90 GPU (a device-only TU: NVRTC and a module swap)
and the mma kernel (an nvcc TU: compile, link, dlopen), each repeat a new value. Each time runs
from writing the file to the first correct result of the new code, through ``lib.reload()``.
The last column runs to the edited TU's whole module swapped in (a reload compiles first the
kernels the process ran, the rest behind them; for an nvcc TU, the same time). Goals: the wgmma
edit in at most 1.0 s (the device-only issue), the tensor-core edit at most 2x
the elementwise one (the matmul issue); the mma edit is the nvcc path in the same run.

Usage: python -m bench reload_matmul [--repeats 5] [--out F]   (needs a CUDA GPU)
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import ROOT, Spread, environment, markdown_table, parser, write_text
from bench.reload import ALPHA, edit_for

# One line of each tensor-core kernel, edited so that c[0, 0] gets + k. wgmma: the device-only TU
# matmul_wgmma.kernel.cu itself (its module holds the whole-k and split-k kernels; the narrow
# route's is matmul_wgmma_narrow.kernel.cu's), in wgmma_units between the main loop and the
# epilogue: d[0] of each consumer thread gets + k, and thread 0 of consumer 0 holds c[row0, col0]
# there, which the whole-k kernel stores at c[0, 0] for its first tile (c below has enough tiles
# for that route). mma: the epilogue's stores of pairs, every pair + k.
MATMUL_EDITS = {
    "wgmma": ("matmul_wgmma.kernel.cu",
              "const int64_t row0 = int64_t{tile_m} * Tl::BM + consumer * 64;",
              "d[0] += {k}.0f; const int64_t row0 = int64_t{{tile_m}} * Tl::BM + consumer * 64;"),
    "mma": ("matmul_mma.cu", "store_pair(c, m, n, r, j, acc[mi][ni][0], acc[mi][ni][1]);",
            "store_pair(c, m, n, r, j, acc[mi][ni][0] + {k}.0f, acc[mi][ni][1] + {k}.0f);"),
}  # fmt: skip


def timed_edit(
    path: Path, old: str, new: str, lib: Any, check: Callable[[], None]
) -> tuple[float, float]:
    """Seconds from writing the edit to ``check`` passing on the reloaded code, and to the edited
    TU's whole module swapped in (a reload compiles the kernels the process ran first, the rest
    behind them); then undone."""
    from workbench import device

    original = path.read_text()
    assert old in original, (path, old)
    t0 = time.perf_counter()
    path.write_text(original.replace(old, new))
    lib.reload()
    check()
    seconds = time.perf_counter() - t0
    device.settle()
    whole = time.perf_counter() - t0
    path.write_text(original)
    lib.reload()
    device.settle()
    return seconds, whole


def main(argv: list[str] | None = None) -> None:
    import torch

    import workbench
    from workbench import scaffold

    p = parser(__name__, __doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    paths = ["wgmma", "mma"] if torch.cuda.get_device_capability() == (9, 0) else ["mma"]
    work = Path(tempfile.mkdtemp(prefix="wb-reload-matmul-"))
    kernels = scaffold.write_registry(work / "registry", 1)
    shutil.copytree(ROOT / "kernels" / "matmul", kernels / "matmul")
    shutil.copy(ROOT / "bindings" / "matmul.cpp", kernels.parent / "bindings" / "matmul.cpp")
    lib = workbench.load(kernels, namespace="bench_mm")
    x = torch.randn(1 << 16, device="cuda")
    # Small integers: every product and sum is exact in float32 and bfloat16, so c is exact.
    # 32 x 8 tiles of 128 x 256: more than the SMs, so the whole-k kernel (not a few-rows route)
    a = torch.randint(-2, 3, (4096, 128), device="cuda").to(torch.bfloat16)
    b = torch.randint(-2, 3, (128, 2048), device="cuda").to(torch.bfloat16)
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    times: dict[str, list[tuple[float, float]]] = {"elementwise": [], **{p: [] for p in paths}}
    lib.op00(x, ALPHA)  # the kernels a user ran before the edit: a reload compiles them first
    for path in [{"wgmma": 3, "mma": 2}[p] for p in paths]:
        lib.matmul_path(a, b, path)
    for k in range(1, args.repeats + 1):
        rel, old, new = edit_for("device", "op00", k)

        def check_template(k: int = k) -> None:
            out = lib.op00(x, ALPHA)
            torch.testing.assert_close(out, ALPHA * x + k, atol=1e-4, rtol=0)

        times["elementwise"].append(
            timed_edit(work / "registry" / rel, old, new, lib, check_template)
        )
        for path_name in paths:
            file, old, new = MATMUL_EDITS[path_name]
            path = {"wgmma": 3, "mma": 2}[path_name]

            def check_matmul(k: int = k, path: int = path) -> None:
                c = lib.matmul_path(a, b, path)
                got, want = float(c[0, 0]), float(ref[0, 0]) + k
                assert got == want, (got, want, k)

            times[path_name].append(
                timed_edit(kernels / "matmul" / file, old, new.format(k=k), lib, check_matmul)
            )
    base = Spread.of([t for t, _ in times["elementwise"]]).median
    rows = []
    for name, ts in times.items():
        s, whole = Spread.of([t for t, _ in ts]), Spread.of([w for _, w in ts])
        rows.append(
            (
                name,
                *(f"{v:.2f}" for v in (s.median, s.min, s.max)),
                f"{s.median / base:.2f}x",
                f"{whole.median:.2f}",
            )
        )
    head = ("kernel-body edit to first correct result", "median s", "min s", "max s")
    text = "\n".join(
        [
            environment().line("cuda"),
            f"{args.repeats} repeats",
            "",
            markdown_table((*head, "vs elementwise", "whole module, median s"), rows),
        ]
    )
    print(text)
    write_text(args.out, text)
    shutil.rmtree(work, ignore_errors=True)
