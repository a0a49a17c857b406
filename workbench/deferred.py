"""Families registered with torch at the first lookup of one of their ops, not at load.

A warm load of a family whose library this cache has loaded before (its schemas and C++
autograd ops are recorded in the warm-start index: :meth:`workbench.warm.Index.describe`) need
not open the library, hand it its device modules, define its ops and register its kernels,
fake functions and autograd formulas before ``load()`` returns: most processes call a few ops
of a registry. Such a family is *deferred*: its op names are known, and the first lookup of one
of them (``torch.ops.<ns>.<op>``, ``lib.<op>``, ``getattr`` by TorchScript, Dynamo or
``torch.library`` alike: all of them look ops up through the namespace object) registers the
whole family first, then answers as if it had been registered at load.

The hook is the namespace object itself (``torch.ops.<ns>``, a ``torch._ops._OpNamespace``):
while any op of the namespace is deferred its class is :class:`_Namespace`, whose
``__getattr__`` (called only for names torch has not bound yet) registers the op's family
first; when none is left it is torch's class again.

What it does not see: a caller that finds an op by name in the C++ dispatcher without Python
(a C++ extension calling ``c10::Dispatcher::findSchema``, ``torch._C`` functions given the
op's qualified name). Such a caller needs the family registered first:
:func:`activate_all` (``lib.ops_now()``), or ``WB_EAGER=1`` / ``load(..., eager=True)`` to
register every family at load.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class Pending:
    """A family whose registration waits for the first lookup of one of its ops."""

    def __init__(
        self, family: str, schemas: dict[str, str], activate: Callable[[], object]
    ) -> None:
        self.family = family
        self.schemas = schemas  # op name -> schema, as the library described them
        self.activate = activate  # registers the family (raises LoadError when it cannot)

    def names(self) -> list[str]:
        """The names it will bind under the namespace: its ops, and the functional twin of each
        op that returns an argument it writes (:func:`workbench.runtime.returns_alias`)."""
        twins = [f"{op}_functional" for op, schema in self.schemas.items() if _aliased(schema)]
        return [*self.schemas, *twins]


def _aliased(schema: str) -> bool:
    if "Tensor(" not in schema.rsplit("->", 1)[-1]:
        return False
    from workbench import runtime

    return runtime.returns_alias(schema)


class _State:
    def __init__(self) -> None:
        self.pending: dict[str, Pending] = {}  # family -> its pending registration
        self.names: dict[str, str] = {}  # op name -> family
        self.busy = 0  # registrations in progress: a lookup meanwhile waits for them


_states: dict[str, _State] = {}
_generation = 0  # bumped whenever a family is deferred or leaves the pending set


def generation() -> int:
    """A number that changes whenever :func:`pending` may answer differently."""
    return _generation


# One registration at a time, process-wide; re-entered by the thread that holds it (registering
# a family looks its own ops up).
_lock = threading.RLock()


class _Namespace(torch._ops._OpNamespace):
    """``torch.ops.<ns>`` while some of its ops are deferred (see the module docstring)."""

    def __getattr__(self, op_name: str) -> torch._ops.OpOverloadPacket:
        if not op_name.startswith("__"):
            activate_op(self.name, op_name)
        # torch's own lookup (the class may be torch's again by now: no super())
        return torch._ops._OpNamespace.__getattr__(self, op_name)


def _set_class(obj: Any, cls: type) -> None:
    obj.__class__ = cls  # a module's class may change (both are torch._ops._OpNamespace)


def _namespace(ns: str) -> torch._ops._OpNamespace:
    found: torch._ops._OpNamespace = getattr(torch.ops, ns)
    return found


def defer(ns: str, pending: Pending) -> None:
    """Register ``pending``'s family at the first lookup of one of its ops."""
    with _lock:
        state = _states.setdefault(ns, _State())
        cancel(ns, pending.family)
        state.pending[pending.family] = pending
        global _generation
        _generation += 1
        for name in pending.names():
            state.names[name] = pending.family
        obj = _namespace(ns)
        if type(obj) is torch._ops._OpNamespace:
            _set_class(obj, _Namespace)


def cancel(ns: str, family: str) -> Pending | None:
    """Forget ``family``'s pending registration (it is registered now, or gone); the record."""
    with _lock:
        state = _states.get(ns)
        pending = state.pending.pop(family, None) if state is not None else None
        if state is None or pending is None:
            return None
        global _generation
        _generation += 1
        for name in pending.names():
            if state.names.get(name) == family:
                del state.names[name]
        _unhook(ns, state)
        return pending


def _unhook(ns: str, state: _State) -> None:
    """Give the namespace torch's own class again once nothing is deferred or registering."""
    if not state.pending and not state.busy:
        obj: Any = torch.ops.__dict__.get(ns)
        if type(obj) is _Namespace:
            _set_class(obj, torch._ops._OpNamespace)


def _run(ns: str, pending: Pending) -> None:
    """Register a pending family; on failure it stays pending (the next lookup tries again).

    Its names are forgotten first, so that its own lookups while it registers go to torch; a
    lookup from another thread meanwhile waits for the lock (``busy``) and then finds the op."""
    state = _states[ns]
    state.busy += 1
    try:
        cancel(ns, pending.family)
        pending.activate()
    except BaseException:
        if pending.family not in state.pending:
            defer(ns, pending)
        raise
    finally:
        state.busy -= 1
        _unhook(ns, state)


def activate_op(ns: str, op: str) -> None:
    """Register the family of ``ns::op`` if it is deferred (or wait for its registration)."""
    state = _states.get(ns)
    if state is None or (op not in state.names and not state.busy):
        return
    with _lock:
        family = state.names.get(op)
        if family is not None:
            _run(ns, state.pending[family])


def activate_all(ns: str) -> None:
    """Register every deferred family of ``ns``."""
    with _lock:
        state = _states.get(ns)
        while state is not None and state.pending:
            _run(ns, next(iter(state.pending.values())))


def pending(ns: str) -> dict[str, Pending]:
    """The deferred families of ``ns``: family -> record."""
    state = _states.get(ns)
    return dict(state.pending) if state is not None else {}


def owner(ns: str, op: str) -> str | None:
    """The deferred family that will define ``ns::op``, if any."""
    state = _states.get(ns)
    return state.names.get(op) if state is not None else None
