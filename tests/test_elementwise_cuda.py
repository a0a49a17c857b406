"""The elementwise launchers' two vector paths (kernels/include/wb/elementwise.cuh, and
elementwise_launch.h for a device-only TU's kernel: scale's).

A launch that moves at most 1.5x the L2's size reads without allocating in L1; a larger one
reads with plain ld.global.nc. Both must give eager's answer, and the kernel the profiler sees
must be the one the rule names (its template arguments say which).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

pytestmark = pytest.mark.cuda


def _threshold_elements(dtype: torch.dtype, streams: int) -> int:
    """The largest element count whose launch still skips L1 (``streams``: inputs + output)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return 3 * l2 // (2 * streams * dtype.itemsize)


def _kernel_names(fn: Any, kernel: str = "elementwise_kernel") -> list[str]:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if kernel in e.name]


def _says(name: str, kernel: str, n: int, skip: str) -> bool:
    """Whether a profiled kernel is ``kernel<n, skip, ...>``, demangled or not."""
    return f"{kernel}<{n}, {skip}," in name or f"{kernel}ILi{n}ELb{int(skip == 'true')}E" in name


def _vec(dtype: torch.dtype) -> int:
    return 16 // dtype.itemsize


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("side", ["at the threshold", "past the threshold"])
def test_scale_takes_the_path_its_size_names(lib: Any, dtype: torch.dtype, side: str) -> None:
    edge = _threshold_elements(dtype, streams=2)
    n = edge - edge % _vec(dtype) if side == "at the threshold" else edge + _vec(dtype)
    x = torch.randn(n, device="cuda").to(dtype)
    # scale's kernel is a device-only TU's (scale.kernel.cu), launched from its module
    names = _kernel_names(lambda: lib.scale(x, 0.3), "scale_kernel")
    torch.testing.assert_close(lib.scale(x, 0.3), x * 0.3, rtol=0, atol=0)
    skip = "true" if side == "at the threshold" else "false"
    assert names, "the profiler saw no scale kernel"
    assert all(_says(name, "scale_kernel", _vec(dtype), skip) for name in names), names


@pytest.mark.parametrize("side", ["at the threshold", "past the threshold"])
def test_muladd_counts_both_inputs(lib: Any, side: str) -> None:
    edge = _threshold_elements(torch.float32, streams=3)
    n = edge - edge % 4 if side == "at the threshold" else edge + 4
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    names = _kernel_names(lambda: lib.muladd(a, b, -0.75))
    torch.testing.assert_close(lib.muladd(a, b, -0.75), a * b - 0.75)
    skip = "true" if side == "at the threshold" else "false"
    assert names and all(f"elementwise_kernel<4, {skip}," in name for name in names), names


def test_unaligned_input_keeps_the_scalar_path(lib: Any) -> None:
    x = torch.randn(4097, device="cuda")[1:]
    names = _kernel_names(lambda: lib.scale(x, 0.3), "scale_kernel")
    torch.testing.assert_close(lib.scale(x, 0.3), x * 0.3, rtol=0, atol=0)
    assert names and all(_says(name, "scale_kernel", 1, "false") for name in names), names
