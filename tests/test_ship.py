"""Shipping: the workbench as a wheel, and a registry as a wheel that needs no compiler.

The installed behaviour is tested for real: one fresh virtual environment (torch pinned to this
process's release, the workbench installed from this checkout with ``pip install``, not
editable), the registry's wheel installed there with pip, and every run a subprocess outside the
checkout with the compiler replaced by a program that fails and records that it was called.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import workbench
from workbench import cli, knobs, ship
from workbench.errors import WorkbenchError
from workbench.ship import package, wheel

ROOT = Path(__file__).resolve().parent.parent
TORCH_RELEASE = torch.__version__.split("+", 1)[0]
PACKAGE = "shipme_ops"
NAMESPACE = "shipme"


def _clean_env() -> dict[str, str]:
    """This environment without what points into this checkout or this session's cache."""
    drop = ("PYTHON", "WB_", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("env", _clean_env())
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `wb new` registry of one family; returns its kernels/ folder."""
    kernels = tmp_path_factory.mktemp("registry") / "kernels"
    kernels.mkdir()
    assert cli.main(["--kernels", str(kernels), "new", "shipme"]) == 0
    spec = kernels / "shipme" / "spec.py"
    # A declared tuning space, as the bundled families have: the shipped spec must import it
    # from the package's own copy (the installed wheel has no workbench).
    spec.write_text(
        spec.read_text()
        + "\nfrom workbench import TuneSpace  # noqa: E402\n\n"
        + 'TUNE = TuneSpace({"THREADS": [128, 256]}, where=lambda p: p["THREADS"] > 0)\n'
    )
    return kernels


def _workbench_imports(text: str) -> list[str]:
    """The workbench modules the Python source ``text`` imports (comments do not count)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "workbench"]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [node.module] if node.module.split(".")[0] == "workbench" else []
    return found


@pytest.fixture(scope="module")
def shipped(registry: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The registry's wheel, built through `wb wheel`."""
    out = tmp_path_factory.mktemp("dist")
    argv = ["--namespace", NAMESPACE, "wheel", "--kernels", str(registry), "--name", PACKAGE]
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        assert cli.main([*argv, "--out", str(out)]) == 0
    (path,) = out.glob("*.whl")
    return path


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment: pinned torch, and the workbench from `pip install <checkout>`."""
    env = tmp_path_factory.mktemp("env") / "venv"
    _run([sys.executable, "-m", "venv", str(env)])
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, f"torch=={TORCH_RELEASE}"])
    _run([*pip, str(ROOT)], cwd=env.parent)
    return env


@pytest.fixture
def no_compiler(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """(environment with CXX failing and no nvcc on PATH, the file a compiler call leaves)."""
    called = tmp_path / "compiler-was-called"
    fake = tmp_path / "no-compiler"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {called}\necho 'no compiler here' >&2\nexit 1\n")
    fake.chmod(0o755)
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvcc").exists()]
    env = {k: v for k, v in _clean_env().items() if not k.startswith("CUDA")}
    env.update(CXX=str(fake), PATH=os.pathsep.join(path), WB_CACHE_DIR=str(tmp_path / "cache"))
    assert shutil.which("nvcc", path=env["PATH"]) is None
    yield env, called


def test_the_workbench_wheel_and_sdist_carry_every_cxx_file(tmp_path: Path) -> None:
    tracked = _run(["git", "ls-files", "kernels", "bindings"], cwd=ROOT).stdout.split()
    assert "bindings/registry.cpp" in tracked and "bindings/compat/wb_compat.h" in tracked
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    _run([*pip, str(ROOT), "-w", str(tmp_path)])
    sdist = f"from setuptools import build_meta; build_meta.build_sdist({str(tmp_path)!r})"
    _run([sys.executable, "-c", sdist], cwd=ROOT)
    (whl,) = tmp_path.glob("workbench-*.whl")
    (tar,) = tmp_path.glob("workbench-*.tar.gz")
    in_wheel = set(zipfile.ZipFile(whl).namelist())
    with tarfile.open(tar) as tf:
        in_sdist = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for rel in tracked:
        assert f"workbench/_data/{rel}" in in_wheel, rel
        assert rel in in_sdist, rel
    assert "workbench/ship/__init__.py" in in_wheel and "workbench/runtime.py" in in_wheel
    # Every module of the package, subpackages included (pyproject lists them one by one).
    modules = _run(["git", "ls-files", "workbench/*.py"], cwd=ROOT).stdout.split()
    assert "workbench/tuning/space.py" in modules
    missing = [m for m in modules if m not in in_wheel]
    assert not missing, f"not in the wheel (add the package to pyproject.toml): {missing}"


def test_installed_workbench_finds_its_trees_outside_the_checkout(
    fresh_env: Path, no_compiler: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, _ = no_compiler
    code = (
        "import workbench.project as p; "
        "assert p.INSTALLED and p.WB_REGISTRY_SOURCE.is_file(), p.WB_ROOT; "
        "print(p.WB_ROOT); print(len(p.discover().families))"
    )
    proc = _run([str(fresh_env / "bin" / "python"), "-c", code], cwd=tmp_path, env=env)
    root, families = proc.stdout.split()
    assert Path(root).is_relative_to(fresh_env) and int(families) >= 3
    wb = str(fresh_env / "bin" / "wb")
    _run([wb, "--help"], cwd=tmp_path, env=env)
    refused = subprocess.run([wb, "new", "mine"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "wb --kernels DIR new mine" in refused.stderr
    _run([wb, "--kernels", str(tmp_path / "kernels"), "new", "mine"], cwd=tmp_path, env=env)
    assert (tmp_path / "bindings" / "mine.cpp").is_file()


def test_the_jit_build_is_shipped_as_is(registry: Path, shipped: Path, cache_dir: Path) -> None:
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        lib = workbench.load(registry, namespace=NAMESPACE)
    library = lib.families["shipme"].library
    assert library is not None
    assert shipped.name == f"{PACKAGE}-0.1.0-py3-none-{wheel.platform_tag()}.whl"
    with zipfile.ZipFile(shipped) as zf:
        names = zf.namelist()
        assert zf.read(f"{PACKAGE}/_lib/{library.name}") == library.read_bytes()
        meta = zf.read(f"{PACKAGE}-0.1.0.dist-info/METADATA").decode()
        info = json.loads(zf.read(f"{PACKAGE}/_build.json"))
        spec = zf.read(f"{PACKAGE}/_specs/shipme.py").decode()
        tune = zf.read(f"{PACKAGE}/_tune.py").decode()
    assert f"Requires-Dist: torch=={TORCH_RELEASE}" in meta
    assert info["torch"]["version"] == torch.__version__ and info["python_api"] == []
    assert "from .._spec import OpSpec" in spec and "from .._tune import TuneSpace" in spec
    assert _workbench_imports(spec) == [] and "from ._errors import WorkbenchError" in tune
    # Only the import under `if TYPE_CHECKING:` (never run) still names the workbench.
    assert _workbench_imports(tune) == ["workbench.project"]
    assert not any("ninja" in n or n.startswith("workbench") for n in names)


def test_a_second_wheel_compiles_nothing(
    registry: Path, shipped: Path, cache_dir: Path, tmp_path: Path, compiled: list[str]
) -> None:
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        again = ship.build_wheel(registry, name=PACKAGE, namespace=NAMESPACE, out=tmp_path)
    assert compiled == [] and all(b.hit for b in again.built)
    assert again.path.read_bytes() == shipped.read_bytes()  # reproducible


def test_the_installed_wheel_needs_no_compiler_and_passes_wb_check(
    fresh_env: Path, shipped: Path, no_compiler: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, called = no_compiler
    python = str(fresh_env / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", str(shipped)], env=env)
    code = f"""
import sys, time, torch
start = time.perf_counter()
import {PACKAGE} as pkg
print(f"import {{(time.perf_counter() - start) * 1e3:.1f}} ms", file=sys.stderr)
assert not [m for m in sys.modules if m.split(".")[0] in ("workbench", "ninja")], "imported"
x = torch.randn(5, dtype=torch.float64, requires_grad=True)
y = torch.ops.{NAMESPACE}.shipme(x, 0.5)
torch.testing.assert_close(y, 0.5 * x + 1.0)
y.sum().backward()
torch.testing.assert_close(x.grad, torch.full_like(x, 0.5))
f = torch.compile(lambda t: pkg.shipme(t, 2.0), fullgraph=True, backend="eager")
torch.testing.assert_close(f(torch.ones(3)), torch.full((3,), 3.0))
tune = sys.modules["{PACKAGE}._specs.shipme"].TUNE
assert [p["THREADS"] for p in tune.points()] == [128, 256], tune.points()
print(pkg.build_info["tag"], pkg.ops)
"""
    proc = _run([python, "-c", code], cwd=tmp_path, env=env)
    assert proc.stdout.split() == ["py3-none-" + wheel.platform_tag(), "['shipme']"]
    check = [str(fresh_env / "bin" / "wb"), "check", "--package", PACKAGE, "--device", "cpu"]
    proc = _run(check, cwd=tmp_path, env=env)
    assert "0 failed" in proc.stdout and " gradcheck " in proc.stdout and " opcheck " in proc.stdout
    assert not called.exists(), f"a compiler ran: {called.read_text()}"


def test_a_shipped_cpp_autograd_kernel_differentiates_with_no_python(
    lib: workbench.Library,
    cache_dir: Path,
    no_compiler: tuple[dict[str, str], Path],
    tmp_path: Path,
) -> None:
    """The bundled layer_norm, shipped: its C++ autograd kernel registers from the package's
    library, its spec declares it, and first and second derivatives are right."""
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        shipped = ship.build_wheel(
            name="shipln_ops", namespace="shipln", families=["layer_norm"], out=tmp_path / "dist"
        )
    with zipfile.ZipFile(shipped.path) as zf:
        zf.extractall(tmp_path / "site")
    env, called = no_compiler
    env["PYTHONPATH"] = str(tmp_path / "site")
    code = """
import sys, torch
import shipln_ops as pkg
assert not [m for m in sys.modules if m.split(".")[0] == "workbench"], "imported"
assert pkg.specs["layer_norm"].cpp_autograd and pkg.specs["layer_norm"].backward is None
dump = torch._C._dispatch_dump("shipln::layer_norm")
assert "layer_norm.cpp" in next(l for l in dump.splitlines() if l.startswith("Autograd")), dump
x = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
w, b = (torch.randn(10, dtype=torch.float64, requires_grad=True) for _ in range(2))
f = lambda *a: torch.ops.shipln.layer_norm(*a, 1e-5)[0]
assert torch.autograd.gradcheck(f, (x, w, b)) and torch.autograd.gradgradcheck(f, (x, w, b))
with torch.no_grad():
    assert f(x, w, b).grad_fn is None
print("ok")
"""
    proc = _run([sys.executable, "-c", code], cwd=tmp_path, env=env)
    assert proc.stdout.split() == ["ok"]
    assert not called.exists(), f"a compiler ran: {called.read_text()}"


def test_another_torch_fails_at_import_saying_what_it_was_built_for(
    fresh_env: Path, shipped: Path, no_compiler: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, _ = no_compiler
    python = str(fresh_env / "bin" / "python")
    target = tmp_path / "site"
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(shipped)])
    record = target / PACKAGE / "_build.json"
    info = json.loads(record.read_text())
    info["torch"]["version"] = "2.4.1+cpu"
    record.write_text(json.dumps(info))
    env["PYTHONPATH"] = str(target)
    proc = subprocess.run(
        [python, "-c", f"import {PACKAGE}"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: shipme_ops was built for torch 2.4.1+cpu"), last
    assert f"this environment has torch {torch.__version__}" in last
    assert "install torch==2.4.1" in last


def test_a_library_that_uses_the_python_api_gets_this_interpreters_tag(tmp_path: Path) -> None:
    src = tmp_path / "py.c"
    src.write_text(
        "typedef struct _object PyObject;\nPyObject* PyLong_FromLong(long);\n"
        "PyObject* f(void) { return PyLong_FromLong(1); }\n"
    )
    lib = tmp_path / "libpy.so"
    _run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)])
    tag, used = wheel.tag_for([lib])
    cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert tag == f"{cp}-{cp}-{wheel.platform_tag()}" and used == ["PyLong_FromLong"]


def test_shipped_specs_import_the_packaged_spec_module(tmp_path: Path) -> None:
    spec = tmp_path / "spec.py"
    spec.write_text(
        "import os\nfrom workbench.spec import (\n    OpSpec,\n    randn,\n)\n"
        "import workbench.spec as S\nfrom workbench import spec\n\n"
        "def f():\n    from workbench.spec import Sample  # inside\n    return Sample\n"
    )
    assert package.shipped_spec(spec) == (
        "import os\nfrom .._spec import OpSpec, randn\n"
        "from .. import _spec as S\nfrom .. import _spec as spec\n\n"
        "def f():\n    from .._spec import Sample  # inside\n    return Sample\n"
    )
    spec.write_text("from workbench.verify import check\n")
    with pytest.raises(WorkbenchError, match=r"imports workbench\.verify\.check"):
        package.shipped_spec(spec)
    spec.write_text("from workbench import TuneSpace, tune\n")
    with pytest.raises(WorkbenchError, match=r"imports workbench\.tune;"):
        package.shipped_spec(spec)


def test_shipped_specs_take_tunespace_from_the_package(tmp_path: Path) -> None:
    spec = tmp_path / "spec.py"
    spec.write_text(
        "from typing import TYPE_CHECKING\n"
        "from workbench import TuneSpace as T, spec\n"
        "from workbench.tuning.space import TuneSpace\n"
        "if TYPE_CHECKING:\n    from workbench.project import Family\n"
    )
    assert package.shipped_spec(spec) == (
        "from typing import TYPE_CHECKING\n"
        "from .._tune import TuneSpace as T; from .. import _spec as spec\n"
        "from .._tune import TuneSpace\n"
        "if TYPE_CHECKING:\n    from workbench.project import Family\n"
    )


@pytest.mark.parametrize(
    "spec", sorted((ROOT / "kernels").glob("*/spec.py")), ids=lambda p: p.parent.name
)
def test_every_bundled_spec_ships(spec: Path) -> None:
    text = package.shipped_spec(spec)
    compile(text, str(spec), "exec")
    assert _workbench_imports(text) == []
