"""C++ autograd kernels (WB_AUTOGRAD, bindings/include/wb/autograd.h): an op's spec and its library
agree on who differentiates it, or the load is refused naming the op and the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from workbench import runtime
from workbench.spec import OpSpec

# --- the spec and the library agree on who differentiates an op ---------------------------------


def _spec(**kwargs: Any) -> OpSpec:
    return OpSpec(name="op", reference=torch.neg, samples=lambda *a: [], fake=torch.neg, **kwargs)


def test_a_spec_with_cpp_autograd_takes_no_python_backward() -> None:
    with pytest.raises(ValueError, match="takes no backward= or setup_context="):
        _spec(cpp_autograd=True, backward=lambda ctx, g: (g,))
    assert _spec(cpp_autograd=True).differentiable and not _spec().differentiable


@pytest.mark.parametrize(
    ("spec", "cpp", "message"),
    [
        (_spec(backward=lambda ctx, g: (g,)), True, r"a Python backward .* remove backward="),
        (_spec(), True, r"does not declare it: set cpp_autograd=True"),
        (_spec(cpp_autograd=True), False, r'no C\+\+ autograd kernel .* WB_AUTOGRAD\("op"'),
    ],
)
def test_a_disagreement_is_refused_naming_the_op_and_the_fix(
    spec: OpSpec, cpp: bool, message: str
) -> None:
    with pytest.raises(runtime.AutogradError, match=f"op op: .*{message}"):
        runtime.check_autograd(spec, "op", cpp)
    runtime.check_autograd(None, "op", cpp)  # an op with no spec: nothing to agree on
