"""Checking one op against its spec on one device: every dtype, several seeds, every sample, and
the contract checks. Everything comes from the spec; nothing about an op is written here.

Per dtype and seed (fresh inputs on every trial) and per sample, and for a floating dtype one
more sample holding NaN, Inf, -0.0 and subnormals (``specials``), and the samples derived from
the spec's (other layouts, tails, 0-d, grown, a wide range: :mod:`~workbench.verify.variants`),
one ``values`` row: the call
under poisoned allocation, the inputs compared byte for byte before and after, the oracle, and a
second call that must agree bit for bit (unless the spec says ``nondeterministic``). Then per
dtype, on a few small samples of the first trial: ``opcheck``, ``compile`` and on CUDA
``stream`` and ``graph``; and once per device ``gradcheck`` in float64 when the op has a backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from workbench.spec import OpSpec, Sample
from workbench.verify import contract, isolate, specials, variants
from workbench.verify.oracle import (
    CRASH,
    ERROR,
    MUTATED,
    UNWRITTEN,
    Verdict,
    compare_outputs,
    dtype_of,
    fail,
    references,
)
from workbench.verify.report import VALUES, Report, Row
from workbench.verify.schema import flat_outputs, signature

# What a contract check returns when the values already fail on its sample: no row.
_SKIPPED = Verdict(True, float("nan"), "skipped: the values row reports this sample")

# Contract checks run on samples of at most this many elements per tensor: gradcheck perturbs
# every element, and opcheck and torch.compile cost the same for any size.
SMALL_NUMEL = 4096


@dataclass(frozen=True)
class Options:
    trials: int = 3  # seeds per dtype, each with fresh inputs
    seed: int = 0
    contract: bool = True  # opcheck, gradcheck, compile, stream, graph
    contract_samples: int = 2  # small samples per dtype for opcheck / compile / stream / graph
    compile_backend: str = "aot_eager"
    gradcheck_fast: bool = True  # random Jacobian projections; False: perturb every element
    checks: tuple[str, ...] | None = None  # contract checks to run (None: all that apply)
    values: bool = True  # the per-sample value rows
    derived: bool = True  # the samples derived from the spec's (workbench.verify.variants)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_call(
    op: Callable[..., Any], spec: OpSpec, args: tuple[Any, ...], dtype: torch.dtype | None = None
) -> Verdict:
    """Check one call of ``op`` on exactly ``args`` against the spec's reference.

    The call runs with poisoned allocation and its inputs are compared before and after; a
    raised exception is a failed verdict, not an exception. Stable entry point for callers that
    verify their own inputs (benchmarks verify before they time).
    """
    return _call(op, spec, args, dtype or dtype_of(args), spec.name)[0]


def _call(
    op: Callable[..., Any], spec: OpSpec, args: tuple[Any, ...], dtype: torch.dtype, name: str
) -> tuple[Verdict, Any]:
    """One checked call on ``args``: (verdict, the call's outputs). Written arguments get fresh
    copies (:mod:`~workbench.verify.schema`), so ``args`` are never changed by a right op."""
    sig = signature(op)
    try:
        ref64, ref_dtype = references(spec, args, sig)
        fresh = sig.fresh(args)
        before = contract.snapshot(fresh)
        with contract.poisoned():
            returned = sig.call(op, fresh)
        out = sig.outputs(fresh, returned)
        alias = sig.wrong_alias(fresh, returned)
        verdict = (
            (fail(MUTATED, alias) if alias else None)
            or contract.mutated(fresh, before, sig.written)
            or contract.aliased(fresh, returned, sig)
            or compare_outputs(
                out, ref64, dtype, spec, ref_dtype, sig.output_names(len(flat_outputs(out)))
                if sig.mutates else None, args,
            )
        )  # fmt: skip
        if verdict.passed:  # right values: are they where the fake says?
            verdict = contract.layout(spec, fresh, returned, sig) or verdict
        if verdict.reason in (VALUES, UNWRITTEN):  # say so where an out= kept every byte
            verdict = contract.unwritten_argument(fresh, before, sig.written) or verdict
    except Exception as e:  # a kernel error is a failed check, not a crash of the checker
        return _error(name, e), None
    return verdict, out


def invoker(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op`` as a function of the sample's arguments (schema order) returning the call's
    outputs (:meth:`Signature.outputs`): what compile, stream and graph checks run."""
    sig = signature(op)
    if not sig.mutates and not any(sig.kwarg_only):
        return op

    def call(*args: Any) -> Any:
        return sig.outputs(args, sig.call(op, args))

    return call


def _error(name: str, e: BaseException) -> Verdict:
    if isolate.is_cuda_error(e):
        return fail(CRASH, isolate.crash_detail(name, e))
    text = str(e).strip().splitlines()
    return fail(ERROR, f"{type(e).__name__}: {text[0] if text else ''}")


def _row(spec: OpSpec, device: str, dtype: str, label: str, v: Verdict, **kw: Any) -> Row:
    return Row(
        spec.name, device, dtype, label, v.passed, v.ratio, v.explained,
        reason=v.reason, torch_ratio=v.torch_ratio, **kw,
    )  # fmt: skip


def _sample_row(
    op: Callable[..., Any], spec: OpSpec, device: str, dtype: torch.dtype, s: Sample, seed: int
) -> Row:
    verdict, out = _call(op, spec, s.args, dtype, spec.name)
    if verdict.passed and not spec.nondeterministic:
        try:
            sig = signature(op)
            fresh = sig.fresh(s.args)
            with contract.poisoned():
                again = sig.outputs(fresh, sig.call(op, fresh))
            verdict = contract.same_again(out, again, "a second run") or verdict
        except Exception as e:
            verdict = _error(spec.name, e)
    return _row(spec, device, dtype_name(dtype), s.label, verdict, seed=seed)


def samples(spec: OpSpec, dtype: torch.dtype, device: str, seed: int) -> list[Sample]:
    """The spec's samples for one trial: a fresh generator per (seed), the same on every device."""
    return spec.samples(dtype, torch.device(device), torch.Generator().manual_seed(seed))


def value_samples(spec: OpSpec, dtype: torch.dtype, device: str, seed: int) -> list[Sample]:
    """The samples of the ``values`` rows: the spec's, then its special-values sample.

    The special values (NaN, Inf, -0.0, subnormals; :mod:`~workbench.verify.specials`) are for
    the value rows only: gradcheck and the contract checks run on the spec's own samples.
    """
    found = samples(spec, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed)
    special = specials.special_sample(spec, dtype, found, gen)
    return [*found, special] if special is not None else found


def derived_samples(
    op: Any, spec: OpSpec, found: list[Sample], seed: int, first_trial: bool
) -> list[Sample]:
    """The samples the check derives from the spec's ``found`` for one trial: other layouts,
    tails, a 0-d scalar, a grown size, a wide range of values
    (:mod:`~workbench.verify.variants`)."""
    gen = torch.Generator().manual_seed(seed + 1)
    base = variants.base_sample(found)
    return variants.derived(spec, signature(op), base, gen, first_trial)


def is_small(s: Sample) -> bool:
    tensors = [a for a in s.args if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(0 < t.numel() <= SMALL_NUMEL for t in tensors)


def check_op(
    op: Any,
    spec: OpSpec,
    device: str,
    dtypes: Sequence[torch.dtype] | None = None,
    seed: int = 0,
    options: Options | None = None,
    on_check: Callable[[str], None] | None = None,
) -> list[Row]:
    """Every check of ``op`` on ``device``; one row per sample and trial, one per contract check.

    ``on_check`` hears the name of each kind of check as it starts (values, then the contract's
    checks, then gradcheck), with its dtype: a progress line can name what runs.

    Raises :class:`~workbench.verify.isolate.ContextLost` (carrying the rows so far) when a CUDA
    error left this process unable to run CUDA.
    """
    opts = options or Options(seed=seed)
    report = Report()
    tell = on_check or (lambda _: None)
    for dtype in dtypes or spec.dtypes:
        if opts.values and opts.trials:
            tell(f"{dtype_name(dtype)} values")
        for trial in range(opts.trials if opts.values else 0):
            seed = opts.seed + trial
            found = value_samples(spec, dtype, device, seed)
            if opts.derived:
                own = [s for s in found if s.label != specials.LABEL]
                found += derived_samples(op, spec, own, seed, trial == 0)
            for s in found:
                report.rows.append(_sample_row(op, spec, device, dtype, s, seed))
                _stop_if_context_lost(report, device)
        if opts.contract:
            tell(f"{dtype_name(dtype)} contract (opcheck, compile)")
            report.rows += _contract_rows(op, spec, device, dtype, opts)
            _stop_if_context_lost(report, device)
    floats64 = torch.float64 in (dtypes or spec.dtypes)
    if opts.contract and spec.differentiable and floats64 and _wanted(opts, contract.GRADCHECK):
        tell("float64 gradcheck")
        report.rows += _gradcheck_rows(op, spec, device, opts)
    return report.rows


def _stop_if_context_lost(report: Report, device: str) -> None:
    last = report.rows[-1] if report.rows else None
    crashed = device == "cuda" and last is not None and last.reason == CRASH
    if crashed and not isolate.context_alive():
        raise isolate.ContextLost(report)


def _contract_rows(
    op: Any, spec: OpSpec, device: str, dtype: torch.dtype, opts: Options
) -> list[Row]:
    chosen = [s for s in samples(spec, dtype, device, opts.seed) if is_small(s)]
    chosen = chosen[: opts.contract_samples]
    rows = []
    for s in chosen:
        checks: list[tuple[str, Callable[[], Verdict | None]]] = [
            (contract.OPCHECK, partial(contract.run_opcheck, op, s.args, signature(op))),
            (contract.COMPILE, partial(_compiled, op, spec, s, dtype, opts.compile_backend)),
        ]
        if device == "cuda":
            checks += [
                (contract.STREAM, partial(_replayed, op, spec, s, dtype, contract.STREAM)),
                (contract.GRAPH, partial(_replayed, op, spec, s, dtype, contract.GRAPH)),
            ]
        for name, run in checks:
            if _wanted(opts, name):
                rows.append(_contract_row(spec, device, dtype_name(dtype), s.label, name, run))
    return [r for r in rows if r.detail != _SKIPPED.detail]


def _wanted(opts: Options, check: str) -> bool:
    return opts.checks is None or check in opts.checks


def _contract_row(
    spec: OpSpec,
    device: str,
    dtype: str,
    label: str,
    check: str,
    run: Callable[[], Verdict | None],
) -> Row:
    try:
        verdict = run() or Verdict(True, float("nan"), "")
    except Exception as e:
        verdict = _error(spec.name, e)
        if verdict.reason != CRASH:
            verdict = fail(check, verdict.detail)
    return _row(spec, device, dtype, label, verdict, check=check)


def _agrees(
    op: Any,
    spec: OpSpec,
    s: Sample,
    dtype: torch.dtype,
    eager: Any,
    got: Any,
    check: str,
    what: str,
) -> Verdict | None:
    """``got`` must equal the eager output bit for bit (a nondeterministic op: pass the oracle)."""
    if isinstance(got, Verdict):
        return got if got.passed else fail(check, got.detail)
    if spec.nondeterministic:
        ref64, ref_dtype = references(spec, s.args, signature(op))
        v = compare_outputs(got, ref64, dtype, spec, ref_dtype)
        return None if v.passed else fail(check, f"{what}: {v.reason}: {v.detail}")
    if contract.bitwise_equal(eager, got):
        return None
    return fail(check, f"{what} differs from the eager result{_first_diff(eager, got)}")


def _first_diff(eager: Any, got: Any) -> str:
    if isinstance(eager, (tuple, list)) and isinstance(got, (tuple, list)):
        for k, (e, g) in enumerate(zip(eager, got, strict=False)):
            if not contract.bitwise_equal(e, g):
                return f" in output {k}{_first_diff(e, g)}"
        return f": {len(got)} outputs, expected {len(eager)}"
    if not isinstance(got, torch.Tensor) or not isinstance(eager, torch.Tensor):
        return f": got {type(got).__name__}"
    if got.shape != eager.shape:
        return f": got {type(got).__name__} {getattr(got, 'shape', '')}"
    mismatch = (contract.bitwise_mismatch(eager, got)).flatten().nonzero()
    if not len(mismatch):
        return ""
    from workbench.verify.oracle import element

    i = int(mismatch[0])
    return " " + element(i, got.detach().double().cpu(), eager.detach().double().cpu())


def _compiled(op: Any, spec: OpSpec, s: Sample, dtype: torch.dtype, backend: str) -> Verdict | None:
    if _noncontiguous_out(op, s.args):
        return _SKIPPED  # torch.compile refuses it (a graph break), whatever the kernel
    verdict, eager = _call(op, spec, s.args, dtype, spec.name)
    if not verdict.passed:
        return _SKIPPED
    got = contract.run_compiled(invoker(op), signature(op).fresh(s.args), backend)
    return _agrees(op, spec, s, dtype, eager, got, contract.COMPILE, "the compiled output")


def _noncontiguous_out(op: Any, args: tuple[Any, ...]) -> bool:
    """Whether ``args`` pass a non-contiguous tensor as keyword ``out``, which Dynamo will not
    trace (PyTorch's rule for ``out=`` arguments, not this op's)."""
    names = signature(op).kwarg_only
    return any(
        name == "out" and isinstance(a, torch.Tensor) and not a.is_contiguous()
        for a, name in zip(args, names, strict=False)
    )


def _replayed(op: Any, spec: OpSpec, s: Sample, dtype: torch.dtype, check: str) -> Verdict | None:
    verdict, eager = _call(op, spec, s.args, dtype, spec.name)
    if not verdict.passed:
        return _SKIPPED
    if check == contract.STREAM:
        got = contract.run_on_side_stream(invoker(op), s.args)
        what = "the output on a side stream (is the kernel launched on the current stream?)"
    else:
        got = contract.run_graph(invoker(op), s.args)
        what = "the output of a CUDA graph replay"
    return _agrees(op, spec, s, dtype, eager, got, check, what)


def _gradcheck_rows(op: Any, spec: OpSpec, device: str, opts: Options) -> list[Row]:
    if signature(op).mutates:
        return []  # an op that writes into its arguments has no autograd formula to check
    chosen = [s for s in samples(spec, torch.float64, device, opts.seed) if is_small(s)]
    rows = []
    for s in chosen:
        row = _contract_row(
            spec, device, "float64", s.label, contract.GRADCHECK,
            partial(contract.run_gradcheck, op, s.args, opts.gradcheck_fast),
        )  # fmt: skip
        rows.append(row)
    if not chosen:
        rows.append(
            _row(spec, device, "float64", "-", fail(contract.GRADCHECK, "no small sample"),
                 check=contract.GRADCHECK)
        )  # fmt: skip
    return rows


__all__ = [
    "VALUES",
    "Options",
    "check_call",
    "check_op",
    "derived_samples",
    "is_small",
    "samples",
    "value_samples",
]
