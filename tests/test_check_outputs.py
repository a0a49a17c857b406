"""The check on ops that are not one tensor in, one tensor out: several outputs, integer outputs
(compared exactly, poisoned with the dtype's largest value), arguments written in place
(``Tensor(a!)``), keyword-only arguments. Each contract comes with impostors it must catch.

The ops are Python kernels registered with ``torch.library`` in namespace ``wbout`` (the check
sees torch ops, whatever language their kernels are in); their fake functions and the functional
twin of the in-place op come from the workbench's own registration (``workbench.runtime``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import workbench
from workbench import runtime
from workbench.spec import OpSpec, Sample, randn
from workbench.verify import Report, specials

NS = "wbout"


def _add_ref(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    torch.add(a, b, out=out)


def _add_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    out = []
    for label, shape in (("empty", (0,)), ("one", (1,)), ("odd", (7, 13))):
        a, b = randn(shape, dtype, device, gen), randn(shape, dtype, device, gen)
        out.append(Sample((a, b, torch.full_like(a, float("nan"))), label))
    buf = randn((6, 20), dtype, device, gen)
    a, b = randn((6, 10), dtype, device, gen), randn((6, 10), dtype, device, gen)
    out.append(Sample((a, b, buf[:, ::2]), "strided_out"))
    return out


def _add_fake(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    return None


def _scale_ref(x: torch.Tensor, s: float) -> torch.Tensor:
    return x.mul_(s)


def _scale_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    return [
        Sample((randn((5, 9), dtype, device, gen), 0.3), "odd"),
        Sample((randn((8, 30), dtype, device, gen)[:, 2:11], -0.3), "sliced"),
    ]


def _minmax_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.amin(-1), x.amax(-1)


def _minmax_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1])


def _rows_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    return [Sample((randn((rows, 33), dtype, device, gen),), f"{rows}x33") for rows in (1, 6)]


def _signs_ref(x: torch.Tensor) -> torch.Tensor:
    """Counts of negative, zero and positive elements: int64 [3] for any input dtype."""
    return torch.stack([(x < 0).sum(), (x == 0).sum(), (x > 0).sum()])


def _signs_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((3,), dtype=torch.int64)


def _signs_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    x = randn((40,), torch.float32, device, gen)
    x[::7] = 0
    return [Sample((x.to(dtype),), "40")]


SCHEMAS = {
    "add_out": "(Tensor a, Tensor b, *, Tensor(a!) out) -> ()",
    "scale_": "(Tensor(a!) x, float s) -> Tensor(a!)",
    "minmax": "(Tensor x) -> (Tensor, Tensor)",
    "signs": "(Tensor x) -> Tensor",
}
SPECS = {
    "add_out": dict(reference=_add_ref, samples=_add_samples, fake=_add_fake),
    "scale_": dict(reference=_scale_ref, samples=_scale_samples, fake=lambda x, s: x),
    "minmax": dict(reference=_minmax_ref, samples=_rows_samples, fake=_minmax_fake),
    "signs": dict(
        reference=_signs_ref, samples=_signs_samples, fake=_signs_fake, specials=False,
        why="counting signs: NaN has none", dtypes=(torch.float32, torch.int32, torch.int64),
    ),
}  # fmt: skip


def _add_out_writes_a(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    torch.add(a, b, out=out)
    a.add_(1)


def _add_out_skips_last(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    if not out.is_contiguous():
        out.copy_(a + b)
    elif out.numel():
        out.view(-1)[:-1] = (a + b).reshape(-1)[:-1]


def _add_out_past_view(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    whole = torch.empty(0, dtype=out.dtype).set_(out.untyped_storage())
    whole.zero_()  # the whole buffer out is a view of, not only its elements
    torch.add(a, b, out=out)


def _scale_returns_new(x: torch.Tensor, s: float) -> torch.Tensor:
    x.mul_(s)
    return x.clone()


def _minmax_wrong_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.amin(-1), x.abs().amax(-1)


def _signs_off_by_one(x: torch.Tensor) -> torch.Tensor:
    return _signs_ref(x) + torch.tensor([0, 0, 1])


def _signs_unwritten(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty((3,), dtype=torch.int64)  # the poisoned allocator fills it
    out[:2] = _signs_ref(x)[:2]
    return out


# op name -> (schema of, kernel, reason the check must fail with, or "" for the right kernel)
KERNELS: dict[str, tuple[str, Callable[..., Any], str]] = {
    "add_out": ("add_out", _add_ref, ""),
    "add_out_writes_a": ("add_out", _add_out_writes_a, "mutated"),
    "add_out_skips_last": ("add_out", _add_out_skips_last, "unwritten"),
    "add_out_past_view": ("add_out", _add_out_past_view, "mutated"),
    "scale_": ("scale_", lambda x, s: x.mul_(s), ""),
    "scale_returns_new": ("scale_", _scale_returns_new, "mutated"),
    "minmax": ("minmax", _minmax_ref, ""),
    "minmax_wrong_max": ("minmax", _minmax_wrong_max, "values"),
    "signs": ("signs", _signs_ref, ""),
    "signs_off_by_one": ("signs", _signs_off_by_one, "values"),
    "signs_unwritten": ("signs", _signs_unwritten, "unwritten"),
}


@pytest.fixture(scope="module")
def ops() -> Iterator[dict[str, tuple[Any, OpSpec]]]:
    keep: list[torch.library.Library] = []
    lib = torch.library.Library(NS, "FRAGMENT")
    keep.append(lib)
    found = {}
    for name, (kind, kernel, _) in KERNELS.items():
        schema = f"{name}{SCHEMAS[kind]}"
        lib.define(schema)
        lib.impl(name, kernel, "CPU")
        spec = OpSpec(name=name, **SPECS[kind])  # type: ignore[arg-type]
        keep.append(runtime.register_python(NS, spec, schema))
        found[name] = (getattr(torch.ops.wbout, name), spec)
    yield found
    for held in reversed(keep):
        held._destroy()


def _check(ops: dict[str, tuple[Any, OpSpec]], name: str, contract: bool = False) -> Report:
    op, spec = ops[name]
    return workbench.check(op, spec, device="cpu", trials=1, contract=contract)


@pytest.mark.parametrize("name", [n for n, k in KERNELS.items() if k[2]])
def test_an_impostor_fails_with_its_reason(ops: Any, name: str) -> None:
    report = _check(ops, name)
    assert not report.passed, str(report)
    # The special-values sample may fail for another reason (a wrong max meets an Inf).
    finite = [r for r in report.failures if r.label != specials.LABEL]
    assert {r.reason for r in finite or report.failures} == {KERNELS[name][2]}, str(report)


@pytest.mark.parametrize("name", [n for n, k in KERNELS.items() if not k[2]])
def test_the_right_kernel_passes_values_opcheck_and_compile(ops: Any, name: str) -> None:
    report = _check(ops, name, contract=True)
    assert report.passed, str(report)
    checks = {r.check for r in report.rows}
    assert {"values", "opcheck", "compile"} <= checks, checks


def test_each_failure_names_the_output(ops: Any) -> None:
    report = _check(ops, "minmax_wrong_max")
    assert all(r.detail.startswith("output 1:") for r in report.failures), str(report)
    report = _check(ops, "add_out_writes_a")
    assert all("argument 0 changed" in r.detail for r in report.failures), str(report)
    report = _check(ops, "scale_returns_new")
    assert all("must be argument 0 itself" in r.detail for r in report.failures), str(report)


def test_integer_outputs_compare_exactly_for_every_input_dtype(ops: Any) -> None:
    report = _check(ops, "signs")
    assert {r.dtype for r in report.rows} == {"float32", "int32", "int64"}
    assert report.passed, str(report)
    report = _check(ops, "signs_off_by_one")
    assert all("compared exactly" in r.detail for r in report.failures), str(report)
    report = _check(ops, "signs_unwritten")
    assert all("poison" in r.detail for r in report.failures), str(report)


def test_the_written_arguments_of_the_sample_are_left_as_they_were(ops: Any) -> None:
    op, spec = ops["scale_"]
    (sample,) = [s for s in spec.samples(torch.float32, torch.device("cpu"), torch.Generator())
                 if s.label == "odd"]  # fmt: skip
    before = sample.args[0].clone()
    verdict = workbench.verify.check_call(op, spec, sample.args)
    assert verdict.passed, verdict
    assert torch.equal(sample.args[0], before)


@pytest.mark.filterwarnings("ignore:Warning only once")
def test_an_in_place_op_returning_its_argument_compiles_to_its_own_kernel(ops: Any) -> None:
    op, _ = ops["scale_"]
    calls: list[int] = []
    lib = torch.library.Library(NS, "IMPL")

    def counted(x: torch.Tensor, s: float) -> torch.Tensor:
        calls.append(1)
        return x.mul_(s)

    lib.impl("scale_", counted, "CPU", allow_override=True)
    try:
        x = torch.randn(4, 6)
        want = x * 0.5
        fn = torch.compile(lambda t: op(t[:, 1:], 0.5), backend="aot_eager", fullgraph=True)
        got = x.clone()
        returned = fn(got)
        assert torch.equal(got[:, 1:], want[:, 1:]) and torch.equal(got[:, :1], x[:, :1])
        assert returned.shape == (4, 5) and calls, "the compiled graph must call the op's kernel"
    finally:
        lib._destroy()
