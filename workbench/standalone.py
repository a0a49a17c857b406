"""The kernel registry without PyTorch: a family's kernels as a pybind11 module over NumPy.

``bindings/python/<family>.cpp`` binds a family's torch-free launchers (``kernels/<family>/``)
with pybind11; :func:`load` compiles it with the family's CPU kernel TU (and, with CUDA, its
``.cu`` TU plus host-device staging in ``wb/numpy.h``) and imports the module. Builds share the
drop-in's content-keyed cache; the toolchain identity has no torch in it, and neither does the
module: ``import torch`` is never needed to use it. An edited kernel rebuilds only its TU, and
loading again imports the new build under the same module object.
"""

from __future__ import annotations

import sys
import sysconfig
import time
import types
from pathlib import Path

from workbench import knobs, toolchain
from workbench.compat import cached
from workbench.compat.cached import OBJECTS, OUT, Recipe, Unit
from workbench.compat.live import activate
from workbench.config import CUDA_FLAGS
from workbench.errors import WorkbenchError
from workbench.project import WB_ROOT, discover
from workbench.version import VERSION

PYTHON_BINDINGS = WB_ROOT / "bindings" / "python"
CXX_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden")


def _archs() -> tuple[str, ...]:
    try:
        return toolchain.default_archs()
    except ImportError:  # no torch to ask for the GPUs: TORCH_CUDA_ARCH_LIST only
        return ()


def _binding(kernels_dir: Path, family: str) -> Path:
    for folder in (kernels_dir.parent / "bindings" / "python", PYTHON_BINDINGS):
        if (folder / f"{family}.cpp").is_file():
            return folder / f"{family}.cpp"
    raise WorkbenchError(
        f"op family {family!r} has no standalone binding; write bindings/python/{family}.cpp "
        "(see bindings/python/muladd.cpp)"
    )


def recipe(family: str, path: str | Path | None = None, with_cuda: bool | None = None) -> Recipe:
    """What to compile for the standalone module of ``family`` (pure apart from probing)."""
    project = discover(path)
    fam = project.family(family)
    cxx = toolchain.find_cxx()
    cuda_home = toolchain.find_cuda_home()
    archs = _archs() if with_cuda is not False and cuda_home is not None else ()
    if with_cuda and not archs:
        raise WorkbenchError(
            "with_cuda=True needs nvcc and a GPU (or TORCH_CUDA_ARCH_LIST to compile for one)"
        )
    import pybind11

    py_inc = sysconfig.get_paths()["include"]
    inc = [f"-I{d}" for d in project.include_dirs]
    binding = _binding(project.kernels_dir, family)
    binding_inc = [f"-I{binding.parent / 'include'}", f"-I{PYTHON_BINDINGS / 'include'}"]
    defines = [f"-DWB_MODULE_NAME={family}"] + (["-DWB_WITH_CUDA"] if archs else [])
    tail = ["-MMD", "-MF", f"{OUT}.d", "-c"]
    units = []
    for src in fam.sources:
        if src.kind == "cpu":
            units.append(
                Unit(src.path, (str(cxx), *CXX_FLAGS, *inc, *tail, str(src.path), "-o", OUT))
            )
        elif src.kind == "cuda" and archs:
            assert cuda_home is not None
            nvcc = [str(cuda_home / "bin" / "nvcc"), *CUDA_FLAGS, *toolchain.gencode_flags(archs)]
            units.append(Unit(src.path, (*nvcc, *inc, *tail, str(src.path), "-o", OUT)))
    host = [str(cxx), *CXX_FLAGS, *defines, *inc, *binding_inc]
    host += [f"-isystem{pybind11.get_include()}", f"-isystem{py_inc}"]
    if archs:
        assert cuda_home is not None
        host.append(f"-isystem{cuda_home / 'include'}")
    units.append(Unit(binding, (*host, *tail, str(binding), "-o", OUT)))
    link = [str(cxx), "-shared", "-o", OUT, OBJECTS]
    if archs:
        assert cuda_home is not None
        lib = str(cuda_home / "lib64")
        link += [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lcudart"]
    identity = {
        "workbench": VERSION,
        "standalone": 1,
        "python": toolchain.python_tag(),
        "pybind11": pybind11.__version__,
        "cxx": f"{cxx} ({toolchain.compiler_version(cxx)})",
        "nvcc": toolchain.compiler_version(cuda_home / "bin" / "nvcc")
        if archs and cuda_home
        else None,
        "archs": list(archs),
        "env": knobs.compiler_env(),
    }
    roots = ["/usr/include", "/usr/lib", py_inc, pybind11.get_include()]
    if cuda_home is not None:
        roots += [str(cuda_home), str(cuda_home.resolve())]
    return Recipe(
        f"{family}_numpy",
        tuple(units),
        tuple(link),
        identity,
        tuple(r.rstrip("/") + "/" for r in roots),
    )


def load(
    family: str,
    path: str | Path | None = None,
    with_cuda: bool | None = None,
    verbose: bool = False,
) -> types.ModuleType:
    """Build (or find in the cache) and import the NumPy module of an op family.

    ``path`` is the registry's kernels folder (default: the bundled kernels). ``with_cuda``
    defaults to whether nvcc and a GPU are present; the module's ``with_cuda`` says which.
    """
    start = time.perf_counter()
    out = cached.build(recipe(family, path, with_cuda), knobs.jobs(), print if verbose else None)
    live = activate(family, out.path, python_module=True)
    if verbose or not knobs.quiet():
        what = f"{len(out.compiled)} compiled" if out.compiled else "cached"
        took = time.perf_counter() - start
        print(f"wb: {family} (NumPy): {what}, {took:.3f} s", file=sys.stderr, flush=True)
    assert live.module is not None
    return live.module
