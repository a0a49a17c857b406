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

A reload in a live process whose calls have launched some of a TU's kernels compiles those first
(one NVRTC program each), loads them and returns; the TU's other kernels compile behind them and
are swapped in when done (:class:`Rest`). A launch of one of those before then waits for them in
the library's completion hook (``wb_module_hook``). So an edit of a TU of many heavy kernels (the
Hopper matmul's) reloads in the time of the kernels the user runs.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import cache, events
from workbench.device_live import Completion, Handle, Module, Rest, complete_later, failed, install
from workbench.device_live import hooked as _hooked
from workbench.device_live import kernel_names as kernel_names
from workbench.device_live import listed as _listed
from workbench.device_live import load as load
from workbench.device_live import settle as settle
from workbench.device_live import used_kernels as used_kernels
from workbench.device_record import Image
from workbench.device_record import cached as _cached
from workbench.device_record import cubin_path as cubin_path
from workbench.device_record import warm as _warm
from workbench.errors import BuildError
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
    first: Callable[[], set[tuple[str, str]]] | None = None,
) -> list[Module]:
    """The cubins of every device-only TU the launchers name: from the cache, or compiled now.

    A TU whose inputs (its text, its headers, its cubins) have the ``stat`` stamps recorded by
    an earlier call, for the same names, architectures, options and NVRTC, reuses that call's
    cubins without reading a header or loading NVRTC (:class:`workbench.device_record.Warm`).
    ``seen``: the stamps this load has read (one load of many families reads a shared header once).
    ``pool``: where the NVRTC programs run (``wb tune`` shares one among its variants: one
    pool per call would put more programs on the cores than they have); default: threads of
    this call, one per program up to the cores. ``workers``: compile in those processes
    (:mod:`workbench.nvrtc_worker`), each pool thread driving one, instead of in this process.
    ``first``: the kernels a live process has launched (read only where a TU compiles): a TU
    that names others too compiles these first and returns their module, whose ``rest``
    compiles the others in the background (:class:`Rest`).
    """
    from workbench import nvrtc

    archs = device_archs(config)
    base = _base_options(project, family, config)
    modules = []
    warm = _warm()
    seen = {} if seen is None else seen
    used: set[tuple[str, str]] | None = None
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
        jobs = functools.partial(_jobs, archs, release, options, inputs)
        content = digest("module", release, archs, options, names, inputs)
        whole = jobs(names)
        images = _listed(content)
        cached: list[Image | None] = []
        if images is None:  # compiled whole before, or by an earlier version of this layer
            cached = [_cached(arch, key) for arch, key, _ in whole]
            images = [i for i in cached if i is not None] if None not in cached else None
        early: list[str] = []
        if images is None and first is not None:
            used = first() if used is None else used
            early = [n for n in names if (file, n) in used]
        if early and len(early) < len(names) and not failed(content):  # its kernels first
            # The rest on as many programs as the cores run (its keys are listed, not derived).
            later = [n for n in names if n not in early]
            rest = jobs(later, max(MAX_PROGRAMS, os.cpu_count() or 1))
            part = Module(file, source, _images(source, jobs(early), options, headers))
            part.rest = Rest(content, file, source, part.images, len(later))
            part.rest.start(functools.partial(_images, source, rest, options, headers))
            events.compiled(family.name, source)
            modules.append(part)  # not recorded: a warm start finds the whole module's list
            continue
        if images is None:
            images = _images(source, whole, options, headers, pool, workers, cached)
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


def _jobs(
    archs: list[str],
    release: str,
    options: list[str],
    inputs: list[Any],
    names: list[str],
    programs: int = MAX_PROGRAMS,
) -> list[tuple[str, str, list[str]]]:
    """(arch, cubin key, names) of each NVRTC program that compiles ``names``."""
    return [
        (arch, digest("cubin", release, arch, options, part, inputs), part)
        for arch in archs
        for part in chunks(names, programs)
    ]


def chunks(names: list[str], programs: int = MAX_PROGRAMS) -> list[list[str]]:
    """``names`` (sorted) in at most ``programs`` runs of equal size."""
    size = max(1, -(-len(names) // programs))
    return [names[i : i + size] for i in range(0, len(names), size)]


def _images(
    source: Path,
    jobs: list[tuple[str, str, list[str]]],
    options: list[str],
    headers: list[str],
    pool: Executor | None = None,
    workers: Workers | None = None,
    found: list[Image | None] | None = None,
) -> list[Image]:
    """The cubin of each (arch, key, names): from the cache (``found``, the caller's lookup of
    each there, where it made one), else compiled (in parallel)."""
    found = [_cached(arch, key) for arch, key, _ in jobs] if not found else list(found)
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
    these of the kernels the launchers name (``wb tune``'s variants, checked and timed on the
    inputs on which the plain build launched only these); a launch of any other kernel compiles
    it then (:class:`workbench.device_live.Completion`), until a ``sync`` without ``only``
    completes the modules. ``ready``: the modules :func:`prepare` found for this library (a
    deferred family's), loaded as they are."""
    if handle.kernels is None:
        handle.kernels = _warm().kernels_of(handle.built.library, lambda: kernel_names(handle))
    kernels = handle.kernels if only is None else [k for k in handle.kernels if k in only]
    swapped = []
    if kernels:
        # A reload of a library whose kernels ran: those first (ensure's ``first``).
        early = only is None and bool(handle.modules) and _hooked(handle)
        first = (lambda: used_kernels(handle)) if early else None
        if ready is None:
            ready = ensure(project, family, config, kernels, seen, first=first)
        swapped = [module for module in ready if install(handle, module)]
    else:
        _warm().save()
    if only is not None:
        _complete_on_launch(project, family, config, handle, ready or [])
    return swapped


def _complete_on_launch(
    project: Project, family: Family, config: Config, handle: Handle, loaded: list[Module]
) -> None:
    """Each device-only TU of ``handle`` whose module lacks some of the kernels the launchers
    name compiles one of them at the launch that needs it."""
    have = {m.file: m.images for m in loaded}

    def compile_one(file: str, expression: str) -> list[Image]:
        return [i for m in ensure(project, family, config, [(file, expression)]) for i in m.images]

    for file, source, names in plan(family, handle.kernels or []):
        images = have.get(file, [])
        if set(names) - {n for i in images for n in i.lowered}:
            completion = Completion(
                file, source, images, set(names), functools.partial(compile_one, file)
            )
            complete_later(handle, completion)


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
