"""The CPU code an adopted family keeps in ``NAME.cpp``: the torch-free functions of the C++
sources (loops over raw pointers), declared in ``NAME.h`` for the binding that calls them.

A function moves when it is an ordinary external function (no template, ``static``, ``inline``
or anonymous namespace), names nothing of torch (``at::``, ``Tensor``, ``TORCH_CHECK``, ...),
and every name it takes from the sources is another function that moves or a constant of
``NAME_shared.h``. The rest (the ops written on ``at::Tensor``) stays in the binding, which is
the TU that may include torch.
"""

from __future__ import annotations

import re

from workbench.adopt.lexer import directive
from workbench.adopt.parse import Item, Unit
from workbench.adopt.plan import Plan, torch_use

TENSOR_NAMES = frozenset(
    {
        "Tensor", "TensorOptions", "Scalar", "ScalarType", "IntArrayRef", "Device", "TensorList",
        "Generator", "Layout", "MemoryFormat", "optional", "OptionalTensorRef",
    }
)  # fmt: skip
_KEEP = frozenset({"static", "inline", "__host__", "__device__", "__forceinline__", "constexpr"})
_TORCH_INCLUDE = re.compile(r"<(?:torch|ATen|c10|caffe2|pybind11|cuda|Python)\b")


def _movable(it: Item) -> bool:
    if it.kind != "function" or it.template is not None or it.specifiers & _KEEP:
        return False
    if any(not re.match(r"namespace\s*[\w:]+\s*\{", o) for o in it.scope):
        return False  # an anonymous namespace or an extern "C" block
    if it.name.startswith("PyInit_") or "::" in [t.text for t in it.tokens[: -len(it.body or [])]]:
        return False  # a member defined out of its class
    return torch_use(it) is None and not (it.refs & TENSOR_NAMES)


def functions(plan: Plan) -> list[tuple[Unit, Item]]:
    """The CPU functions that move to NAME.cpp (none when the binding wraps its sources)."""
    if plan.wrap:
        return []
    shared = {n for _, it in plan.shared for n in it.names}
    defined: dict[str, list[Item]] = {}
    for u in plan.units:
        for it in u.items:
            for n in it.names[1:] if it.kind == "pp" else it.names:
                defined.setdefault(n, []).append(it)
    moving = {
        id(it): (u, it) for u in plan.units if not u.is_cuda for it in u.items if _movable(it)
    }
    changed = True
    while changed:  # drop a function that needs a name of the sources that stays behind
        changed = False
        for key, (_, it) in list(moving.items()):
            for n in it.refs - set(it.names) - shared:
                if any(id(d) not in moving for d in defined.get(n, [])):
                    del moving[key]
                    changed = True
                    break
    return list(moving.values())


def declaration(u: Unit, it: Item) -> str:
    """The function's head, as declared: its text up to the body's brace, and ';'."""
    brace = it.tokens[-(len(it.body or []) + 2)]
    return u.text[it.start : brace.start].rstrip() + ";"


def includes(moved: list[tuple[Unit, Item]]) -> list[str]:
    """The C++ library headers of the sources the moved functions come from."""
    out = []
    for u in {id(u): u for u, _ in moved}.values():
        for it in u.items:
            if it.kind == "pp" and it.names[:1] == ("include",):
                rest = directive(it.tokens[0])[1]
                if rest.startswith("<") and not _TORCH_INCLUDE.match(rest):
                    out.append(f"#include {rest}")
    return list(dict.fromkeys(out))
