"""The oracle and the contract primitives, on hand-made tensors (no compiler)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.spec import OpSpec
from workbench.verify import compare
from workbench.verify.contract import mutated, poisoned, snapshot

FP32 = (1e-4, 1e-5)


def test_a_correct_result_passes_and_unpacks_as_a_triple() -> None:
    ref = torch.linspace(-3, 3, 101, dtype=torch.float64)
    passed, ratio, detail = compare(ref.float(), ref, torch.float32, FP32, ref.float())
    assert passed and ratio < 0.01 and detail.startswith("at [")


def test_pytorchs_own_error_widens_the_allowance_to_twice_it() -> None:
    ref = torch.ones(10, dtype=torch.float64)
    unit = 1e-5 + 1e-4  # the floor bound of an element of 1 with scale 1
    theirs = ref + 10 * unit  # PyTorch itself is 10 floor units off
    ok = compare((ref + 15 * unit).float(), ref, torch.float32, FP32, theirs)
    bad = compare((ref + 25 * unit).float(), ref, torch.float32, FP32, theirs)
    assert ok.passed and ok.torch_ratio == pytest.approx(10, rel=1e-3)
    assert not bad.passed and bad.reason == "values" and bad.ratio == pytest.approx(1.25, rel=1e-2)


def test_without_a_dtype_reference_the_floor_applies() -> None:
    ref = torch.ones(4, dtype=torch.float64)
    assert not compare((ref * (1 + 1e-3)).float(), ref, torch.float32, FP32).passed


def test_atol_scales_with_the_largest_reference_magnitude() -> None:
    ref = torch.tensor([1000.0, 1e-3], dtype=torch.float64)
    got = torch.tensor([1000.0, 1e-3 + 5e-3])  # 5e-3 off, atol 1e-5 * 1000 = 1e-2
    assert compare(got, ref, torch.float32, FP32).passed


def test_the_worst_element_is_named_with_index_got_and_expected() -> None:
    ref = torch.zeros(3, 4, dtype=torch.float64)
    got = torch.zeros(3, 4)
    got[2, 1] = 0.5
    v = compare(got, ref, torch.float32, FP32)
    assert not v.passed and v.detail == "at [2, 1]: got 0.5, expected 0"


def test_nan_where_the_truth_is_finite_reads_as_unwritten() -> None:
    ref = torch.arange(5, dtype=torch.float64)
    got = ref.float().clone()
    got[-1] = float("nan")
    v = compare(got, ref, torch.float32, FP32)
    assert v.reason == "unwritten" and "at [4]" in v.detail and "never written" in v.detail


@pytest.mark.parametrize(
    ("got", "passed"),
    [
        ([1.0, float("inf"), float("nan")], True),
        ([1.0, float("-inf"), float("nan")], False),  # wrong sign of inf
        ([1.0, 3.0e38, float("nan")], False),  # finite where inf is expected
        ([1.0, float("inf"), 0.0], False),  # finite where NaN is expected
    ],
)
def test_nan_and_inf_must_sit_exactly_where_the_truth_has_them(
    got: list[float], passed: bool
) -> None:
    ref = torch.tensor([1.0, float("inf"), float("nan")], dtype=torch.float64)
    v = compare(torch.tensor(got), ref, torch.float32, FP32)
    assert v.passed == passed and (passed or v.reason == "nonfinite")


def test_an_overflow_that_pytorch_shares_is_fair() -> None:
    ref = torch.tensor([70000.0, 1.0], dtype=torch.float64)  # beyond float16's max
    got = torch.tensor([float("inf"), 1.0], dtype=torch.float16)
    assert compare(got, ref, torch.float16, (2e-3, 1e-3), ref.half()).passed


@pytest.mark.parametrize(
    ("got", "reason"),
    [(torch.zeros(3), "shape"), (torch.zeros(2, dtype=torch.float64), "dtype"), (None, "shape")],
)
def test_wrong_shape_dtype_or_type_fails(got: object, reason: str) -> None:
    v = compare(got, torch.zeros(2, dtype=torch.float64), torch.float32, FP32)
    assert not v.passed and v.reason == reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_poisoned_allocation_fills_new_tensors_and_restores_the_mode(dtype: torch.dtype) -> None:
    before = torch.are_deterministic_algorithms_enabled()
    with poisoned():
        t = torch.empty(64, dtype=dtype)
    assert torch.are_deterministic_algorithms_enabled() == before
    if dtype.is_floating_point:
        assert bool(t.isnan().all())
    else:
        assert bool((t == torch.iinfo(dtype).max).all())


def test_a_write_into_an_input_view_or_its_storage_is_caught() -> None:
    base = torch.randn(8, 4)
    view = base[:, ::2]
    args = (view, 2.0)
    saved = snapshot(args)
    assert mutated(args, saved) is None
    base[0, 1] += 1  # outside the view, inside its storage
    v = mutated(args, saved)
    assert v is not None and v.reason == "mutated" and "argument 0" in v.detail


def test_an_overflowing_sum_may_give_nan_or_either_inf() -> None:
    """The truth is finite, but rounds to -Inf in float32: NaN (+Inf and -Inf met in the sum)
    or Inf is accepted there, while a NaN where the truth is representable still fails."""
    big = torch.finfo(torch.float32).max
    ref64 = torch.tensor([-3.0 * big, 1.0], dtype=torch.float64)
    for got in ([float("nan"), 1.0], [float("-inf"), 1.0], [float("inf"), 1.0]):
        v = compare(torch.tensor(got), ref64, torch.float32, (1e-4, 1e-5))
        assert v.passed, (got, v)
    v = compare(torch.tensor([float("-inf"), float("nan")]), ref64, torch.float32, (1e-4, 1e-5))
    assert not v.passed and v.reason == "unwritten"


def test_a_zeros_sign_is_held_only_where_an_input_carries_negative_zero() -> None:
    """x * s of x = -0.0 is -0.0, so +0.0 there is a lost sign; a zero the arithmetic makes from
    other values (y * g - y * d against y * (g - d) at y = 0) may take either sign."""
    truth = torch.tensor([-0.0, 1.0, -0.0], dtype=torch.float64)
    theirs = truth.float()  # PyTorch's own result in the dtype agrees with the truth
    got = torch.tensor([0.0, 1.0, 0.0])
    carried = torch.tensor([-0.0, 1.0, 2.0])  # element 0 comes from a -0.0 input
    lost = compare(got, truth, torch.float32, FP32, theirs, (carried, 3.0))
    assert not lost.passed and lost.reason == "signed_zero" and "(1 such)" in lost.detail
    made = torch.tensor([0.5, 1.0, 2.0])  # no -0.0 in: both zeros are the arithmetic's
    assert compare(got, truth, torch.float32, FP32, theirs, (made,)).passed
    assert compare(got, truth, torch.float32, FP32, theirs).passed  # no inputs named
    other_shape = torch.tensor([[-0.0, -0.0, -0.0]])  # a broadcast input is not the output's
    assert compare(got, truth, torch.float32, FP32, theirs, (other_shape,)).passed


def test_only_a_spec_that_carries_zero_signs_is_held_to_them() -> None:
    """softmax_backward's y * (g - d) at y = -0.0 is -0.0 in PyTorch and +0.0 as y * g - y * d:
    both right. A spec without ``signed_zeros`` is not held to the sign; one with it is."""
    from workbench.verify.oracle import compare_outputs

    truth = torch.tensor([-0.0, 1.0], dtype=torch.float64)
    got, y = torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 0.5])
    plain = OpSpec("plain", torch.neg, lambda *a: [], torch.empty_like)
    carrying = dataclasses.replace(plain, signed_zeros=True)
    args = (truth, torch.float32)
    assert compare_outputs(got, *args, plain, truth.float(), inputs=(y,)).passed
    held = compare_outputs(got, *args, carrying, truth.float(), inputs=(y,))
    assert not held.passed and held.reason == "signed_zero"
