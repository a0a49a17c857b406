"""``wb wheel``: a kernel registry as a wheel that needs no compiler.

Lifecycle (:func:`build_wheel`): discover the registry; make the JIT's configuration (the same
flags, and the same archs unless given); ``build.ensure`` every family, which takes each library
from the content-keyed cache where the keys match and builds only what is missing; then zip the
libraries exactly as the cache holds them, the specs' Python, a copy of
``workbench/runtime.py`` and a record of the build into a wheel (:mod:`workbench.ship.wheel`).

What the wheel does at import is :func:`workbench.runtime.load_package`. The libraries find
torch's libraries by name: the package imports torch first, so ``libc10.so``,
``libtorch_cpu.so`` (and on CUDA ``libc10_cuda.so`` and the CUDA runtime) are already in the
process and the dynamic loader matches them by name before any path; the build machine's
rpath in a library is never searched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from workbench import build, errors, loader, runtime
from workbench import spec as spec_module
from workbench.config import Config, make_config
from workbench.errors import WorkbenchError
from workbench.project import Family, Project, discover
from workbench.ship import package, wheel
from workbench.tuning import space
from workbench.version import VERSION

BUILD_INFO_FORMAT = 1
RESERVED_NAMES = ("workbench", "torch")


class Shipped(NamedTuple):
    path: Path  # the wheel
    name: str  # its import name
    tag: str
    info: dict[str, Any]  # what <name>/_build.json records
    built: list[build.Built]  # how each family's library was obtained (``hit``: from the cache)
    seconds: float


def check_name(name: str) -> str:
    if not name.isidentifier() or name in RESERVED_NAMES:
        raise WorkbenchError(
            f"package name {name!r} must be a Python identifier other than "
            f"{' or '.join(RESERVED_NAMES)} (it is what `import NAME` imports)"
        )
    return name


def build_wheel(
    kernels: str | Path | None = None,
    *,
    name: str | None = None,
    archs: Sequence[str] | None = None,
    out: str | Path = "dist",
    version: str = "0.1.0",
    namespace: str | None = None,
    families: Sequence[str] | None = None,
    jobs: int | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Shipped:
    """Build the registry under ``kernels`` (default: the bundled one) into a wheel in ``out``.

    ``name`` is the import name (default: the namespace). ``archs`` as ``('sm_80', 'sm_90a')``
    (default: the JIT's, from TORCH_CUDA_ARCH_LIST or the GPUs present; none on a CPU torch).
    """
    start = time.perf_counter()
    project = discover(kernels, namespace)
    name = check_name(name or project.namespace)
    wheel.check_version(version)
    config = make_config(archs=tuple(archs) if archs else None)
    chosen = [project.family(f) for f in families] if families else list(project.families)
    if not chosen:
        raise WorkbenchError(f"no op family under {project.kernels_dir} to ship")
    built = [build.ensure(project, fam, config, jobs, on_line) for fam in chosen]
    libraries = [b.library for b in built if b.library is not None]
    assert len(libraries) == len(built), "a linked configuration always yields a library"
    tag, python_api = wheel.tag_for(libraries)
    files: dict[str, bytes] = {}
    records = [
        _add_family(files, name, project, config, f, b) for f, b in zip(chosen, built, strict=True)
    ]
    info = _build_info(project, name, version, config, tag, python_api, records)
    files[f"{name}/_specs/__init__.py"] = b'"""The op specs of the shipped families."""\n'
    files[f"{name}/_spec.py"] = Path(spec_module.__file__).read_bytes()
    files[f"{name}/_tune.py"] = package.shipped_module(Path(space.__file__), 1).encode()
    files[f"{name}/_errors.py"] = Path(errors.__file__).read_bytes()
    files[f"{name}/_runtime.py"] = Path(runtime.__file__).read_bytes()
    files[f"{name}/{runtime.BUILD_INFO}"] = (json.dumps(info, indent=1) + "\n").encode()
    files[f"{name}/__init__.py"] = package.init_text(name, info).encode()
    summary = f"Ahead-of-time build of the torch.ops.{project.namespace} ops ({name})"
    requires = [f"torch=={config.torch.version.split('+', 1)[0]}"]
    meta = wheel.metadata(name, version, summary, requires)
    path = wheel.write_wheel(Path(out), name, version, tag, files, meta)
    return Shipped(path, name, tag, info, built, time.perf_counter() - start)


def _add_family(
    files: dict[str, bytes],
    name: str,
    project: Project,
    config: Config,
    family: Family,
    built: build.Built,
) -> dict[str, Any]:
    """Put a family's library, the cubins of its device-only TUs and its shipped spec into
    ``files``; its record in the build info."""
    assert built.library is not None
    handle = loader.open_library(built)  # RTLD_LOCAL, registers nothing
    schemas = handle.schemas
    modules = []
    from workbench import device

    if device.has_modules(family, config):
        for m in device.ensure(project, family, config, device.kernel_names(handle)):
            images = []
            for j, image in enumerate(m.images):
                arc = f"_lib/{family.name}/{m.file}.{image.arch}.{j}.cubin"
                files[f"{name}/{arc}"] = image.path.read_bytes()
                images.append({"arch": image.arch, "cubin": arc, "lowered": image.lowered})
            modules.append({"file": m.file, "images": images})
    arcname = f"_lib/{built.library.name}"
    files[f"{name}/{arcname}"] = built.library.read_bytes()
    if family.spec_path is not None:
        files[f"{name}/_specs/{family.name}.py"] = package.shipped_spec(family.spec_path).encode()
    return {
        "name": family.name,
        "key": built.key,
        "library": arcname,
        "sha256": built.manifest.get("sha256"),
        "spec": family.spec_path is not None,
        "schemas": sorted(schemas.values()),
        "modules": modules,
    }


def _build_info(
    project: Project,
    name: str,
    version: str,
    config: Config,
    tag: str,
    python_api: list[str],
    families: list[dict[str, Any]],
) -> dict[str, Any]:
    """What the package records (``<name>/_build.json``) and checks at import."""
    torch = config.torch
    return {
        "format": BUILD_INFO_FORMAT,
        "name": name,
        "version": version,
        "namespace": project.namespace,
        "workbench": VERSION,
        "torch": {"version": torch.version, "cuda": torch.cuda, "cxx11_abi": torch.cxx11_abi},
        "nvcc": config.nvcc_version,
        "cxx": config.cxx_version,
        "archs": list(config.archs),
        "devices": ["cpu", "cuda"] if config.with_cuda else ["cpu"],
        "tag": tag,
        "python_api": python_api,
        "families": families,
    }
