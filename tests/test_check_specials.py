"""The special-values sample (NaN, Inf, -0.0, subnormals, the largest finite values): how it is
made from a spec's own samples, how the oracle judges it, and the spec's opt-out (no compiler)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.spec import OpSpec, Sample, randn
from workbench.verify import check, compare
from workbench.verify.runner import value_samples
from workbench.verify.specials import LABEL, base_sample, special_sample, values

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _kinds(t: torch.Tensor) -> set[str]:
    """Which special values ``t`` holds."""
    x, info = t.double(), torch.finfo(t.dtype)
    found = {
        "nan": bool(x.isnan().any()),
        "+inf": bool((x == float("inf")).any()),
        "-inf": bool((x == float("-inf")).any()),
        "-0.0": bool(((x == 0) & x.signbit()).any()),
        "subnormal": bool(((x != 0) & (x.abs() < info.tiny)).any()),
        "max": bool((x == info.max).any()),
        "lowest": bool((x == info.min).any()),
    }
    return {k for k, v in found.items() if v}


ALL = {"nan", "+inf", "-inf", "-0.0", "subnormal", "max", "lowest"}


@pytest.mark.parametrize("dtype", FLOATS)
def test_the_values_are_the_dtypes_own(dtype: torch.dtype) -> None:
    v = values(dtype)
    assert v.dtype == dtype and _kinds(v) == ALL


def _reference(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, eps: float) -> torch.Tensor:
    return x * w[idx] + eps


def _samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    idx = torch.arange(8) % 3
    return [
        Sample((randn((0, 8), dtype, device, gen), randn((3,), dtype, device, gen), idx, 0.5), "e"),
        Sample((randn((1, 8), dtype, device, gen), randn((3,), dtype, device, gen), idx, 0.5), "1"),
        Sample(
            (
                randn((40, 8), dtype, device, gen, strided=True),
                randn((3,), dtype, device, gen),
                idx,
                0.5,
            ),
            "strided",
        ),
    ]


SPEC = OpSpec("gather_scale", _reference, _samples, lambda *a: torch.empty(0))


@pytest.mark.parametrize("dtype", FLOATS)
def test_every_floating_input_gets_every_value_scattered_and_the_rest_is_kept(
    dtype: torch.dtype,
) -> None:
    found = _samples(dtype, torch.device("cpu"), torch.Generator().manual_seed(0))
    special = special_sample(SPEC, dtype, found, torch.Generator().manual_seed(1))
    assert special is not None and special.label == LABEL
    x, w, idx, eps = special.args
    base = found[2].args  # the largest non-empty sample
    assert x.shape == base[0].shape and w.shape == base[1].shape
    assert idx is base[2] and eps == base[3]  # non-floating arguments are kept
    assert _kinds(x) == ALL and _kinds(w) <= ALL and len(_kinds(w)) == 3
    flat = x.flatten().double()
    changed = (flat != base[0].flatten().double()) | flat.isnan()
    positions = changed.nonzero().flatten()
    assert len(positions) >= 8 and int(positions.max()) > len(flat) // 2  # not only the front
    assert torch.equal(base[0], found[2].args[0])  # the spec's own sample is untouched


def test_the_positions_change_with_the_seed() -> None:
    found = _samples(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    a, b = (
        special_sample(SPEC, torch.float32, found, torch.Generator().manual_seed(s)) for s in (1, 2)
    )
    assert a is not None and b is not None
    assert not torch.equal(a.args[0].isnan(), b.args[0].isnan())


def test_the_check_adds_it_to_floating_dtypes_only() -> None:
    assert value_samples(SPEC, torch.float32, "cpu", 0)[-1].label == LABEL
    ints = dataclasses.replace(SPEC, dtypes=(torch.int32,))
    assert all(s.label != LABEL for s in value_samples(ints, torch.int32, "cpu", 0))
    empty = [found for found in _samples(torch.float32, torch.device("cpu"), torch.Generator())[:1]]
    assert base_sample(empty) is None


def test_opting_out_needs_a_reason_that_names_the_op() -> None:
    with pytest.raises(ValueError, match=r"'gather_scale'.*why="):
        dataclasses.replace(SPEC, specials=False)
    out = dataclasses.replace(SPEC, specials=False, why="NaN inputs are rejected by design")
    assert all(s.label != LABEL for s in value_samples(out, torch.float32, "cpu", 0))


def test_a_python_op_that_handles_specials_right_passes() -> None:
    report = check(_reference, SPEC, device="cpu", trials=2, contract=False)
    assert report.passed, str(report)
    assert LABEL in {r.label for r in report.rows}


def test_zeros_of_either_sign_and_nans_of_either_sign_compare_equal() -> None:
    ref = torch.tensor([0.0, -0.0, float("nan"), float("nan")], dtype=torch.float64)
    got = torch.tensor([-0.0, 0.0, float("nan"), float("nan")])
    got[3] = -got[3]  # a NaN with its sign bit set
    assert bool(got[3].signbit())
    assert compare(got, ref, torch.float32, (1e-4, 1e-5)).passed


def test_a_row_the_truth_makes_all_nan_is_judged_by_it() -> None:
    """A reduction over a row holding NaN: the whole row is NaN, and must be."""
    ref = torch.tensor([[1.0, 2.0], [float("nan"), float("nan")]], dtype=torch.float64)
    right = ref.float()
    wrong = right.clone()
    wrong[1, 0] = 0.0
    assert compare(right, ref, torch.float32, (1e-4, 1e-5)).passed
    assert compare(wrong, ref, torch.float32, (1e-4, 1e-5)).reason == "nonfinite"


def test_the_largest_value_may_overflow_where_pytorch_does_too() -> None:
    x = torch.tensor([torch.finfo(torch.float32).max, 1.0])
    ref64 = x.double() * 4  # finite in float64, beyond float32
    assert compare(x * 4, ref64, torch.float32, (1e-4, 1e-5), x * 4).passed


def test_a_spec_may_leave_out_named_kinds_with_a_reason() -> None:
    from workbench.spec import OpSpec
    from workbench.verify.specials import values

    base = dict(name="op", reference=torch.neg, samples=lambda *a: [], fake=torch.neg)
    with pytest.raises(ValueError, match="specials_exclude needs a reason"):
        OpSpec(**base, specials_exclude=("max",))
    with pytest.raises(ValueError, match=r"unknown kinds \['huge'\]"):
        OpSpec(**base, specials_exclude=("huge",), why="x")
    kept = values(torch.float32, ("max",))
    assert not (kept.abs() == torch.finfo(torch.float32).max).any()
    assert torch.isnan(kept).any() and torch.isinf(kept).any()
