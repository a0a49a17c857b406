"""The wgmma matmul as a device-only TU, without a GPU: its names, its tile variants, its cubins.

Real nvcc (the launchers), the real host compiler and the real NVRTC run here; nothing is
launched (tests/test_matmul.py and `wb check matmul --device cuda` run it on a GPU).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench import build, device, lister, nvrtc
from workbench.config import make_config
from workbench.project import Family, discover
from workbench.tuning.space import TuneSpace, space_of, variant

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")
FILE = "matmul_wgmma.kernel.cu"
WGMMA_NAMES = sorted(
    [
        "&wb::matmul::wgmma_shape",
        "&wb::matmul::wgmma_split_shape",
        "&wb::matmul::wgmma_wide_split_shape",
        "&wb::matmul::wgmma_mid_shape",
        "&wb::matmul::wgmma_square_shape",
        "&wb::matmul::wgmma_square192_shape",
        "&wb::matmul::wgmma_square256_shape",
    ]
    + [  # the square tiles: two consumer warpgroups (128 x 128), three (192), four (256); a m-major
        f"wb::matmul::wgmma_square_kernel<wb::{t},{k},{c},{mm}>"
        for t in ("f16", "bf16")
        for k in ("true", "false")
        for c in (2, 3, 4)
        for mm in ("true", "false")
    ]
    + [
        f"wb::matmul::{kernel}<wb::{t},{k}>"
        for kernel in ("wgmma_split_kernel", "wgmma_mid_kernel")
        for t in ("f16", "bf16")
        for k in ("true", "false")
    ]
    + [  # b k-major, a m-major (the whole-k kernel reads a column-major a too)
        f"wb::matmul::wgmma_kernel<wb::{t},{k},{mm}>"
        for t in ("f16", "bf16")
        for k in ("true", "false")
        for mm in ("true", "false")
    ]
    + [
        f"wb::matmul::wgmma_cluster_split_kernel<wb::{t},{k},{wide}>"
        for t in ("f16", "bf16")
        for k in ("true", "false")
        for wide in ("true", "false")
    ]
    + [  # a batch in one launch: three tiles, b k-major or not, a m-major or not, k whole or
        # (the 128 x 256 and 128 x 128 tiles) in slices summed in clusters
        f"wb::matmul::wgmma_batched_kernel<wb::{t},{tile},{k},{mm},{sliced}>"
        for t in ("f16", "bf16")
        for tile in ("128,256", "192,128", "128,128")
        for k in ("true", "false")
        for mm in ("true", "false")
        for sliced in (("true", "false") if tile != "192,128" else ("false",))
    ]
)
# The narrow route's device-only TU, a module of its own: an edit of either TU compiles its own
# names alone.
NARROW_FILE = "matmul_wgmma_narrow.kernel.cu"
NARROW_NAMES = sorted(
    [f"&wb::matmul::wgmma_narrow{bn}_shape" for bn in (32, 64)]
    + [f"&wb::matmul::wgmma_narrow_tall{bn}_shape" for bn in (32, 64)]
    + [f"&wb::matmul::wgmma_narrow_split{bn}_shape" for bn in (64, 128)]
    + [
        f"wb::matmul::wgmma_narrow_kernel<wb::{t},{k},{bn},{kind}>"
        for t in ("f16", "bf16")
        for k in ("true", "false")
        for bn in (32, 64)
        for kind in (4, 12)  # NarrowKind: the 64-row tile, the 128-row tile (kNarrowTall)
    ]
    + [  # the 256-row tile with k in slices (kNarrowTall | kNarrowSplit)
        f"wb::matmul::wgmma_narrow_kernel<wb::{t},{k},{bn},24>"
        for t in ("f16", "bf16")
        for k in ("true", "false")
        for bn in (64, 128)
    ]
)
# The GEMV route's device-only TU (an a of 1 to 8 rows), a module of its own.
GEMV_FILE = "matmul_gemv.kernel.cu"
GEMV_NAMES = sorted(
    [
        f"wb::matmul::gemv_kernel<wb::{t},{m},{k}>"
        for t in ("f16", "bf16")
        for m in (1, 2, 4, 8)
        for k in ("true", "false")
    ]
    + [f"wb::matmul::gemv_sum_kernel<wb::{t}>" for t in ("f16", "bf16")]
    + [f"wb::matmul::gemv_row_kernel<wb::{t}>" for t in ("f16", "bf16")]
    + [
        f"wb::matmul::gemv_unaligned_kernel<wb::{t},{m}>"
        for t in ("f16", "bf16")
        for m in (1, 4, 8)
    ]
)
# A point of the space other than the default (kernels/matmul/spec.py): 64 x 128 tiles.
POINT = {"BN": 128, "CONSUMERS": 1, "STAGES": 4, "BLOCKS": 1}


@needs_nvrtc
@pytest.mark.nvcc
def test_a_tile_variant_compiles_only_the_device_only_tu_and_is_a_build_of_its_own() -> None:
    project = discover()
    plain_family = project.family("matmul")
    config = make_config(archs=("sm_90a",), link=False)
    plain = build.ensure(project, plain_family, config)
    # The launcher names its kernels and tile variables, read from its compiled object.
    kernels = lister.listed_kernels(project, plain_family, config, plain)
    assert sorted(e for f, e in kernels if f == FILE) == WGMMA_NAMES
    assert sorted(e for f, e in kernels if f == NARROW_FILE) == NARROW_NAMES
    assert sorted(e for f, e in kernels if f == GEMV_FILE) == GEMV_NAMES

    tile = variant(plain_family, POINT)
    assert device.device_defines(project, tile, config) == tile.defines
    assert device.device_defines(project, plain_family, config) == ()
    built = build.ensure(project, tile, config)
    assert built.compiled == []  # every host object is the plain build's
    assert built.key != plain.key  # ... but its modules differ: a build of its own

    plain_modules = {m.file: m for m in device.ensure(project, plain_family, config, kernels)}
    tile_modules = {m.file: m for m in device.ensure(project, tile, config, kernels)}
    assert set(plain_modules) == set(tile_modules) == {FILE, NARROW_FILE, GEMV_FILE}  # a TU each
    for file, names in ((FILE, WGMMA_NAMES), (NARROW_FILE, NARROW_NAMES), (GEMV_FILE, GEMV_NAMES)):
        assert {n for i in plain_modules[file].images for n in i.lowered} == set(names)
    plain_module, tile_module = plain_modules[FILE], tile_modules[FILE]
    assert plain_module.key != tile_module.key
    lowered = {n: m for image in tile_module.images for n, m in image.lowered.items()}
    assert lowered["&wb::matmul::wgmma_shape"] == "_ZN2wb6matmul11wgmma_shapeE"
    # The point's options reached NVRTC (the next test shows them in the kernel itself).
    meta = [image.path.with_suffix(".json").read_text() for image in tile_module.images]
    assert any("-DWB_TUNE_BN=128" in m for m in meta)


def test_the_whole_k_and_narrow_kernels_are_device_only_tus_that_include_neither_other() -> None:
    """An edit of one kernel's source compiles that TU's names alone (a module's key reads the
    TU and the headers it includes): the two share only wgmma_module.cuh and what it includes."""
    project = discover()
    folder = project.family("matmul").dir
    wgmma = {Path(h).name for h in device.includes(folder / FILE, project.include_dirs)}
    narrow = {Path(h).name for h in device.includes(folder / NARROW_FILE, project.include_dirs)}
    assert "wgmma_module.cuh" in wgmma & narrow
    assert "wgmma_narrow.cuh" in narrow and "wgmma_narrow.cuh" not in wgmma
    assert FILE not in narrow and NARROW_FILE not in wgmma


@needs_nvrtc
def test_the_tile_is_a_constant_of_the_module_and_each_point_its_own_cubin() -> None:
    """NVRTC compiles the wgmma kernels of two points: ptxas reports each tile's launch bounds
    through its register budget, and the shape variable is in both."""
    project = discover()
    source = project.family("matmul").dir / FILE
    options = [*device.NVRTC_FLAGS, "--ptxas-options=-v"]
    options += [f"-I{d}" for d in project.include_dirs]
    regs = {}
    # the split-k, 64 x 128 (mid) and batch tiles are not tuned
    tuned = [n for n in WGMMA_NAMES if not any(s in n for s in ("split", "mid", "batched"))]
    for label, defines in (("plain", []), ("one consumer", ["-DWB_TUNE_CONSUMERS=1"])):
        result = nvrtc.compile(source, "sm_90a", tuned, options + defines)
        assert set(result.lowered) == set(tuned)
        regs[label] = sorted(set(re.findall(r"Used (\d+) registers", result.log)))
    # 65536 registers / 384 threads -> 168 a thread; with 256 threads the cap is 255.
    assert "168" in regs["plain"] and "255" not in regs["plain"]
    assert "255" in regs["one consumer"]


@needs_nvrtc
@pytest.mark.nvcc
def test_tile_variants_compile_their_modules_in_one_shared_pool() -> None:
    """wb tune's build phase: a variant whose options reach only device-only TUs keeps the plain
    build's host objects (its modules can compile before its host bookkeeping is done), and the
    NVRTC programs of several variants run in one pool of the caller's."""
    from concurrent.futures import ThreadPoolExecutor

    project = discover()
    config = make_config(archs=("sm_90a",), link=False)
    matmul, scale = project.family("matmul"), project.family("scale")
    for fam in (matmul, scale):
        build.ensure(project, fam, config)  # the plain builds: their TUs' header lists
    points = [{**POINT, "STAGES": 3}, {**POINT, "STAGES": 5}]
    assert all(build.shares_host_objects(project, variant(matmul, p), config) for p in points)
    # scale's space tunes its launcher (threads, vectors): a variant's host TU changes too.
    scale_point = next(p for p in _space(scale).points() if p != _space(scale).default)
    assert not build.shares_host_objects(project, variant(scale, scale_point), config)

    class Counting(ThreadPoolExecutor):
        submitted = 0

        def submit(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
            Counting.submitted += 1
            return super().submit(*args, **kwargs)

    names = [(FILE, n) for n in WGMMA_NAMES if "bf16" in n or n.startswith("&")]
    with Counting(max_workers=2) as pool:
        found = [
            device.ensure(project, variant(matmul, p), config, names, pool=pool) for p in points
        ]
    compiled = sum(1 for (module,) in found for image in module.images if image.seconds)
    assert compiled > 0 and Counting.submitted == compiled  # every program ran in the pool
    for (module,) in found:
        assert {n for image in module.images for n in image.lowered} == {n for _, n in names}


def _space(family: Family) -> TuneSpace:
    import importlib.util

    loaded = importlib.util.spec_from_file_location(f"{family.name}_spec_t", family.spec_path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    space = space_of(module)
    assert space is not None
    return space
