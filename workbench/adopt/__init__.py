"""``wb adopt``: a registry family made from a torch.utils.cpp_extension-style extension.

:func:`adopt` reads the sources (a lexer and a reader of their top-level items, not regular
expressions over the text), plans the split (:mod:`workbench.adopt.plan`), and writes the
family's files, all or none, never over an existing family:

- ``kernels/NAME/NAME.kernel.cu``: the ``__global__`` kernels and the device code they use;
- ``kernels/NAME/NAME.h`` and ``NAME.cu``: a torch-free launcher per kernel;
- ``kernels/NAME/NAME_shared.h``: constants and macros both sides use (when there are any);
- ``kernels/NAME/NAME.cpp``: the CPU kernel TU (the sources' CPU ops take ``at::Tensor``, so
  they live with the binding);
- ``bindings/NAME.cpp``: the host code, schemas and registrations;
- ``kernels/NAME/spec.py``: the op specs, references to fill in (or the ones named).

A construct that cannot be split safely is a :class:`Refusal` naming file:line, and then
nothing is written (:class:`AdoptRefused` lists them all).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from workbench import scaffold
from workbench.adopt import binding, cpu, emit, spec_text
from workbench.adopt.lexer import LexError
from workbench.adopt.parse import ParseError, Unit, parse
from workbench.adopt.plan import Plan, make
from workbench.adopt.registration import Refusal
from workbench.errors import WorkbenchError

__all__ = ["AdoptRefused", "Adopted", "Refusal", "adopt", "plan_sources"]

SUFFIXES = (".cpp", ".cc", ".cxx", ".cu")
_REFERENCE = re.compile(r"(?:(?P<op>[\w.]+)=)?(?P<module>[\w.]+):(?P<attr>\w+)")


class AdoptRefused(WorkbenchError):
    """Constructs adopt cannot split; nothing was written."""

    def __init__(self, refusals: list[Refusal]) -> None:
        lines = "\n".join(f"  {r}" for r in refusals)
        super().__init__(
            f"wb adopt wrote nothing: {len(refusals)} construct(s) cannot be split safely:\n"
            f"{lines}\nmove them by hand as said, then run wb adopt again"
        )
        self.refusals = refusals


@dataclass
class Adopted:
    name: str
    written: list[Path]
    ops: list[str]
    namespace: str  # the extension's own TORCH_LIBRARY namespace
    dropped: list[str]  # what was left out on purpose, and why


def _read(sources: list[Path]) -> list[Unit]:
    if not sources:
        raise WorkbenchError("wb adopt needs the extension's sources: wb adopt a.cpp a.cu --name N")
    units = []
    refusals = []
    for path in sources:
        if path.suffix not in SUFFIXES:
            raise WorkbenchError(
                f"{path}: adopt reads C++ and CUDA sources ({', '.join(SUFFIXES)}); headers "
                "come along with the sources that include them"
            )
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise WorkbenchError(f"cannot read source {path}: {e}") from e
        try:
            units.append(parse(path, text))
        except (LexError, ParseError) as e:
            refusals.append(
                Refusal(
                    f"{path}:{e.line}",
                    str(e),
                    "adopt cannot read the source here: "
                    "check that it compiles, or simplify the construct",
                )
            )
    if refusals:
        raise AdoptRefused(refusals)
    return units


def plan_sources(sources: list[Path]) -> Plan:
    """The split of ``sources``; raises AdoptRefused when any construct is refused."""
    plan = make(_read([Path(s) for s in sources]))
    if plan.refusals:
        raise AdoptRefused(plan.refusals)
    plan.cpu = cpu.functions(plan)
    return plan


def _references(given: list[str], ops: list[str]) -> dict[str, str]:
    out = {}
    for text in given:
        m = _REFERENCE.fullmatch(text)
        if m is None:
            raise WorkbenchError(
                f"--reference {text!r}: write it as module:function (or OP=module:function)"
            )
        op = m.group("op")
        if op is None:
            if len(ops) != 1:
                raise WorkbenchError(
                    f"--reference {text!r} names no op, and the sources define {len(ops)} "
                    f"({', '.join(ops)}): write OP=module:function"
                )
            op = ops[0]
        if op not in ops:
            raise WorkbenchError(f"--reference {text!r}: no op {op!r}; ops: {', '.join(ops)}")
        try:
            module = importlib.import_module(m.group("module"))
        except ImportError as e:
            raise WorkbenchError(f"--reference {text!r}: cannot import the module: {e}") from e
        if not callable(getattr(module, m.group("attr"), None)):
            raise WorkbenchError(
                f"--reference {text!r}: {m.group('module')} has no function {m.group('attr')}"
            )
        out[op] = f"{m.group('module')}:{m.group('attr')}"
    return out


_KEY_DEVICES = {
    "CPU": {"cpu"},
    "CUDA": {"cuda"},
    "CompositeExplicitAutograd": {"cpu", "cuda"},
    "CompositeImplicitAutograd": {"cpu", "cuda"},
    "CatchAll": {"cpu", "cuda"},
}


def _devices(plan: Plan) -> dict[str, tuple[str, ...]]:
    keys: dict[str, set[str]] = {}
    for b in plan.blocks:
        for op, _, impl in b.defs:
            keys.setdefault(op, set())
            if impl is not None:
                keys[op] |= {"cpu", "cuda"}
        for op in b.impls:
            dev = _KEY_DEVICES.get(b.key, set())  # Meta, Autograd, ...: no device of their own
            keys.setdefault(op, set()).update(dev)
    return {
        op: tuple(d for d in ("cpu", "cuda") if d in k) or ("cpu", "cuda") for op, k in keys.items()
    }


def family_texts(plan: Plan, name: str, references: dict[str, str]) -> dict[str, str]:
    """Paths (relative to the folder of kernels/ and bindings/) and texts of the family."""
    k = f"kernels/{name}"
    sources = ", ".join(u.path.name for u in plan.units)
    ops = [(op, schema) for b in plan.blocks for op, schema, _ in b.defs]
    devices = _devices(plan)
    floating = any("AT_DISPATCH_FLOATING" in u.text for u in plan.units)
    texts = {
        f"{k}/{name}.cpp": emit.cpu_cpp(plan, name, sources),
        f"{k}/spec.py": spec_text.spec_py(
            name,
            [(op, s, devices.get(op, ("cpu", "cuda"))) for op, s in ops],
            references,
            floating,
            sources,
        ),
        f"bindings/{name}.cpp": binding.binding_cpp(plan, name),
    }
    if plan.kernels or plan.cpu:
        texts[f"{k}/{name}.h"] = emit.launcher_h(plan, name)
    if plan.kernels:
        texts[f"{k}/{name}.kernel.cu"] = emit.kernel_cu(plan, name)
        texts[f"{k}/{name}.cu"] = emit.launcher_cu(plan, name)
    if plan.shared:
        texts[f"{k}/{name}_shared.h"] = emit.shared_h(plan, name)
    return texts


def adopt(
    sources: list[Path],
    name: str,
    kernels_dir: Path,
    references: list[str] = (),  # type: ignore[assignment]
) -> Adopted:
    """Make family ``name`` in ``kernels_dir`` from the extension ``sources``."""
    try:
        scaffold.check_name(name)
    except ValueError as e:
        raise WorkbenchError(str(e)) from e
    kernels_dir = Path(kernels_dir)
    folder = kernels_dir / name
    binding_path = kernels_dir.parent / "bindings" / f"{name}.cpp"
    existing = [p for p in (folder, binding_path) if p.exists()]
    if existing:  # before reading a source: an existing family is never touched
        raise scaffold.FamilyExists(existing)
    plan = plan_sources(list(sources))
    ops = [op for b in plan.blocks for op, _, _ in b.defs]
    refs = _references(list(references), ops)
    texts = family_texts(plan, name, refs)
    paths = {}
    for rel, text in texts.items():
        top, _, rest = rel.partition("/")
        paths[(kernels_dir if top == "kernels" else kernels_dir.parent / "bindings") / rest] = text
    written = scaffold.write_all(paths, folder)
    dropped = [f"{u.where(it.line)}: {it.name} ({why})" for u, it, why in plan.dropped]
    dropped += [
        f"{b.unit.where(line)}: {b.var}.{call} (fakes and autograd come from spec.py)"
        for b in plan.blocks
        for line, call in b.dropped
    ]
    return Adopted(name, written, ops, plan.namespace, dropped)
