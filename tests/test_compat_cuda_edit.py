"""A tutorial-style drop-in .cu (torch/extension.h, kernel, launcher and TORCH_LIBRARY_IMPL in one
file) edited and loaded again in one process on a GPU: a kernel-body edit that moves no line
reuses the host object, the result matches a build through plain nvcc bit for bit, an edit that
moves a line compiles the host side again, and `wb why` reads the record."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch

import workbench
from workbench import knobs
from workbench.cli import main as wb
from workbench.compat import timing

pytestmark = pytest.mark.cuda

SOURCE = """\
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

__global__ void affine_kernel(int64_t n, const float* x, float a, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = x[i] * a + 1.0f;
}

at::Tensor affine_cuda(const at::Tensor& x, double a) {
  TORCH_CHECK(x.is_cuda() && x.dtype() == at::kFloat, "x must be a float32 CUDA tensor");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t n = xc.numel();
  affine_kernel<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      n, xc.data_ptr<float>(), static_cast<float>(a), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

TORCH_LIBRARY(NAMESPACE, m) { m.def("affine(Tensor x, float a) -> Tensor"); }
TORCH_LIBRARY_IMPL(NAMESPACE, CUDA, m) { m.impl("affine", &affine_cuda); }
"""


def _load(path: Path, ns: str, text: str):  # type: ignore[no-untyped-def]
    path.write_text(text.replace("NAMESPACE", ns))
    workbench.load(ns, [str(path)], is_python_module=False)
    return getattr(torch.ops, ns).affine


def test_a_kernel_body_edit_reuses_the_host_object_and_matches_plain_nvcc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = f"wb_cu_edit_{uuid.uuid4().hex[:8]}"
    src = tmp_path / "affine.cu"
    x = torch.randn(100_003, device="cuda")
    with knobs.override(WB_CACHE_DIR=str(tmp_path / "cache")):
        op = _load(src, ns, SOURCE)
        torch.testing.assert_close(op(x, 3.0), x * 3.0 + 1.0)
        first = timing.last(src)
        assert first is not None and first["host_reused"] is False

        edited = SOURCE.replace("+ 1.0f;", "+ 2.0f;")
        got = _load(src, ns, edited)(x, 3.0)
        record = timing.last(src)
        assert record is not None and record["host_reused"] is True
        assert "host-cc" in {p["kind"] for p in record["passes"]}
        torch.testing.assert_close(got, x * 3.0 + 2.0)

        # The same source through nvcc as one process: the same bits.
        plain_src = tmp_path / "plain" / "affine.cu"
        plain_src.parent.mkdir()
        with knobs.override(WB_NVCC_PIPELINE="0"):
            want = _load(plain_src, f"{ns}_plain", edited)(x, 3.0)
        assert torch.equal(got, want)

        moved = SOURCE.replace("+ 1.0f;", "\n      + 4.0f;")
        got = _load(src, ns, moved)(x, 3.0)
        record = timing.last(src)
        assert record is not None and record["host_reused"] is False
        torch.testing.assert_close(got, x * 3.0 + 4.0)

        assert wb(["why", str(src)]) == 0
        out = capsys.readouterr().out
        assert "device front end (cicc)" in out and "torch's headers" in out
        assert f"wb adopt affine.cu --name {ns}" in out
