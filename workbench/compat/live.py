"""Opening drop-in builds, and swapping an edited build in without aborting the process.

A drop-in library whose sources use ``TORCH_LIBRARY`` is compiled with ``wb_compat.h``, so
opening it registers nothing: its blocks are recorded and made by ``wbc_register()``. To load an
edited build of the same extension name:

1. open the new build (import it, for a pybind11 module: a new file and import name per build,
   so neither Python's nor pybind11's cache of extension modules hands back the old one);
2. hold each op of the old build's namespaces with a placeholder kernel, so the dispatcher keeps
   the operator (and every ``torch.ops`` handle to it) alive across the swap;
3. ``wbc_unregister()`` the old build, ``wbc_register()`` the new one; if that fails, register the
   old one again: the last good build keeps working;
4. an op the old build defined and the new one does not (an emptied file, a deleted or renamed
   op, a renamed namespace) is kept in the dispatcher with its old schema and a kernel that
   raises ``RemovedOpError`` naming it: a ``torch.ops`` handle held across the reload then
   raises a Python error instead of calling into an operator the dispatcher has freed; a later
   build that defines the op again replaces it;
5. drop the placeholders; close the old library (a plain library; Python keeps modules open) and
   point the old module object's attributes at the new build.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import LoadError

ABI_VERSION = 1
# The dispatch key of the placeholder kernels: one no backend of this process uses.
_PLACEHOLDER_KEY = "PrivateUse3"


@dataclass
class Live:
    path: Path
    cdll: ctypes.CDLL
    module: types.ModuleType | None
    deferred: bool  # built with wb_compat.h: registers through wbc_register
    registered: bool = False
    # The ops its registration defined: qualified name ("ns::op.overload") -> schema text.
    defined: dict[str, str] = field(default_factory=dict)
    # The ops that opening it registered (torch::RegisterOperators and other registrations that
    # run when the library is loaded): no second build of it can be opened in this process.
    opened_ops: list[str] = field(default_factory=list)
    extension: str = ""  # the name it was loaded under
    no_module: str = ""  # loaded as a module but holds none: the ImportError's text

    def namespaces(self) -> list[str]:
        if not self.deferred:
            return []
        count = self.cdll.wbc_block_count()
        return sorted({self.cdll.wbc_block_namespace(i).decode() for i in range(count)})

    def register(self) -> None:
        if not self.deferred or self.registered:
            return
        namespaces = self.namespaces()
        before = _schemas(namespaces)
        err = ctypes.create_string_buffer(8192)
        if self.cdll.wbc_register(err, len(err)) != 0:
            raise LoadError(_registration_failure(self.path.name, err.value.decode()))
        self.registered = True
        self.defined = {k: v for k, v in _schemas(namespaces).items() if k not in before}

    def unregister(self) -> None:
        if self.registered:
            self.cdll.wbc_unregister()
            self.registered = False


_live: dict[str, Live] = {}  # a load's key (see activate) -> its live build
_replaced: set[str] = set()  # loads whose build a load of other sources replaced
_imported: set[str] = set()  # names imported as modules: a later module gets a name of its own

_MISMATCH = re.compile(
    r"Mismatch in kernel C\+\+ signatures\s+operator: (?P<op>[\w:.]+)\((?P<args>.*?)\n.*?"
    r"kernel 1: (?P<old>[^\n]*)\n.*?kernel 2: (?P<new>[^\n]*)\n",
    re.S,
)


def _registration_failure(build: str, text: str) -> str:
    """The error of a failed registration; a changed C++ signature gets its cause and fix.

    PyTorch's dispatcher keeps the C++ signature of an operator's first kernel for as long as
    the operator exists, and a reload keeps every operator alive (handles a script holds point
    into it), so a build whose kernel takes other arguments cannot replace the old one in place.
    """
    found = _MISMATCH.search(text)
    if found is None:
        return f"registering the ops of {build} failed: {text}"
    op = found["op"]
    return (
        f"registering the ops of {build} failed: the C++ signature of {op}'s kernel changed, "
        f"from {found['old'].strip()} to {found['new'].strip()} (schema now {op}({found['args']})."
        " PyTorch keeps an operator's kernel signature for the life of the process, so this "
        "edit cannot be loaded in place: restart the Python process to load it, or give the op "
        f"a new name (say {op.rsplit('::', 1)[-1]}_v2). The last good build stays loaded.\n\n"
        f"{text}"
    )


class RemovedOpError(LoadError, RuntimeError):
    """A call of an op that the extension's newest build no longer defines."""


def _schemas(namespaces: list[str]) -> dict[str, str]:
    """Every op of ``namespaces`` that has a schema now: qualified name -> schema text."""
    import torch

    if not namespaces:
        return {}
    wanted = {ns + "::" for ns in namespaces}
    out: dict[str, str] = {}
    for full in torch._C._dispatch_get_all_op_names():
        head, sep, rest = full.partition("::")
        if not sep or head + "::" not in wanted:
            continue
        op, _, overload = rest.partition(".")
        try:
            out[full] = str(torch._C._get_schema(f"{head}::{op}", overload))
        except RuntimeError:  # an op with kernels but no schema (a placeholder's, an impl's)
            continue
    return out


@dataclass
class _Tombstones:
    """The ops an extension's reloads removed, each defined again with a raising kernel."""

    extension: str
    schemas: dict[str, str]  # qualified name -> schema text
    libs: list[object] = field(default_factory=list)

    def namespaces(self) -> list[str]:
        return sorted({name.split("::", 1)[0] for name in self.schemas})

    def install(self, build: str) -> None:
        import torch

        for ns in self.namespaces():
            lib = torch.library.Library(ns, "FRAGMENT")
            self.libs.append(lib)
            for name, schema in sorted(self.schemas.items()):
                if not name.startswith(ns + "::"):
                    continue
                try:
                    lib.define(schema.split("::", 1)[1])
                except RuntimeError:  # defined again by another library: nothing to guard
                    continue
                kernel = _raiser(self.extension, name, build)
                lib.impl(name.split("::", 1)[1], kernel, "CompositeImplicitAutograd")

    def remove(self) -> None:
        for lib in self.libs:
            lib._destroy()  # type: ignore[attr-defined]
        self.libs.clear()


def _raiser(extension: str, name: str, build: str) -> object:
    def removed(*args: object, **kwargs: object) -> object:
        raise RemovedOpError(
            f"{name} is no longer defined: the newest build of the extension {extension!r} "
            f"({build}) does not define it (a deleted or renamed op or namespace, or a source "
            "saved empty). Restore its TORCH_LIBRARY definition and load again, or stop calling it."
        )

    return removed


_removed: dict[str, _Tombstones] = {}  # a load's key -> the ops its reloads removed


def _import_extension(name: str, path: Path) -> types.ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise LoadError(f"cannot import {path} as the Python module {name!r}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _module_name(name: str, path: Path, first: bool) -> str:
    """The import name of a build: ``name`` for the first; later builds get a package prefix.

    CPython finds ``PyInit_<name>`` from the last component, and pybind11 caches modules by
    the full name, so a reloaded build needs a full name of its own to be imported afresh.
    """
    return name if first else f"_wb_build_{path.suffixes[0].lstrip('.')}.{name}"


def _op_names() -> set[str]:
    """Every operator name the dispatcher holds, where torch is imported (else nothing)."""
    torch = sys.modules.get("torch")
    return set(torch._C._dispatch_get_all_op_names()) if torch is not None else set()


def _open(name: str, path: Path, python_module: bool, first: bool = True) -> Live:
    before = _op_names()
    live = _open_library(name, path, python_module, first)
    live.opened_ops = sorted(_op_names() - before)
    return live


def _open_library(name: str, path: Path, python_module: bool, first: bool) -> Live:
    module = None
    if python_module:
        try:
            module = _import_extension(_module_name(name, path, first), path)
        except ImportError as e:
            if "does not define module export function" in str(e):
                # As torch's load: the library stays open with its ops registered, and the
                # load raises ImportError (see activate).
                return _with_no_module(name, path, str(e))
            if _UNDEFINED.search(str(e)):
                raise ExtensionImportError(_explain_open(path, str(e))) from None
            if first or "already registered" not in str(e):
                raise
            raise LoadError(
                f"the new build of {name!r} cannot be imported: {e} pybind11 keeps one Python "
                "type per C++ class for the whole process, so a rebuilt module that binds a "
                "class clashes with the one already loaded. Bind the class with "
                "py::module_local(), or restart the process; the last good build stays loaded."
            ) from e
    try:
        cdll = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        raise LibraryOpenError(_explain_open(path, str(e))) from None
    deferred = hasattr(cdll, "wbc_abi_version")
    if deferred:
        if cdll.wbc_abi_version() != ABI_VERSION:
            raise LoadError(f"{path} has registration entry points of another workbench version")
        cdll.wbc_register.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        cdll.wbc_block_namespace.restype = ctypes.c_char_p
        cdll.wbc_block_namespace.argtypes = [ctypes.c_int]
    return Live(path, cdll, module, deferred)


class LibraryOpenError(LoadError, OSError):
    """A built library that cannot be opened (an OSError, as torch.ops.load_library raises)."""


class ExtensionImportError(LoadError, ImportError):
    """A built module that cannot be imported (an ImportError, as torch's load raises)."""


_UNDEFINED = re.compile(r"undefined symbol: (\S+)")


def _explain_open(path: Path, error: str) -> str:
    """Why ``path`` does not open; an undefined symbol gets its C++ name and the fix."""
    found = _UNDEFINED.search(error)
    if found is None:
        return f"cannot open {path}: {error}"
    symbol = found[1]
    return (
        f"cannot open {path.name}: it uses {_demangle(symbol)} ({symbol}), which none of its "
        "sources and none of the libraries it links defines. Add the source that defines it "
        "to sources, or the library that holds it to extra_ldflags (['-L<dir>', '-l<name>']); a "
        "template or inline function must be defined in a header its users include.\n\n"
        f"{error}"
    )


def _demangle(symbol: str) -> str:
    """The C++ name of a mangled symbol (``c++filt``), or the symbol where that cannot tell."""
    tool = shutil.which("c++filt")
    if tool is None:
        return symbol
    try:
        proc = subprocess.run([tool, symbol], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return symbol
    return proc.stdout.strip() or symbol


def _with_no_module(name: str, path: Path, error: str) -> Live:
    live = _open_library(name, path, False, True)
    live.no_module = (
        f"{path.name} holds no Python module {name!r} ({error}): it defines no "
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m). Its TORCH_LIBRARY ops are registered under "
        "torch.ops; load it with is_python_module=False, which returns the library's path, or "
        "add a PYBIND11_MODULE block."
    )
    return live


def _hold_ops(namespaces: list[str]) -> list[object]:
    """Placeholder kernels that keep every op of ``namespaces`` alive in the dispatcher."""
    if not namespaces:
        return []  # a pybind11 module's first load: torch may not even be importable
    import torch

    holders: list[object] = []
    names = torch._C._dispatch_get_all_op_names()
    for ns in namespaces:
        # Every overload ("op.out" too): an overload held by nothing is freed mid-swap, and a
        # torch.ops handle to it would point into freed memory.
        ops = sorted({n.split("::", 1)[1] for n in names if n.startswith(ns + "::")})
        if not ops:
            continue
        lib = torch.library.Library(ns, "FRAGMENT")
        for op in ops:
            lib.impl(op, _placeholder, _PLACEHOLDER_KEY)
        holders.append(lib)
    return holders


def _placeholder(*args: object, **kwargs: object) -> object:
    raise RuntimeError("this op is being reloaded")


def activate(name: str, path: Path, python_module: bool, key: str | None = None) -> Live:
    """Make ``path`` the live build of the extension ``name``; the old one is swapped out.

    ``key`` names the load (its name, sources and options; default: the name): a build of the
    same key is an edit and replaces the last one, module object and all. A load of the same
    name with other sources or flags is another extension, as under torch's load (which calls
    it ``name_v1``) and both stay loaded, unless it registers ops in a namespace of a loaded
    build of that name: then it replaces that build, where torch's load would abort.
    """
    key = name if key is None else key
    old = _live.get(key)
    if old is not None and old.path == path:
        return _module_checked(old)
    if old is not None and old.opened_ops:
        raise LoadError(
            f"the edited build of {name!r} cannot be loaded in this process: its loaded build "
            f"registered {', '.join(old.opened_ops)} as it was opened (torch::RegisterOperators "
            "or another registration that runs when the library loads), and PyTorch aborts the "
            "process when a second library registers an op again. Restart the process to load "
            "it, or register the ops with TORCH_LIBRARY and TORCH_LIBRARY_IMPL, which a reload "
            "swaps in place. The last good build stays loaded."
        )
    new = _open(name, path, python_module, first=name not in _imported)
    if python_module:
        _imported.add(name)
    old_key = key if old is not None else _sibling(name, new)
    old = _live.pop(old_key) if old_key is not None else None
    home = old_key if old_key is not None else key  # where the ops it replaces were loaded
    gone = _removed.pop(home, _Tombstones(name, {}))
    held = (old.namespaces() if old is not None else []) + gone.namespaces()
    holders = _hold_ops(sorted(set(held)))
    try:
        if old is not None:
            old.unregister()
        gone.remove()
        try:
            new.register()
        except LoadError:
            if old is not None and old_key is not None:
                old.register()  # the last good build keeps working
                _live[old_key] = old
            build = old.path.name if old is not None else path.name
            _bury(name, home, gone.schemas, build, say=False)
            _close(new)
            raise
        lost = {**gone.schemas, **(old.defined if old is not None else {})}
        _bury(name, key, {k: v for k, v in lost.items() if k not in new.defined}, path.name)
    finally:
        for lib in holders:
            lib._destroy()  # type: ignore[attr-defined]
    new.extension = name
    _live[key] = new
    _replaced.discard(key)
    if old_key is not None and old_key != key:
        _replaced.add(old_key)
    if old is not None:
        _retire(old, new)
    if not python_module or new.no_module:
        _note_loaded_library(path)
    return _module_checked(new)


def _module_checked(live: Live) -> Live:
    """``live``, or the ImportError of a module load whose library holds no module."""
    if live.no_module:
        raise ExtensionImportError(live.no_module)
    return live


def _sibling(name: str, new: Live) -> str | None:
    """The key of a loaded build of extension ``name`` whose op namespaces ``new`` shares."""
    mine = set(new.namespaces())
    for key, live in _live.items():
        if live.extension == name and mine & set(live.namespaces()):
            return key
    return None


def _bury(name: str, key: str, schemas: dict[str, str], build: str, say: bool = True) -> None:
    """Keep the ops ``schemas`` names callable, each raising ``RemovedOpError``; say so."""
    if not schemas:
        return
    tombs = _Tombstones(name, schemas)
    tombs.install(build)
    _removed[key] = tombs
    if not say:
        return
    warnings.warn(
        f"the new build of the extension {name!r} ({build}) no longer defines "
        f"{', '.join(sorted(schemas))}: calling it raises RemovedOpError until a build defines "
        "it again",
        RemovedOpWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the workbench: the user's load call."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("workbench"):
        frame = frame.f_back
        level += 1
    return level


class RemovedOpWarning(UserWarning):
    """A reload whose new build no longer defines ops the old one did."""


def _retire(old: Live, new: Live) -> None:
    if old.module is not None and new.module is not None:
        old.module.__dict__.update(
            {k: v for k, v in new.module.__dict__.items() if k not in ("__spec__", "__loader__")}
        )
    _close(old)


def _close(live: Live) -> None:
    """Unregister, and keep the library mapped: the dispatcher may hold a pointer into it (the
    C++ signature of an op's first kernel; see ``workbench.loader._retired``)."""
    live.unregister()
    _retired.append(live.cdll)


_retired: list[object] = []


def _note_loaded_library(path: Path) -> None:
    import torch

    torch.ops.loaded_libraries.add(str(path))


def replaced(key: str) -> bool:
    """Whether the load ``key``'s build was replaced by a load of other sources (see activate)."""
    return key in _replaced


def live(name: str) -> Live | None:
    """The build last loaded under the extension name ``name``."""
    found = [lv for lv in _live.values() if lv.extension == name]
    return found[-1] if found else None
