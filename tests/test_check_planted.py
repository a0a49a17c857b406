"""Planted bugs, one class each (strides, tails, value ranges, dtypes, aliasing, determinism,
autograd): the check fails every one with the reason that names it, and passes the same kernel
written right. See ``PLANTED`` in tests/planted.py for the table."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench
from tests.planted import (
    AUTOGRAD_REASONS,
    PLANTED,
    PLANTED_NO_MAX,
    autograd_impostors,
    write_planted,
)
from workbench.spec import OpSpec, Sample, randn
from workbench.verify import Report, compare, runner
from workbench.verify.variants import relaid, tail_lengths

# Caught only by the samples the check derives (layouts, tails, the 0-d scalar): with those
# turned off, the bundled spec's own samples let them pass.
NEEDS_DERIVED = (
    "scale_packed_rows",
    "scale_out_like_x",
    "scale_tail_mod8",
    "scale_tail_mod32",
    "scale_last_dim1",
    "scale_scalar_shape",
)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Any:
    from workbench import knobs

    kernels = write_planted(tmp_path_factory.mktemp("planted"))
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        return workbench.load(kernels, namespace="planted")


def _spec(lib: Any, planted: Any, name: str) -> OpSpec:
    """The bundled op's spec (its own samples, tolerances, specials) under the planted name."""
    family = PLANTED[name][0] if name in PLANTED else "scale"
    if family not in lib.specs:
        return planted.specs[name]
    return dataclasses.replace(
        lib.specs[family], name=name, backward=None, setup_context=None, devices=("cpu",)
    )


def _check(planted: Any, spec: OpSpec, name: str, derived: bool = True) -> Report:
    op = getattr(planted, name)
    options = runner.Options(trials=1, contract=False, derived=derived)
    return Report(rows=runner.check_op(op, spec, "cpu", options=options))


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_bug_fails_with_the_reason_that_names_it(
    lib: Any, planted: Any, name: str
) -> None:
    report = _check(planted, _spec(lib, planted, name), name)
    reason = PLANTED[name][1]
    assert not report.passed, str(report)
    assert reason in {r.reason for r in report.failures}, str(report)
    row = next(r for r in report.failures if r.reason == reason)
    assert row.op == name and row.label and row.dtype  # names the op, the sample and the dtype


@pytest.mark.parametrize("name", NEEDS_DERIVED)
def test_only_the_derived_samples_catch_what_the_spec_misses(
    lib: Any, planted: Any, name: str
) -> None:
    spec = _spec(lib, planted, name)
    assert _check(planted, spec, name, derived=False).passed
    caught = _check(planted, spec, name).failures
    own = {s.label for s in runner.samples(spec, torch.float32, "cpu", 0)}
    assert caught and not own & {r.label for r in caught}, caught


def _contiguous_only(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list:
    return [Sample((randn((7, 131), dtype, device, gen), 0.3), "odd")]


@pytest.mark.parametrize(
    "name, label",
    [
        ("scale_as_contiguous", "layout:"),  # no strided sample: the derived layouts catch it
        ("scale_empty_raises", "tail:0"),  # no empty sample: the tail of length 0
        ("scale_big_chunk", "grown"),  # nothing past 64Ki elements: the grown sample
    ],
)
def test_a_spec_of_one_contiguous_sample_still_catches_each_class(
    lib: Any, planted: Any, name: str, label: str
) -> None:
    spec = dataclasses.replace(_spec(lib, planted, name), samples=_contiguous_only)
    report = _check(planted, spec, name)
    assert any(r.label.startswith(label) for r in report.failures), str(report)


@pytest.mark.parametrize("name", PLANTED_NO_MAX)
def test_the_range_sample_catches_overflow_where_specials_leave_out_the_largest(
    lib: Any, planted: Any, name: str
) -> None:
    spec = dataclasses.replace(_spec(lib, planted, name), specials_exclude=("max",), why="test")
    report = _check(planted, spec, name)
    assert {r.label for r in report.failures} == {"range"}, str(report)
    assert {r.reason for r in report.failures} == {"nonfinite"}


def _short_rows(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list:
    x, w = randn((4, 1000), dtype, device, gen), randn((1000,), dtype, device, gen)
    return [Sample((x, w, 1e-6), "odd")]


def test_the_long_sample_catches_a_half_precision_sum_where_rows_are_short(
    lib: Any, planted: Any
) -> None:
    spec = dataclasses.replace(_spec(lib, planted, "rms_norm_half_acc"), samples=_short_rows)
    report = _check(planted, spec, "rms_norm_half_acc")
    failing = {(r.dtype, r.label) for r in report.failures}
    assert {("float16", "long"), ("bfloat16", "long")} <= failing, str(report)
    assert not any(r.dtype in ("float32", "float64") for r in report.failures), str(report)


def test_the_same_kernel_written_right_passes_every_check(lib: Any, planted: Any) -> None:
    spec = _spec(lib, planted, "scale_exact")
    report = workbench.check(planted.scale_exact, spec, device="cpu", trials=2)
    assert report.passed, str(report)
    labels = {r.label for r in report.rows}
    assert {"layout:transposed", "layout:padded", "tail:0", "tail:1", "scalar", "grown"} <= labels
    assert "long" in labels
    assert "range" in labels


def test_the_tails_cover_every_residue_modulo_32() -> None:
    for n in (7, 33, 65, 4096):
        lengths = tail_lengths(n)
        assert 0 in lengths and 1 in lengths and max(lengths) <= n
        if n > 32:
            assert {k % 32 for k in lengths if k > 1} == set(range(32))


@pytest.mark.parametrize("name", sorted(AUTOGRAD_REASONS))
def test_a_wrong_backward_fails_gradcheck_with_its_reason(lib: Any, name: str) -> None:
    op, spec = _autograd_once(lib)[name]
    report = workbench.check(op, spec, device="cpu", trials=1)
    grads = [r for r in report.failures if r.check == "gradcheck"]
    assert grads, str(report)
    assert any(AUTOGRAD_REASONS[name] in r.detail for r in grads), str(report)
    assert not [r for r in report.failures if r.check == "values"], str(report)


_GRAD: dict[str, Any] = {}


def _autograd_once(lib: Any) -> dict[str, Any]:
    """torch.library ops can be defined once per process."""
    if not _GRAD:
        _GRAD.update(autograd_impostors(lib.specs["scale"], lib.specs["mul"]))
    return _GRAD


def test_an_output_on_another_device_fails_by_name() -> None:
    truth = torch.zeros(3, dtype=torch.float64)
    verdict = compare(torch.empty(3, device="meta"), truth, torch.float32, (1e-4, 1e-5))
    assert verdict.reason == "device" and "meta" in verdict.detail


@pytest.mark.parametrize("how", ["transposed", "padded"])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)])
def test_a_relaid_tensor_keeps_its_values_in_other_strides(how: str, shape: tuple) -> None:
    t = torch.randn(shape)
    r = relaid(t, how)
    assert torch.equal(r, t) and r.storage_offset() % 2 == 1  # off every vector alignment
    assert not r.is_contiguous() or (how == "padded" and len(shape) == 1)
