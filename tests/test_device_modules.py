"""Device-only TUs without a GPU: discovery, NVRTC cubins per arch, keys, errors, kernel names.

The real NVRTC (the nvidia-cuda-nvrtc wheel) and the real host compiler run here; nothing is
launched. The launch path itself is tested on a GPU (tests/test_device_cuda.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workbench import build, device, lister, nvrtc, scaffold
from workbench.config import make_config
from workbench.errors import BuildError
from workbench.project import BUNDLED_KERNELS, discover

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")
ARCHS = ("sm_80", "sm_90a")
ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190


def scale_names() -> list[tuple[str, str]]:
    """The instantiations scale.cu's launcher names: 4 dtypes x (scalar, 2 vector kernels)."""
    vec = {"float": 4, "double": 2, "wb::f16": 8, "wb::bf16": 8}
    out = []
    for t, n in vec.items():
        out.append(("scale.kernel.cu", f"wb::scale::scale_kernel<1,false,{t}>"))
        for no_l1 in ("true", "false"):
            out.append(("scale.kernel.cu", f"wb::scale::scale_kernel<{n},{no_l1},{t}>"))
    return out


def cubin_machine(data: bytes) -> int:
    return int.from_bytes(data[18:20], "little")  # ELF e_machine


def test_a_kernel_cu_file_is_a_device_only_tu_outside_the_library() -> None:
    family = discover().family("scale")
    kinds = {s.path.name: s.kind for s in family.sources}
    assert kinds["scale.kernel.cu"] == "device" and kinds["scale.cu"] == "cuda"
    config = make_config(archs=ARCHS, link=False)
    names = [s.path.name for s in build.family_sources(family, config)]
    assert "scale.kernel.cu" not in names and "scale.cu" in names


def test_wb_new_writes_the_device_only_layout_unless_asked_for_nvcc() -> None:
    files = scaffold.family_files("fam")
    assert "kernels/fam/fam.kernel.cu" in files
    assert '"fam.kernel.cu", "wb::fam_family::fam_kernel"' in files["kernels/fam/fam.cu"]
    assert "__global__" not in files["kernels/fam/fam.cu"]  # the launcher: host code only
    nvcc = scaffold.family_files("fam", layout="nvcc")
    assert "kernels/fam/fam.kernel.cu" not in nvcc
    assert '#include "wb/elementwise.cuh"' in nvcc["kernels/fam/fam.cu"]  # kernel and launcher
    with pytest.raises(ValueError, match="layout"):
        scaffold.family_files("fam", layout="ptx")


def test_the_include_scan_follows_headers_through_the_include_path() -> None:
    project = discover()
    found = device.includes(BUNDLED_KERNELS / "scale" / "scale.kernel.cu", project.include_dirs)
    names = {Path(p).name for p in found}
    assert {"elementwise_device.cuh", "device.cuh", "elementwise_config.h", "types.h"} <= names
    assert "cuda_runtime.h" not in names  # a device-only TU includes no CUDA runtime header


@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_nvrtc_compiles_the_named_instantiations_to_a_cubin(arch: str) -> None:
    project = discover()
    names = [e for _, e in scale_names()]
    options = ["-std=c++17", "-default-device", *(f"-I{d}" for d in project.include_dirs)]
    result = nvrtc.compile(BUNDLED_KERNELS / "scale" / "scale.kernel.cu", arch, names, options)
    assert result.cubin.startswith(ELF_MAGIC) and cubin_machine(result.cubin) == EM_CUDA
    assert set(result.lowered) == set(names)
    for name, mangled in result.lowered.items():
        assert mangled.startswith("_ZN2wb5scale12scale_kernel"), (name, mangled)
        assert mangled.encode() in result.cubin  # the symbol the library looks up
    assert len(set(result.lowered.values())) == len(names)


@needs_nvrtc
def test_an_nvrtc_error_names_the_file_and_line_as_nvcc_does(tmp_path: Path) -> None:
    source = tmp_path / "bad.kernel.cu"
    source.write_text("__global__ void k(float* x) {\n  x[0] = not_declared;\n}\n")
    with pytest.raises(BuildError) as info:
        nvrtc.compile(source, "sm_80", [], ["-std=c++17"])
    assert f"{source}:2: error" in str(info.value) and "not_declared" in str(info.value)


@needs_nvrtc
def test_a_name_the_tu_does_not_define_is_a_build_error_that_lists_the_names(
    tmp_path: Path,
) -> None:
    project = scaffold.write_registry(tmp_path, 1)
    family = discover(project).family("op00")
    config = make_config(archs=("sm_80",), link=False)
    bad = [("op00.kernel.cu", "wb::op00_family::no_such_kernel<1,false,float>")]
    with pytest.raises(BuildError, match="no_such_kernel"):
        device.ensure(discover(project), family, config, bad)
    with pytest.raises(BuildError, match=r"not a device-only TU of the family"):
        device.ensure(discover(project), family, config, [("op00.cu", "x")])


@needs_nvrtc
def test_cubins_are_cached_by_content_and_a_header_edit_compiles_again(
    tmp_path: Path, compiled: list[str]
) -> None:
    kernels = scaffold.write_registry(tmp_path, 1)
    project = discover(kernels)
    family = project.family("op00")
    config = make_config(archs=ARCHS, link=False)
    names = [("op00.kernel.cu", "wb::op00_family::op00_kernel<4,true,float>")]
    first = device.ensure(project, family, config, names)
    assert compiled == ["op00/op00.kernel.cu"]  # once, for both archs
    (module,) = first
    assert [i.arch for i in module.images] == list(ARCHS)  # one name: one program per arch
    assert all(i.path.read_bytes().startswith(ELF_MAGIC) for i in module.images)
    compiled.clear()
    again = device.ensure(project, family, config, names)
    assert compiled == [] and again[0].key == module.key
    math = kernels / "op00" / "op00_math.h"  # included by the kernel, not the launcher
    math.write_text(math.read_text().replace("kShift = 0.0", "kShift = 2.0"))
    edited = device.ensure(project, family, config, names)
    assert compiled == ["op00/op00.kernel.cu"] and edited[0].key != module.key
    more = [*names, ("op00.kernel.cu", "wb::op00_family::op00_kernel<1,false,float>")]
    assert device.ensure(project, family, config, more)[0].key != edited[0].key


@needs_nvrtc
@pytest.mark.nvcc
def test_smoke_lists_the_launchers_kernels_without_torch_cuda_or_a_gpu(tmp_path: Path) -> None:
    kernels = tmp_path / "kernels"
    shutil.copytree(BUNDLED_KERNELS / "scale", kernels / "scale")
    (tmp_path / "bindings").mkdir()
    shutil.copy(BUNDLED_KERNELS.parent / "bindings" / "scale.cpp", tmp_path / "bindings")
    project = discover(kernels)
    family = project.family("scale")
    config = make_config(archs=("sm_90a",), link=False)
    built = build.ensure(project, family, config)
    listed = lister.listed_kernels(project, family, config, built)
    assert sorted(listed) == sorted(scale_names())
    kept = list((Path(build.cache.root()) / "lister").glob("*.json"))
    assert any(json.loads(p.read_text()) == [list(x) for x in listed] for p in kept)


def test_a_tuning_variant_s_options_reach_the_device_only_tu() -> None:
    project = discover()
    plain = project.family("scale")
    variant = plain._replace(defines=("-DWB_TUNE_THREADS=256", "-DWB_TUNE_VECS=1"))
    config = make_config(archs=("sm_90a",), link=False)
    source = BUNDLED_KERNELS / "scale" / "scale.kernel.cu"
    headers = device.includes(source, project.include_dirs)
    options = device._options(project, variant, config, headers, source)
    assert "-DWB_TUNE_THREADS=256" in options and "-DWB_TUNE_VECS=1" in options
    assert not any(
        o.startswith("-DWB_TUNE_") for o in device._options(project, plain, config, headers, source)
    )


def test_wb_why_says_how_each_tu_builds() -> None:
    from workbench.cli.why import build_paths

    family = discover().family("scale")
    paths = {
        Path(p["source"]).name: p for p in build_paths(family, make_config(archs=ARCHS, link=False))
    }
    assert paths["scale.kernel.cu"]["path"].startswith("NVRTC")
    assert "module swap" in paths["scale.kernel.cu"]["why"]
    assert paths["scale.cu"]["path"].startswith("nvcc")
    assert "dlopen" in paths["scale.cu"]["why"]
    muladd = {
        Path(p["source"]).name: p
        for p in build_paths(discover().family("muladd"), make_config(archs=ARCHS, link=False))
    }
    assert "NAME.kernel.cu" in muladd["muladd.cu"]["why"]  # kernels that could move out


def test_the_names_split_into_the_same_chunks_on_every_machine() -> None:
    names = [f"k<{i}>" for i in range(12)]
    parts = device.chunks(names)
    assert len(parts) <= device.MAX_PROGRAMS and [n for p in parts for n in p] == names
    assert parts == device.chunks(list(names)) and len({len(p) for p in parts}) == 1
    assert device.chunks(["one"]) == [["one"]] and device.chunks([]) == []


@needs_nvrtc
def test_chunks_compile_side_by_side_into_one_module_per_arch(tmp_path: Path) -> None:
    kernels = scaffold.write_registry(tmp_path, 1)
    project = discover(kernels)
    family = project.family("op00")
    config = make_config(archs=ARCHS, link=False)
    names = [
        ("op00.kernel.cu", f"wb::op00_family::op00_kernel<{n},{b},{t}>")
        for t, n in (("float", 4), ("double", 2))
        for b in ("true", "false")
    ]
    (module,) = device.ensure(project, family, config, names)
    per_arch = len(device.chunks(sorted(e for _, e in names)))
    assert per_arch > 1 and len(module.images) == per_arch * len(ARCHS)
    for arch in ARCHS:  # every name in exactly one cubin of each arch
        lowered = [n for i in module.images if i.arch == arch for n in i.lowered]
        assert sorted(lowered) == sorted(e for _, e in names)
