"""Discovery of a kernel registry: op families, their sources, and the project's settings.

A registry is a ``kernels/`` folder beside a ``bindings/`` folder::

    kernels/include/...          headers shared by the kernels (torch-free)
    kernels/<family>/*.cu        CUDA kernel TUs (torch-free), compiled by nvcc
    kernels/<family>/*.kernel.cu device-only TUs (no host code), compiled by NVRTC to cubins
    kernels/<family>/*.cpp       CPU kernel TUs (torch-free)
    kernels/<family>/spec.py     the op spec (reference, samples, fake, backward)
    bindings/<family>.cpp        the host side that knows torch (schemas, checks, dispatch)
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

from workbench import knobs
from workbench.errors import WorkbenchError


def _data_root() -> Path:
    """The folder holding the workbench's C++ trees (``kernels/``, ``bindings/``).

    Installed from a wheel or an sdist, they travel inside the package as ``workbench/_data``
    (setup.py copies them there); in a checkout (and an editable install) they sit beside the
    package. One ``stat`` at import.
    """
    package = Path(__file__).resolve().parent
    shipped = package / "_data"
    return shipped if shipped.is_dir() else package.parent


# The workbench's own tree: its registry headers and library entry points serve every project.
WB_ROOT = _data_root()
# True when the workbench runs from an installed package, whose bundled kernels are read-only.
INSTALLED = WB_ROOT.name == "_data"
WB_KERNEL_INCLUDE = WB_ROOT / "kernels" / "include"
WB_BINDING_INCLUDE = WB_ROOT / "bindings" / "include"
WB_REGISTRY_SOURCE = WB_ROOT / "bindings" / "registry.cpp"
BUNDLED_KERNELS = WB_ROOT / "kernels"

DEFAULT_NAMESPACE = "wb"
# Device-only TUs: compiled by NVRTC and loaded as modules (workbench.device).
DEVICE_SUFFIX = ".kernel.cu"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Source(NamedTuple):
    path: Path
    # "cuda" (nvcc), "device" (a device-only TU: NVRTC, loaded as a module), "cpu" (kernel TU,
    # c++), "binding" (host TU with torch headers), or "registry" (the workbench's library entry
    # points, linked into every library)
    kind: str


class Family(NamedTuple):
    name: str
    dir: Path
    sources: tuple[Source, ...]
    spec_path: Path | None
    # A tuning variant's -D options for its kernel TUs (workbench.tuning); () for the plain build.
    defines: tuple[str, ...] = ()

    @property
    def build_name(self) -> str:
        """The name of this build's lock and failure record: a variant's own, so that variants
        build in parallel and a failing one does not stand for the family."""
        if not self.defines:
            return self.name
        return f"{self.name}-v{hashlib.sha256(' '.join(self.defines).encode()).hexdigest()[:10]}"


# Each registry's include path, as its last discover() found it.
_include_dirs: dict[Path, tuple[Path, ...]] = {}


class Project(NamedTuple):
    kernels_dir: Path
    bindings_dir: Path
    namespace: str
    families: tuple[Family, ...]

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        """Kernel include path: the project's headers first, then the workbench's.

        Looked up once per discovery (a load asks for it per family and per device-only TU).
        """
        found = _include_dirs.get(self.kernels_dir)
        if found is None:
            dirs = [self.kernels_dir / "include", self.kernels_dir, WB_KERNEL_INCLUDE]
            found = _include_dirs[self.kernels_dir] = tuple(
                dict.fromkeys(d for d in dirs if d.is_dir())
            )
        return found

    @property
    def binding_include_dirs(self) -> tuple[Path, ...]:
        dirs = [self.bindings_dir / "include", WB_BINDING_INCLUDE]
        return tuple(dict.fromkeys(d for d in dirs if d.is_dir()))

    def family(self, name: str) -> Family:
        for f in self.families:
            if f.name == name:
                return f
        known = ", ".join(f.name for f in self.families) or "none"
        raise WorkbenchError(f"no op family {name!r} under {self.kernels_dir}; known: {known}")


def settings(kernels_dir: Path) -> dict[str, Any]:
    """The ``[tool.workbench]`` table of the nearest pyproject.toml at or above ``kernels_dir``
    ({} where there is none)."""
    for folder in (kernels_dir, *kernels_dir.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            if sys.version_info >= (3, 11):  # imported here: most loads never read it
                import tomllib
            else:
                import tomli as tomllib
            try:
                data = tomllib.loads(pyproject.read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise WorkbenchError(f"cannot read {pyproject}: {e}") from e
            table = data.get("tool", {}).get("workbench", {})
            return table if isinstance(table, dict) else {}
    return {}


def _read_namespace(kernels_dir: Path) -> str | None:
    value = settings(kernels_dir).get("namespace")
    return str(value) if value is not None else None


def _files(dir: Path) -> set[str]:
    """The names of the files in ``dir`` (one scandir: discovery is part of every warm start)."""
    try:
        with os.scandir(dir) as entries:
            return {e.name for e in entries if e.is_file()}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _family(name: str, dir: Path, bindings: set[str], bindings_dir: Path) -> Family | None:
    """The family in folder ``dir`` (named ``name``), or None when it holds no family.

    Part of every warm start: names are compared as strings, and paths made only to keep."""
    files = _files(dir)
    # Sorted as names, then made paths: sorting paths parses each of them.
    kernels = sorted(n for n in files if os.path.splitext(n)[1] in (".cu", ".cpp"))
    binding_name = f"{name}.cpp"
    binding = bindings_dir / binding_name
    if not kernels and binding_name not in bindings:
        return None
    if binding_name not in bindings:
        raise WorkbenchError(
            f"op family {name!r} has kernels in {dir} but no binding {binding}; "
            "write the host side there (see bindings/muladd.cpp)"
        )
    if not _IDENT.fullmatch(name):
        raise WorkbenchError(f"op family folder {dir} must be named like a C identifier")
    sources = [Source(dir / n, _kind(n)) for n in kernels]
    sources.append(Source(binding, "binding"))
    return Family(name, dir, tuple(sources), dir / "spec.py" if "spec.py" in files else None)


def _kind(name: str) -> str:
    if name.endswith(DEVICE_SUFFIX):
        return "device"
    return "cuda" if name.endswith(".cu") else "cpu"


def discover(path: str | Path | None = None, namespace: str | None = None) -> Project:
    """The registry under ``path`` (a kernels/ folder; default: the bundled kernels)."""
    if not WB_KERNEL_INCLUDE.is_dir() or not WB_REGISTRY_SOURCE.is_file():
        raise WorkbenchError(
            f"the workbench's own headers are missing under {WB_ROOT}; reinstall the workbench "
            "(`pip install workbench-*.whl`, `pip install .` or `pip install -e .` in a checkout)"
        )
    kernels_dir = Path(path).resolve() if path is not None else BUNDLED_KERNELS
    if not kernels_dir.is_dir():
        raise WorkbenchError(f"kernel folder {kernels_dir} does not exist")
    bindings_dir = kernels_dir.parent / "bindings"
    ns = namespace or knobs.namespace() or _read_namespace(kernels_dir) or DEFAULT_NAMESPACE
    if not _IDENT.fullmatch(ns):
        raise WorkbenchError(f"namespace {ns!r} is not a valid identifier (set WB_NAMESPACE)")
    _include_dirs.pop(kernels_dir, None)  # a folder made since the last load counts
    bindings = _files(bindings_dir)
    with os.scandir(kernels_dir) as entries:
        dirs = sorted(e.name for e in entries if e.is_dir())
    families = []
    for name in dirs:
        if name != "include" and not name.startswith((".", "_")):
            fam = _family(name, kernels_dir / name, bindings, bindings_dir)
            if fam is not None:
                families.append(fam)
    return Project(kernels_dir, bindings_dir, ns, tuple(families))


def mentions_tune(path: str) -> bool:
    """Whether the file reads a tuning parameter (``WB_TUNE_``); True for a file that is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return True  # a header that is gone: the build will say so; assume it matters
    return _mentions_tune_at(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4096)
def _mentions_tune_at(path: str, mtime_ns: int, size: int) -> bool:
    try:
        with open(path, "rb") as f:
            return b"WB_TUNE_" in f.read()
    except OSError:
        return True
