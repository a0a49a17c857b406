"""``workbench.check()``: check an op (by name, or a ``torch.ops`` handle with its spec) and get a
:class:`~workbench.verify.report.Report` back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.spec import OpSpec
from workbench.verify import isolate
from workbench.verify.report import Report
from workbench.verify.runner import Options, check_op, samples


def check(
    op_or_name: Any,
    spec: OpSpec | None = None,
    *,
    device: str | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    lib: Any = None,
    trials: int = 3,
    seed: int = 0,
    contract: bool = True,
    strict: bool = False,
) -> Report:
    """Check an op against its spec on every sample, dtype and seed, plus the op contract.

    ``op_or_name``: an op name of ``lib`` (``workbench.check`` loads the bundled library where it
    is left out),
    ``lib.<op>`` / ``torch.ops.<ns>.<op>`` of a loaded library, or any op or callable together
    with its ``spec``. ``device``: ``"cpu"``, ``"cuda"`` or ``"all"`` (default: every device
    the spec lists that this process can run). ``dtypes`` defaults to the spec's.
    ``report.passed`` says whether everything passed; ``strict=True`` raises
    :class:`~workbench.verify.report.CheckFailed` on any failure instead of returning.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    op, spec = resolve(op_or_name, spec, lib)
    report = Report(warnings=sample_warnings(spec))
    options = Options(trials=trials, seed=seed, contract=contract)
    for dev in devices_for(spec, device):
        try:
            report.rows += check_op(op, spec, dev, dtypes, options=options)
        except isolate.ContextLost as lost:
            report.extend(lost.report)
            report.warnings.append(
                f"{spec.name}: a CUDA error broke this process's CUDA context; restart Python "
                "before using CUDA again (`wb check` isolates such ops in child processes)"
            )
    if strict:
        report.raise_for_failure()
    return report


def resolve(op_or_name: Any, spec: OpSpec | None, lib: Any) -> tuple[Any, OpSpec]:
    """(callable op, its spec) from a name, an op handle, or an op with an explicit spec."""
    if isinstance(op_or_name, str):
        if lib is None:
            raise WorkbenchError(
                "check needs the library it works on: pass lib=workbench.load(...), or call "
                "workbench.check, which loads the bundled kernels when lib is left out"
            )
        if op_or_name not in lib.specs:
            known = ", ".join(sorted(lib.specs)) or "none"
            raise WorkbenchError(f"no op spec named {op_or_name!r}; ops with specs: {known}")
        return getattr(lib, op_or_name), spec or lib.specs[op_or_name]
    if spec is None:
        spec = spec_of(op_or_name)
    return op_or_name, spec


def qualified_name(op: Any) -> str | None:
    """``ns::name`` of a torch op handle (packet, overload or custom op), else None."""
    for attr in ("_qualified_op_name", "_qualname"):
        name = getattr(op, attr, None)
        if isinstance(name, str):
            return name
    schema = getattr(op, "_schema", None)
    return getattr(schema, "name", None)


def spec_of(op: Any) -> OpSpec:
    """The spec the loader registered for a loaded op."""
    from workbench import loader

    name = qualified_name(op)
    if name and "::" in name:
        ns, short = name.split("::", 1)
        found = loader.registered_spec(ns, short.split(".", 1)[0])
        if found is not None:
            return found
    raise WorkbenchError(f"no op spec known for {name or op!r}; pass it: workbench.check(op, spec)")


def devices_for(spec: OpSpec, device: str | None) -> list[str]:
    if device not in (None, "all", "cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'all', got {device!r}")
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise WorkbenchError("device='cuda' but torch sees no CUDA GPU (torch.cuda.is_available())")
    wanted = ["cpu", "cuda"] if device in (None, "all") else [device]
    chosen = [d for d in wanted if d in spec.devices and (d == "cpu" or has_cuda)]
    if device in ("cpu", "cuda") and not chosen:
        raise WorkbenchError(
            f"{spec.name}'s spec lists devices {list(spec.devices)}, not {device!r}"
        )
    return chosen


def sample_warnings(spec: OpSpec) -> list[str]:
    """Weak spots in a spec's samples: inputs a wrong kernel could pass on."""
    dtype = spec.dtypes[0]
    found = samples(spec, dtype, "cpu", 0)
    tensors = [a for s in found for a in s.args if isinstance(a, torch.Tensor)]
    floating = [t for t in tensors if t.is_floating_point() and t.numel()]
    notes = []
    if floating and not any(bool((t < 0).any()) for t in floating):
        notes.append(
            f"{spec.name}: no sample has a negative input; an abs/identity kernel may pass"
        )
    if not any(t.numel() == 0 for t in tensors):
        notes.append(f"{spec.name}: no empty sample")
    if not any(0 < t.numel() <= 1 for t in tensors):
        notes.append(f"{spec.name}: no sample of size 1")
    if not any(not t.is_contiguous() for t in tensors):
        notes.append(f"{spec.name}: no non-contiguous sample")
    return notes
