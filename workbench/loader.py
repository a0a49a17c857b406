"""Loading built libraries into torch: schemas, kernels, and the spec's Python registrations.

How a build becomes ``torch.ops.<ns>.<op>``, and how an edited build replaces it in place:

1. The library is opened with RTLD_LOCAL (hidden visibility: two builds never bind to each
   other's symbols) and its schemas are read through ``wb_schema``; nothing registers on open.
2. Each schema is defined once per process from Python (one ``torch.library.Library`` per op),
   so the op, its fake function and its autograd formula outlive any one build.
3. ``wb_register(ns)`` adds the build's kernels. To swap builds: open the new library, call
   ``wb_unregister`` on the old one, register the new one, then ``dlclose`` the old one. If the
   new one fails to register, the old one is registered again and keeps working.
4. A schema that changed (or an op that disappeared) has its definition and its Python
   registrations dropped and made again.
"""

from __future__ import annotations

import _ctypes
import ctypes
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.build import Built
from workbench.errors import LoadError
from workbench.hashing import file_digest
from workbench.spec import OpSpec

ABI_VERSION = 2


@dataclass
class _OpDef:
    schema: str
    definition: torch.library.Library
    python: torch.library.Library | None = None  # fake + autograd

    def destroy(self) -> None:
        if self.python is not None:
            self.python._destroy()
        self.definition._destroy()


@dataclass
class Handle:
    """An open library and what it registered."""

    built: Built
    cdll: ctypes.CDLL
    schemas: dict[str, str]  # op name -> schema
    namespace: str | None = None  # where its kernels are registered

    def register(self, ns: str) -> None:
        err = ctypes.create_string_buffer(8192)
        if self.cdll.wb_register(ns.encode(), err, len(err)) != 0:
            raise LoadError(
                f"registering the kernels of {self.built.family} failed: {err.value.decode()}"
            )
        self.namespace = ns

    def unregister(self) -> None:
        if self.namespace is not None:
            self.cdll.wb_unregister(self.namespace.encode())
            self.namespace = None

    def close(self) -> None:
        self.unregister()
        _ctypes.dlclose(self.cdll._handle)


@dataclass
class _Namespace:
    defs: dict[str, _OpDef] = field(default_factory=dict)
    handles: dict[str, Handle] = field(default_factory=dict)  # family -> live handle
    specs: dict[str, tuple[str | None, types.ModuleType | None]] = field(default_factory=dict)


# Process-wide state: torch's dispatcher is process-wide too.
_namespaces: dict[str, _Namespace] = {}


def _op_name(schema: str) -> str:
    return schema.split("(", 1)[0].split(".", 1)[0].strip()


def open_library(built: Built) -> Handle:
    assert built.library is not None
    try:
        cdll = ctypes.CDLL(str(built.library), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        raise LoadError(f"cannot open {built.library}: {e}") from e
    version = cdll.wb_abi_version()
    if version != ABI_VERSION:
        _ctypes.dlclose(cdll._handle)
        raise LoadError(f"{built.library} has entry-point version {version}, want {ABI_VERSION}")
    cdll.wb_schema.restype = ctypes.c_char_p
    cdll.wb_schema.argtypes = [ctypes.c_int]
    cdll.wb_register.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    cdll.wb_unregister.argtypes = [ctypes.c_char_p]
    schemas = {}
    for i in range(cdll.wb_schema_count()):
        schema = cdll.wb_schema(i).decode()
        schemas[_op_name(schema)] = schema
    return Handle(built, cdll, schemas)


def load_spec_module(family: str, ns: str, path: Path | None) -> types.ModuleType | None:
    """Import (or re-import after an edit) a family's spec.py under a private module name."""
    state = _namespaces.setdefault(ns, _Namespace())
    if path is None:
        return None
    stamp = file_digest(str(path))
    cached = state.specs.get(family)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    name = f"workbench._specs.{ns}.{family}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot import the op spec {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    state.specs[family] = (stamp, module)
    return module


def specs_of(module: types.ModuleType | None) -> dict[str, OpSpec]:
    if module is None:
        return {}
    return {s.name: s for s in getattr(module, "OPS", [])}


def _register_python(ns: str, spec: OpSpec) -> torch.library.Library:
    lib = torch.library.Library(ns, "FRAGMENT")
    qualname = f"{ns}::{spec.name}"
    torch.library.register_fake(qualname, spec.fake, lib=lib)
    if spec.backward is not None:
        ops = getattr(torch.ops, ns)
        user_setup = spec.setup_context

        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.ops = ops
            if user_setup is not None:
                user_setup(ctx, inputs, output)

        torch.library.register_autograd(
            qualname, spec.backward, setup_context=setup_context, lib=lib
        )
    return lib


def _sync_defs(
    ns: str, state: _Namespace, old: Handle | None, new: Handle, specs: dict[str, OpSpec]
) -> None:
    """Define new or changed schemas; drop ops that the new build no longer has."""
    previous = set(old.schemas) if old is not None else set()
    for name in previous - set(new.schemas):
        state.defs.pop(name).destroy()
    for name, schema in new.schemas.items():
        current = state.defs.get(name)
        if current is not None and current.schema == schema:
            continue
        if current is not None:
            state.defs.pop(name).destroy()
        definition = torch.library.Library(ns, "FRAGMENT")
        definition.define(schema)
        op_def = _OpDef(schema, definition)
        state.defs[name] = op_def
        if name in specs:
            op_def.python = _register_python(ns, specs[name])


def activate(ns: str, built: Built, specs: dict[str, OpSpec]) -> bool:
    """Make ``built`` the live build of its family; False if it already was."""
    state = _namespaces.setdefault(ns, _Namespace())
    old = state.handles.get(built.family)
    if old is not None and old.built.library == built.library:
        return False
    new = open_library(built)
    clash = [
        n for n in new.schemas if n in state.defs and _owner(state, n) not in (None, built.family)
    ]
    if clash:
        new.close()
        raise LoadError(f"ops {clash} of {built.family} are already defined by another family")
    if old is not None:
        old.unregister()
    try:
        _sync_defs(ns, state, old, new, specs)
        new.register(ns)
    except Exception:
        new.close()
        if old is not None:
            old.register(ns)  # the last good build keeps working
        raise
    state.handles[built.family] = new
    if old is not None:
        old.close()
    return True


def _owner(state: _Namespace, op: str) -> str | None:
    for family, handle in state.handles.items():
        if op in handle.schemas:
            return family
    return None


def live_handles(ns: str) -> dict[str, Handle]:
    return dict(_namespaces.get(ns, _Namespace()).handles)
