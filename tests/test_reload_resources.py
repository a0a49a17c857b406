"""The resources a reload prints: a line per kernel it changed, a warning where one got worse.

Without a GPU, real builds of a registry's family stand in for a reload: two builds of its nvcc
TU (objects in the cache, ptxas's report in their compile log) and two compiles of its
device-only TU (NVRTC cubins), compared as a reload compares the live build with the new one.
On a GPU, a copy of bundled families is edited and reloaded, and the line is read from stderr.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.reliability_helpers import edit
from workbench import build, cubin, device, events, knobs, nvrtc, resources, scaffold
from workbench.config import make_config
from workbench.project import discover

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90a"
HEAVY = """template <typename A>
struct Apply {
  A alpha;
  __device__ A operator()(A x) const {
    A acc[48];
#pragma unroll
    for (int j = 0; j < 48; ++j) acc[j] = x * A(j + 1) + alpha;
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
      for (int j = 0; j < 48; ++j) acc[j] = acc[j] * acc[(j * 5 + r) % 48] + acc[(j * 7 + 1) % 48];
    A s = 0;
#pragma unroll
    for (int j = 0; j < 48; ++j) s += acc[j];
    return s;
  }
};"""
LIGHT = """template <typename A>
struct Apply {
  A alpha;
  __device__ A operator()(A x) const { return apply(x, alpha); }
};"""


def report(
    before: dict[str, resources.Snapshot], after: dict[str, resources.Snapshot]
) -> tuple[list[str], list[str]]:
    return resources.report(before, after, ARCH)


@pytest.mark.nvcc
def test_an_nvcc_kernel_edit_names_each_changed_kernel_and_a_comment_names_none(
    tmp_path: Path,
) -> None:
    kernels = scaffold.write_registry(tmp_path, 1, layout="nvcc")
    config = make_config(archs=(ARCH,), link=False)
    source = kernels / "op00" / "op00.cu"

    def built() -> build.Built:
        project = discover(kernels)
        return build.ensure(project, project.family("op00"), config)

    first = built()
    (tu,) = [t for t in first.manifest["tus"] if t["kind"] == "cuda"]
    assert "bytes spill stores" in build.compile_log(tu["key"])["output"]  # ptxas -v was kept
    assert "-Xptxas=-v" not in tu["command"]  # ... outside the TU's key

    source.write_text(source.read_text() + "// a comment: the same code\n")
    second = built()
    assert second.compiled == [source]  # compiled again ...
    lines, warnings = report(
        {"op00": resources.Snapshot(first, {})}, {"op00": resources.Snapshot(second, {})}
    )
    assert lines == [] and warnings == []  # ... to the same kernels: nothing to say

    edit(source, LIGHT, HEAVY)
    # A reload reads the kernels it may replace while it compiles, in a thread, and each new
    # object as the build stores it (before it links).
    (old_tu,) = [t for t in second.manifest["tus"] if t["kind"] == "cuda"]
    resources.forget()
    assert not resources.remembered(old_tu["key"], ARCH)
    reader = resources.Reader({"op00": resources.Snapshot(second, {})}, ARCH)
    third = built()
    (new_tu,) = [t for t in third.manifest["tus"] if t["kind"] == "cuda"]
    assert reader.close() > 0
    assert resources.remembered(old_tu["key"], ARCH) and resources.remembered(new_tu["key"], ARCH)
    assert reader.close() >= 0 and not events.stored_hooks  # closed twice: no error, no hook
    lines, warnings = report(
        {"op00": resources.Snapshot(second, {})}, {"op00": resources.Snapshot(third, {})}
    )
    # Every instantiation of the kernel (4 dtypes x 3 paths) runs the new functor.
    assert len(lines) == 12, lines
    assert all(line.startswith("op00: wb::") for line in lines), lines  # demangled
    assert len({line.split(" sm_90a: ")[0] for line in lines}) == 12  # one name each
    assert all(" sm_90a: " in line and " B spilled, " in line for line in lines)  # known


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")
def test_a_device_only_edit_warns_when_spills_appear_and_when_the_bound_falls(
    tmp_path: Path,
) -> None:
    kernels = scaffold.write_registry(tmp_path, 1)
    source = kernels / "op00" / "op00.kernel.cu"
    edit(source, LIGHT, HEAVY)
    config = make_config(archs=(ARCH,), link=False)
    names = [("op00.kernel.cu", "wb::op00_family::op00_kernel<1,false,float>")]
    stand_in = build.Built("op00", "k", None, {"tus": []})  # the library: unchanged here

    def modules() -> dict[str, tuple[str, ...]]:
        project = discover(kernels)
        (module,) = device.ensure(project, project.family("op00"), config, names)
        return {module.file: module.key}

    def compare(
        old: dict[str, tuple[str, ...]], new: dict[str, tuple[str, ...]]
    ) -> tuple[list[str], list[str]]:
        return report(
            {"op00": resources.Snapshot(stand_in, old)},
            {"op00": resources.Snapshot(stand_in, new)},
        )

    free = modules()
    bound = "__launch_bounds__(wb::detail::kThreads)"
    edit(source, bound, "__maxnreg__(24)")
    capped = modules()
    (line,), (warning,) = compare(free, capped)
    assert line.startswith("op00: wb::op00_family::op00_kernel<1,false,float> sm_90a: 24 regs")
    assert "op00_kernel<1,false,float> sm_90a spills" in warning

    edit(source, "__maxnreg__(24)", bound)
    assert modules() == free  # the cache's cubin of the first compile
    (line,), (warning,) = compare(capped, free)
    assert "0 B spilled" in line and "occupancy bound fell from 64 to" in warning


@pytest.mark.cuda
def test_a_reload_prints_the_resources_of_the_kernels_an_edit_changed(
    tmp_path: Path, cache_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import torch

    import workbench

    root = tmp_path / "copy"
    for family in ("scale", "layer_norm"):
        shutil.copytree(ROOT / "kernels" / family, root / "kernels" / family)
        (root / "bindings").mkdir(exist_ok=True)
        shutil.copy(ROOT / "bindings" / f"{family}.cpp", root / "bindings" / f"{family}.cpp")
    ns = f"wbres{id(tmp_path) % 10000}"
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="0"):
        lib = workbench.load(root / "kernels", namespace=ns)
        x = torch.randn(1000, device="cuda")
        torch.testing.assert_close(lib.scale(x, 2.0), 2 * x)  # its modules are loaded
        capfd.readouterr()
        edit(
            root / "kernels" / "scale" / "scale.kernel.cu",
            "return x * s;",
            "return (x + x) * (s * A(0.5));",
        )
        edit(
            root / "kernels" / "layer_norm" / "layer_norm.cu",
            "__shared__ A buf[32];",
            "__shared__ A buf[64];",
        )
        report = lib.reload()
    err = capfd.readouterr().err
    assert sorted(report.swapped) == ["layer_norm", "scale"]
    scale_lines = [line for line in err.splitlines() if line.startswith("wb: scale: wb::scale::")]
    assert scale_lines and all(" regs, " in line and " B spilled, " in line for line in scale_lines)
    norm_lines = [line for line in err.splitlines() if line.startswith("wb: layer_norm: ")]
    # The edit changes the shared buffer of the row kernels (the long-row kernel's too): each
    # kernel it changed has its line, and no kernel of another TU has one.
    assert any("layer_norm_regs_kernel" in line for line in norm_lines), err
    assert all("wb::layer_norm::layer_norm_" in line for line in norm_lines), err
    assert not any("backward" in line for line in norm_lines), err
    arch = resources.newest_arch(list(lib.config.archs))
    assert arch is not None and all(f" {arch}: " in line for line in scale_lines + norm_lines)
    print(f"resources: {report.resource_seconds * 1e3:.2f} ms", report.resource_parts)
    assert report.resource_seconds < 0.005, (report.resource_seconds, report.resource_parts)
    print(err)  # the lines, for the record of the run
    assert cubin.sm_of(arch) >= 70
