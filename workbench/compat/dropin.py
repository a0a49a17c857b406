"""``load`` and ``load_inline`` with the signature and meaning of ``torch.utils.cpp_extension``.

A script changes only its import. Differences, all on the safe side:

- builds are cached by content (sources, the headers they include, flags, toolchain), one object
  per translation unit, so an edit recompiles one file and a reverted edit recompiles nothing;
- locks are ``fcntl.flock``s: a killed build never leaves a lock that hangs the next ``load``;
- loading an edited ``TORCH_LIBRARY`` source again in the same process swaps the new kernels in
  under the same ``torch.ops`` names instead of aborting the process (see ``live.py``), and an
  edited pybind11 module is imported from a new file, with the old module object updated too;
- ``keep_intermediates`` is accepted and has no effect: objects are the cache.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench import cache, knobs, toolchain
from workbench.compat import cached, pch, timing
from workbench.compat.cached import OBJECTS, OUT, Recipe, Unit
from workbench.compat.live import activate, replaced
from workbench.config import Config, make_config
from workbench.errors import BuildError, ToolchainError, WorkbenchError
from workbench.hashing import digest
from workbench.project import WB_ROOT

COMPAT_DIR = WB_ROOT / "bindings" / "compat"
PRELUDE = COMPAT_DIR / "wb_compat.h"
STABLE_PRELUDE = COMPAT_DIR / "wb_compat_stable.h"
DEFERRED_SOURCE = COMPAT_DIR / "deferred.cpp"
CUDA_SUFFIXES = (".cu", ".cuh")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What torch.utils.cpp_extension passes nvcc besides the user's flags.
NVCC_COMMON = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
)


def _say(line: str) -> None:
    print(line, flush=True)


def _list(value: Sequence[str] | str | None, arg: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not all(isinstance(v, str) for v in value):
        raise TypeError(f"{arg} must be a list of strings, got {value!r}")
    return list(value)


def _pybind11_abi_flags() -> list[str]:
    """The pybind11 ABI defines torch was built with: its casters must match ours."""
    import torch

    flags = []
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = getattr(torch._C, f"_PYBIND11_{name}", None)
        if value is not None:
            flags.append(f'-DPYBIND11_{name}="{value}"')
    return flags


def _config(with_cuda: bool, link: bool) -> Config:
    if not with_cuda:
        return make_config(devices="cpu")
    archs = toolchain.default_archs()
    if not archs:
        raise ToolchainError(
            "with_cuda=True but no GPU was found to build for; set TORCH_CUDA_ARCH_LIST "
            "(e.g. '9.0') to compile for a GPU that is not here"
        )
    return make_config(archs=archs, link=link)


def _common_flags(config: Config, name: str) -> list[str]:
    torch = config.torch
    flags = [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    flags += _pybind11_abi_flags()
    flags += [f"-isystem{d}" for d in torch.include_dirs]
    flags += [f"-isystem{sysconfig.get_paths()['include']}"]
    flags += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.cxx11_abi)}"]
    return flags


def _split_isystem(flags: list[str]) -> list[str]:
    """nvcc wants ``-isystem DIR`` as two words."""
    out: list[str] = []
    for f in flags:
        out += ["-isystem", f.removeprefix("-isystem")] if f.startswith("-isystem") else [f]
    return out


def _unit(
    config: Config,
    source: Path,
    common: list[str],
    extra_cflags: list[str],
    extra_cuda_cflags: list[str],
    own: bool = False,
    defer: bool = True,
    include_dirs: tuple[Path, ...] = (),
) -> Unit:
    """How to compile ``source``; ``own``: the workbench's own file (no precompiled header, no
    host reuse, not the user's to explain or adopt); ``defer``: its TORCH_LIBRARY blocks wait
    for wbc_register (all but executables)."""
    text = source.read_text(errors="replace")
    plain, stable = (False, False)
    if defer and not own:
        plain, stable = _names_torch_library(source, text, include_dirs)
    prelude = ["-include", str(PRELUDE)] if plain else []
    if stable:
        # The prelude reads the stable C shim before the source can define USE_CUDA, which
        # declares its CUDA functions (a CUDA file, or a source that defines it, wants them).
        cuda = source.suffix in CUDA_SUFFIXES or _DEFINES_USE_CUDA.search(text) is not None
        prelude += [*(["-DUSE_CUDA="] if cuda else []), "-include", str(STABLE_PRELUDE)]
    std = f"-std={config.torch.cxx_std}"
    head: list[str]
    made, note = None, ""
    fallback: tuple[str, ...] | None = None
    refused: Path | None = None
    if source.suffix in CUDA_SUFFIXES:
        ccbin = ["-ccbin", str(config.cxx)] if knobs.cxx() else []
        head = [str(config.nvcc), *_split_isystem(common), *NVCC_COMMON, *ccbin]
        head += [*toolchain.gencode_flags(config.archs), std, *extra_cuda_cflags]
        if config.cuda_home is not None:
            head += ["-isystem", str(config.cuda_home / "include")]
    else:
        head = [str(config.cxx), *common, "-fPIC", std, *extra_cflags]
        if not own and config.use_pch and knobs.dropin_pch():  # see workbench.compat.pch
            made, note = pch.plan(text, head, config.identity)
    tail = ["-MMD", "-MF", f"{OUT}.d", "-c", str(source), "-o", OUT]
    slim = pch.lean(made, text, head, config.identity) if made and knobs.dropin_lean() else None
    if made is not None and slim is not None:
        refused = pch.refused_file(slim, source)
        if not refused.exists():  # else the lean header failed this source before: the whole
            fallback = (*head, *made.flags, *prelude, *tail)
            made = slim
    flags = made.flags if made is not None else ()
    # A .cu's host compile is its longest pass when it includes torch: kept apart and reused
    # while an edit leaves nvcc's host-side output unchanged (see workbench.nvcc_pipeline).
    reuse = source.suffix == ".cu" and not own
    command = (*head, *flags, *prelude, *tail)
    return Unit(source, command, made, note, reuse, own, fallback, refused)


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
_PLAIN = re.compile(r"(?<!STABLE_)TORCH_LIBRARY")
_DEFINES_USE_CUDA = re.compile(r"^[ \t]*#[ \t]*define[ \t]+USE_CUDA\b", re.M)
_SCANNED_HEADERS = 256  # a bound on the headers read per source: a project's own, not a library's


def _names_torch_library(
    source: Path, text: str, include_dirs: tuple[Path, ...]
) -> tuple[bool, bool]:
    """Whether ``source``, or a header of the project's that it includes (``"x.h"`` beside the
    file including it or under ``extra_include_paths``, ``<x.h>`` under those), names
    TORCH_LIBRARY, and STABLE_TORCH_LIBRARY: such a TU's registration blocks must wait for
    wbc_register, or a reload of its library would register them a second time as it opens."""
    seen: set[Path] = set()
    todo = [(source.parent, text)]
    plain = stable = False
    while todo:
        folder, body = todo.pop()
        plain = plain or _PLAIN.search(body) is not None
        stable = stable or "STABLE_TORCH_LIBRARY" in body
        for quote, name in _INCLUDE.findall(body):
            for d in (folder, *include_dirs) if quote == '"' else include_dirs:
                path = (d / name).resolve()
                if path.is_file():
                    if path not in seen and len(seen) < _SCANNED_HEADERS:
                        seen.add(path)
                        todo.append((path.parent, path.read_text(errors="replace")))
                    break
    return plain, stable


def _link_command(config: Config, standalone: bool, extra_ldflags: list[str]) -> tuple[str, ...]:
    lib = str(config.torch.lib_dir)
    cmd = [str(config.cxx), *([] if standalone else ["-shared"]), "-o", OUT, OBJECTS]
    # Each build's calls bind to its own functions: an edited build loaded beside the old one
    # must never call into it (user code keeps default visibility, as with torch's load).
    cmd.append("-Wl,-Bsymbolic-functions")
    cmd += [str(config.libstdcxx)] if config.libstdcxx else ["-lstdc++"]
    cmd += [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu", "-ltorch"]
    if not standalone:  # as torch's load: a library of ops may bind pybind11 functions too
        cmd.append("-ltorch_python")
    if config.with_cuda:
        assert config.cuda_home is not None
        cuda_lib = str(config.cuda_home / "lib64")
        cmd += ["-lc10_cuda", "-ltorch_cuda", f"-L{cuda_lib}", f"-Wl,-rpath,{cuda_lib}", "-lcudart"]
    return (*cmd, *extra_ldflags)


_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _file_safe(name: str) -> str:
    """``name``'s form in file names (the cache folder, the lock, the library's file name)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _check_name(name: object, python_module: bool) -> None:
    """``name`` checked as torch's load would build it. A library of ops
    (``is_python_module=False``) may be named ``my-ext`` or ``my.ext``, as with torch; a module
    must be importable."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
        raise ValueError(
            f"name must be the extension's name, letters, digits, '_', '-' or '.', got {name!r}"
        )
    if python_module and not _IDENT.fullmatch(name):
        raise ValueError(
            f"name {name!r} is not a Python identifier, so no module of that name can be "
            f"imported (PYBIND11_MODULE({name}, m) does not compile): name it "
            f"{_file_safe(name)!r}, or pass is_python_module=False for a "
            "library of TORCH_LIBRARY ops"
        )


def _check_sources(sources: object) -> list[Path]:
    bad = TypeError(
        f"sources must be a list of paths of .cpp/.cu files (str or pathlib.Path), got {sources!r}"
    )
    if isinstance(sources, (str, os.PathLike)):
        items = [sources]
    else:
        try:
            items = list(sources)  # type: ignore[call-overload]
        except TypeError:
            raise bad from None
    if not all(isinstance(s, (str, os.PathLike)) for s in items):
        raise bad
    if not items:
        raise ValueError("sources is empty; give the .cpp/.cu files to compile")
    paths = [Path(s).resolve() for s in items]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"sources not found: {', '.join(missing)}")
    return paths


def _no_sycl(with_sycl: bool | None, sources: Sequence[object]) -> None:
    if with_sycl or any(str(s).endswith(".sycl") for s in sources):
        raise ValueError(
            "with_sycl / a .sycl source: the drop-in builds C++ and CUDA extensions; build a "
            "SYCL extension with torch.utils.cpp_extension.load"
        )


def recipe(
    name: str,
    sources: list[Path],
    *,
    extra_cflags: list[str],
    extra_cuda_cflags: list[str],
    extra_ldflags: list[str],
    extra_include_paths: list[str],
    with_cuda: bool,
    python_module: bool,
    standalone: bool = False,
    link: bool = True,
) -> Recipe:
    """What to compile and link for a drop-in load (pure apart from reading the sources)."""
    config = _config(with_cuda, link)
    common = _common_flags(config, name)
    dirs = tuple(Path(p).resolve() for p in extra_include_paths)
    common += [f"-I{d}" for d in dirs]
    # An executable has no driver to call wbc_register(): its TORCH_LIBRARY blocks register
    # as they do under torch's load, when it starts.
    units = [
        _unit(
            config,
            s,
            common,
            extra_cflags,
            extra_cuda_cflags,
            defer=not standalone,
            include_dirs=dirs,
        )
        for s in sources
    ]
    if any("-include" in u.command for u in units):
        # The workbench's own file, compiled once per flag set: no header of its own.
        units.append(_unit(config, DEFERRED_SOURCE, common, [], [], own=True))
    excluded = (*config.excluded_roots, sysconfig.get_paths()["include"] + "/")
    identity = {**config.identity, "drop-in": 1}
    return Recipe(
        _file_safe(name),
        tuple(units),
        _link_command(config, standalone, extra_ldflags),
        identity,
        excluded,
        "" if standalone else ".so",
    )


def load(
    name: str,
    sources: Sequence[str | Path] | str | Path,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_sycl_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    build_directory: str | None = None,
    verbose: bool = False,
    with_cuda: bool | None = None,
    with_sycl: bool | None = None,
    is_python_module: bool = True,
    is_standalone: bool = False,
    keep_intermediates: bool = True,
) -> Any:
    """Build and load a PyTorch C++/CUDA extension, as ``torch.utils.cpp_extension.load``.

    Returns the imported module (``is_python_module=True``); the library path after loading it
    as ``torch.ops.load_library`` would (``is_python_module=False``); or the path of the built
    executable (``is_standalone=True``, with ``is_python_module=False``). ``with_cuda`` defaults
    to whether any source is a ``.cu``/``.cuh`` file. ``build_directory`` holds the cache for
    this build (default: the workbench cache). SYCL is not built (``with_sycl`` raises);
    ``extra_sycl_cflags`` is accepted, as torch ignores it without SYCL sources.
    """
    if is_python_module and is_standalone:
        raise ValueError(
            "`is_python_module` and `is_standalone` are mutually exclusive: pass "
            "is_python_module=False with is_standalone=True"
        )
    _check_name(name, is_python_module)
    paths = _check_sources(sources)
    _no_sycl(with_sycl, paths)
    cuda = with_cuda if with_cuda is not None else any(p.suffix in CUDA_SUFFIXES for p in paths)
    return _build_and_load(
        name,
        paths,
        dict(
            extra_cflags=_list(extra_cflags, "extra_cflags"),
            extra_cuda_cflags=_list(extra_cuda_cflags, "extra_cuda_cflags"),
            extra_ldflags=_list(extra_ldflags, "extra_ldflags"),
            extra_include_paths=_list(extra_include_paths, "extra_include_paths"),
            with_cuda=cuda,
            python_module=is_python_module,
            standalone=is_standalone,
        ),
        build_directory,
        verbose,
    )


class ExtensionBuildError(BuildError, RuntimeError):
    """A drop-in compile or link that failed: a RuntimeError, as torch's load raises, so that
    a script's ``except RuntimeError`` fallback still catches it."""


class ExtensionToolchainError(ToolchainError, OSError):
    """No toolchain for a drop-in build (no CUDA to build for, a CPU build of torch): an OSError,
    as torch's load raises for a missing CUDA_HOME."""


# What a build could not do (a precompiled header), said once per process.
_said: set[str] = set()

# The last load of each extension (its key: see _key), for reload_all() (the notebook's
# autoreload).
_calls: dict[str, tuple[str, list[Path], dict[str, Any], str | None]] = {}


def _key(name: str, paths: list[Path], options: dict[str, Any], build_directory: str | None) -> str:
    """What makes two loads one extension (an edit) rather than two of one name."""
    return f"{name}:{digest(name, [str(p) for p in paths], options, build_directory)[:16]}"


def reload_all() -> list[tuple[str, list[str], float, str | None]]:
    """Load every extension loaded so far again: (name, files compiled, seconds, error).

    An unchanged extension costs a cache lookup; an edited one is rebuilt and swapped in. One
    that fails to build or register keeps its last good build, and its error is returned.
    """
    done: list[tuple[str, list[str], float, str | None]] = []
    for key, (name, paths, options, build_directory) in list(_calls.items()):
        start = time.perf_counter()
        try:
            out = _build(name, paths, options, build_directory, None)
            if not options["standalone"]:
                activate(name, out.path, options["python_module"], key)
                _forget_replaced(name)
        except WorkbenchError as e:
            done.append((name, [], time.perf_counter() - start, str(e)))
            continue
        done.append((name, [p.name for p in out.compiled], time.perf_counter() - start, None))
    return done


def _forget_replaced(name: str) -> None:
    """Drop the loads of ``name`` that a later load replaced (it registered their namespaces):
    reloading them would swap the two back and forth."""
    for key, call in list(_calls.items()):
        if call[0] == name and replaced(key):
            del _calls[key]


def _build(
    name: str,
    paths: list[Path],
    options: dict[str, Any],
    build_directory: str | None,
    on_line: Callable[[str], None] | None,
) -> cached.Output:
    try:
        if build_directory is None:
            return cached.build(recipe(name, paths, **options), knobs.jobs(), on_line)
        with knobs.override(WB_CACHE_DIR=str(Path(build_directory).resolve())):
            return cached.build(recipe(name, paths, **options), knobs.jobs(), on_line)
    except BuildError as e:
        if isinstance(e, RuntimeError):
            raise
        error = ExtensionBuildError(str(e), e.log)
        error.failed = e.failed
        raise error from None
    except ToolchainError as e:
        if isinstance(e, OSError):
            raise
        raise ExtensionToolchainError(str(e)) from None


def _build_and_load(
    name: str,
    paths: list[Path],
    options: dict[str, Any],
    build_directory: str | None,
    verbose: bool,
) -> Any:
    start = time.perf_counter()
    out = _build(name, paths, options, build_directory, _say if verbose else None)
    key = _key(name, paths, options, build_directory)
    _calls[key] = (name, paths, options, build_directory)
    if options["standalone"]:
        return str(out.path)
    live = activate(name, out.path, options["python_module"], key)
    _forget_replaced(name)
    if verbose or not knobs.quiet():
        for note in out.notes:  # each reason once per process, not at every edit
            if note not in _said:
                _said.add(note)
                print(f"wb: {name}: {note}", file=sys.stderr, flush=True)
        what = f"{len(out.compiled)} compiled" if out.compiled else "cached"
        print(
            f"wb: {name}: {what}, {time.perf_counter() - start:.3f} s ({out.path.name})"
            + _slow_hint(out.tu_seconds),
            file=sys.stderr,
            flush=True,
        )
    return live.module if options["python_module"] else str(out.path)


def _slow_hint(tu_seconds: dict[Path, float]) -> str:
    """A pointer to ``wb why`` for the slowest TU when it took long enough to matter."""
    if not tu_seconds:
        return ""
    source, secs = max(tu_seconds.items(), key=lambda kv: kv[1])
    if secs < timing.SLOW:
        return ""
    return f"; {source.name} took {secs:.1f} s: `wb why {source}` says where and what to do"


def _functions(functions: object) -> dict[str, str] | None:
    """``functions`` as torch reads it: None, a name, a list of names, or names to docstrings."""
    if functions is None or isinstance(functions, dict):
        return functions
    if isinstance(functions, str):
        return {functions: functions}
    if isinstance(functions, (list, tuple)) and all(isinstance(f, str) for f in functions):
        return {f: f for f in functions}
    raise ValueError(
        f"Expected 'functions' to be a list or dict of function names, but was {functions!r}"
    )


def _inline_sources(
    name: str,
    cpp_sources: Sequence[str] | str,
    cuda_sources: Sequence[str] | str | None,
    functions: dict[str, str] | None,
    with_pytorch_error_handling: bool,
    implicit_headers: bool,
) -> list[Path]:
    head = ["#include <torch/extension.h>"] if implicit_headers else []
    cpp = "\n".join([*head, *_list(cpp_sources, "cpp_sources")])
    if functions is not None:  # as torch: an empty list still makes the (empty) module
        wrap = "torch::wrap_pybind_function({f})" if with_pytorch_error_handling else "&{f}"
        defs = "".join(
            f'  m.def("{f}", {wrap.format(f=f)}, {json_string(doc)});\n'
            for f, doc in functions.items()
        )
        cpp += f"\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}}}\n"
    texts = {"main.cpp": cpp}
    cuda = _list(cuda_sources, "cuda_sources")
    if cuda:
        head = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
        texts["cuda.cu"] = "\n".join([*(head if implicit_headers else []), *cuda])
    folder = cache.root() / "inline" / _file_safe(name) / digest(texts)[:24]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for file, text in texts.items():
        path = folder / file
        if not path.is_file() or path.read_text() != text:
            cache.write_atomic(path, text)
        paths.append(path)
    return paths


def json_string(text: str) -> str:
    """A C++ string literal for ``text``."""
    import json

    return json.dumps(text)


def load_inline(
    name: str,
    cpp_sources: Sequence[str] | str,
    cuda_sources: Sequence[str] | str | None = None,
    sycl_sources: Sequence[str] | str | None = None,
    functions: Sequence[str] | str | dict[str, str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_sycl_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    build_directory: str | None = None,
    verbose: bool = False,
    with_cuda: bool | None = None,
    with_sycl: bool | None = None,
    is_python_module: bool = True,
    with_pytorch_error_handling: bool = True,
    keep_intermediates: bool = True,
    use_pch: bool = False,
    no_implicit_headers: bool = False,
) -> Any:
    """Build and load an extension from source strings, as ``cpp_extension.load_inline``.

    ``cpp_sources`` go into one ``main.cpp`` after ``#include <torch/extension.h>`` (none with
    ``no_implicit_headers``); ``functions`` (names, or a dict of name to docstring) are bound
    with pybind11; ``cuda_sources`` go into one ``cuda.cu``. ``use_pch`` is accepted and has no
    effect (the drop-in precompiles torch headers by itself); SYCL raises.
    """
    _check_name(name, is_python_module)
    _no_sycl(with_sycl or bool(sycl_sources), [])
    binds = _functions(functions)
    make = (name, cpp_sources, cuda_sources, binds, with_pytorch_error_handling)
    if build_directory is not None:
        with knobs.override(WB_CACHE_DIR=str(Path(build_directory).resolve())):
            paths = _inline_sources(*make, not no_implicit_headers)
    else:
        paths = _inline_sources(*make, not no_implicit_headers)
    cuda = with_cuda if with_cuda is not None else bool(cuda_sources)
    return _build_and_load(
        name,
        paths,
        dict(
            extra_cflags=_list(extra_cflags, "extra_cflags"),
            extra_cuda_cflags=_list(extra_cuda_cflags, "extra_cuda_cflags"),
            extra_ldflags=_list(extra_ldflags, "extra_ldflags"),
            extra_include_paths=_list(extra_include_paths, "extra_include_paths"),
            with_cuda=cuda,
            python_module=is_python_module,
            standalone=False,
        ),
        build_directory,
        verbose,
    )
