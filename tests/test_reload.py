"""Hot reload with the real compiler and dispatcher: every edit kind, under the same op names.

One registry of two template families (``wb new``'s) serves the module; each test edits it,
reloads, checks what ran and what was rebuilt, and the fixture puts the files back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import workbench
from tests.conftest import DEVICES, HAS_CUDA
from tests.reliability_helpers import edit
from workbench import scaffold
from workbench.errors import BuildError, LoadError
from workbench.project import WB_KERNEL_INCLUDE

NS = f"wbreload{os.getpid()}"
ENTRY_POINTS = {
    *("wb_abi_version", "wb_describe"),
    *("wb_register", "wb_unregister", "wb_route"),
    *("wb_kernel_count", "wb_kernel_name", "wb_kernel_used", "wb_module_load", "wb_module_hook"),
    *("wb_register_autograd", "wb_autograd_recorded", "wb_autograd_gate"),
}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    return scaffold.write_registry(tmp_path_factory.mktemp("reload"), 2)


@pytest.fixture(scope="module")
def loaded(registry: Path, cache_dir: Path) -> workbench.Library:
    from workbench import knobs

    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        return workbench.load(registry, namespace=NS)


@pytest.fixture
def lib(loaded: workbench.Library, registry: Path) -> Iterator[workbench.Library]:
    """The loaded registry; files edited by the test are put back and reloaded afterwards."""
    root = registry.parent
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    yield loaded
    for p in [p for p in root.rglob("*") if p.is_file() and p not in before]:
        p.unlink()
    for d in sorted((d for d in root.rglob("*") if d.is_dir()), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    for p, data in before.items():
        if not p.exists() or p.read_bytes() != data:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    loaded.reload()


def kernel_tus(family: str) -> list[str]:
    """The kernel TUs of a template family that this configuration compiles."""
    return [f"{family}/{family}.cpp"] + ([f"{family}/{family}.kernel.cu"] if HAS_CUDA else [])


def kernels_in_dispatcher(op: str, key: str) -> int:
    """How many kernels the dispatcher holds for ``op`` under dispatch key ``key``."""
    dump = torch._C._dispatch_dump(f"{NS}::{op}")
    return sum(line.startswith(f"{key}: ") for line in dump.splitlines())


@pytest.mark.parametrize("device", DEVICES)
def test_a_kernel_body_edit_runs_under_the_same_name(
    lib: workbench.Library, registry: Path, compiled: list[str], device: str
) -> None:
    x = torch.arange(4.0, device=device)
    packet = torch.ops.__getattr__(NS).op00  # held across the reload, as user code would
    assert torch.equal(packet(x, 2.0), 2 * x)  # shift of op00 is 0
    source = registry / "op00" / ("op00.kernel.cu" if device == "cuda" else "op00.cpp")
    edit(source, "apply(", "-apply(")
    report = lib.reload()
    assert compiled == [f"op00/{source.name}"]
    assert report.swapped == ["op00"]
    assert torch.equal(packet(x, 2.0), -2 * x)
    assert torch.equal(lib.op00(x, 2.0), -2 * x)
    if device == "cuda":
        on_cpu = torch.arange(4.0)
        assert torch.equal(lib.op00(on_cpu, 1.0), on_cpu)  # the CPU kernel is untouched


def test_a_user_header_edit_rebuilds_its_includers(
    lib: workbench.Library, registry: Path, compiled: list[str]
) -> None:
    edit(registry / "op01" / "op01_math.h", "kShift = 1.0", "kShift = 7.0")
    lib.reload()
    assert sorted(compiled) == kernel_tus("op01")  # the binding does not include it
    assert torch.equal(lib.op01(torch.zeros(3), 1.0), torch.full((3,), 7.0))


def test_a_workbench_header_edit_rebuilds_its_includers(
    lib: workbench.Library, compiled: list[str]
) -> None:
    header = WB_KERNEL_INCLUDE / "wb" / "elementwise.h"
    original = header.read_bytes()
    try:
        header.write_bytes(original + b"// edited by a test\n")
        lib.reload()
    finally:
        header.write_bytes(original)
    # Every CPU kernel includes wb/elementwise.h; no binding and no CUDA kernel does.
    assert sorted(compiled) == ["op00/op00.cpp", "op01/op01.cpp"]


def test_a_binding_edit_changes_checks_and_allocation(
    lib: workbench.Library, registry: Path, compiled: list[str]
) -> None:
    binding = registry.parent / "bindings" / "op00.cpp"
    edit(
        binding,
        "  at::Tensor out = at::empty(x_in.sizes(), x_in.options());\n  const at::Tensor x = x_in",
        '  TORCH_CHECK(alpha != 0.0, "op00: alpha must be nonzero");\n'
        "  at::Tensor out = at::empty(x_in.sizes(), x_in.options().dtype(at::kDouble));\n"
        "  const at::Tensor x = x_in",
    )
    edit(
        binding,
        "WB_DISPATCH(WB_FLOATING, x.scalar_type()",
        "WB_DISPATCH(WB_FLOATING, out.scalar_type()",
    )
    edit(binding, "wb::data<scalar_t>(x), alpha", "wb::data<scalar_t>(x.to(out.dtype())), alpha")
    lib.reload()
    assert compiled == ["bindings/op00.cpp"]
    with pytest.raises(RuntimeError, match="op00: alpha must be nonzero"):
        lib.op00(torch.ones(2), 0.0)
    assert lib.op00(torch.ones(2), 3.0).dtype == torch.float64


def test_a_schema_change_redefines_the_op_and_its_python_registrations(
    lib: workbench.Library, registry: Path
) -> None:
    binding = registry.parent / "bindings" / "op00.cpp"
    edit(binding, "float alpha) -> Tensor", "float alpha, float beta) -> Tensor")
    edit(
        binding,
        "(const at::Tensor& x_in, double alpha) {",
        "(const at::Tensor& x_in, double alpha, double beta) {",
    )
    edit(binding, "  return out;\n}\n", "  return out.add_(beta);\n}\n")  # CPU and CUDA
    spec = registry / "op00" / "spec.py"
    edit(
        spec,
        "def op00_reference(x: torch.Tensor, alpha: float)",
        "def op00_reference(x: torch.Tensor, alpha: float, beta: float = 0.0)",
    )
    edit(spec, "return alpha * x + SHIFT", "return alpha * x + SHIFT + beta")
    edit(
        spec,
        "def op00_fake(x: torch.Tensor, alpha: float)",
        "def op00_fake(x: torch.Tensor, alpha: float, beta: float)",
    )
    edit(
        spec,
        "return (grad * ctx.alpha if ctx.needs_input_grad[0] else None), None",
        "return (grad * ctx.alpha if ctx.needs_input_grad[0] else None), None, None",
    )
    report = lib.reload()
    assert report.redefined == ["op00"]
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    assert torch.equal(lib.op00(x, 2.0, 3.0), torch.full((3,), 5.0, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="beta"):
        lib.op00(x, 2.0)
    # The fake function and the autograd formula follow the new schema.
    torch.library.opcheck(getattr(torch.ops, NS).op00.default, (x.detach(), 2.0, 3.0))
    assert torch.autograd.gradcheck(lambda t: lib.op00(t, 2.0, 3.0), (x,))
    compiled_fn = torch.compile(
        lambda t: lib.op00(t, 2.0, 1.0), backend="aot_eager", fullgraph=True
    )
    assert torch.equal(compiled_fn(x.detach()), torch.full((3,), 3.0, dtype=torch.float64))


def test_a_spec_edit_replaces_the_autograd_formula(lib: workbench.Library, registry: Path) -> None:
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    lib.op01(x, 3.0).sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 3.0, dtype=torch.float64))
    edit(registry / "op01" / "spec.py", "grad * ctx.alpha if", "grad * ctx.alpha * 10 if")
    report = lib.reload()
    assert report.compiled == []  # nothing to compile: only Python changed
    x.grad = None
    lib.op01(x, 3.0).sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 30.0, dtype=torch.float64))


def test_families_added_and_removed_on_disk(lib: workbench.Library, registry: Path) -> None:
    scaffold.write_family(registry, "added", shift=4.0)
    report = lib.reload()
    assert report.swapped == ["added"]
    assert torch.equal(lib.added(torch.zeros(2), 1.0), torch.full((2,), 4.0))
    assert torch.equal(getattr(torch.ops, NS).added(torch.zeros(2), 1.0), torch.full((2,), 4.0))
    shutil.rmtree(registry / "added")
    (registry.parent / "bindings" / "added.cpp").unlink()
    report = lib.reload()
    assert report.removed == ["added"]
    assert "added" not in lib.ops and "added" not in lib.specs
    with pytest.raises(AttributeError, match="no op 'added'"):
        lib.added  # noqa: B018
    assert not hasattr(getattr(torch.ops, NS), "added")


def test_the_old_build_is_unregistered_and_exports_only_the_entry_points(
    lib: workbench.Library, registry: Path
) -> None:
    old = lib.families["op01"].library
    edit(registry / "op01" / "op01.cpp", "apply(v, a)", "apply(v, a) + 1")
    lib.reload()
    new = lib.families["op01"].library
    assert new != old
    assert torch.equal(lib.op01(torch.zeros(2), 1.0), torch.full((2,), 2.0))
    # Exactly one kernel per device: the new build's. The old one's can never be dispatched to.
    assert kernels_in_dispatcher("op01", "CPU") == 1
    assert kernels_in_dispatcher("op01", "CUDA") == (1 if HAS_CUDA else 0)
    symbols = subprocess.run(
        ["readelf", "--dyn-syms", "-W", str(new)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    exported = {
        f[7]
        for f in (line.split() for line in symbols)
        if len(f) >= 8 and f[6] != "UND" and f[4] in ("GLOBAL", "WEAK", "UNIQUE")
    }
    assert exported == ENTRY_POINTS


def test_a_failed_build_changes_nothing_and_the_next_edit_loads(
    lib: workbench.Library, registry: Path, compiled: list[str]
) -> None:
    source = registry / "op00" / "op00.cpp"
    good = lib.families["op00"]
    edit(source, "apply(v, a);", "apply(v, a) +* ;")
    scaffold.write_family(registry, "op01", shift=2.0)  # another family's good edit
    with pytest.raises(BuildError) as info:
        lib.reload()
    line = next(i for i, x in enumerate(source.read_text().splitlines(), 1) if "+* ;" in x)
    assert f"{source}:{line}:" in str(info.value)
    assert lib.families["op00"] is good
    assert torch.equal(lib.op00(torch.ones(2), 1.0), torch.ones(2))  # last good build
    assert torch.equal(lib.op01(torch.zeros(2), 1.0), torch.full((2,), 2.0))  # swapped anyway
    edit(source, "apply(v, a) +* ;", "apply(v, a) * 3;")
    compiled.clear()
    lib.reload()
    assert compiled == ["op00/op00.cpp"]
    assert torch.equal(lib.op00(torch.ones(2), 1.0), torch.full((2,), 3.0))


def test_a_library_that_fails_to_register_keeps_the_last_good_build(
    lib: workbench.Library, registry: Path
) -> None:
    binding = registry.parent / "bindings" / "op01.cpp"
    edit(binding, 'WB_DEF("op01(Tensor x', 'WB_DEF("op01(Tensor x, Tensor)) ->')
    with pytest.raises(LoadError, match="op01"):
        lib.reload()
    assert torch.equal(lib.op01(torch.zeros(2), 1.0), torch.ones(2))
    edit(binding, 'WB_DEF("op01(Tensor x, Tensor)) ->', 'WB_DEF("op01(Tensor x')
    lib.reload()
    assert torch.equal(lib.op01(torch.zeros(2), 1.0), torch.ones(2))


def test_nothing_changed_means_nothing_happens(lib: workbench.Library, compiled: list[str]) -> None:
    before = {name: b.library for name, b in lib.families.items()}
    report = lib.reload()
    assert compiled == []
    assert report.swapped == [] and report.removed == [] and report.redefined == []
    assert all(b.hit for b in report.built)
    assert {name: b.library for name, b in lib.families.items()} == before


def test_an_undefined_symbol_is_named_when_the_library_opens(
    lib: workbench.Library, registry: Path
) -> None:
    edit(
        registry / "op00" / "op00.cpp",
        "WB_INSTANTIATE(WB_FLOATING, op00_cpu)",
        "WB_INSTANTIATE(WB_FLOAT32, op00_cpu)",
    )
    with pytest.raises(LoadError, match=r"op00_cpu<.*WB_INSTANTIATE"):
        lib.reload()
    assert torch.equal(
        lib.op00(torch.ones(2, dtype=torch.float64), 1.0), torch.ones(2, dtype=torch.float64)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_a_compiled_caller_runs_the_new_kernel_and_retraces_after_a_schema_change(
    lib: workbench.Library, registry: Path, device: str
) -> None:
    fn = torch.compile(lambda t: lib.op01(t, 2.0) * 2)  # the default backend: inductor
    x = torch.ones(4, device=device)
    assert torch.equal(fn(x), torch.full((4,), 6.0, device=device))
    source = registry / "op01" / ("op01.kernel.cu" if device == "cuda" else "op01.cpp")
    edit(source, "apply(", "10 + apply(")
    lib.reload()
    assert torch.equal(fn(x), torch.full((4,), 26.0, device=device))
    binding = registry.parent / "bindings" / "op01.cpp"
    edit(binding, "float alpha) -> Tensor", "float alpha, float beta) -> Tensor")
    edit(binding, "double alpha) {", "double alpha, double beta) {")
    lib.reload()
    with pytest.raises(Exception, match="beta"):  # re-traced against the new schema
        fn(x)


@pytest.mark.cuda
def test_a_cuda_graph_of_a_compiled_caller_records_the_new_kernel(
    lib: workbench.Library, registry: Path
) -> None:
    fn = torch.compile(lambda t: lib.op01(t, 2.0) + 1, mode="reduce-overhead")
    x = torch.ones(8, device="cuda")
    for _ in range(3):  # warm-up, record, replay
        assert torch.equal(fn(x), torch.full((8,), 4.0, device="cuda"))
    edit(registry / "op01" / "op01.kernel.cu", "apply(", "10 + apply(")
    lib.reload()
    for _ in range(3):
        assert torch.equal(fn(x), torch.full((8,), 14.0, device="cuda"))


def test_one_edit_in_thirty_families_rebuilds_only_that_family(
    tmp_path: Path, compiled: list[str]
) -> None:
    kernels = scaffold.write_registry(tmp_path, 30)
    lib = workbench.load(kernels, namespace=f"{NS}_thirty")
    assert len(lib.ops) == 30
    compiled.clear()
    edit(kernels / "op17" / "op17.cpp", "apply(v, a)", "apply(v, a) * 2")
    report = lib.reload()
    assert compiled == ["op17/op17.cpp"]
    assert report.swapped == ["op17"]
    assert torch.equal(lib.op17(torch.zeros(2), 1.0), torch.full((2,), 34.0))
    compiled.clear()
    edit(kernels / "op05" / "op05_math.h", "kShift = 5.0", "kShift = 6.0")
    edit(
        kernels.parent / "bindings" / "op22.cpp",
        "x_in.options()",
        "x_in.options().dtype(at::kDouble)",
    )
    edit(
        kernels.parent / "bindings" / "op22.cpp",
        "WB_DISPATCH(WB_FLOATING, x.scalar_type()",
        "WB_DISPATCH(WB_FLOATING, out.scalar_type()",
    )
    edit(
        kernels.parent / "bindings" / "op22.cpp",
        "wb::data<scalar_t>(x), alpha",
        "wb::data<scalar_t>(x.to(out.dtype())), alpha",
    )
    report = lib.reload()
    assert sorted(compiled) == sorted([*kernel_tus("op05"), "bindings/op22.cpp"])
    assert report.swapped == ["op05", "op22"]
    assert torch.equal(lib.op05(torch.zeros(2), 1.0), torch.full((2,), 6.0))
    assert lib.op22(torch.zeros(2), 1.0).dtype == torch.float64
