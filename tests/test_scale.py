"""scale(x, s) = x * s: against the reference, and the op contract."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import DEVICES
from tests.op_contract import assert_gradcheck, assert_matches_reference, assert_opcheck


@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(lib: Any, device: str) -> None:
    assert_matches_reference(lib, "scale", device)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(lib: Any, device: str) -> None:
    assert_opcheck(lib, "scale", device)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(lib: Any, device: str) -> None:
    assert_gradcheck(lib, "scale", device)


def test_rejects_an_unsupported_dtype(lib: Any) -> None:
    with pytest.raises(TypeError, match="scale: x has dtype Long, which is not supported"):
        lib.scale(torch.arange(3), 2.0)
