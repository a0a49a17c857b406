"""The standalone path: a registry family as a pybind11 module over NumPy arrays, no torch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from workbench import knobs, standalone


def test_muladd_over_numpy_on_cpu() -> None:
    m = standalone.load("muladd", with_cuda=False)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((7, 33)), rng.standard_normal((7, 33))
    np.testing.assert_allclose(m.muladd(a, b, -0.5), a * b - 0.5, rtol=1e-15)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    out = m.mul(a32, b32)
    assert out.dtype == np.float32 and out.shape == (7, 33)
    np.testing.assert_allclose(out, a32 * b32, rtol=1e-6)
    np.testing.assert_allclose(m.mul(a[:, ::2], b[:, ::2]), a[:, ::2] * b[:, ::2])  # strided in
    assert m.muladd(np.empty(0), np.empty(0), 1.0).shape == (0,)
    with pytest.raises(ValueError, match="muladd: expected b to have the shape of a"):
        m.muladd(a, b[:3], 1.0)
    with pytest.raises(ValueError, match="built without CUDA"):
        m.mul(a, b, device="cuda")


def test_the_module_runs_where_torch_cannot_be_imported() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import numpy as np
        from workbench import standalone
        m = standalone.load("muladd", with_cuda=False)
        print(m.muladd(np.arange(3.0), np.full(3, 2.0), 1.0).tolist())
        """
    )
    env = dict(os.environ, WB_CACHE_DIR=knobs.cache_dir().as_posix(), WB_QUIET="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1.0, 3.0, 5.0]"


def test_a_family_without_a_standalone_binding_names_the_file() -> None:
    with pytest.raises(Exception, match=r"bindings/python/scale\.cpp"):
        standalone.load("scale", with_cuda=False)


@pytest.mark.nvcc
def test_the_cuda_build_compiles_and_links_here() -> None:
    with knobs.override(TORCH_CUDA_ARCH_LIST="9.0"):
        m = standalone.load("muladd", with_cuda=True)
    assert m.with_cuda
    np.testing.assert_allclose(m.mul(np.ones(3), np.ones(3)), np.ones(3))  # the CPU path still


@pytest.mark.cuda
def test_muladd_over_numpy_on_cuda_with_staging() -> None:
    m = standalone.load("muladd", with_cuda=True)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(100_003), rng.standard_normal(100_003)
    # nvcc contracts a * b + c into one fused multiply-add (one rounding instead of two).
    np.testing.assert_allclose(m.muladd(a, b, 2.0, device="cuda"), a * b + 2.0, rtol=1e-10)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_allclose(m.mul(a32, b32, device="cuda"), a32 * b32, rtol=1e-6)
