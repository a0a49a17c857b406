"""The live library's side of device-only TUs: the modules it holds and their swap.

:mod:`workbench.device` compiles a TU's cubins; this module hands them to an opened library
(``wb_module_load``) and keeps what a launch may still need:

- a reload's second step (:class:`Rest`): the TU's kernels the process never launched, compiled
  behind those it did, swapped in when done;
- a variant's completion (:class:`Completion`): ``wb tune`` compiles a variant's modules with
  only the kernels the plain build launched on the tuned inputs; a launch of any other kernel
  (a tuned launcher routes differently) compiles that kernel alone and adds it to the module.

A launch whose kernel the live module lacks asks the library's completion hook
(``wb_module_hook``), which waits for the first or compiles the second.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from workbench import cache
from workbench.device_record import Image
from workbench.device_record import cached as _cached
from workbench.errors import LoadError


class Built(Protocol):
    """What this layer reads of a build: the path of its library (None before the link)."""

    @property
    def library(self) -> Path | None: ...


class Handle(Protocol):
    """What this layer needs of an opened library (``workbench.loader.Handle`` is one): the
    library, its registry entry points, and the slots where the modules it holds are noted."""

    @property
    def built(self) -> Built: ...

    cdll: ctypes.CDLL
    kernels: list[tuple[str, str]] | None  # what its launchers name, once read
    modules: dict[str, tuple[str, ...]]  # the module key loaded per device-only TU


class Module:
    """The cubins of one device-only TU for the current sources, one per architecture; or, where
    ``rest`` is set, those of the kernels a live process has launched, with the rest to come."""

    def __init__(
        self, file: str, source: Path, images: list[Image], rest: Rest | None = None
    ) -> None:
        self.file = file  # relative to the family's folder, as the launchers name it
        self.source = source
        self.images = images
        self.rest = rest

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(i.key for i in self.images)

    @property
    def compiled(self) -> bool:
        return any(i.seconds > 0 for i in self.images)


def kernel_names(handle: Handle) -> list[tuple[str, str]]:
    """(file, name expression) of every kernel the library's launchers name."""
    cdll = handle.cdll
    count = cdll.wb_kernel_count()
    cdll.wb_kernel_name.restype = ctypes.c_char_p
    out = []
    for i in range(count):
        raw = cdll.wb_kernel_name(i)
        file, _, expression = (raw or b"").decode().partition("\t")
        out.append((file, expression))
    return out


def used_kernels(handle: Handle) -> set[tuple[str, str]]:
    """(file, name expression) of each kernel of the library that this process has launched (or
    global it has read), on any device: what the calls so far needed of its modules."""
    cdll = handle.cdll
    names = handle.kernels if handle.kernels is not None else kernel_names(handle)
    return {names[i] for i in range(len(names)) if cdll.wb_kernel_used(i)}


# A reload's modules in two steps (the module's docstring). The whole module's cubins are listed
# by its inputs' content (cubin/modules/KEY.json), so a warm start or the next reload finds them,
# and a second ensure of the same content waits for the compile under way.
_rest_lock = threading.Lock()
_in_flight: dict[str, Rest] = {}  # by the module's content key
_failed: set[str] = set()  # content keys whose rest failed to compile
# By id(library): each file's rest to come, or its completion (a variant's module).
_waiting: dict[int, dict[str, Rest | Completion]] = {}
_hooks: dict[int, tuple[Any, Any]] = {}  # by id(library): (the library, its hook), kept alive
_HOOK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char), ctypes.c_int
)


class Rest:
    """The kernels of a device-only TU compiled after those a live process has launched."""

    def __init__(self, content: str, file: str, source: Path, first: list[Image], n: int) -> None:
        self.content, self.file, self.source, self.first = content, file, source, first
        self.count = n  # the kernels it compiles
        self.images: list[Image] | None = None  # the whole module's, once compiled
        self.error = ""
        self.finished = False  # compiled (or failed); done: and swapped into its holders
        self.done = threading.Event()
        self.holders: dict[int, tuple[Handle, tuple[str, ...]]] = {}

    def start(self, compile_rest: Callable[[], list[Image]]) -> None:
        with _rest_lock:
            _in_flight[self.content] = self
        # Not a daemon: a process that ends meanwhile waits for it, so the cache keeps the work.
        threading.Thread(target=self._run, args=(compile_rest,), name="wb-module-rest").start()

    def _run(self, compile_rest: Callable[[], list[Image]]) -> None:
        try:
            images = [*self.first, *compile_rest()]
            path = _listing(self.content)
            path.parent.mkdir(parents=True, exist_ok=True)
            cache.write_atomic(path, json.dumps([[i.arch, i.key] for i in images]))
            self.images = images
        except Exception as e:  # shown at the launch that needs them, and at the next reload
            self.error = str(e)
            with _rest_lock:
                _failed.add(self.content)  # its next ensure compiles it whole: the error raised
        with _rest_lock:
            self.finished = True
            holders = [handle for handle, _ in self.holders.values()]
        for handle in holders:
            self.swap_into(handle)
        with _rest_lock:
            if _in_flight.get(self.content) is self:
                del _in_flight[self.content]
            self.done.set()

    def hold(self, handle: Handle, key: tuple[str, ...]) -> None:
        """``handle`` loaded the first kernels as ``key``: swap the whole module in when done."""
        with _rest_lock:
            self.holders[id(handle)] = (handle, key)
            _waiting.setdefault(id(handle.cdll), {})[self.file] = self
            finished = self.finished
        if finished:
            self.swap_into(handle)

    def complete(self, handle: Handle, expression: str) -> str | None:
        """Wait for the whole module and swap it in; None once it is live, else why not."""
        self.done.wait()  # without the GIL: the compile's threads run
        if self.swap_into(handle):
            return None
        return f"{self.source}: compiling its other kernels failed: {self.error}"

    def swap_into(self, handle: Handle) -> bool:
        """Load the whole module into ``handle`` if its live module is still the first step's;
        whether the whole module compiled (and is live, unless a later load replaced it)."""
        with _rest_lock:
            held = self.holders.pop(id(handle), None)
            if self.images is not None and held and handle.modules.get(self.file) == held[1]:
                try:
                    load(handle, Module(self.file, self.source, self.images))
                except LoadError as e:
                    self.error, self.images = str(e), None
            return self.images is not None


def settle(timeout: float | None = None) -> bool:
    """Wait for the second step of the modules that reloads are compiling; whether all are done
    (compiled and swapped in, or failed) within ``timeout`` seconds."""
    with _rest_lock:
        rests = list(_in_flight.values())
    return all(rest.done.wait(timeout) for rest in rests)


def _listing(content: str) -> Path:
    return cache.root() / "cubin" / "modules" / f"{content}.json"


def listed(content: str) -> list[Image] | None:
    """The images of the module of ``content``: when a rest compiles it now, once it is done."""
    with _rest_lock:
        rest = _in_flight.get(content)
    if rest is not None:
        rest.done.wait()
        if rest.images is None:
            return None  # it failed: compiled again, and the error raised
        return [Image(i.arch, i.key, i.file, i.lowered) for i in rest.images]  # compiled there
    listed = cache.read_json(_listing(content))
    if not isinstance(listed, list):
        return None
    images = [_cached(str(arch), str(key)) for arch, key in listed]
    return None if any(i is None for i in images) else [i for i in images if i is not None]


def hooked(handle: Handle) -> bool:
    """Whether the library of ``handle`` calls the completion hook (libraries built before it do
    not: a reload then compiles every kernel at once); installs it on the first call."""
    key = id(handle.cdll)
    if key in _hooks:
        return True
    setter = getattr(handle.cdll, "wb_module_hook", None)
    if setter is None:
        return False

    def complete(file: bytes, expression: bytes, message: Any, capacity: int) -> int:
        with _rest_lock:
            pending = _waiting.get(key, {}).get(file.decode())
        if pending is None:
            return 0
        try:
            error = pending.complete(handle, expression.decode())
        except Exception as e:  # nothing may escape into the launching C++ frame
            error = f"{pending.source}: completing its module failed: {e}"
        if error is None:
            return 1
        text = error.encode()
        ctypes.memmove(message, text, min(len(text), capacity - 1))
        return -1

    hook = _HOOK(complete)
    setter.argtypes, setter.restype = [_HOOK], None
    setter(hook)
    _hooks[key] = (handle.cdll, hook)
    return True


class Completion:
    """A variant's module compiled with only some of the kernels its launchers name (``wb tune``
    compiles those the plain build launched on the tuned inputs): a launch of another kernel of
    the file compiles that one alone, now, and loads the module with its cubins added. A tuned
    launcher may route a shape elsewhere than the plain one (matmul's tuned tile runs every
    shape), so the plain build's launches only predict what a variant needs."""

    def __init__(
        self,
        file: str,
        source: Path,
        images: list[Image],
        names: set[str],
        compile_one: Callable[[str], list[Image]],
    ) -> None:
        self.file, self.source, self.images = file, source, list(images)
        self.names = names  # every name expression the launchers name in this file
        self.compile_one = compile_one
        self.lock = threading.Lock()

    def complete(self, handle: Handle, expression: str) -> str | None:
        """Add ``expression``'s cubins to the live module; None once it holds them, else why not."""
        if expression not in self.names:
            return f"{self.source}: the launchers do not name {expression}"
        with self.lock:  # one compile at a time; a second launch of it finds it added
            if any(expression in i.lowered for i in self.images):
                return None
            images = [*self.images, *self.compile_one(expression)]
            with _rest_lock:
                if handle.modules.get(self.file, ()) != tuple(i.key for i in self.images):
                    return None  # a later load replaced the module: the launch looks again
                load(handle, Module(self.file, self.source, images))
            self.images = images
        return None


def complete_later(handle: Handle, completion: Completion) -> None:
    """Let a launch that needs a kernel missing from ``completion``'s file compile it then."""
    if hooked(handle):
        with _rest_lock:
            _waiting.setdefault(id(handle.cdll), {})[completion.file] = completion


def install(handle: Handle, module: Module) -> bool:
    """Make ``module`` the live module of its file, unless it is; whether it was loaded now. What
    the file waited for before (a rest, a completion) no longer applies; a ``module`` with a
    ``rest`` has it swapped in when done."""
    with _rest_lock:
        loaded = handle.modules.get(module.file) != module.key
        if loaded:
            load(handle, module)
        _waiting.get(id(handle.cdll), {}).pop(module.file, None)
    if module.rest is not None:
        module.rest.hold(handle, module.key)
    return loaded


def failed(content: str) -> bool:
    """Whether the second step of the module of ``content`` failed to compile in this process."""
    with _rest_lock:
        return content in _failed


def load(handle: Handle, module: Module) -> None:
    """Make ``module`` the live module of its file in the library of ``handle``."""
    from workbench import runtime

    images = [(i.arch, i.file, i.lowered) for i in module.images]
    error = runtime.load_module(handle.cdll, module.file, images)
    if error is not None:
        raise LoadError(f"loading the module of {module.source} failed: {error}")
    handle.modules[module.file] = module.key
