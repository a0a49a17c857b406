"""``wb tune`` on a GPU: the bundled elementwise family's declared launcher space (scale), tuned
on CUDA, routes in C++ by the device's name, and the routed op works under CUDA graphs and
torch.compile, in this process and in a new one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import workbench
from workbench import knobs, loader
from workbench.benchmark.run import sweep
from workbench.tuning import route, store

pytestmark = pytest.mark.cuda
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tuned(
    lib: workbench.Library, cache_dir: Path
) -> Iterator[tuple[workbench.Library, object, list[int]]]:
    spec = lib.specs["scale"]
    samples = sweep(spec, torch.float32, torch.device("cuda"), 0)
    picked = [samples[0], samples[-1]]
    # A module fixture runs before the per-test cache override: the session cache, named here.
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        result = workbench.tune(
            "scale", lib=lib, device="cuda", sizes=[s.label for s in picked], rounds=1
        )
    numels = [s.args[0].numel() for s in picked]
    yield lib, result, numels
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        store.forget("scale", lib.families["scale"].key)  # other tests get the plain build
        lib.route("scale")


def test_every_variant_builds_passes_and_is_timed(tuned: tuple) -> None:
    _, result, _ = tuned
    assert result.variants and all(v.status == "checked" for v in result.variants), str(result)
    assert len(result.sizes) == 2 and result.winners
    assert all(set(s.variants) == {v.label for v in result.variants} for s in result.sizes)


def test_routed_op_is_right_eager_in_graphs_and_compiled(tuned: tuple) -> None:
    lib, _, numels = tuned
    assert loader.live_handles(lib.namespace)["scale"].routes is not None
    for n in numels:
        for dtype in (torch.float32, torch.bfloat16):  # bfloat16: no table, the plain build
            x = torch.randn(n, device="cuda", dtype=dtype)
            torch.testing.assert_close(lib.scale(x, 0.5), x * 0.5, rtol=0, atol=0)
    x = torch.randn(numels[-1], device="cuda")
    static = torch.empty_like(x)
    lib.scale(x, 0.5)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.copy_(lib.scale(x, 0.5))
    x.normal_()
    graph.replay()
    torch.testing.assert_close(static, x * 0.5, rtol=0, atol=0)
    op = getattr(torch.ops, lib.namespace).scale
    compiled = torch.compile(lambda t: op(t, 0.25) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x), x * 0.25 + 1)


def test_a_new_process_routes_each_bucket_by_the_device_name(tuned: tuple, cache_dir: Path) -> None:
    lib, result, numels = tuned
    code = (
        "import torch, workbench\n"
        "lib = workbench.load()\n"
        "assert lib.last.tuned == ['scale'], lib.last.tuned\n"
        f"for n in {numels}:\n"
        "    lib.scale(torch.randn(n, device='cuda'), 0.5)\n"
        "torch.cuda.synchronize()\n"
    )
    env = dict(os.environ, WB_CACHE_DIR=str(cache_dir), WB_QUIET="1", WB_ROUTE_TRACE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    served = re.findall(r"wb route: \S+::scale numel=(\d+) Float -> (\S+)::scale", out.stderr)
    record = store.lookup("scale", lib.families["scale"].key)
    assert record is not None
    want = []
    for n in numels:
        bucket = sum(1 for b in result.bounds if n >= b)
        label = result.winners[bucket]
        key = record["variants"][label]["key"]
        want.append((str(n), route.private_namespace(lib.namespace, "scale", key)))
    assert served == want, out.stderr


@pytest.fixture(scope="module")
def tuned_matmul(
    lib: workbench.Library, cache_dir: Path
) -> Iterator[tuple[workbench.Library, object]]:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the matmul's tile space is the wgmma path's: an sm_90 GPU")
    spec = lib.specs["matmul"]
    size = min(
        sweep(spec, torch.bfloat16, torch.device("cuda"), 0), key=lambda s: s.args[0].numel()
    )
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        result = workbench.tune(
            "matmul", lib=lib, device="cuda", dtype="bfloat16", sizes=[size.label], rounds=1
        )
    yield lib, result
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        store.forget("matmul", lib.families["matmul"].key)
        lib.route("matmul")


def test_a_matmul_tune_compiles_the_tuned_dtypes_kernels_and_completes_its_winners(
    tuned_matmul: tuple,
) -> None:
    lib, result = tuned_matmul
    assert "trace" in result.phases, result.phases
    checked = [v for v in result.variants if v.status == "checked"]
    assert len(checked) == len(result.variants), str(result)
    plain = lib.families["matmul"].library
    record = store.lookup("matmul", lib.families["matmul"].key)
    assert record is not None
    winners = {
        record["variants"][w]["key"]
        for t in record["ops"]["matmul"]
        for w in t["winners"]
        if w in record["variants"]
    }
    a = torch.randn(64, 96, device="cuda", dtype=torch.float16)
    b = torch.randn(96, 80, device="cuda", dtype=torch.float16)
    variants = 0
    for pns, handle in route._variants.items():
        if handle.built.family != "matmul" or handle.built.library == plain:
            continue
        variants += 1
        op = getattr(torch.ops, pns).matmul
        # bfloat16, b row-major and column-major: what the tune checked, in every variant. A
        # tuned module runs its tile on these small shapes where the plain build, whose launches
        # chose the variant's kernels, took other routes: a kernel it lacked compiled at launch.
        x = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)
        for y in (torch.randn(96, 80, device="cuda", dtype=torch.bfloat16),
                  torch.randn(80, 96, device="cuda", dtype=torch.bfloat16).t()):  # fmt: skip
            torch.testing.assert_close(
                op(x, y).float(), x.float() @ y.float(), rtol=1e-2, atol=1e-1
            )
        if handle.built.key in winners or variants == 1:
            # A winner's modules were completed; another compiles float16 at its first launch.
            torch.testing.assert_close(
                op(a, b).float(), a.float() @ b.float(), rtol=1e-2, atol=1e-1
            )
    assert variants > 1
