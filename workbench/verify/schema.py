"""What an op's schema tells the check: which arguments it writes, which are keyword-only, and
what a call of it produces.

A sample holds the op's arguments in schema order, keyword-only ones included
(``add_out(a, b, out)`` for ``add_out(Tensor a, Tensor b, *, Tensor(a!) out) -> ()``); a
:class:`Signature` passes those by name. The *outputs* of a call are what the check compares with
the reference: the arguments the schema marks as written (``Tensor(a!)``), as they are after the
call, then every return that is not one of those arguments. A functional op's outputs are its
returns. The reference is called the same way (it writes into its own copies of those
arguments), so both sides line up output by output.

Each call gets fresh copies of the written arguments (:meth:`Signature.fresh`): the sample itself
is never changed, so a second run, ``opcheck`` and ``torch.compile`` all start from the same
values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Signature:
    """The parts of an op's schema the check needs (an op without a schema: all defaults)."""

    kwarg_only: tuple[str | None, ...] = ()  # per argument: its name if keyword-only, else None
    written: tuple[int, ...] = ()  # indices of the arguments marked Tensor(a!)
    aliased_returns: tuple[int | None, ...] = ()  # per return: the written argument it is

    @property
    def mutates(self) -> bool:
        return bool(self.written)

    def call(self, op: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``op`` on ``args`` in schema order, keyword-only arguments passed by name."""
        if not any(self.kwarg_only):
            return op(*args)
        positional, named = self.split(args)
        return op(*positional, **named)

    def split(self, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``args`` in schema order as (positional arguments, keyword-only ones by name)."""
        names = (self.kwarg_only + (None,) * len(args))[: len(args)]
        positional = tuple(a for a, kw in zip(args, names, strict=True) if kw is None)
        named = {kw: a for a, kw in zip(args, names, strict=True) if kw is not None}
        return positional, named

    def fresh(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` with each written argument replaced by a copy of the same layout."""
        if not self.written:
            return args
        return tuple(
            same_layout_copy(a) if i in self.written and isinstance(a, torch.Tensor) else a
            for i, a in enumerate(args)
        )

    def outputs(self, args: tuple[Any, ...], returned: Any) -> Any:
        """What the check compares: the returns of a functional op as they are; else a tuple of
        the written arguments, then the returns that are not written arguments."""
        if not self.written:
            return returned
        rets = returned if isinstance(returned, (tuple, list)) else (returned,)
        if returned is None:
            rets = ()
        extra = [
            r for i, r in enumerate(rets) if i >= len(self.aliased_returns)
            or self.aliased_returns[i] is None
        ]  # fmt: skip
        return (*(args[i] for i in self.written), *extra)

    def output_names(self, count: int) -> list[str]:
        """Names of the outputs, for messages: ``argument 2 (written)``, ``return 0``."""
        names = [f"argument {i} (written)" for i in self.written]
        names += [f"return {k}" for k in range(count - len(names))]
        return names

    def wrong_alias(self, args: tuple[Any, ...], returned: Any) -> str | None:
        """Why a return that the schema says *is* a written argument is not that tensor."""
        if not any(r is not None for r in self.aliased_returns):
            return None
        rets = returned if isinstance(returned, (tuple, list)) else (returned,)
        for k, i in enumerate(self.aliased_returns):
            if i is None:
                continue
            got = rets[k] if k < len(rets) else None
            want = args[i]
            if not (isinstance(got, torch.Tensor) and _same_view(got, want)):
                return (
                    f"return {k} must be argument {i} itself (its schema says Tensor(a!)), "
                    f"got {_describe(got)}"
                )
        return None


def signature(op: Any) -> Signature:
    """The :class:`Signature` of a torch op handle (packet, overload, custom op), else defaults."""
    schema = schema_of(op)
    if schema is None:
        return Signature()
    args = list(schema.arguments)
    written = tuple(
        i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write
    )
    sets = {i: tuple(args[i].alias_info.before_set) for i in written}
    aliased: list[int | None] = []
    for r in schema.returns:
        info = r.alias_info
        match = [i for i, s in sets.items() if info is not None and tuple(info.before_set) == s]
        aliased.append(match[0] if match else None)
    return Signature(
        kwarg_only=tuple(a.name if a.kwarg_only else None for a in args),
        written=written,
        aliased_returns=tuple(aliased),
    )


def schema_of(op: Any) -> Any:
    """The ``torch._C.FunctionSchema`` of an op handle, or None for a plain callable."""
    for path in (("_opoverload", "_schema"), ("_schema",), ("default", "_schema")):
        found: Any = op
        try:
            for attr in path:
                found = getattr(found, attr)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(found, torch._C.FunctionSchema):
            return found
    return None


def same_layout_copy(t: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``t``'s values, sizes, strides and offset (expanded views included)."""
    buf = raw(t).clone()
    typed = torch.empty(0, dtype=t.dtype, device=t.device)
    return typed.set_(buf.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s storage as a uint8 tensor (a view: writes go to ``t``)."""
    out = torch.empty(0, dtype=torch.uint8, device=t.device)
    return out.set_(t.untyped_storage())


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a new tensor of shape {list(x.shape)}"
    return type(x).__name__


def flat_outputs(out: Any) -> list[Any]:
    """A call's outputs as a list (a single tensor is a list of one)."""
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]
