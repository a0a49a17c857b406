"""Tuning spaces (issue 17, item 1): declaring a space, pruning it, and building its variants.

A variant is the family built with its point's -D options on the kernel TUs; each is its own
cached object and library, so switching back to one compiles nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.registry_fixture import write_registry
from workbench import build, project, runtime, specfile
from workbench.config import make_config
from workbench.tuning.space import TuneError, TuneSpace, defines, label, space_of, variant

# --- the space -----------------------------------------------------------------------------


def test_points_in_declaration_order_pruned_by_where() -> None:
    space = TuneSpace(
        {"BLOCK": [128, 256, 512], "VEC": [1, 4]}, where=lambda p: p["BLOCK"] * p["VEC"] <= 512
    )
    assert space.size == 6
    assert [label(p) for p in space.points()] == [
        "BLOCK=128,VEC=1",
        "BLOCK=128,VEC=4",
        "BLOCK=256,VEC=1",
        "BLOCK=512,VEC=1",
    ]
    assert space.default == {"BLOCK": 128, "VEC": 1}  # the first valid point


def test_defines_name_each_parameter_as_a_macro_in_a_fixed_order() -> None:
    assert defines({"VEC": 4, "BLOCK": 128, "LOAD": "ld_nc"}) == (
        "-DWB_TUNE_BLOCK=128",
        "-DWB_TUNE_LOAD=ld_nc",
        "-DWB_TUNE_VEC=4",
    )


@pytest.mark.parametrize(
    ("params", "kwargs", "message"),
    [
        ({}, {}, "at least one parameter"),
        ({"block": [1]}, {}, "name it in capitals"),
        ({"BLOCK": []}, {}, "has no values"),
        ({"BLOCK": 128}, {}, "give a list of values"),
        ({"BLOCK": [1, 1]}, {}, "lists a value twice"),
        ({"BLOCK": [1.5]}, {}, "neither an integer nor an identifier"),
        ({"BLOCK": ["a b"]}, {}, "neither an integer nor an identifier"),
        ({"FAST": [True, False]}, {}, "write 0 and 1"),
        ({"BLOCK": [1, 2]}, {"where": lambda p: False}, "no valid point"),
        ({"BLOCK": [1, 2]}, {"where": lambda p: p["TYPO"]}, "`where` failed on BLOCK=1"),
        ({"BLOCK": [1, 2]}, {"default": {"BLOCK": 3}}, "default point"),
        ({"BLOCK": [1, 2]}, {"where": lambda p: p["BLOCK"] > 1, "default": {"BLOCK": 1}}, "not a"),
    ],
)
def test_a_bad_space_is_a_clear_error(params: dict, kwargs: dict, message: str) -> None:
    with pytest.raises(TuneError, match=message):
        TuneSpace(params, **kwargs)


def test_space_of_reads_TUNE_and_rejects_anything_else() -> None:
    class Spec:
        TUNE = TuneSpace({"BLOCK": [1, 2]})

    assert space_of(Spec) is Spec.TUNE
    assert space_of(object()) is None

    class Wrong:
        TUNE = ("BLOCK", 1, 2)

    with pytest.raises(TuneError, match=r"must be a workbench\.TuneSpace"):
        space_of(Wrong)


# --- variants are built, cached and kept apart -----------------------------------------------

KERNEL = """\
// tiny.cpp: out = x + OFFSET + WB_TUNE_STEP (0 in the plain build)
#include "tiny/tiny.h"
#include "tiny_common.h"

#ifndef WB_TUNE_STEP
#define WB_TUNE_STEP 0
#endif

namespace tiny {
template <typename T>
void add_offset_cpu(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + T(OFFSET + WB_TUNE_STEP);
}
WB_INSTANTIATE(WB_FLOAT32_64, add_offset_cpu)
}  // namespace tiny
"""

SPEC = """\
from workbench import TuneSpace

TUNE = TuneSpace({"STEP": [2, 3, 5]}, where=lambda p: p["STEP"] != 3)
"""


def _call(built: build.Built, ns: str) -> torch.Tensor:
    """Open a variant's library, register it under its own namespace and call its op."""
    cdll, schemas, _ = runtime.open_library(built.library)
    keep = [runtime.define(ns, schema) for schema in schemas.values()]
    assert runtime.register_kernels(cdll, ns) is None
    try:
        return getattr(torch.ops, ns).add_offset(torch.zeros(3))
    finally:
        cdll.wb_unregister(ns.encode())
        for definition in keep:
            definition._destroy()


def test_each_variant_is_its_own_cached_build(tmp_path: Path, compiled: list[str]) -> None:
    kernels = write_registry(tmp_path)
    (kernels / "tiny" / "tiny.cpp").write_text(KERNEL)
    (kernels / "tiny" / "spec.py").write_text(SPEC)
    proj = project.discover(kernels, namespace="wbtune")
    family = proj.families[0]
    config = make_config(devices="cpu")
    module = specfile.load_module(family.name, "wbtune", family.spec_path)
    space = space_of(module)
    assert space is not None and [p["STEP"] for p in space.points()] == [2, 5]

    plain = build.ensure(proj, family, config)
    builds = {p["STEP"]: build.ensure(proj, variant(family, p), config) for p in space.points()}
    keys = {plain.key, *(b.key for b in builds.values())}
    assert len(keys) == 3  # three libraries, none overwriting another
    tag = os.getpid()
    assert torch.equal(_call(plain, f"wbtune_plain_{tag}"), torch.full((3,), 1.0))
    for step, built in builds.items():
        assert torch.equal(_call(built, f"wbtune_v{step}_{tag}"), torch.full((3,), 1.0 + step))

    # Only the kernel TU took the -D: the binding's object is shared by every variant.
    compiled.clear()
    again = build.ensure(proj, variant(family, {"STEP": 2}), config)
    assert again.key == builds[2].key and again.hit and compiled == []
    new = build.ensure(proj, variant(family, {"STEP": 7}), config)
    assert compiled == ["tiny/tiny.cpp"] and new.key not in keys


def test_defines_reach_kernel_tus_only(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path)
    proj = project.discover(kernels, namespace="wbtune")
    family = variant(proj.families[0], {"STEP": 2})
    config = make_config(devices="cpu")
    for src in family.sources:
        cmd = config.compile_command(proj, src, Path("out.o"), family.defines)
        assert ("-DWB_TUNE_STEP=2" in cmd) == (src.kind in ("cpu", "cuda")), (src.kind, cmd)
    assert family.build_name != proj.families[0].build_name  # its own lock and failure record


def test_the_router_gets_each_dtype_by_its_c10_name() -> None:
    """The router's tables name dtypes as c10 does (registry.cpp parses them with toString), so
    every dtype of this torch routes, float8 and the unsigned ones included."""
    from workbench.errors import LoadError
    from workbench.tuning.route import _c10_name

    names = {d: _c10_name(d) for d in ("float32", "bfloat16", "float16", "int64", "uint16")}
    assert names == {
        "float32": "Float",
        "bfloat16": "BFloat16",
        "float16": "Half",
        "int64": "Long",
        "uint16": "UInt16",
    }
    assert _c10_name("float8_e4m3fn") == "Float8_e4m3fn"
    with pytest.raises(LoadError, match="names dtype 'float99', which this torch does not have"):
        _c10_name("float99")
