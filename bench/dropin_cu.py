"""Edit to new result of a CUDA extension's kernel: torch's load, the drop-in, and after wb adopt.

The extension has the layout of PyTorch's custom-op tutorials: ``ext.cpp`` includes
``torch/extension.h``, defines the op with ``TORCH_LIBRARY`` and its CPU kernel; ``ext.cu``
includes it too and holds the ``__global__`` kernel, its launcher and ``TORCH_LIBRARY_IMPL(...,
CUDA, ...)``. Each edit changes a constant in the kernel's body (no line moves); the time runs
from writing the file to the op's correct result on the GPU.

- ``torch load``: ``torch.utils.cpp_extension.load`` of both files; an in-process reload of a
  ``TORCH_LIBRARY`` op aborts the process, so each edit is a new process (its start and
  ``import torch`` counted), with torch's own build folder kept between edits;
- ``dropin``: ``workbench.load(name, sources)`` in one process, each edit loaded again in place
  (nvcc's passes side by side, the host compile reused while the edit leaves nvcc's host-side
  output as it was); the passes of its last edit are printed below the table;
- ``adopted``: ``wb adopt ext.cpp ext.cu --name NAME`` once, then ``workbench.load(kernels)`` and,
  per edit of ``NAME.kernel.cu``, ``lib.reload()`` in the same process (a device-only TU).

Usage: python -m bench dropin_cu [--edits 3] [--no-torch] [--out F]   (needs a GPU)
Prints the environment line and a markdown table last.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import child_env, environment, markdown_table, parser, run_python, write_text

CPP = """\
#include <torch/extension.h>

at::Tensor mymuladd_cpu(const at::Tensor& a, const at::Tensor& b, double c) {
  TORCH_CHECK(a.sizes() == b.sizes(), "a and b must have the same shape");
  return a * b + c;
}

TORCH_LIBRARY(NAMESPACE, m) { m.def("mymuladd(Tensor a, Tensor b, float c) -> Tensor"); }

TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("mymuladd", &mymuladd_cpu); }
"""

CU = """\
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

__global__ void muladd_kernel(int64_t n, const float* a, const float* b, float c, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] * b[i] + c + 0.0f;
}

at::Tensor mymuladd_cuda(const at::Tensor& a, const at::Tensor& b, double c) {
  TORCH_CHECK(a.sizes() == b.sizes(), "a and b must have the same shape");
  TORCH_CHECK(a.is_cuda() && a.dtype() == at::kFloat, "a must be a float32 CUDA tensor");
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = at::empty_like(ac);
  const int64_t n = out.numel();
  muladd_kernel<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      n, ac.data_ptr<float>(), bc.data_ptr<float>(), static_cast<float>(c), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

TORCH_LIBRARY_IMPL(NAMESPACE, CUDA, m) { m.impl("mymuladd", &mymuladd_cuda); }
"""

STEP = re.compile(r"\+ \d+\.0f;")

# Shared by the children: write edit k of a kernel file, then time to the op's correct result.
STEP_CODE = """
import json, re, sys, time
from pathlib import Path
import torch
a = torch.rand(1 << 20, device="cuda"); b = torch.rand(1 << 20, device="cuda")
def edit(path, k):
    p = Path(path)
    p.write_text(re.sub(r"\\+ \\d+\\.0f;", f"+ {k}.0f;", p.read_text()))
def check(op, k):
    got = op(a, b, 2.0)
    want = a * b + 2.0 + k
    assert torch.allclose(got, want), (k, (got - want).abs().max())
"""

DROPIN = (
    STEP_CODE
    + """
import workbench
from workbench.compat import timing
cpp, cu, ns, edits = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = []
for k in range(edits + 1):
    start = time.perf_counter()
    edit(cu, k)
    workbench.load(ns, [cpp, cu], is_python_module=False)
    check(getattr(torch.ops, ns).mymuladd, k)
    out.append(time.perf_counter() - start)
print(json.dumps({"seconds": out, "last": timing.last(Path(cu))}))
"""
)

ADOPTED = (
    STEP_CODE
    + """
import workbench
kernels, kernel_file, edits = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = []
start = time.perf_counter()
edit(kernel_file, 0)
lib = workbench.load(kernels)
check(lib.mymuladd, 0)
out.append(time.perf_counter() - start)
for k in range(1, edits + 1):
    start = time.perf_counter()
    edit(kernel_file, k)
    lib.reload()
    check(lib.mymuladd, k)
    out.append(time.perf_counter() - start)
print(json.dumps({"seconds": out}))
"""
)

TORCH_LOAD = (
    STEP_CODE
    + """
from torch.utils.cpp_extension import load
cpp, cu, ns, k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
load(ns, [cpp, cu], is_python_module=False)
check(getattr(torch.ops, ns).mymuladd, k)
"""
)


def _write(folder: Path, ns: str) -> tuple[Path, Path]:
    folder.mkdir(parents=True)
    cpp, cu = folder / "ext.cpp", folder / "ext.cu"
    cpp.write_text(CPP.replace("NAMESPACE", ns))
    cu.write_text(CU.replace("NAMESPACE", ns))
    return cpp, cu


def dropin(work: Path, edits: int) -> tuple[list[float], dict[str, object]]:
    ns = "ext_dropin"
    cpp, cu = _write(work / ns, ns)
    env = child_env(work / "cache_dropin")
    ran = run_python(DROPIN, str(cpp), str(cu), ns, str(edits), env=env, what="drop-in")
    got = json.loads(ran.last_line)
    return [float(s) for s in got["seconds"]], got["last"] or {}


def adopted(work: Path, edits: int) -> list[float]:
    ns = "ext_adopted"
    cpp, cu = _write(work / ns, ns)
    kernels = work / "project" / "kernels"
    kernels.mkdir(parents=True)
    env = child_env(work / "cache_adopted")
    cmd = [sys.executable, "-m", "workbench", "adopt", str(cpp), str(cu), "--name", "mymuladd"]
    subprocess.run([*cmd, "--kernels", str(kernels)], check=True, env=env)
    kernel_file = kernels / "mymuladd" / "mymuladd.kernel.cu"
    ran = run_python(ADOPTED, str(kernels), str(kernel_file), str(edits), env=env, what="adopted")
    return [float(s) for s in json.loads(ran.last_line)["seconds"]]


def torch_load(work: Path, edits: int) -> list[float]:
    ns = "ext_torch"
    cpp, cu = _write(work / ns, ns)
    env = child_env(None, tree=None, TORCH_EXTENSIONS_DIR=str(work / "torch_extensions"))
    seconds = []
    for k in range(edits + 1):
        cu.write_text(STEP.sub(f"+ {k}.0f;", cu.read_text()))
        seconds.append(run_python(TORCH_LOAD, str(cpp), str(cu), ns, str(k), env=env).wall)
    return seconds


def row(name: str, seconds: list[float], anchor: float | None) -> list[object]:
    edit = statistics.median(seconds[1:])
    ratio = f"{edit / anchor:.3f}x" if anchor else "-"
    return [name, f"{seconds[0]:.2f}", f"{edit:.2f}", ratio, len(seconds) - 1]


def passes_line(last: dict[str, object]) -> str:
    passes = last.get("passes") or []
    parts = [f"{p['kind']} {p['seconds']:.2f}" for p in passes]  # type: ignore[union-attr]
    reused = "reused" if last.get("host_reused") else "compiled"
    return (
        f"drop-in ext.cu, last edit: {last.get('seconds')} s; host object {reused}; "
        + ", ".join(parts)
    )


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--edits", type=int, default=3, help="edits per path (at least 1)")
    p.add_argument("--no-torch", action="store_true", help="skip torch's own load")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    if args.edits < 1:
        raise SystemExit("--edits must be at least 1")
    with tempfile.TemporaryDirectory(prefix="wb-dropin-cu-") as tmp:
        work = Path(tmp)
        anchor_seconds = None if args.no_torch else torch_load(work, args.edits)
        anchor = statistics.median(anchor_seconds[1:]) if anchor_seconds else None
        rows = [] if anchor_seconds is None else [row("torch load", anchor_seconds, anchor)]
        seconds, last = dropin(work, args.edits)
        rows.append(row("dropin", seconds, anchor))
        rows.append(row("adopted (wb adopt, then lib.reload())", adopted(work, args.edits), anchor))
    head = ["path", "cold s", "edit s (median)", "edit / torch load", "edits"]
    text = f"{environment().line('cuda')}\n{markdown_table(head, rows, 'lrrrr')}\n"
    text += f"\n{passes_line(last)}\n"
    write_text(args.out, text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
