"""The ops of an extension, read from its ``TORCH_LIBRARY`` / ``TORCH_LIBRARY_FRAGMENT`` /
``TORCH_LIBRARY_IMPL`` blocks: each ``m.def`` (schema, optional inline kernel) and ``m.impl``."""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.adopt.lexer import Token, string_value
from workbench.adopt.parse import Item, Unit, split_commas

# Calls that point torch at a Python module of fake kernels: the family's spec.py holds them.
_PYTHON_ONLY = frozenset({"impl_abstract_pystub", "set_python_module"})


@dataclass(frozen=True)
class Refusal:
    """A construct adopt will not split: where, what, and what to do by hand."""

    where: str  # file:line
    construct: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: {self.construct}: {self.fix}"


@dataclass
class Block:
    """One registration block of a source."""

    unit: Unit
    item: Item
    macro: str  # TORCH_LIBRARY, TORCH_LIBRARY_FRAGMENT or TORCH_LIBRARY_IMPL
    namespace: str
    key: str  # the dispatch key of an IMPL block ("" for a DEF block)
    var: str  # the torch::Library parameter's name
    defs: list[tuple[str, str, str | None]] = field(default_factory=list)  # (op, schema, impl)
    impls: list[str] = field(default_factory=list)  # op names
    head_end: int = 0  # offset after the macro's ')' (where the body starts)
    dropped: list[tuple[int, str]] = field(default_factory=list)  # (line, call) left out


def op_name(schema: str) -> str:
    """``ns::name.overload(...) -> ...`` -> ``name.overload``."""
    head = schema.split("(", 1)[0].strip()
    return head.rsplit("::", 1)[-1]


def _text(unit: Unit, toks: list[Token]) -> str:
    return unit.text[toks[0].start : toks[-1].end] if toks else ""


def _strings(toks: list[Token]) -> str | None:
    """The value of an argument that is only string literals (adjacent ones joined)."""
    if not toks or any(t.kind != "string" for t in toks):
        return None
    return "".join(string_value(t) for t in toks)


def read_block(unit: Unit, item: Item) -> tuple[Block | None, list[Refusal]]:
    """The registration block ``item`` of ``unit``, or the reasons it cannot be read."""
    macro = item.name
    where = unit.where(item.line)
    args = [_text(unit, a) for a in split_commas(item.params or [])]
    want = 3 if macro == "TORCH_LIBRARY_IMPL" else 2
    if len(args) != want or not all(args):
        return None, [
            Refusal(
                where,
                f"{macro} with {len(args)} arguments",
                "write it as torch "
                "documents it (TORCH_LIBRARY(ns, m), TORCH_LIBRARY_IMPL(ns, KEY, m))",
            )
        ]
    key = args[1] if want == 3 else ""
    if key.startswith("c10::DispatchKey::") or key.startswith("DispatchKey::"):
        key = key.rsplit("::", 1)[-1]
    block = Block(unit, item, macro, args[0], key, args[-1])
    assert item.params is not None
    block.head_end = item.params[-1].end + 1 if item.params else item.start
    refusals: list[Refusal] = []
    body = item.body or []
    statement: list[Token] = []
    depth = 0  # a lambda kernel's body holds ';' of its own
    for t in body:
        depth += t.text in ("(", "[", "{")
        depth -= t.text in (")", "]", "}")
        if t.text != ";" or depth > 0:
            statement.append(t)
            continue
        refusals += _statement(block, statement)
        statement = []
    if statement:
        refusals += _statement(block, statement)
    return block, refusals


def _statement(block: Block, toks: list[Token]) -> list[Refusal]:
    unit = block.unit
    where = unit.where(toks[0].line if toks else block.item.line)
    call = "impl" if block.macro == "TORCH_LIBRARY_IMPL" else "def"
    if len(toks) > 2 and toks[0].text == block.var and toks[2].text in _PYTHON_ONLY:
        block.dropped.append((toks[0].line, toks[2].text))  # the spec's fakes stand for it
        return []
    ok = (
        len(toks) >= 5
        and toks[0].text == block.var
        and toks[1].text == "."
        and toks[2].text == call
        and toks[3].text == "("
        and toks[-1].text == ")"
    )
    if not ok:
        return [
            Refusal(
                where,
                f"'{_text(unit, toks)}' in {block.macro}",
                f"adopt reads only {block.var}.{call}(...) statements here; register the op "
                f'with {block.var}.{call}("...", ...) or move this statement by hand',
            )
        ]
    args = split_commas(toks[4:-1])
    name = _strings(args[0]) if args else None
    if name is None or len(args) > 2:
        return [
            Refusal(
                where,
                f"{block.var}.{call}({_text(unit, toks[4:-1])})",
                f"adopt reads {call}'s first argument as a string literal "
                "(TORCH_SELECTIVE_SCHEMA and other wrappers are not read): write the string",
            )
        ]
    impl = _text(unit, args[1]) if len(args) == 2 else None
    if call == "def":
        block.defs.append((op_name(name), name, impl))
    else:
        block.impls.append(op_name(name))
    return []
