"""Extensions on the LibTorch stable ABI (STABLE_TORCH_LIBRARY, the style of pytorch/extension-cpp):
an edit reloads in place as TORCH_LIBRARY sources do, and a second library that defines the same
namespace raises a LoadError where registering it at dlopen would run through a handle never
set. Run in a child process: a crash there must fail the test, not end the test run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench import knobs
from workbench.compat import dropin

FILL = """\
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

using torch::stable::Tensor;

Tensor fill_val(const Tensor& a) {
  Tensor out = torch::stable::empty_like(a);
  torch::stable::fill_(out, VALUE);
  return out;
}

STABLE_TORCH_LIBRARY(NAMESPACE, m) { m.def("fill_val(Tensor a) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("fill_val", TORCH_BOX(&fill_val)); }
"""

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch, workbench

    src, ns = Path(sys.argv[1]), sys.argv[2]
    text = src.read_text()
    x = torch.zeros(2)
    for value in ("1.0", "2.0"):
        src.write_text(text.replace("VALUE", value))
        workbench.load("wb_stable", [src], is_python_module=False)
        print("value", getattr(torch.ops, ns).fill_val(x).tolist())
    other = src.with_name("other.cpp")
    other.write_text(text.replace("VALUE", "3.0"))
    try:
        workbench.load("wb_stable_other", [other], is_python_module=False)
    except workbench.errors.LoadError as e:
        print("refused", " ".join(str(e).split())[:300])
    print("still", getattr(torch.ops, ns).fill_val(x).tolist())
    """
)


def test_a_stable_abi_extension_reloads_and_a_second_definition_is_refused(
    tmp_path: Path,
) -> None:
    ns = f"wbstable_{os.getpid()}"
    src = tmp_path / "fill.cpp"
    src.write_text(FILL.replace("NAMESPACE", ns))
    env = {**os.environ, "WB_CACHE_DIR": str(knobs.cache_dir()), "WB_QUIET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(src), ns],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["value [1.0, 1.0]", "value [2.0, 2.0]"], proc.stdout + proc.stderr
    assert lines[2].startswith("refused registering the ops of wb_stable_other"), lines[2]
    assert f"namespace {ns}" in lines[2]
    assert lines[3] == "still [2.0, 2.0]"


FILL_CUDA = """\
#define USE_CUDA  // the stable C shim's CUDA functions (the current stream)
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

using torch::stable::Tensor;

__global__ void fill_kernel(int64_t n, float value, float* out) {  // out: [n]
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = value;
}

Tensor fill_cuda(const Tensor& a) {
  Tensor out = torch::stable::empty_like(a);
  const int64_t n = out.numel();
  void* stream = nullptr;  // the caller's current stream, never the default one
  aoti_torch_get_current_cuda_stream(a.get_device_index(), &stream);
  fill_kernel<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      n, VALUE, static_cast<float*>(out.data_ptr()));
  return out;
}

STABLE_TORCH_LIBRARY_IMPL(NAMESPACE, CUDA, m) { m.impl("fill_val", TORCH_BOX(&fill_cuda)); }
"""


@pytest.mark.nvcc
def test_nvcc_compiles_a_stable_abi_cuda_file_with_the_prelude(tmp_path: Path) -> None:
    src = tmp_path / "fill.cu"
    src.write_text(FILL_CUDA.replace("NAMESPACE", "wbstablecu").replace("VALUE", "1.0f"))
    with knobs.override(TORCH_CUDA_ARCH_LIST="9.0"):
        recipe = dropin.recipe(
            "wb_stable_cu",
            [src],
            extra_cflags=[],
            extra_cuda_cflags=[],
            extra_ldflags=[],
            extra_include_paths=[],
            with_cuda=True,
            python_module=False,
            link=False,
        )
    assert str(dropin.STABLE_PRELUDE) in recipe.units[0].command
    out = tmp_path / "fill.o"
    proc = subprocess.run(
        [part.replace("@OUT@", str(out)) for part in recipe.units[0].command],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0


CUDA_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch, workbench

    cpp, cu, ns = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    text = cu.read_text()
    x = torch.zeros(3, device="cuda")
    for value in ("1.0f", "2.0f"):
        cu.write_text(text.replace("VALUE", value))
        workbench.load("wb_stable_cuda", [cpp, cu], is_python_module=False)
        print("value", getattr(torch.ops, ns).fill_val(x).tolist())
    """
)


@pytest.mark.cuda
def test_a_stable_abi_cuda_kernel_edit_reloads_in_place(tmp_path: Path) -> None:
    ns = f"wbstablecuda_{os.getpid()}"
    cpp, cu = tmp_path / "fill.cpp", tmp_path / "fill_cuda.cu"
    cpp.write_text(FILL.replace("NAMESPACE", ns).replace("VALUE", "0.0"))
    cu.write_text(FILL_CUDA.replace("NAMESPACE", ns))
    env = {**os.environ, "WB_CACHE_DIR": str(knobs.cache_dir()), "WB_QUIET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CUDA_SCRIPT, str(cpp), str(cu), ns],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["value [1.0, 1.0, 1.0]", "value [2.0, 2.0, 2.0]"]
