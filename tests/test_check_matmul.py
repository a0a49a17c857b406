"""The checker's self-test for matrix products: K is treated fairly.

The bound comes from the float64 truth and PyTorch's own error in the tested dtype, so a right
kernel passes however deep k is, while two classic impostors fail: a bfloat16 kernel that keeps
its running sum in bfloat16 (per k16 step, as an mma loop with a bfloat16 accumulator would),
and a float32 kernel that multiplies through TF32 (inputs rounded to a 10-bit mantissa) when
the spec does not allow TF32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import workbench
from workbench.spec import Sample, randn
from workbench.verify import check_call


@torch.library.custom_op("wbimp::mm_bf16_acc", mutates_args=())
def mm_bf16_acc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with the running sum rounded to a's dtype after every 16 products."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    for p in range(0, a.shape[1], 16):
        step = a[:, p : p + 16].float() @ b[p : p + 16].float()
        acc = (acc.float() + step).to(a.dtype)
    return acc


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32 (10 explicit mantissa bits, to nearest), as float32."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@torch.library.custom_op("wbimp::mm_tf32", mutates_args=())
def mm_tf32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with every input rounded to TF32, the products summed exactly."""
    if a.dtype != torch.float32:
        return a @ b
    return (_tf32(a).double() @ _tf32(b).double()).float()


for _op in (mm_bf16_acc, mm_tf32):
    _op.register_fake(lambda a, b: a.new_empty((a.shape[0], b.shape[1])))

DEPTHS = [16, 256, 1024, 8192]


def _sample(k: int, dtype: torch.dtype) -> Sample:
    gen = torch.Generator().manual_seed(k)
    cpu = torch.device("cpu")
    return Sample((randn((8, k), dtype, cpu, gen), randn((k, 24), dtype, cpu, gen)), f"k{k}")


@pytest.fixture(scope="module")
def spec(lib: Any) -> Any:
    return lib.specs["matmul"]


@pytest.mark.parametrize("k", DEPTHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_right_kernel_passes_at_every_depth(
    lib: Any, spec: Any, k: int, dtype: torch.dtype
) -> None:
    verdict = check_call(lib.matmul, spec, _sample(k, dtype).args)
    assert verdict.passed, verdict.detail


@pytest.mark.parametrize("k", [256, 1024, 8192])
def test_a_bfloat16_accumulator_fails_deep_products(spec: Any, k: int) -> None:
    verdict = check_call(mm_bf16_acc, spec, _sample(k, torch.bfloat16).args)
    assert not verdict.passed and verdict.reason == "values", verdict
    assert verdict.ratio > 1


def _matmul_on_tf32_hardware(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul as a GPU with TF32 units computes it: where the process allows TF32
    (``torch.set_float32_matmul_precision("high")``), float32 inputs are rounded to TF32 and
    the products summed in float32; at "highest", full float32. A CPU build of PyTorch ignores
    the setting, so this reference stands in for the GPU's own to make the spec's choice seen."""
    if a.dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return _tf32(a) @ _tf32(b)
    return a @ b


@pytest.mark.parametrize("k", DEPTHS)
def test_tf32_fails_unless_the_spec_allows_it(spec: Any, k: int) -> None:
    """The TF32 kernel against the same reference, under a spec that forbids TF32 and one that
    allows it: the check computes PyTorch's own error with TF32 only when the spec allows it."""
    args = _sample(k, torch.float32).args
    full = dataclasses.replace(spec, reference=_matmul_on_tf32_hardware)
    verdict = check_call(mm_tf32, full, args)
    assert not verdict.passed and verdict.reason == "values", verdict
    float32_error = verdict.torch_ratio  # PyTorch's own, at full float32 precision
    allowing = dataclasses.replace(full, allow_tf32=True)
    verdict = check_call(mm_tf32, allowing, args)
    assert verdict.passed, verdict
    # the bound came from PyTorch's own TF32 error, far above its float32 error
    assert verdict.torch_ratio > max(1, 100 * float32_error)


@pytest.mark.cuda
@pytest.mark.parametrize("k", DEPTHS)
def test_on_a_gpu_tf32_fails_unless_the_spec_allows_it(spec: Any, k: int) -> None:
    """The same, with the spec's own reference on the GPU, whose matmuls run through TF32
    when the check allows it."""
    args = tuple(a.cuda() for a in _sample(k, torch.float32).args)
    verdict = check_call(mm_tf32, spec, args)
    assert not verdict.passed and verdict.reason == "values", verdict
    verdict = check_call(mm_tf32, dataclasses.replace(spec, allow_tf32=True), args)
    assert verdict.passed and verdict.torch_ratio > 1, verdict


def test_the_process_tf32_setting_does_not_loosen_the_bound(spec: Any) -> None:
    """A process that allows TF32 globally still holds a full-precision spec to float32."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        verdict = check_call(mm_tf32, spec, _sample(8192, torch.float32).args)
    finally:
        torch.set_float32_matmul_precision(before)
    assert not verdict.passed
    assert torch.get_float32_matmul_precision() == before


def test_the_impostors_fail_the_whole_check(spec: Any) -> None:
    """Through workbench.check on the spec's own samples (which reach k = 8192)."""
    for op, dtype in ((mm_bf16_acc, torch.bfloat16), (mm_tf32, torch.float32)):
        report = workbench.check(op, spec, device="cpu", dtypes=[dtype], trials=1, contract=False)
        assert not report.passed
        failed = {r.label for r in report.rows if not r.passed}
        assert "k8192" in failed, failed
