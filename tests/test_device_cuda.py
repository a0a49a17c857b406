"""Device-only TUs on a GPU: kernels launched from NVRTC modules, swapped in a running library.

One registry of two template families (``wb new``'s device-only layout) serves the module; each
test edits it, reloads, and checks what ran, what was compiled and which library is live.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import workbench
from tests.reliability_helpers import edit
from workbench import cache, device, knobs, loader, scaffold, ship
from workbench.api import BuildWarning

pytestmark = pytest.mark.cuda

NS = f"wbdevice{os.getpid()}"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scaffold.write_registry(tmp_path_factory.mktemp("device"), 2)


@pytest.fixture(scope="module")
def loaded(registry: Path, cache_dir: Path) -> workbench.Library:
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        return workbench.load(registry, namespace=NS)


@pytest.fixture
def lib(loaded: workbench.Library, registry: Path) -> Iterator[workbench.Library]:
    root = registry.parent
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    yield loaded
    for p, data in before.items():
        if p.read_bytes() != data:
            p.write_bytes(data)
    loaded.reload(on_error="warn")


def live_library(family: str) -> Path | None:
    return loader.live_handles(NS)[family].built.library


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_every_dtype_and_alignment_runs_from_the_module(
    lib: workbench.Library, dtype: torch.dtype
) -> None:
    for n in (1, 127, 4096 + 3, 1 << 20):
        x = torch.randn(n + 1, device="cuda", dtype=dtype)
        for view in (x[:n], x[1:]):  # 16-byte aligned and not: the vector and scalar kernels
            expected = (2.0 * view.float() + 1.0).to(dtype)  # op01 shifts by 1
            torch.testing.assert_close(lib.op01(view, 2.0), expected)


def test_a_kernel_edit_swaps_the_module_and_keeps_the_library(
    lib: workbench.Library, registry: Path, compiled: list[str]
) -> None:
    x = torch.arange(8.0, device="cuda")
    op = torch.ops.__getattr__(NS).op00  # held across the reload, as user code would
    assert torch.equal(op(x, 2.0), 2 * x)
    library = live_library("op00")
    edit(registry / "op00" / "op00.kernel.cu", "apply(x, alpha);", "apply(x, alpha) + A(3);")
    report = lib.reload()
    assert compiled == ["op00/op00.kernel.cu"]  # no host TU, no link
    assert report.swapped == ["op00"] and report.device_only == ["op00"]
    assert live_library("op00") == library  # the same library: no dlopen
    assert torch.equal(op(x, 2.0), 2 * x + 3)
    assert torch.equal(lib.op00(x.cpu(), 2.0), 2 * x.cpu())  # the CPU kernel is untouched


def module_names(family: str, file: str) -> set[str]:
    """The kernels in the live module of ``file`` (from its cubins' records)."""
    keys = loader.live_handles(NS)[family].modules[file]
    return {
        n
        for key in keys
        for n in cache.read_json(device.cubin_path(key).with_suffix(".json"))["lowered"]
    }


def test_a_reload_loads_the_kernels_run_so_far_first_and_another_waits_for_the_rest(
    lib: workbench.Library, registry: Path
) -> None:
    x = torch.arange(8.0, device="cuda")
    assert torch.equal(lib.op00(x, 2.0), 2 * x)  # float runs; op00's double kernels never did
    edit(registry / "op00" / "op00.kernel.cu", "apply(x, alpha);", "apply(x, alpha) + A(7);")
    report = lib.reload()
    assert report.device_only == ["op00"]
    ((source, behind),) = report.device_behind  # the summary says so: "N more kernels of ..."
    assert source.name == "op00.kernel.cu" and behind > 0
    first = module_names("op00", "op00.kernel.cu")
    assert first and not any("double" in n for n in first), first
    assert torch.equal(lib.op00(x, 2.0), 2 * x + 7)
    xd = x.double()  # a kernel the first step lacks: its launch waits for the rest
    assert torch.equal(lib.op00(xd, 2.0), 2 * xd + 7)
    assert device.settle(300)
    whole = module_names("op00", "op00.kernel.cu")
    assert first < whole and any("double" in n for n in whole)
    assert len(whole) == len(first) + behind
    assert lib.reload().swapped == []  # nothing changed: the whole module is found, not compiled


def test_a_kernel_of_the_rest_that_does_not_compile_fails_at_its_launch_and_next_reload(
    lib: workbench.Library, registry: Path
) -> None:
    x = torch.arange(8.0, device="cuda")
    assert torch.equal(lib.op00(x, 2.0), 2 * x)
    body = "  wb::detail::elementwise_body<N, NoL1>"
    edit(registry / "op00" / "op00.kernel.cu", body,
         '  static_assert(sizeof(T) != 2, "no halves here");\n' + body)  # fmt: skip
    lib.reload()  # op00 never ran float16 here: its kernels are the rest's
    assert torch.equal(lib.op00(x, 2.0), 2 * x)  # the float kernel compiled first
    with pytest.raises(RuntimeError, match=r"(?s)other kernels failed.*no halves here"):
        lib.op00(x.half(), 2.0)
    assert device.settle(300)
    with pytest.warns(BuildWarning):
        report = lib.reload(on_error="warn")
    assert "no halves here" in str(report.failed["op00"])


def test_a_module_of_some_kernels_compiles_another_at_the_launch_that_needs_it(
    lib: workbench.Library, registry: Path
) -> None:
    # What wb tune gives a variant: a module of the kernels the plain build launched (float).
    handle = loader.live_handles(NS)["op01"]
    assert handle.kernels is not None
    floats = {k for k in handle.kernels if k[1].endswith(",float>")}
    family = lib.project.family("op01")
    device.sync(lib.project, family, lib.config, handle, only=floats)
    assert module_names("op01", "op01.kernel.cu") == {e for _, e in floats}
    x = torch.arange(8.0, device="cuda")
    assert torch.equal(lib.op01(x, 2.0), 2 * x + 1)
    xd = x.double()  # not in the module: its launch compiles that one kernel, then runs it
    assert torch.equal(lib.op01(xd, 2.0), 2 * xd + 1)
    added = module_names("op01", "op01.kernel.cu") - {e for _, e in floats}
    assert len(added) == 1 and "double" in added.pop()
    # A kernel that does not compile fails its launch with the compiler's message, and the
    # kernels the module holds keep running.
    edit(registry / "op01" / "op01.kernel.cu", "  wb::detail::elementwise_body<N, NoL1>",
         '  static_assert(sizeof(T) != 2, "no halves here");\n'
         "  wb::detail::elementwise_body<N, NoL1>")  # fmt: skip
    with pytest.raises(RuntimeError, match=r"(?s)completing its module failed.*no halves here"):
        lib.op01(x.half(), 2.0)
    assert torch.equal(lib.op01(xd, 2.0), 2 * xd + 1)


def test_a_device_compile_error_names_the_line_and_keeps_the_old_kernel(
    lib: workbench.Library, registry: Path
) -> None:
    source = registry / "op00" / "op00.kernel.cu"
    edit(source, "apply(x, alpha);", "apply(x, alpha) + not_declared;")
    line = 1 + source.read_text().split("not_declared")[0].count("\n")
    with pytest.warns(BuildWarning) as caught:
        report = lib.reload(on_error="warn")
    message = str(report.failed["op00"])
    assert f"{source}:{line}: error" in message and "not_declared" in message
    assert "op00" in str(caught[0].message)
    x = torch.arange(4.0, device="cuda")
    assert torch.equal(lib.op00(x, 2.0), 2 * x)  # the last good module still runs


def test_a_launch_whose_arguments_do_not_match_the_kernel_fails_clearly(
    lib: workbench.Library, registry: Path
) -> None:
    edit(registry / "op00" / "op00.kernel.cu", "(int n, acc_t<T>", "(long n, acc_t<T>")
    lib.reload()
    with pytest.raises(RuntimeError, match=r"op00_kernel<.*parameters take 8, 4, 8, 8 bytes wher"):
        lib.op00(torch.ones(4, device="cuda"), 2.0)


def test_a_launcher_reads_a_variable_of_the_module_again_after_a_swap(
    lib: workbench.Library, registry: Path
) -> None:
    """wb::global: the launcher scales by alpha + bias, bias a __constant__ of the kernel's TU;
    a swap that changes it is read again (first inside a graph capture); reading it as another
    size fails with both sizes."""
    kernel, launcher = registry / "op00" / "op00.kernel.cu", registry / "op00" / "op00.cu"
    edit(kernel, "template <typename A>\nstruct Apply", "__constant__ float bias = 5.0f;\n\n"
         "template <typename A>\nstruct Apply")  # fmt: skip
    edit(launcher, "template <typename T>\nStatus op00_cuda",
         'WB_DEVICE_TEMPLATE(kBias, "op00.kernel.cu", "wb::op00_family::bias");\n\n'
         "template <typename T>\nStatus op00_cuda")  # fmt: skip
    edit(launcher, "  return wb::elementwise_launch",
         "  float bias = 0;\n"
         "  if (const Status e = wb::global<&kBias>.read(&bias)) return e;\n"
         "  alpha += bias;\n  return wb::elementwise_launch")  # fmt: skip
    lib.reload()
    x = torch.arange(8.0, device="cuda")
    assert torch.equal(lib.op00(x, 2.0), 7 * x)
    edit(kernel, "bias = 5.0f", "bias = 1.0f")
    assert lib.reload().device_only == ["op00"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the new module's first read and launch, inside a capture
        y = lib.op00(x, 2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, 3 * x)
    assert torch.equal(lib.op00(x, 2.0), 3 * x)
    edit(launcher, "float bias = 0;", "double bias = 0;")
    lib.reload()
    with pytest.raises(RuntimeError, match=r"bias in op00.kernel.cu is 4 bytes; it is read as 8"):
        lib.op00(x, 2.0)


def test_a_captured_graph_replays_and_the_next_capture_takes_the_new_module(
    lib: workbench.Library, registry: Path
) -> None:
    x = torch.ones(1024, device="cuda")
    lib.op01(x, 2.0)  # warm: the module is loaded before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = lib.op01(x, 2.0)
    graph.replay()
    assert torch.equal(y, torch.full_like(x, 3.0))
    edit(registry / "op01" / "op01.kernel.cu", "apply(x, alpha);", "apply(x, alpha) * A(2);")
    lib.reload()
    graph.replay()  # the old module stays loaded: the captured kernel still runs
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(x, 3.0))
    assert torch.equal(lib.op01(x, 2.0), torch.full_like(x, 6.0))


def test_a_compiled_caller_runs_the_new_module(lib: workbench.Library, registry: Path) -> None:
    fn = torch.compile(lambda t: lib.op01(t, 2.0) * 2)
    x = torch.ones(4, device="cuda")
    assert torch.equal(fn(x), torch.full((4,), 6.0, device="cuda"))
    edit(registry / "op01" / "op01.kernel.cu", "apply(x, alpha);", "apply(x, alpha) + A(10);")
    lib.reload()
    assert torch.equal(fn(x), torch.full((4,), 26.0, device="cuda"))


def test_a_wheel_carries_the_cubins_and_runs_them_without_the_workbench(
    lib: workbench.Library, registry: Path, cache_dir: Path, tmp_path: Path
) -> None:
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        shipped = ship.build_wheel(
            registry, name="devship_ops", namespace="devship", out=tmp_path, families=["op01"]
        )
    cubins = [n for n in zipfile.ZipFile(shipped.path).namelist() if n.endswith(".cubin")]
    assert cubins and all("op01.kernel.cu.sm_" in n for n in cubins), cubins
    (module,) = shipped.info["families"][0]["modules"]
    assert module["file"] == "op01.kernel.cu" and len(module["images"]) == len(cubins)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*pip, "--target", str(site), str(shipped.path)], check=True)
    code = """
import sys, torch
import devship_ops
assert not [m for m in sys.modules if m.split(".")[0] == "workbench"], "workbench imported"
x = torch.ones(1 << 12, device="cuda", dtype=torch.float16)
torch.testing.assert_close(torch.ops.devship.op01(x, 2.0), torch.full_like(x, 3.0))
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WB_", "PYTHONPATH"))}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_each_device_launches_from_the_module_and_an_edit_reaches_both(
    lib: workbench.Library, registry: Path
) -> None:
    xs = [torch.arange(1024.0, device=f"cuda:{d}") for d in range(2)]
    for x in xs:  # one load of the cubin serves both devices (context-independent loading)
        assert torch.equal(lib.op01(x, 2.0), 2 * x + 1)
    edit(registry / "op01" / "op01.kernel.cu", "apply(x, alpha);", "apply(x, alpha) + A(5);")
    lib.reload()
    for x in reversed(xs):  # the second device first this time
        with torch.cuda.device(x.device):
            assert torch.equal(lib.op01(x, 2.0), 2 * x + 6)
