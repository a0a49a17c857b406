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
from workbench.compat.live import activate
from workbench.config import Config, make_config
from workbench.errors import ToolchainError, WorkbenchError
from workbench.hashing import digest
from workbench.project import WB_ROOT

COMPAT_DIR = WB_ROOT / "bindings" / "compat"
PRELUDE = COMPAT_DIR / "wb_compat.h"
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
) -> Unit:
    """How to compile ``source``; ``own``: the workbench's own file (no precompiled header, no
    host reuse, not the user's to explain or adopt)."""
    text = source.read_text(errors="replace")
    prelude = ["-include", str(PRELUDE)] if "TORCH_LIBRARY" in text else []
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


def _link_command(
    config: Config, python_module: bool, standalone: bool, extra_ldflags: list[str]
) -> tuple[str, ...]:
    lib = str(config.torch.lib_dir)
    cmd = [str(config.cxx), *([] if standalone else ["-shared"]), "-o", OUT, OBJECTS]
    # Each build's calls bind to its own functions: an edited build loaded beside the old one
    # must never call into it (user code keeps default visibility, as with torch's load).
    cmd.append("-Wl,-Bsymbolic-functions")
    cmd += [str(config.libstdcxx)] if config.libstdcxx else ["-lstdc++"]
    cmd += [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu", "-ltorch"]
    if python_module:
        cmd.append("-ltorch_python")
    if config.with_cuda:
        assert config.cuda_home is not None
        cuda_lib = str(config.cuda_home / "lib64")
        cmd += ["-lc10_cuda", "-ltorch_cuda", f"-L{cuda_lib}", f"-Wl,-rpath,{cuda_lib}", "-lcudart"]
    return (*cmd, *extra_ldflags)


def _check_sources(name: str, sources: Sequence[str | Path] | str | Path) -> list[Path]:
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ValueError(f"name must be a valid Python identifier (the module name), got {name!r}")
    items = [sources] if isinstance(sources, (str, Path)) else list(sources)
    if not items:
        raise ValueError("sources is empty; give the .cpp/.cu files to compile")
    paths = [Path(s).resolve() for s in items]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"sources not found: {', '.join(missing)}")
    return paths


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
    common += [f"-I{Path(p).resolve()}" for p in extra_include_paths]
    units = [_unit(config, s, common, extra_cflags, extra_cuda_cflags) for s in sources]
    if any("-include" in u.command for u in units):
        # The workbench's own file, compiled once per flag set: no header of its own.
        units.append(_unit(config, DEFERRED_SOURCE, common, [], [], own=True))
    excluded = (*config.excluded_roots, sysconfig.get_paths()["include"] + "/")
    identity = {**config.identity, "drop-in": 1}
    return Recipe(
        name,
        tuple(units),
        _link_command(config, python_module, standalone, extra_ldflags),
        identity,
        excluded,
        "" if standalone else ".so",
    )


def load(
    name: str,
    sources: Sequence[str | Path] | str | Path,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    build_directory: str | None = None,
    verbose: bool = False,
    with_cuda: bool | None = None,
    is_python_module: bool = True,
    is_standalone: bool = False,
    keep_intermediates: bool = True,
) -> Any:
    """Build and load a PyTorch C++/CUDA extension, as ``torch.utils.cpp_extension.load``.

    Returns the imported module (``is_python_module=True``); the library path after loading it
    as ``torch.ops.load_library`` would (``is_python_module=False``); or the path of the built
    executable (``is_standalone=True``). ``with_cuda`` defaults to whether any source is a
    ``.cu``/``.cuh`` file. ``build_directory`` holds the cache for this build (default: the
    workbench cache).
    """
    paths = _check_sources(name, sources)
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
            python_module=is_python_module and not is_standalone,
            standalone=is_standalone,
        ),
        build_directory,
        verbose,
    )


# What a build could not do (a precompiled header), said once per process.
_said: set[str] = set()

# The last load of each extension name, for reload_all() (the notebook's autoreload).
_calls: dict[str, tuple[list[Path], dict[str, Any], str | None]] = {}


def reload_all() -> list[tuple[str, list[str], float, str | None]]:
    """Load every extension loaded so far again: (name, files compiled, seconds, error).

    An unchanged extension costs a cache lookup; an edited one is rebuilt and swapped in. One
    that fails to build or register keeps its last good build, and its error is returned.
    """
    done: list[tuple[str, list[str], float, str | None]] = []
    for name, (paths, options, build_directory) in list(_calls.items()):
        start = time.perf_counter()
        try:
            out = _build(name, paths, options, build_directory, None)
            if not options["standalone"]:
                activate(name, out.path, options["python_module"])
        except WorkbenchError as e:
            done.append((name, [], time.perf_counter() - start, str(e)))
            continue
        done.append((name, [p.name for p in out.compiled], time.perf_counter() - start, None))
    return done


def _build(
    name: str,
    paths: list[Path],
    options: dict[str, Any],
    build_directory: str | None,
    on_line: Callable[[str], None] | None,
) -> cached.Output:
    if build_directory is None:
        return cached.build(recipe(name, paths, **options), knobs.jobs(), on_line)
    with knobs.override(WB_CACHE_DIR=str(Path(build_directory).resolve())):
        return cached.build(recipe(name, paths, **options), knobs.jobs(), on_line)


def _build_and_load(
    name: str,
    paths: list[Path],
    options: dict[str, Any],
    build_directory: str | None,
    verbose: bool,
) -> Any:
    start = time.perf_counter()
    out = _build(name, paths, options, build_directory, _say if verbose else None)
    _calls[name] = (paths, options, build_directory)
    if options["standalone"]:
        return str(out.path)
    live = activate(name, out.path, options["python_module"])
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


def _inline_sources(
    name: str,
    cpp_sources: Sequence[str] | str,
    cuda_sources: Sequence[str] | str | None,
    functions: Sequence[str] | str | dict[str, str] | None,
    with_pytorch_error_handling: bool,
) -> list[Path]:
    cpp = "#include <torch/extension.h>\n" + "\n".join(_list(cpp_sources, "cpp_sources"))
    if functions:
        docs = (
            functions
            if isinstance(functions, dict)
            else {f: f for f in _list(functions, "functions")}
        )
        wrap = "torch::wrap_pybind_function({f})" if with_pytorch_error_handling else "&{f}"
        defs = "".join(
            f'  m.def("{f}", {wrap.format(f=f)}, {json_string(doc)});\n' for f, doc in docs.items()
        )
        cpp += f"\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}}}\n"
    texts = {"main.cpp": cpp}
    cuda = _list(cuda_sources, "cuda_sources")
    if cuda:
        head = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
        texts["cuda.cu"] = head + "\n".join(cuda)
    folder = cache.root() / "inline" / name / digest(texts)[:24]
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
    functions: Sequence[str] | str | dict[str, str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    build_directory: str | None = None,
    verbose: bool = False,
    with_cuda: bool | None = None,
    is_python_module: bool = True,
    with_pytorch_error_handling: bool = True,
    keep_intermediates: bool = True,
    use_pch: bool = False,
    no_implicit_headers: bool = False,
) -> Any:
    """Build and load an extension from source strings, as ``cpp_extension.load_inline``.

    ``cpp_sources`` go into one ``main.cpp`` after ``#include <torch/extension.h>``;
    ``functions`` (names, or a dict of name to docstring) are bound with pybind11;
    ``cuda_sources`` go into one ``cuda.cu``. ``use_pch`` and ``no_implicit_headers`` are
    accepted for compatibility; the first has no effect.
    """
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ValueError(f"name must be a valid Python identifier (the module name), got {name!r}")
    if build_directory is not None:
        with knobs.override(WB_CACHE_DIR=str(Path(build_directory).resolve())):
            paths = _inline_sources(
                name, cpp_sources, cuda_sources, functions, with_pytorch_error_handling
            )
    else:
        paths = _inline_sources(
            name, cpp_sources, cuda_sources, functions, with_pytorch_error_handling
        )
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
