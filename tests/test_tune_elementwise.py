"""The elementwise launcher's tuning space (issue 17): kernels/scale and kernels/muladd declare
it, kernels/include/wb/elementwise_config.h reads each parameter as a WB_TUNE_<NAME> macro for
both launchers (elementwise.cuh, nvcc: muladd; elementwise_launch.h with a device-only TU: scale).

The declared default must be the header's own (#ifndef) default, read from the header's text so
that the two cannot drift; and a point must reach the kernels: its PTX (sm_90a, one compile
each, no GPU) shows its block size, vectors per thread and L1 policy, and the default point's
PTX is the plain build's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from workbench import specfile
from workbench.config import make_config
from workbench.project import BUNDLED_KERNELS, WB_KERNEL_INCLUDE, discover
from workbench.tuning.space import TuneSpace, Value, defines, label

HEADER = WB_KERNEL_INCLUDE / "wb" / "elementwise_config.h"
FAMILIES = ("scale", "muladd")
# The values of WB_TUNE_L1 (the header's kL1BySize, kL1Skip, kL1Keep).
BY_SIZE, SKIP, KEEP = 0, 1, 2


def _space(family: str) -> TuneSpace:
    project = discover(BUNDLED_KERNELS)
    module = specfile.load_module(family, "wbtune_ew", project.family(family).spec_path)
    assert module is not None
    assert isinstance(module.TUNE, TuneSpace)
    return module.TUNE


def _header_defaults() -> dict[str, Value]:
    """``#ifndef WB_TUNE_X`` / ``#define WB_TUNE_X value`` pairs of the launcher's header."""
    found = re.findall(
        r"^#ifndef WB_TUNE_(\w+)\n#define WB_TUNE_\1 (-?\d+)\b", HEADER.read_text(), re.M
    )
    return {name: int(value) for name, value in found}


def test_the_header_reads_three_parameters_with_the_launcher_as_measured() -> None:
    assert _header_defaults() == {"THREADS": 128, "VECS": 2, "L1": BY_SIZE}
    text = HEADER.read_text()
    for name, value in (("kL1BySize", BY_SIZE), ("kL1Skip", SKIP), ("kL1Keep", KEEP)):
        assert f"constexpr int {name} = {value};" in text


@pytest.mark.parametrize("family", FAMILIES)
def test_the_declared_default_is_the_headers(family: str) -> None:
    space = _space(family)
    assert space.default == _header_defaults()
    assert set(space.params) == set(_header_defaults())
    for point in space.points():  # within the header's static_asserts
        assert point["THREADS"] % 32 == 0 and 32 <= int(point["THREADS"]) <= 1024
        assert 1 <= int(point["VECS"]) <= 8
        assert point["L1"] in (BY_SIZE, SKIP, KEEP)


def test_both_families_tune_the_same_space() -> None:
    scale, muladd = (_space(f) for f in FAMILIES)
    assert scale.params == muladd.params
    assert scale.points() == muladd.points()
    assert scale.default == muladd.default
    assert 12 <= len(scale.points()) <= 18


def test_the_shapes_tried_by_hand_are_points() -> None:
    # bench/results/elementwise-variants.md and kernels.md: k<vecs>_t<threads>, and the two
    # fixed L1 policies (l1_always: never skip; no_l1_always: always skip) on the default shape.
    points = _space("scale").points()
    for vecs, threads in ((1, 128), (2, 128), (4, 128), (1, 256), (2, 256)):
        assert {"THREADS": threads, "VECS": vecs, "L1": BY_SIZE} in points
    for policy in (SKIP, KEEP):
        assert {"THREADS": 128, "VECS": 2, "L1": policy} in points


# --- a point reaches the kernels ----------------------------------------------------------


def _ptx(tmp_path: Path, point: dict[str, Value] | None) -> str:
    """muladd.cu's PTX for sm_90a, by the workbench's own compile command (``point``: its -D).

    (scale's kernel is a device-only TU: NVRTC gets the same -D options, test_device_modules.)
    """
    project = discover(BUNDLED_KERNELS)
    (src,) = [s for s in project.family("muladd").sources if s.kind == "cuda"]
    out = tmp_path / f"muladd-{label(point).replace(',', '-') if point else 'plain'}.ptx"
    config = make_config(archs=("sm_90a",), link=False)
    cmd = list(config.compile_command(project, src, out, defines(point) if point else ()))
    i = cmd.index("-MMD")
    del cmd[i : i + 3]  # -MMD -MF <depfile>
    cmd[cmd.index("-c")] = "--ptx"
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    return out.read_text()


def _kernels(ptx: str) -> dict[tuple[int, bool, str], str]:
    """Each elementwise kernel's PTX, by (N, NoL1, its whole mangled name)."""
    found = {}
    for entry in re.split(r"^\.visible \.entry ", ptx, flags=re.M)[1:]:
        name = entry.split("(", 1)[0]
        m = re.search(r"elementwise_kernelILi(\d+)ELb([01])E", name)
        assert m, name
        found[(int(m.group(1)), m.group(2) == "1", name)] = entry
    return found


def _check_point(ptx: str, threads: int, vecs: int, l1: int) -> None:
    kernels = _kernels(ptx)
    assert len(kernels) >= 4 * 2  # four dtypes, a scalar and at least one vector kernel each
    for (n, no_l1, name), body in kernels.items():
        assert re.findall(r"\.maxntid (\d+), 1, 1", body) == [str(threads)], name
        skipping = len(re.findall(r"ld\.global\.nc\.L1::no_allocate\.v\d", body))
        plain = len(re.findall(r"ld\.global\.nc\.v\d", body))
        if n == 1:  # the scalar path: element by element, L1 as it is
            assert not no_l1 and skipping == plain == 0, name
        else:  # VECS 16-byte loads of each input (muladd's ops take 2 or 3), L1 as it says
            loads, other = (skipping, plain) if no_l1 else (plain, skipping)
            assert other == 0 and loads in (2 * vecs, 3 * vecs), (name, skipping, plain)
    vector_kinds = {no_l1 for (n, no_l1, _) in kernels if n > 1}
    assert vector_kinds == {BY_SIZE: {True, False}, SKIP: {True}, KEEP: {False}}[l1]


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "point",
    [{"THREADS": 512, "VECS": 1, "L1": SKIP}, {"THREADS": 128, "VECS": 4, "L1": KEEP}],
    ids=["k1_t512-skip", "k4_t128-keep"],
)
def test_a_point_shows_in_the_ptx(tmp_path: Path, point: dict[str, int]) -> None:
    assert point in _space("muladd").points()
    _check_point(_ptx(tmp_path, point), point["THREADS"], point["VECS"], point["L1"])


@pytest.mark.nvcc
def test_the_default_point_builds_the_plain_kernel(tmp_path: Path) -> None:
    plain = _ptx(tmp_path, None)
    _check_point(plain, 128, 2, BY_SIZE)
    assert _ptx(tmp_path, _space("muladd").default) == plain
