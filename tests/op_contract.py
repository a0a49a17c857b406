"""Checks every op test runs, through the workbench's own check (workbench.verify), driven by the
op's spec: nothing about an op is written twice."""

from __future__ import annotations

from typing import Any

from workbench.verify import Options, check_op


def _failures(rows: list[Any]) -> str:
    return "\n".join(
        f"{r.dtype} {r.check} {r.label}: {r.reason}: {r.detail} (err/tol {r.ratio:.3g})"
        for r in rows
        if not r.passed
    )


def assert_matches_reference(lib: Any, name: str, device: str) -> None:
    """Every sample (and the special-values one), every dtype of the spec, three seeds, against
    the float64 reference (with poisoned outputs, untouched inputs and a bitwise-equal second
    run)."""
    rows = check_op(getattr(lib, name), lib.specs[name], device, options=Options(contract=False))
    assert rows, f"{name} has no samples"
    assert not _failures(rows), _failures(rows)
    labels = {r.label for r in rows}
    assert {"empty", "one", "strided"} <= labels, f"{name} lacks awkward samples: {labels}"
    spec = lib.specs[name]
    assert "specials" in labels or not spec.specials, f"{name}: no special-values sample"


def assert_contract(lib: Any, name: str, device: str, check: str) -> None:
    """One contract check (opcheck, gradcheck, compile, stream, graph) on every small sample."""
    options = Options(values=False, checks=(check,), contract_samples=100, gradcheck_fast=False)
    rows = check_op(getattr(lib, name), lib.specs[name], device, options=options)
    assert rows, f"{name}: no {check} row"
    assert not _failures(rows), _failures(rows)


def assert_opcheck(lib: Any, name: str, device: str) -> None:
    """torch.library.opcheck with its default tests on every small sample and dtype."""
    assert_contract(lib, name, device, "opcheck")


def assert_gradcheck(lib: Any, name: str, device: str) -> None:
    """Full float64 gradcheck of the registered backward on every small sample."""
    assert_contract(lib, name, device, "gradcheck")
