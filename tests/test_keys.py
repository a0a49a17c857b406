"""Build identity and generated build files: no compiler runs in this file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import knobs, toolchain
from workbench.build import TU, headers_from_depfile
from workbench.config import Config
from workbench.errors import WorkbenchError
from workbench.ninja import Job, ninja_text
from workbench.project import Source, discover

TORCH = toolchain.Torch("2.13.0", "abc", None, True, (Path("/t/include"),), Path("/t/lib"))


def make_config(**changes: object) -> Config:
    base: dict[str, object] = dict(
        cxx=Path("/usr/bin/g++"), cxx_version="g++ 12.2.0", torch=TORCH, python_tag="cp311", env={}
    )
    base.update(changes)
    return Config(**base)  # type: ignore[arg-type]


def test_same_inputs_give_the_same_config_key() -> None:
    assert make_config().id == make_config().id


@pytest.mark.parametrize(
    "change",
    [
        {"cxx_version": "g++ 13.1.0"},
        {"env": {"TORCH_CUDA_ARCH_LIST": "9.0a"}},
        {"env": {"NVCC_APPEND_FLAGS": "-G"}},
        {"torch": toolchain.Torch("2.12.0", "abc", None, True, (), Path("/t/lib"))},
        {"torch": toolchain.Torch("2.13.0", "abc", None, False, (), Path("/t/lib"))},
        {"python_tag": "cp312"},
        {"archs": ("sm_90a",), "cuda_home": Path("/cuda"), "nvcc_version": "13.0"},
    ],
)
def test_toolchain_changes_change_the_config_key(change: dict[str, object]) -> None:
    assert make_config(**change).id != make_config().id


def test_the_precompiled_header_is_shared_by_configs_that_differ_only_in_cuda() -> None:
    """A host TU never sees the CUDA archs or nvcc: ``wb smoke`` and a build for the GPU present
    read one precompiled torch header, which the host toolchain and torch still key."""
    cuda: dict[str, object] = dict(cuda_home=Path("/cuda"), nvcc_version="13.0")
    smoke = make_config(archs=("sm_80", "sm_90a"), **cuda)
    build = make_config(archs=("sm_90a",), **cuda)
    older = make_config(archs=("sm_90a",), cuda_home=Path("/cuda"), nvcc_version="12.8")
    assert len({smoke.id, build.id, older.id, make_config().id}) == 4
    assert smoke.pch_dir == build.pch_dir == older.pch_dir == make_config().pch_dir
    for change in (
        {"cxx_version": "g++ 13.1.0"},
        {"torch": toolchain.Torch("2.12.0", "abc", None, True, (), Path("/t/lib"))},
        {"torch": toolchain.Torch("2.13.0", "abc", None, False, (), Path("/t/lib"))},
        {"python_tag": "cp312"},
        {"env": {"CXXFLAGS": "-O0"}},
    ):
        assert make_config(**change).pch_dir != make_config().pch_dir, change


def test_compiler_env_knobs_reach_the_key() -> None:
    unset: dict[str, str | None] = dict.fromkeys(knobs.COMPILER_ENV)
    with knobs.override(**{**unset, "CXX": "clang++"}):
        env = knobs.compiler_env()
    assert env == {"CXX": "clang++"}


def _tu(tmp_path: Path, headers: list[str], command: tuple[str, ...] = ("c++", "-O3")) -> TU:
    return TU(Source(tmp_path / "k.cpp", "cpu"), command, headers)


def test_tu_key_follows_source_and_header_content(tmp_path: Path) -> None:
    (tmp_path / "k.cpp").write_text('#include "k.h"\n')
    (tmp_path / "k.h").write_text("int f();\n")
    header = str(tmp_path / "k.h")
    config = make_config()
    first = _tu(tmp_path, [header]).compute_key(config)
    assert _tu(tmp_path, [header]).compute_key(config) == first
    (tmp_path / "k.h").write_text("int f(); // edited\n")
    edited_header = _tu(tmp_path, [header]).compute_key(config)
    assert edited_header != first
    (tmp_path / "k.cpp").write_text('#include "k.h"\nint g();\n')
    assert _tu(tmp_path, [header]).compute_key(config) != edited_header


def test_tu_key_follows_flags_and_toolchain(tmp_path: Path) -> None:
    (tmp_path / "k.cpp").write_text("int x;\n")
    config = make_config()
    key = _tu(tmp_path, []).compute_key(config)
    assert _tu(tmp_path, [], ("c++", "-O2")).compute_key(config) != key
    assert _tu(tmp_path, []).compute_key(make_config(cxx_version="g++ 14")) != key


def test_a_deleted_header_changes_the_key(tmp_path: Path) -> None:
    (tmp_path / "k.cpp").write_text("int x;\n")
    (tmp_path / "k.h").write_text("int f();\n")
    key = _tu(tmp_path, [str(tmp_path / "k.h")]).compute_key(make_config())
    (tmp_path / "k.h").unlink()
    assert _tu(tmp_path, [str(tmp_path / "k.h")]).compute_key(make_config()) != key


def test_an_uncompiled_tu_has_no_key(tmp_path: Path) -> None:
    tu = TU(Source(tmp_path / "k.cpp", "cpu"), ("c++",), None)
    assert tu.compute_key(make_config()) is None


def test_depfile_keeps_project_headers_only(tmp_path: Path) -> None:
    dep = tmp_path / "x.o.d"
    src = tmp_path / "k.cu"
    dep.write_text(
        f"x.o: {src} \\\n  {tmp_path}/k.h /usr/include/stdio.h \\\n"
        f"  /t/include/ATen/Tensor.h {tmp_path}/k.h\n"
    )
    assert headers_from_depfile(dep, src, make_config()) == [f"{tmp_path}/k.h"]


def test_ninja_text_has_one_edge_per_tu_and_escapes_paths() -> None:
    jobs = [
        Job(Path("/b/0_k.o"), Path("/src dir/k.cpp"), ("c++", "-c", "/src dir/k.cpp")),
        Job(Path("/b/1_k.o"), Path("/other/k.cpp"), ("nvcc", "-DX=$Y")),
    ]
    text = ninja_text(jobs)
    assert text.count("build ") == 2
    assert "build /b/0_k.o: compile /src$ dir/k.cpp" in text
    assert "$$Y" in text  # a literal $ survives ninja's variable expansion


@pytest.mark.parametrize(
    ("text", "archs"),
    [
        ("8.0;9.0a", ("sm_80", "sm_90a")),
        ("sm_80,sm_90a", ("sm_80", "sm_90a")),
        ("9.0+PTX", ("sm_90", "compute_90")),
        ("8.6 8.6", ("sm_86",)),
    ],
)
def test_parse_arch_list(text: str, archs: tuple[str, ...]) -> None:
    assert toolchain.parse_arch_list(text) == archs


def test_parse_arch_list_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="bad CUDA arch 'ampere'"):
        toolchain.parse_arch_list("ampere")


def test_gencode_flags() -> None:
    assert toolchain.gencode_flags(("sm_90a", "compute_90")) == [
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def _registry(root: Path, pyproject: str = "") -> Path:
    (root / "kernels" / "op1").mkdir(parents=True)
    (root / "kernels" / "op1" / "op1.cpp").write_text("")
    (root / "bindings").mkdir()
    (root / "bindings" / "op1.cpp").write_text("")
    if pyproject:
        (root / "pyproject.toml").write_text(pyproject)
    return root / "kernels"


def test_discover_finds_families_and_namespace(tmp_path: Path) -> None:
    kernels = _registry(tmp_path, '[tool.workbench]\nnamespace = "mine"\n')
    with knobs.override(WB_NAMESPACE=None):
        project = discover(kernels)
    assert project.namespace == "mine"
    assert [f.name for f in project.families] == ["op1"]
    assert [s.kind for s in project.families[0].sources] == ["cpu", "binding"]
    with knobs.override(WB_NAMESPACE="over"):
        assert discover(kernels).namespace == "over"


def test_discover_names_a_missing_binding(tmp_path: Path) -> None:
    kernels = _registry(tmp_path)
    (tmp_path / "bindings" / "op1.cpp").unlink()
    with pytest.raises(WorkbenchError, match=r"no binding .*bindings/op1\.cpp"):
        discover(kernels)


def test_discover_rejects_a_bad_namespace(tmp_path: Path) -> None:
    with pytest.raises(WorkbenchError, match="not a valid identifier"):
        discover(_registry(tmp_path), namespace="my-ops")


# What ``import workbench`` did, seen by an audit hook installed before it (CPython's own
# events: a process started, a folder made, a file opened for writing, a shared library loaded).
IMPORT_AND_AUDIT = """
import json, os, sys
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
SPAWN = ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.spawn", "os.system")
seen = []
def hook(event, args):
    if event in SPAWN or event in ("os.mkdir", "ctypes.dlopen"):
        seen.append([event, str(args[0])])
    elif event == "open" and isinstance(args[2], int) and args[2] & WRITE:
        seen.append([event, str(args[0])])
sys.addaudithook(hook)
import workbench
version = workbench.__version__
heavy = [m for m in ("torch", "subprocess") if m in sys.modules]
print(json.dumps({"events": seen, "heavy": heavy, "version": version}))
"""


def test_import_does_no_heavy_work(tmp_path: Path) -> None:
    """STYLE 9: ``import workbench`` probes no compiler, initialises no CUDA, makes no folder."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "WB_CACHE_DIR": str(tmp_path / "cache"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",  # the interpreter's own __pycache__ folders stay out
    }
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_AND_AUDIT],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["events"] == []  # nothing started, made, written or dlopened
    assert report["heavy"] == []  # no torch (so no CUDA), nothing that runs a compiler
    assert report["version"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    assert list(home.iterdir()) == []


def test_a_present_sm90_gpu_is_built_with_its_arch_specific_features() -> None:
    """wgmma needs sm_90a, which runs on exactly the sm_90 GPU that is present."""
    assert toolchain.gpu_arch((9, 0)) == "sm_90a"
    assert toolchain.gpu_arch((8, 0)) == "sm_80"
    assert toolchain.gpu_arch((10, 0)) == "sm_100"


def test_nvcc_splits_its_optimisation_and_keeps_cubins_plain_where_it_can() -> None:
    from workbench.config import CUDA_FLAGS, NO_COMPRESS, SPLIT_COMPILE, cuda_flags

    both = CUDA_FLAGS + SPLIT_COMPILE + NO_COMPRESS
    assert cuda_flags("Build cuda_13.0.r13.0/compiler.36424714_0") == both
    assert cuda_flags("Build cuda_12.8.r12.8/compiler.35404655_0") == both
    assert cuda_flags("Build cuda_12.6.r12.6/compiler.34714021_0") == CUDA_FLAGS + SPLIT_COMPILE
    assert cuda_flags("Build cuda_12.1.r12.1/compiler.32415258_0") == CUDA_FLAGS + SPLIT_COMPILE
    assert cuda_flags("Build cuda_11.8.r11.8/compiler.31833905_0") == CUDA_FLAGS
    assert cuda_flags(None) == CUDA_FLAGS
