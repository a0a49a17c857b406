"""Loading built libraries into torch: schemas, kernels, and the spec's Python registrations.

How a build becomes ``torch.ops.<ns>.<op>``, and how an edited build replaces it in place:

1. The library is opened with RTLD_LOCAL (hidden visibility: two builds never bind to each
   other's symbols) and its schemas are read through ``wb_describe``; nothing registers on open.
2. Each schema is defined once per process from Python (one ``torch.library.Library`` per op),
   so the op, its fake function and its autograd formula outlive any one build.
3. ``wb_register(ns)`` adds the build's kernels. To swap builds: open the new library, call
   ``wb_unregister`` on the old one, register the new one, and retire the old one (unregistered
   for good, and unmapped unless torch still points into it: see ``_retired``). If the new one
   fails to register, the old one is registered again and keeps working.
4. A schema that changed (or an op that disappeared) has its definition and its Python
   registrations dropped and made again; a spec.py that changed has its Python registrations
   (fake, autograd) made again. A family that disappeared is unregistered and closed.
5. Callers compiled with ``torch.compile`` reach the op through the dispatcher, so they run the
   new kernels. When a schema changes or an op disappears, Dynamo's caches are reset so those
   callers re-trace against the new schema; when a CUDA build is swapped out while Inductor holds
   CUDA graphs (which replay the kernels they captured), Dynamo is reset so they record again.
"""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from workbench import deferred, runtime
from workbench.build import Built
from workbench.errors import LoadError

if TYPE_CHECKING:  # not imported by a warm load: see workbench.specfile
    from workbench.spec import OpSpec

# An op's spec as the loader takes it: an OpSpec, or a specfile.DeferredSpec standing in for one.
Spec = Any

# The records here are plain classes, not dataclasses: creating a dataclass costs about 0.5 ms
# at import, and import is part of every warm start.


class _OpDef:
    def __init__(self, schema: str, definition: torch.library.Library) -> None:
        self.schema = schema
        self.definition = definition
        self.python: torch.library.Library | None = None  # fake + autograd
        self.spec: Spec | None = None  # what ``python`` was registered from

    def register_python(self, ns: str, spec: Spec | None) -> None:
        if self.python is not None:
            self.python._destroy()
            self.python = None
        self.spec = spec
        if spec is not None or runtime.returns_alias(self.schema):
            self.python = runtime.register_python(ns, spec, self.schema)

    def destroy(self) -> None:
        if self.python is not None:
            self.python._destroy()
        self.definition._destroy()


class Swap:
    """What one :func:`activate` changed."""

    def __init__(self) -> None:
        self.swapped = False  # the family's live build changed
        self.redefined: list[str] = []  # ops whose schema is new or changed
        self.removed: list[str] = []  # ops that no longer exist
        self.seconds = 0.0


class Handle:
    """An open library and what it registered."""

    def __init__(
        self,
        built: Built,
        cdll: ctypes.CDLL,
        schemas: dict[str, str],
        autograd: frozenset[str] = frozenset(),
    ) -> None:
        self.built = built
        self.cdll = cdll
        self.schemas = schemas  # op name -> schema
        self.autograd = autograd  # the ops it gives a C++ autograd kernel (WB_AUTOGRAD)
        self.namespace: str | None = None  # where its kernels are registered
        self.pinned = False  # gave some op its first kernel: never unmapped (see _retired)
        # Tuned (workbench.tuning.route): the namespace whose ops it routes, and the record.
        self.routed: str | None = None
        self.routes: str | None = None
        # Device-only TUs (workbench.device): the kernels its launchers name (read when first
        # needed), and the module key loaded for each file.
        self.kernels: list[tuple[str, str]] | None = None
        self.modules: dict[str, tuple[str, ...]] = {}

    def register(self, ns: str) -> None:
        state = _namespaces.setdefault(ns, _Namespace())
        first = set(self.schemas) - state.signed
        if first:  # pinned before the call: a registration that fails half-way counts too
            self.pinned = True
            state.signed |= first
        error = runtime.register_kernels(self.cdll, ns)
        if error is not None:
            raise LoadError(f"registering the kernels of {self.built.family} failed: {error}")
        self.namespace = ns

    def gate_autograd(self) -> None:
        """Put the library's autograd gates in front of its ops' Python formulas again."""
        if self.namespace is not None:
            error = runtime.gate_autograd(self.cdll, self.namespace)
            if error is not None:
                raise LoadError(f"the autograd gates of {self.built.family}: {error}")

    def unregister(self) -> None:
        self.cdll.wb_unregister.argtypes = [ctypes.c_char_p]
        if self.routed is not None:  # its routers, registered under the public namespace
            self.cdll.wb_unregister(self.routed.encode())
            self.routed = self.routes = None
        if self.namespace is not None:
            self.cdll.wb_unregister(self.namespace.encode())
            self.namespace = None

    def recorded_graphs(self) -> bool:
        """Whether one of its C++ autograd kernels may have recorded a graph (see ``_retired``)."""
        return bool(self.autograd) and self.cdll.wb_autograd_recorded() != 0

    def check_autograd(self, specs: dict[str, Spec]) -> None:
        """Raise LoadError unless each op's spec agrees with this library on its autograd."""
        check_autograd(self.schemas, self.autograd, specs)

    def close(self) -> None:
        """Unregister, then unmap the library, unless it must stay mapped: see ``_retired``."""
        self.unregister()
        if self.pinned or self.recorded_graphs():
            _retired.append(self.cdll)
        else:
            _ctypes.dlclose(self.cdll._handle)


def check_autograd(ops: Iterable[str], autograd: Collection[str], specs: dict[str, Spec]) -> None:
    """Raise LoadError unless the spec of each of a library's ``ops`` agrees with it on autograd
    (``autograd``: the ops it gives a C++ autograd kernel); also for a library not opened yet,
    from what it declared when last opened (workbench.deferred)."""
    for name in ops:
        try:
            runtime.check_autograd(specs.get(name), name, name in autograd)
        except runtime.AutogradError as e:
            raise LoadError(str(e)) from e


# Two kinds of library are never unmapped.
#
# 1. The libraries that gave an op its first kernel. The dispatcher keeps the C++ signature of
#    the first kernel registered for an op (a std::type_index, which points into the library
#    that registered it) after that kernel is removed, for as long as the op is defined, and
#    compares every later kernel's signature against it: unmapping that library would leave it
#    pointing into freed memory. An op whose schema changes is defined anew, and the next
#    library to register it is pinned in turn.
# 2. The libraries whose C++ autograd kernels (WB_AUTOGRAD) recorded a graph. Each node of that
#    graph is an object of the library (a torch::autograd::CppNode: its vtable, its backward and
#    its destructor are the library's code), and a graph outlives any reload: the caller may run
#    its backward after the swap, or only drop it, which runs the node's destructor. Unmapping
#    the library would make either jump into freed memory. The library says whether a kernel
#    ran with a graph to record (wb_autograd_recorded); one that only ever ran under no_grad, or
#    has no autograd kernel, is unmapped as any other.
#
# Every other library is unmapped when retired, so a family that is edited and reloaded many
# times keeps two libraries mapped: its first build (pinned, unregistered, its code never called
# again) and the live one; plus, for a family with C++ autograd, each build that recorded a graph.
_retired: list[ctypes.CDLL] = []


class _Namespace:
    def __init__(self) -> None:
        self.defs: dict[str, _OpDef] = {}
        self.handles: dict[str, Handle] = {}  # family -> live handle
        # Ops that have had a kernel registered since they were defined (see _retired).
        self.signed: set[str] = set()


# Process-wide state: torch's dispatcher is process-wide too.
_namespaces: dict[str, _Namespace] = {}
_generation = 0  # bumped whenever a namespace's set of open families changes


def generation() -> int:
    """A number that changes whenever a family's library is swapped in or removed (a caller
    caches what it derives from :func:`handles` under it)."""
    return _generation


class Prefetch:
    """Opens libraries in a thread, in order, while the loader works through them.

    ``dlopen`` of a library (mapping it, binding its symbols to torch's, running its static
    initialisers) is pure C: called through ctypes it runs without the GIL, so a load's spec
    imports and op registrations go on meanwhile. :func:`open_library` waits for the thread to
    be done with its library (releasing the GIL while it waits; the thread never takes the
    loader's lock while the main thread holds the GIL and wants it) and then opens it again,
    which only counts a reference. :meth:`close` drops the thread's references: a library the
    loader opened stays mapped, one it did not (a family that failed) is unmapped.
    """

    def __init__(self, paths: list[str]) -> None:
        self._done = {path: threading.Event() for path in paths}
        self._handles: list[int] = []
        self._stop = False
        libc = ctypes.CDLL(None)
        self._dlopen, self._dlclose = libc.dlopen, libc.dlclose
        self._dlopen.restype, self._dlopen.argtypes = (
            ctypes.c_void_p,
            [ctypes.c_char_p, ctypes.c_int],
        )
        self._dlclose.argtypes = [ctypes.c_void_p]
        self._thread = threading.Thread(target=self._run, name="workbench-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        mode = os.RTLD_NOW | os.RTLD_LOCAL  # as runtime.open_library: the same library
        for path, done in self._done.items():
            try:
                if not self._stop:
                    handle = self._dlopen(os.fsencode(path), mode)
                    if handle:
                        self._handles.append(handle)
            finally:
                done.set()

    def wait(self, path: str) -> None:
        done = self._done.get(path)
        if done is not None:
            done.wait()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        for handle in self._handles:
            self._dlclose(handle)
        self._handles.clear()


# The prefetch of the load in progress (see prefetch()).
_prefetch: Prefetch | None = None


@contextlib.contextmanager
def prefetch(paths: list[str]) -> Iterator[None]:
    """Open ``paths`` in a thread while the block loads them (see :class:`Prefetch`).

    A few libraries are opened as they come: a thread costs more than it saves there.
    """
    global _prefetch
    if len(paths) < PREFETCH_MIN or _prefetch is not None:
        yield
        return
    try:
        _prefetch = Prefetch(paths)
    except (OSError, AttributeError):  # no dlopen to call through ctypes: open as they come
        yield
        return
    try:
        yield
    finally:
        current, _prefetch = _prefetch, None
        current.close()


# Fewer libraries than this are opened without a thread.
PREFETCH_MIN = 4


def open_library(built: Built) -> Handle:
    assert built.library is not None
    if _prefetch is not None:
        _prefetch.wait(os.fspath(built.library))
    try:
        cdll, schemas, autograd = runtime.open_library(built.library)
    except OSError as e:
        raise LoadError(_open_error(built, str(e))) from e
    except runtime.VersionError as e:
        raise LoadError(str(e)) from e
    return Handle(built, cdll, schemas, autograd)


def _open_error(built: Built, error: str) -> str:
    """The loader's error, with an undefined C++ symbol demangled and the usual cause named."""
    marker = "undefined symbol: "
    if marker not in error:
        return f"cannot open the library of {built.family} ({built.library}): {error}"
    symbol = error.split(marker, 1)[1].split()[0]
    try:
        import subprocess

        readable = subprocess.run(
            ["c++filt", symbol], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        readable = symbol
    return (
        f"the library of {built.family} uses {readable}, which none of its sources or torch "
        "defines. A kernel template declared in a header but not instantiated for this type "
        "(WB_INSTANTIATE) is the usual cause."
    )


def registered_spec(ns: str, op: str) -> OpSpec | None:
    """The spec whose fake function and autograd formula ``ns::op`` has (imported if need be)."""
    deferred.activate_op(ns, op)
    state = _namespaces.get(ns)
    op_def = state.defs.get(op) if state is not None else None
    spec = op_def.spec if op_def is not None else None
    resolve = getattr(spec, "resolve", None)  # a specfile.DeferredSpec
    found: OpSpec | None = resolve() if resolve is not None else spec
    return found


def _sync_defs(
    ns: str,
    state: _Namespace,
    old: Handle | None,
    new: Handle,
    specs: dict[str, Spec],
    swap: Swap,
) -> None:
    """Define new or changed schemas; drop ops that the new build no longer has."""
    previous = set(old.schemas) if old is not None else set()
    for name in sorted(previous - set(new.schemas)):
        state.defs.pop(name).destroy()
        swap.removed.append(name)
    for name, schema in new.schemas.items():
        current = state.defs.get(name)
        if current is not None and current.schema == schema:
            if current.spec is not specs.get(name):  # spec.py was edited
                current.register_python(ns, specs.get(name))
            continue
        _define(ns, state, name, schema, specs.get(name))
        if current is not None or old is not None:
            swap.redefined.append(name)


def _define(ns: str, state: _Namespace, name: str, schema: str, spec: Spec | None) -> None:
    """(Re)define op ``name`` with ``schema`` and register the spec's Python functions."""
    if name in state.defs:
        state.defs.pop(name).destroy()
    state.signed.discard(name)  # a new definition: its first kernel pins its library again
    op_def = _OpDef(schema, runtime.define(ns, schema))
    state.defs[name] = op_def
    op_def.register_python(ns, spec)


def activate(
    ns: str,
    built: Built,
    specs: dict[str, Spec],
    prepare: Callable[[Handle], object] | None = None,
) -> Swap:
    """Make ``built`` the live build of its family (a no-op if it already is).

    ``prepare`` is called with a newly opened library before it registers anything (to load its
    device modules); if it raises, the library is closed and the live build stays.
    """
    start = time.perf_counter()
    deferred.cancel(ns, built.family)  # registered now, whether it was deferred or not
    state = _namespaces.setdefault(ns, _Namespace())
    old = state.handles.get(built.family)
    swap = Swap()
    if old is not None and old.built.library == built.library:
        old.check_autograd(specs)
        edited = False
        for name in old.schemas:  # the same build, but spec.py may have changed
            op_def = state.defs[name]
            if op_def.spec is not specs.get(name):
                op_def.register_python(ns, specs.get(name))
                edited = True
        if edited:  # new Python formulas: the library's autograd gates go in front of them again
            old.gate_autograd()
        return swap
    new = open_library(built)
    if prepare is not None:
        try:
            prepare(new)
        except BaseException:
            new.close()
            raise
    clash = [n for n in new.schemas if _owner(state, n, ns) not in (None, built.family)]
    if clash:
        new.close()
        raise LoadError(f"ops {clash} of {built.family} are already defined by another family")
    try:
        new.check_autograd(specs)
    except LoadError:
        new.close()
        raise
    previous_specs = {name: d.spec for name, d in state.defs.items()}
    if old is not None:
        old.unregister()
    try:
        _sync_defs(ns, state, old, new, specs, swap)
        new.register(ns)
    except Exception as e:
        new.close()
        if old is not None:
            _restore(ns, state, old, previous_specs)
        if isinstance(e, LoadError):
            raise
        raise LoadError(f"loading the new build of {built.family} failed: {e}") from e
    state.handles[built.family] = new
    global _generation
    _generation += 1
    if old is not None:
        old.close()
    swap.swapped = True
    _reset_compiled_callers(swap, cuda_swapped=old is not None and _has_cuda(old))
    swap.seconds = time.perf_counter() - start
    return swap


def _restore(ns: str, state: _Namespace, old: Handle, specs: dict[str, Spec | None]) -> None:
    """Put the last good build back after a failed swap: its schemas, then its kernels."""
    for name, schema in old.schemas.items():
        current = state.defs.get(name)
        if current is None or current.schema != schema:
            _define(ns, state, name, schema, specs.get(name))
    for name in [n for n in state.defs if _owner(state, n) is None and n not in old.schemas]:
        state.defs.pop(name).destroy()  # defined by the failed build only
    old.register(ns)


def deactivate(ns: str, family: str) -> Swap:
    """Remove a family that no longer exists: its kernels, its ops, and its library."""
    deferred.cancel(ns, family)
    state = _namespaces.get(ns)
    swap = Swap()
    if state is None or family not in state.handles:
        return swap
    old = state.handles.pop(family)
    global _generation
    _generation += 1
    old.unregister()
    for name in sorted(old.schemas):
        if name in state.defs:
            state.defs.pop(name).destroy()
            swap.removed.append(name)
    cuda = _has_cuda(old)
    old.close()
    swap.swapped = True
    _reset_compiled_callers(swap, cuda_swapped=cuda)
    return swap


def after_module_swap() -> None:
    """A device-only TU's module was swapped in a live library (workbench.device): callers that
    Inductor recorded into CUDA graphs replay the old kernels, so they record again."""
    _reset_compiled_callers(Swap(), cuda_swapped=True)


def _has_cuda(handle: Handle) -> bool:
    return "cuda" in handle.built.manifest.get("devices", [])


def _reset_compiled_callers(swap: Swap, cuda_swapped: bool) -> None:
    """Make code compiled against the old build stop using it (see the module docstring).

    A schema change or a removed op resets Dynamo (compiled callers re-trace). A swapped CUDA
    build resets it too when Inductor has recorded CUDA graphs: they replay the old kernels,
    and a graph tree cannot be reset on its own without breaking the functions that use it.
    """
    schema_changed = bool(swap.redefined or swap.removed) and "torch._dynamo" in sys.modules
    if schema_changed or (cuda_swapped and _cuda_graphs_recorded()):
        torch._dynamo.reset()


def _cuda_graphs_recorded() -> bool:
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return False
    try:
        if not torch._C._is_key_in_tls("tree_manager_containers"):
            return False
        containers = trees.get_obj(trees.local, "tree_manager_containers")
        return any(getattr(c, "tree_manager", None) is not None for c in containers.values())
    except Exception:  # torch internals moved: assume graphs exist and reset
        return True


def _owner(state: _Namespace, op: str, ns: str | None = None) -> str | None:
    for family, handle in state.handles.items():
        if op in handle.schemas:
            return family
    return deferred.owner(ns, op) if ns is not None else None


def live_handles(ns: str) -> dict[str, Handle]:
    """The open library of each family of ``ns``, deferred ones registered first (see
    :mod:`workbench.deferred`)."""
    deferred.activate_all(ns)
    return handles(ns)


def handles(ns: str) -> dict[str, Handle]:
    """The open library of each registered family of ``ns`` (deferred ones left so)."""
    return dict(_namespaces.get(ns, _Namespace()).handles)
