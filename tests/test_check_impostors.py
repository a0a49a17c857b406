"""The check checks itself: every impostor fails, with the right reason; a right kernel passes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import workbench
from tests.impostors import CPP_REASONS, PY_REASONS, python_impostors, write_impostors
from workbench.verify import Report, specials


@pytest.fixture(scope="module")
def impostors(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Any:
    from workbench import knobs

    kernels = write_impostors(tmp_path_factory.mktemp("impostors"))
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        return workbench.load(kernels, namespace="impostor")


def _assert_caught(report: Report, reason: str) -> None:
    """The report fails, its failing value rows all give ``reason``, and no check errored.

    The special-values sample (NaN, Inf, ...) may fail for another reason than the finite ones
    (zeros for NaN reads as misplaced NaN): the reason is that of the finite samples where any
    fail, else that of the special one.
    """
    assert not report.passed, str(report)
    values = [r for r in report.failures if r.check == "values"]
    failing = values or report.failures
    assert failing, str(report)
    finite = [r for r in failing if r.label != specials.LABEL]
    assert {r.reason for r in finite or failing} == {reason}, str(report)


@pytest.mark.parametrize("name", sorted(PY_REASONS))
def test_a_python_impostor_fails_with_its_reason(lib: Any, name: str) -> None:
    op, spec = python_impostors_once(lib)[name]
    _assert_caught(
        workbench.check(op, spec, device="cpu", trials=2, contract=False), PY_REASONS[name]
    )


@pytest.mark.parametrize("name", ["nan_to_zero", "inf_clamped"])
def test_only_the_special_values_catch_a_kernel_that_hides_nan_or_inf(lib: Any, name: str) -> None:
    op, spec = python_impostors_once(lib)[name]
    report = workbench.check(op, spec, device="cpu", trials=2, contract=False)
    assert {r.label for r in report.failures} == {specials.LABEL}, str(report)
    assert all("NaN/Inf at other places" in r.detail for r in report.failures)
    without = dataclasses.replace(spec, specials=False, why="the test shows what specials add")
    assert workbench.check(op, without, device="cpu", trials=2, contract=False).passed


@pytest.mark.parametrize("name", sorted(CPP_REASONS))
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_cpp_impostor_fails_with_its_reason(impostors: Any, name: str, device: str) -> None:
    report = workbench.check(name, lib=impostors, device=device, trials=2, contract=False)
    _assert_caught(report, CPP_REASONS[name])


def test_the_first_block_impostor_passes_samples_that_fit_one_block(impostors: Any) -> None:
    """Only the awkward sizes catch it: the check must hold them (it does: size 1 passes)."""
    report = workbench.check("scale_first_block", lib=impostors, device="cpu", contract=False)
    passing = {r.label for r in report.rows if r.passed}
    failing = {r.label for r in report.failures}
    assert {"empty", "one"} <= passing and {"odd", "large", "strided"} <= failing


def test_the_same_kernel_written_right_passes(impostors: Any) -> None:
    """scale_default_stream is right on CPU: the impostor checks are not just always failing."""
    report = workbench.check("scale_default_stream", lib=impostors, device="cpu", trials=2)
    assert report.passed, str(report)
    assert {"values", "opcheck", "compile"} <= {r.check for r in report.rows}


@pytest.mark.cuda
def test_a_kernel_on_the_default_stream_fails_the_stream_check(impostors: Any) -> None:
    report = workbench.check("scale_default_stream", lib=impostors, device="cuda", trials=1)
    failed = {r.check for r in report.failures}
    assert "stream" in failed, str(report)
    stream = [r for r in report.failures if r.check == "stream"]
    assert all(r.reason == "stream" for r in stream)


def test_a_declared_nondeterministic_op_skips_the_bitwise_check(lib: Any) -> None:
    op, spec = python_impostors_once(lib)["jitter"]  # right values, different bits every call
    strict = workbench.check(op, spec, device="cpu", trials=1, contract=False)
    assert not strict.passed
    assert {r.reason for r in strict.failures} == {"nondeterministic"}, str(strict)
    loose = dataclasses.replace(spec, nondeterministic=True)
    assert workbench.check(op, loose, device="cpu", trials=1, contract=False).passed


_PY: dict[str, Any] = {}


def python_impostors_once(lib: Any) -> dict[str, Any]:
    """torch.library ops can be defined once per process."""
    if not _PY:
        _PY.update(python_impostors(lib.specs["scale"]))
    return _PY
