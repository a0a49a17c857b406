"""Build-time figures of the foundation, with the anchor measured in the same run.

  cold build of the bundled registry (new process, empty cache)
  warm start (new process, nothing changed): workbench.load() to ops ready, after `import torch`
  a one-line kernel-body edit: wb in the same process (lib.reload()), and the anchor,
  torch.utils.cpp_extension.load of the same op in the conventional layout (every TU includes
  torch/extension.h, TORCH_LIBRARY), which needs a new process for every edit

Usage: python -m bench foundation [--out F.md]
Prints a markdown table; the edit cases use a copy of kernels/ in a temporary folder.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

from bench.common import (
    ROOT,
    child_env,
    environment,
    markdown_table,
    one_arch_env,
    parser,
    run_python,
    write_text,
)

ANCHOR_CPP = """\
#include <torch/extension.h>

at::Tensor muladd_cpu(const at::Tensor& a, const at::Tensor& b, double c) {
  TORCH_CHECK(a.sizes() == b.sizes());
  at::Tensor a_c = a.contiguous(), b_c = b.contiguous();
  at::Tensor result = torch::empty(a_c.sizes(), a_c.options());
  const float* a_ptr = a_c.data_ptr<float>();
  const float* b_ptr = b_c.data_ptr<float>();
  float* result_ptr = result.data_ptr<float>();
  for (int64_t i = 0; i < result.numel(); i++) {
    result_ptr[i] = a_ptr[i] * b_ptr[i] + c + EDIT;
  }
  return result;
}

TORCH_LIBRARY(anchor, m) { m.def("muladd(Tensor a, Tensor b, float c) -> Tensor"); }
TORCH_LIBRARY_IMPL(anchor, CPU, m) { m.impl("muladd", &muladd_cpu); }
"""

ANCHOR_CU = """\
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void muladd_kernel(int numel, const float* a, const float* b, float c, float* result) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < numel) result[idx] = a[idx] * b[idx] + c + EDIT;
}

at::Tensor muladd_cuda(const at::Tensor& a, const at::Tensor& b, double c) {
  at::Tensor a_c = a.contiguous(), b_c = b.contiguous();
  at::Tensor result = torch::empty(a_c.sizes(), a_c.options());
  int numel = a_c.numel();
  muladd_kernel<<<(numel + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      numel, a_c.data_ptr<float>(), b_c.data_ptr<float>(), c, result.data_ptr<float>());
  return result;
}

TORCH_LIBRARY_IMPL(anchor, CUDA, m) { m.impl("muladd", &muladd_cuda); }
"""

ANCHOR_RUN = """\
import sys, time, torch
from torch.utils.cpp_extension import load
folder, device, edit = sys.argv[1], sys.argv[2], float(sys.argv[3])
sources = [f"{folder}/muladd.cpp"] + ([f"{folder}/muladd_cuda.cu"] if device == "cuda" else [])
t0 = time.perf_counter()
load(name="anchor_muladd", sources=sources, is_python_module=False,
     build_directory=f"{folder}/build", verbose=False)
a = torch.randn(1000, device=device); b = torch.randn(1000, device=device)
out = torch.ops.anchor.muladd(a, b, 1.0)
expected = a * b + 1.0 + edit
err = (out - expected).abs().max()
assert torch.allclose(out, expected, atol=1e-5), f"anchor gave a wrong result: max error {err}"
print(time.perf_counter() - t0)
"""

WB_WARM = """\
import time, torch
t0 = time.perf_counter()
import workbench
lib = workbench.load()
a = torch.ones(3)
assert torch.equal(lib.muladd(a, a, 1.0), a + 1)
print(time.perf_counter() - t0)
"""


def anchor(device: str, work: Path) -> dict[str, float]:
    folder = work / "anchor"
    (folder / "build").mkdir(parents=True)
    (folder / "muladd.cpp").write_text(ANCHOR_CPP.replace("EDIT", "0"))
    (folder / "muladd_cuda.cu").write_text(ANCHOR_CU.replace("EDIT", "0"))
    cold = float(run_python(ANCHOR_RUN, str(folder), device, "0").last_line)
    edited = "muladd_cuda.cu" if device == "cuda" else "muladd.cpp"
    text = ANCHOR_CU if device == "cuda" else ANCHOR_CPP
    (folder / edited).write_text(text.replace("EDIT", "1.0f"))
    t_edit = time.perf_counter()
    ran = run_python(ANCHOR_RUN, str(folder), device, "1")
    in_process, wall = float(ran.last_line), ran.wall
    edit_to_result = time.perf_counter() - t_edit
    return {
        "cold": cold,
        "edit": edit_to_result,
        "edit_in_process": in_process,
        "restart": wall - in_process,
    }


def wb(device: str, work: Path, env: dict[str, str]) -> dict[str, float]:
    cold = float(run_python(WB_WARM, env=env).last_line)
    warm = statistics.median(float(run_python(WB_WARM, env=env).last_line) for _ in range(7))
    project = work / "project"
    shutil.copytree(ROOT / "kernels", project / "kernels")
    shutil.copytree(ROOT / "bindings", project / "bindings")
    edit_code = textwrap.dedent(f"""
        import time, torch, workbench
        from pathlib import Path
        lib = workbench.load({str(project / "kernels")!r}, families=["muladd"])
        a = torch.randn(1000, device={device!r}); b = torch.randn(1000, device={device!r})
        name = "muladd.cu" if {device!r} == "cuda" else "muladd.cpp"
        src = Path({str(project / "kernels" / "muladd")!r}) / name
        old = "a * b + c;" if {device!r} == "cuda" else "x * y + cc;"
        new = "a * b + c + A(1);" if {device!r} == "cuda" else "x * y + cc + 1;"
        text = src.read_text()
        assert old in text
        t0 = time.perf_counter()
        src.write_text(text.replace(old, new))
        report = lib.reload()
        out = lib.muladd(a, b, 1.0)
        assert torch.allclose(out, a * b + 2.0, atol=1e-5)
        print(len(report.compiled), time.perf_counter() - t0)
    """)
    compiled, edit = run_python(edit_code, env=env, what="wb edit step").last_line.split()
    return {"cold": cold, "warm": warm, "edit": float(edit), "edit_objects": float(compiled)}


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = p.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="wb-bench-") as tmp:
        work = Path(tmp)
        # one arch for both tools; the workbench from the checkout (cwd), as before
        env = one_arch_env(child_env(work / "cache", tree=None, bytecode=False))
        w = wb(device, work, env)
        a = anchor(device, work)
    rows = [
        (
            "cold build, bundled registry (wb: 3 families, PCH included; anchor: muladd only)",
            f"{w['cold']:.2f}",
            f"{a['cold']:.2f}",
            f"{w['cold'] / a['cold']:.2f}",
        ),
        (
            "warm start, new process, load() to ops ready after import torch (median of 7)",
            f"{w['warm']:.4f}",
            "",
            "",
        ),
        (
            f"one-line {device} kernel-body edit to first correct result "
            f"(wb: {w['edit_objects']:.0f} object, same process; anchor: new process, "
            f"{a['restart']:.2f} s of it the restart)",
            f"{w['edit']:.2f}",
            f"{a['edit']:.2f}",
            f"{w['edit'] / a['edit']:.3f}",
        ),
    ]
    head = ("figure", "wb (s)", "anchor (s)", "wb / anchor")
    table = "\n".join([environment().line(device), "", markdown_table(head, rows)])
    print(table)
    print(json.dumps({"wb": w, "anchor": a}))
    write_text(args.out, table)
