"""``workbench.bench``/``check``/``tune``: the layer functions take the library they work on;
the front door supplies the bundled one where a call names none."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import workbench
from workbench import facade
from workbench.benchmark import run as bench_run
from workbench.compat import dispatch
from workbench.errors import WorkbenchError
from workbench.tuning import run as tune_run
from workbench.verify import api as verify_api


def test_the_front_door_names_are_the_facades() -> None:
    assert workbench.bench is facade.bench
    assert workbench.check is facade.check
    assert workbench.tune is facade.tune
    assert facade.bench.__doc__ == bench_run.bench.__doc__  # help() shows the layer's docs


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: bench_run.bench("muladd"), "bench"),
        (lambda: tune_run.tune("muladd"), "tune"),
        (lambda: verify_api.check("muladd"), "check"),
    ],
)
def test_a_layer_function_without_a_library_names_the_fix(call: object, what: str) -> None:
    fix = rf"pass lib=workbench.load\(\.\.\.\).*workbench\.{what}"
    with pytest.raises(WorkbenchError, match=fix):
        call()  # type: ignore[operator]


def test_check_by_name_loads_the_bundled_kernels(lib: object) -> None:
    report = workbench.check("muladd", device="cpu", dtypes=[torch.float32], trials=1)
    assert report.passed and {row.op for row in report.rows} == {"muladd"}


def test_check_of_an_op_with_its_spec_loads_nothing(lib: Any) -> None:
    # The libraries alive before, held (so that one an earlier test left for the collector, dying
    # meanwhile, does not count as a change): none may be added.
    before = set(dispatch.libraries)
    report = facade.check(lib.scale, lib.specs["scale"], device="cpu", dtypes=[torch.float32])
    assert report.passed and set(dispatch.libraries) == before
