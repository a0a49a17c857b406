"""Device-only TUs (``*.kernel.cu``): cubins compiled by NVRTC and swapped into a live library.

A family may keep its kernels in files named ``NAME.kernel.cu`` that hold device code only
(no host function, no CUDA runtime header). Its host launchers, in its ordinary ``.cu``, name
each kernel they launch (``wb/module.h``); the library registers those names as it loads. Then:

1. the driver reads the names from the opened library (``wb_kernel_name``), groups them by file,
   and compiles each file with NVRTC once per GPU architecture of the build, with exactly those
   instantiations (name expressions), into a cubin;
2. each cubin is kept in the cache under a key over the NVRTC release, the architecture, the
   options, the names, and the bytes of the file and of every header it includes;
3. the library gets the cubins (``wb_module_load``) and looks its kernels up in them at their
   next launch.

An edit that changes only a device-only TU (or headers only it includes) leaves the host
library's key unchanged: the reload compiles that file alone and swaps its module in the running
library, with no host compile, no link and no ``dlopen``. Every other file of the family builds
as before (nvcc for ``.cu``, the host compiler for ``.cpp``): a ``.cu`` is the fallback for
device code that needs its host side in the same TU.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from workbench import cache, events
from workbench.errors import BuildError, LoadError
from workbench.hashing import digest, file_digest
from workbench.project import DEVICE_SUFFIX, Family, Project, mentions_tune

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from workbench.config import Config
    from workbench.nvrtc_worker import Workers

# Options of every NVRTC compile besides the architecture, include path and a variant's -D
# options: the language of nvcc's CUDA_FLAGS; line information for the sanitizer and profilers
# (as -lineinfo gives nvcc's kernels); unannotated functions compiled as device functions,
# so that a header of constexpr helpers that host launchers share needs no __host__ __device__;
# and ptxas's report of each kernel's registers and spills, kept in the cubin's record (the
# resources a reload prints, workbench.cubin; wb smoke's table).
NVRTC_FLAGS = ("-std=c++17", "-lineinfo", "-default-device", "--ptxas-options=-v")
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.MULTILINE)


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


class Image:
    """One cubin of a device-only TU: its architecture, cache key, file and lowered names."""

    __slots__ = ("arch", "file", "key", "lowered", "seconds")

    def __init__(self, arch: str, key: str, path: str | Path, lowered: dict[str, str]) -> None:
        self.arch = arch
        self.key = key
        self.file = os.fspath(path)  # a string: a warm start hands it on without a Path
        self.lowered = lowered
        self.seconds = 0.0  # compile time; 0 for a cache hit

    @property
    def path(self) -> Path:
        return Path(self.file)

    def record(self) -> dict[str, Any]:
        """What its compile recorded: seconds, NVRTC's log, options, headers ({} if unknown)."""
        meta = cache.read_json(self.path.with_suffix(".json"))
        return meta if isinstance(meta, dict) else {}


class Module:
    """The cubins of one device-only TU for the current sources, one per architecture."""

    def __init__(self, file: str, source: Path, images: list[Image]) -> None:
        self.file = file  # relative to the family's folder, as the launchers name it
        self.source = source
        self.images = images

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


def includes(source: Path, include_dirs: tuple[Path, ...]) -> list[str]:
    """Every header ``source`` includes, directly or not, that resolves on the include path.

    A textual scan (NVRTC reports no dependencies): an ``#include`` inside a disabled ``#if``
    counts too, which can only make the key change more often than it must.
    """
    seen: dict[str, None] = {}
    todo = [source]
    while todo:
        path = todo.pop()
        try:
            text = path.read_bytes()
        except OSError:
            continue
        for name in _INCLUDE.findall(text):
            rel = name.decode(errors="replace")
            for folder in (path.parent, *include_dirs):
                found = folder / rel
                if found.is_file():
                    key = os.path.abspath(found)
                    if key not in seen:
                        seen[key] = None
                        todo.append(Path(key))
                    break
    return sorted(seen)


def cubin_path(key: str) -> Path:
    """Where the cubin of ``key`` is kept; its record (arch, names, NVRTC's log) is beside it,
    with the suffix .json."""
    return cache.root() / "cubin" / key[:2] / f"{key}.cubin"


def _base_options(project: Project, family: Family, config: Config) -> list[str]:
    return [*NVRTC_FLAGS, *family.defines, *(f"-I{d}" for d in project.include_dirs)]


def _options(
    project: Project, family: Family, config: Config, headers: list[str], source: Path
) -> list[str]:
    """The NVRTC options of one TU: a variant's -D options only where the TU can read them."""
    options = _base_options(project, family, config)
    if family.defines and not any(mentions_tune(p) for p in [str(source), *headers]):
        options = [o for o in options if o not in family.defines]
    return options


def has_modules(family: Family, config: Config) -> bool:
    """Whether ``family`` has device-only TUs that this build compiles and loads (CUDA builds)."""
    return config.with_cuda and any(s.kind == "device" for s in family.sources)


def device_defines(project: Project, family: Family, config: Config) -> tuple[str, ...]:
    """A variant's -D options when one of its device-only TUs reads them, else ().

    Such a variant links the same objects as the plain build (its host launchers do not read
    them) but loads other modules: its library is a build of its own, with a key of its own, so
    that ``wb tune`` measures it as a variant and a process can hold it beside the plain build.
    """
    if not family.defines or not has_modules(family, config):
        return ()
    for src in family.sources:
        if src.kind != "device":
            continue
        headers = includes(src.path, project.include_dirs)
        if any(mentions_tune(p) for p in [str(src.path), *headers]):
            return family.defines
    return ()


def device_archs(config: Config) -> list[str]:
    """The build's GPU architectures that get a cubin (PTX-only entries have none)."""
    archs = [a for a in config.archs if a.startswith("sm_")]
    if not archs:
        raise BuildError(
            f"device-only TUs need a GPU architecture (sm_XY); the build has {config.archs}"
        )
    return archs


def plan(family: Family, kernels: list[tuple[str, str]]) -> list[tuple[str, Path, list[str]]]:
    """(file, source, names) per device-only TU the launchers name."""
    by_file: dict[str, list[str]] = {}
    for file, name in kernels:
        by_file.setdefault(file, []).append(name)
    out = []
    # The device-only TUs discovery found in the family's folder (no stat per warm start).
    tus = {s.path.name for s in family.sources if s.kind == "device"}
    for file, names in sorted(by_file.items()):
        source = family.dir / file
        if file not in tus:
            raise BuildError(
                f"the launchers of {family.name} launch {names[0]} from {file}, which is not a "
                f"device-only TU of the family: name a file *{DEVICE_SUFFIX} in {family.dir} "
                "(WB_DEVICE_TEMPLATE's file is relative to the family's folder)"
            )
        out.append((file, source, sorted(set(names))))
    return out


def ensure(
    project: Project,
    family: Family,
    config: Config,
    kernels: list[tuple[str, str]],
    seen: dict[str, list[int] | None] | None = None,
    pool: Executor | None = None,
    workers: Workers | None = None,
) -> list[Module]:
    """The cubins of every device-only TU the launchers name: from the cache, or compiled now.

    A TU whose inputs (its text, its headers, its cubins) have the ``stat`` stamps recorded by
    an earlier call, for the same names, architectures, options and NVRTC, reuses that call's
    cubins without reading a header or loading NVRTC (see :class:`_Warm`). ``seen``: the stamps
    this load has read already (one load of many families reads a shared header once).
    ``pool``: where the NVRTC programs run (``wb tune`` shares one among its variants: one
    pool per call would put more programs on the cores than they have); default: threads of
    this call, one per program up to the cores. ``workers``: compile in those processes
    (:mod:`workbench.nvrtc_worker`), each pool thread driving one, instead of in this process.
    """
    from workbench import nvrtc

    archs = device_archs(config)
    base = _base_options(project, family, config)
    modules = []
    warm = _warm()
    seen = {} if seen is None else seen
    for file, source, names in plan(family, kernels):
        identity = [nvrtc.identity(), archs, base, names]
        found = warm.lookup(str(source), identity, seen)
        if found is not None:
            modules.append(Module(file, source, found))
            continue
        nvrtc.library()  # a clear error when it is missing, before any key is computed
        release = nvrtc.version()
        headers = includes(source, project.include_dirs)
        options = _options(project, family, config, headers, source)
        inputs = [(p, file_digest(p)) for p in [str(source), *headers]]
        jobs = [
            (arch, digest("cubin", release, arch, options, part, inputs), part)
            for arch in archs
            for part in chunks(names)
        ]
        images = _images(source, jobs, options, headers, pool, workers)
        if any(image.seconds for image in images):  # once per TU, as build.ensure reports
            events.compiled(family.name, source)
        warm.record(str(source), identity, [str(source), *headers], images)
        modules.append(Module(file, source, images))
    warm.save()
    return modules


# At most this many NVRTC programs per (device-only TU, arch): the names are split into chunks
# compiled side by side, each to its own cubin. A program's front end is about 0.04 s and each
# instantiation about 0.02 s (scale.kernel.cu on a CPU host), so 12 instantiations in 6 programs
# on 2 cores took 0.18-0.20 s where one program took 0.28 s. Fixed by the count of names alone,
# so that every machine splits the same way and the cubins' keys agree.
MAX_PROGRAMS = 8


def chunks(names: list[str]) -> list[list[str]]:
    """``names`` (sorted) in at most MAX_PROGRAMS runs of equal size."""
    size = max(1, -(-len(names) // MAX_PROGRAMS))
    return [names[i : i + size] for i in range(0, len(names), size)]


def _images(
    source: Path,
    jobs: list[tuple[str, str, list[str]]],
    options: list[str],
    headers: list[str],
    pool: Executor | None = None,
    workers: Workers | None = None,
) -> list[Image]:
    """The cubin of each (arch, key, names): from the cache, else compiled (in parallel)."""
    found = [_cached(arch, key) for arch, key, _ in jobs]
    todo = [i for i, image in enumerate(found) if image is None]
    if len(todo) == 1 and pool is None:
        arch, key, part = jobs[todo[0]]
        found[todo[0]] = _compile(source, arch, key, part, options, headers)
    elif todo:
        from concurrent.futures import ThreadPoolExecutor

        own = None
        if pool is None:
            pool = own = ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1))
        try:
            futures = {
                i: pool.submit(_compile, source, *jobs[i], options, headers, workers) for i in todo
            }
            for i, future in futures.items():
                found[i] = future.result()
        finally:
            if own is not None:
                own.shutdown()
    return [image for image in found if image is not None]


class _Warm:
    """What :func:`ensure` found for each device-only TU, by the stamps of its inputs.

    Kept in one file of the cache (``warm/device.json``), read once per process; the same
    racy-timestamp rule as the library index (:mod:`workbench.warm`): a file changed in the last
    two seconds is never recorded, so an edit that keeps size and mtime is not missed.
    """

    def __init__(self) -> None:
        self.path = cache.root() / "warm" / "device.json"
        loaded = cache.read_json(self.path)
        if not isinstance(loaded, dict) or loaded.get("version") != 2:
            loaded = {}
        self.entries: dict[str, Any] = loaded.get("tus", {})
        # The kernels each library's launchers name, by the library's path: a library of the
        # cache is never rewritten under its name (the key is in it), so the list stays true.
        self.kernels: dict[str, list[list[str]]] = loaded.get("kernels", {})
        self.dirty = False
        self.lock = threading.Lock()  # wb tune compiles the modules of its variants in threads

    def kernels_of(self, handle: Handle) -> list[tuple[str, str]]:
        """:func:`kernel_names` of the handle's library, as recorded when first read."""
        library = handle.built.library
        key = os.fspath(library) if library is not None else None
        found = self.kernels.get(key) if key is not None else None
        if isinstance(found, list):
            return [(str(f), str(e)) for f, e in found]
        names = kernel_names(handle)
        if key is not None:
            with self.lock:
                self.kernels[key] = [[f, e] for f, e in names]
                self.dirty = True
        return names

    def lookup(
        self, source: str, identity: list[Any], seen: dict[str, list[int] | None]
    ) -> list[Image] | None:
        """The images recorded for ``source``, if its inputs are as recorded; ``seen`` holds the
        stamps read by this call's caller (families share the workbench's headers)."""
        from workbench import warm

        entry = self.entries.get(source)
        if not isinstance(entry, dict) or entry.get("identity") != identity:
            return None
        for path, stamp in entry.get("stamps", {}).items():
            if path not in seen:
                seen[path] = warm.read_stamp(path)
            if seen[path] != stamp:
                return None
        images = entry["images"]
        # A cubin removed since (wb gc, wb clean --all) is compiled again, not handed to a
        # library that would fail at the kernel's first launch (one stat per cubin).
        if not all(os.path.exists(i["path"]) for i in images):
            return None
        return [Image(i["arch"], i["key"], i["path"], i["lowered"]) for i in images]

    def record(
        self, source: str, identity: list[Any], inputs: list[str], images: list[Image]
    ) -> None:
        from workbench import warm

        now = time.time()
        stamps = {}
        for path in inputs:  # the cubins are files of the cache, named by their keys
            stamp = warm.stamp_of(path, now)
            if stamp is None:
                with self.lock:
                    if self.entries.pop(source, None) is not None:
                        self.dirty = True
                return
            stamps[path] = list(stamp)
        entry = {
            "identity": identity,
            "stamps": stamps,
            "images": [
                {"arch": i.arch, "key": i.key, "path": i.file, "lowered": i.lowered} for i in images
            ],
        }
        with self.lock:
            self.entries[source] = entry
            self.dirty = True

    def save(self) -> None:
        with self.lock:
            if not self.dirty:
                return
            # Only saved after a build or a first load: the names of libraries gone since (an
            # edit's older builds, removed by wb gc or clean) are dropped then.
            self.kernels = {k: v for k, v in self.kernels.items() if os.path.exists(k)}
            kept = {"version": 2, "tus": self.entries, "kernels": self.kernels}
            text = json.dumps(kept, sort_keys=True)
            self.dirty = False
        with contextlib.suppress(OSError):  # only saves time
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cache.write_atomic(self.path, text)


_warm_state: dict[tuple[str | None, ...], _Warm] = {}


def _warm() -> _Warm:
    """The warm record of the current cache (one per cache folder and process)."""
    return cache.per_cache(_warm_state, _Warm)


def _cached(arch: str, key: str) -> Image | None:
    path = cubin_path(key)
    meta = cache.read_json(path.with_suffix(".json"))
    if not isinstance(meta, dict) or not path.is_file():
        return None
    if file_digest(str(path)) != meta.get("sha256"):
        return None  # damaged: compiled again, and replaced
    return Image(arch, key, path, dict(meta.get("lowered", {})))


def _compile(
    source: Path,
    arch: str,
    key: str,
    names: list[str],
    options: list[str],
    headers: list[str],
    workers: Workers | None = None,
) -> Image:
    from workbench import nvrtc

    start = time.perf_counter()
    path = cubin_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if workers is None:
            result = nvrtc.compile(source, arch, names, options)
            lowered, log = result.lowered, result.log
            cache.write_atomic(path, result.cubin)
        else:  # written beside its place, then renamed: a cubin in the cache is whole
            part = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.part")
            lowered, log, _ = workers.compile(source, arch, names, options, part)
            os.replace(part, path)
    except BuildError as e:
        listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        raise BuildError(f"{e}\n(the host launchers ask for: {listed})", e.log) from e
    seconds = time.perf_counter() - start
    meta = {
        "arch": arch,
        "source": str(source),
        "headers": headers,
        "options": options,
        "lowered": lowered,
        "log": log,
        "seconds": seconds,
        "sha256": file_digest(str(path)),
    }
    cache.write_atomic(path.with_suffix(".json"), json.dumps(meta, indent=1, sort_keys=True))
    events.stored("cubin", key)
    image = Image(arch, key, path, lowered)
    image.seconds = seconds
    return image


def load(handle: Handle, module: Module) -> None:
    """Make ``module`` the live module of its file in the library of ``handle``."""
    from workbench import runtime

    images = [(i.arch, i.file, i.lowered) for i in module.images]
    error = runtime.load_module(handle.cdll, module.file, images)
    if error is not None:
        raise LoadError(f"loading the module of {module.source} failed: {error}")
    handle.modules[module.file] = module.key


def sync(
    project: Project,
    family: Family,
    config: Config,
    handle: Handle,
    seen: dict[str, list[int] | None] | None = None,
    only: set[tuple[str, str]] | None = None,
    ready: list[Module] | None = None,
) -> list[Module]:
    """Compile and load what changed among the family's device-only TUs; the modules swapped.

    ``seen``: stamps already read by this load (see :func:`ensure`). ``only``: compile just
    these of the kernels the launchers name (``wb tune``'s variants, which are checked and timed
    on inputs that launch no other); a launch of any other kernel then fails and names it, until
    a ``sync`` without ``only`` completes the modules. ``ready``: the modules :func:`prepare`
    found for this library (a deferred family's), loaded as they are."""
    if handle.kernels is None:
        handle.kernels = _warm().kernels_of(handle)
    kernels = handle.kernels if only is None else [k for k in handle.kernels if k in only]
    if not kernels:
        _warm().save()
        return []
    swapped = []
    modules = ready if ready is not None else ensure(project, family, config, kernels, seen)
    for module in modules:
        if handle.modules.get(module.file) != module.key:
            load(handle, module)
            swapped.append(module)
    return swapped


def prepare(
    project: Project,
    family: Family,
    config: Config,
    library: Path,
    seen: dict[str, list[int] | None] | None = None,
) -> list[Module] | None:
    """For a family left unregistered by a load (:mod:`workbench.deferred`): compile what changed
    among its device-only TUs now, so a compile error shows at load; the first lookup of an op
    then only loads these modules (:func:`sync`'s ``ready``). None where the kernels the
    library's launchers name were never recorded (the library was never opened here): the
    family is then registered at load."""
    found = _warm().kernels.get(os.fspath(library))
    if not isinstance(found, list):
        return None
    kernels = [(str(f), str(e)) for f, e in found]
    return ensure(project, family, config, kernels, seen) if kernels else []
