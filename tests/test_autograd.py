"""C++ autograd kernels (WB_AUTOGRAD, bindings/include/wb/autograd.h), through layer_norm's.

The bundled layer_norm is differentiated by ``LayerNormFunction`` in bindings/layer_norm.cpp: no
Python runs in its forward or its backward. A copy of the family in a temporary registry serves
the tests that edit it: a spec that declares a Python backward too is refused, a graph recorded
by a build survives reloads past that build (its library stays mapped), and a tuned (routed)
family keeps its C++ autograd kernel above its routers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import workbench
from tests.conftest import DEVICES
from tests.reliability_helpers import ROOT, child_env, edit, script
from workbench import loader, runtime
from workbench.errors import LoadError
from workbench.spec import OpSpec

NS = f"wbautograd{os.getpid()}"
EPS = 1e-5


def _inputs(
    rows: int = 4, hidden: int = 24, dtype: torch.dtype = torch.float64, device: str = "cpu"
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x, w, b, g = (
        torch.randn(shape, generator=gen, dtype=dtype).to(device)
        for shape in ((rows, hidden), (hidden,), (hidden,), (rows, hidden))
    )
    return x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), g


def _reference_grads(x: Any, w: Any, b: Any, g: Any) -> tuple[torch.Tensor, ...]:
    y = F.layer_norm(x, x.shape[-1:], w, b, EPS)
    return torch.autograd.grad(y, (x, w, b), g)


# --- the bundled layer_norm: its autograd kernel is C++ -----------------------------------------


def test_the_autograd_kernel_is_the_bindings(lib: Any) -> None:
    """Autograd of layer_norm is registered from its binding; layer_norm_backward keeps the
    spec's Python formula (the double backward of layer_norm), behind its library's gate."""
    assert torch.ops.wb.layer_norm.default is not None  # a lookup registers deferred kernels
    dump = torch._C._dispatch_dump("wb::layer_norm")
    (line,) = [line for line in dump.splitlines() if line.startswith("Autograd")]
    assert "bindings/layer_norm.cpp" in line, dump
    dump = torch._C._dispatch_dump("wb::layer_norm_backward")
    (gate, formula) = [line for line in dump.splitlines() if line.startswith("Autograd")]
    assert "registry.cpp" in gate and "(inactive)" not in gate, dump  # in front of the formula
    assert "runtime.py" in formula and "(inactive)" in formula, dump
    spec = lib.specs["layer_norm"]
    assert spec.cpp_autograd and spec.backward is None and spec.differentiable


def _python_called(fn: Any) -> set[str]:
    """The files of every Python function that runs while ``fn()`` runs."""
    files: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            files.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return files


def _ours(files: set[str]) -> list[str]:
    """The files of the workbench, the specs, or torch's Python autograd for custom ops."""
    import torch._library

    folders = [Path(m.__file__).parent for m in (workbench, torch._library)] + [ROOT / "kernels"]
    return sorted(f for f in files if any(Path(f).is_relative_to(d) for d in folders))


def test_no_python_runs_in_the_forward_or_the_backward(lib: Any) -> None:
    """On a CPU, where the backward runs on the calling thread (the profile sees that thread)."""
    x, w, b, g = _inputs(dtype=torch.float32)
    op = torch.ops.wb.layer_norm.default

    def no_grad() -> None:
        with torch.no_grad():
            op(x, w, b, EPS)

    def step() -> None:
        torch.autograd.grad(op(x, w, b, EPS)[0], (x, w, b), g)

    step()  # the first call of anything may import
    assert _ours(_python_called(no_grad)) == []
    assert _ours(_python_called(step)) == []
    # The profile does see a Python autograd kernel (layer_norm_backward's) where one runs.
    mean, rstd = op(x, w, b, EPS)[1:]
    grad = g.detach().requires_grad_()
    called = _python_called(lambda: torch.ops.wb.layer_norm_backward(grad, x, mean, rstd, w))
    assert any("_library" in f for f in called), called


def test_a_python_formula_runs_python_only_for_a_gradient(lib: Any) -> None:
    """scale's formula is Python (its spec's backward). Its library's autograd gate, a C++ kernel
    at Autograd in front of that formula, sends a call whose inputs need no gradient, or one made
    under no_grad, below autograd without running any Python (torch's layers for custom ops cost
    microseconds a call); a call that needs one runs the formula, and its gradient is right."""
    import torch._library

    op = torch.ops.wb.scale.default  # a lookup registers a deferred family's kernels
    dump = torch._C._dispatch_dump("wb::scale")
    (active,) = [line for line in dump.splitlines() if line.startswith("Autograd[alias]:")]
    assert "registry.cpp" in active, dump  # the gate; the Python kernel is inactive under it
    assert "runtime.py" in dump.split(active, 1)[1], dump
    layers = str(Path(torch._library.__file__).parent / "autograd.py")
    x = torch.randn(8)
    xg = x.clone().requires_grad_()
    op(x, 2.0)

    def under_no_grad() -> None:
        with torch.no_grad():
            assert op(xg, 2.0).grad_fn is None

    assert _ours(_python_called(lambda: op(x, 2.0))) == []
    assert _ours(_python_called(under_no_grad)) == []
    assert layers in _python_called(lambda: op(xg, 3.0).sum().backward())
    assert xg.grad is not None and torch.equal(xg.grad, torch.full_like(x, 3.0))
    assert "scale" in type(op(xg, 1.0).grad_fn).__name__  # the op's own node, not the twin's


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_f_layer_norm_and_only_the_asked_ones_are_made(
    lib: Any, device: str
) -> None:
    x, w, b, g = _inputs(device=device)
    y, mean, rstd = lib.layer_norm(x, w, b, EPS)
    assert y.grad_fn is not None and not mean.requires_grad and not rstd.requires_grad
    want = _reference_grads(x, w, b, g)
    got = torch.autograd.grad(y, (x, w, b), g)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e)
    # Only weight requires grad: x's and bias's gradients are neither asked for nor returned.
    w_only = w.detach().requires_grad_()
    (dw,) = torch.autograd.grad(lib.layer_norm(x.detach(), w_only, b.detach(), EPS)[0], w_only, g)
    torch.testing.assert_close(dw, want[1])
    with torch.no_grad():
        assert lib.layer_norm(x, w, b, EPS)[0].grad_fn is None


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_and_gradgradcheck_in_float64(lib: Any, device: str) -> None:
    x, w, b, _ = _inputs(rows=3, hidden=10, device=device)

    def f(*a: torch.Tensor) -> torch.Tensor:
        return lib.layer_norm(*a, EPS)[0]

    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_runs_all_its_tests(lib: Any, device: str) -> None:
    x, w, b, _ = _inputs(rows=3, hidden=10, dtype=torch.float32, device=device)
    torch.library.opcheck(torch.ops.wb.layer_norm.default, (x, w, b, EPS))  # aot_dispatch too


@pytest.mark.parametrize("device", DEVICES)
def test_forward_and_backward_compile_as_one_graph(lib: Any, device: str) -> None:
    x, w, b, g = _inputs(device=device)

    def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.wb.layer_norm(x, w, b, EPS)[0]

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(x, w, b), (x, w, b), g)
    for a, e in zip(got, _reference_grads(x, w, b, g), strict=True):
        torch.testing.assert_close(a, e)


# --- the spec and the library agree on who differentiates an op ---------------------------------


def _spec(**kwargs: Any) -> OpSpec:
    return OpSpec(name="op", reference=torch.neg, samples=lambda *a: [], fake=torch.neg, **kwargs)


def test_a_spec_with_cpp_autograd_takes_no_python_backward() -> None:
    with pytest.raises(ValueError, match="takes no backward= or setup_context="):
        _spec(cpp_autograd=True, backward=lambda ctx, g: (g,))
    assert _spec(cpp_autograd=True).differentiable and not _spec().differentiable


@pytest.mark.parametrize(
    ("spec", "cpp", "message"),
    [
        (_spec(backward=lambda ctx, g: (g,)), True, r"a Python backward .* remove backward="),
        (_spec(), True, r"does not declare it: set cpp_autograd=True"),
        (_spec(cpp_autograd=True), False, r'no C\+\+ autograd kernel .* WB_AUTOGRAD\("op"'),
    ],
)
def test_a_disagreement_is_refused_naming_the_op_and_the_fix(
    spec: OpSpec, cpp: bool, message: str
) -> None:
    with pytest.raises(runtime.AutogradError, match=f"op op: .*{message}"):
        runtime.check_autograd(spec, "op", cpp)
    runtime.check_autograd(None, "op", cpp)  # an op with no spec: nothing to agree on


# --- a copy of the family, edited ---------------------------------------------------------------


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kernels/layer_norm and bindings/layer_norm.cpp, copied; returns the kernels/ folder."""
    root = tmp_path_factory.mktemp("autograd")
    shutil.copytree(ROOT / "kernels" / "layer_norm", root / "kernels" / "layer_norm")
    (root / "bindings").mkdir()
    shutil.copy(ROOT / "bindings" / "layer_norm.cpp", root / "bindings" / "layer_norm.cpp")
    return root / "kernels"


@pytest.fixture(scope="module")
def copy(registry: Path, cache_dir: Path) -> workbench.Library:
    from workbench import knobs

    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        return workbench.load(registry, namespace=NS, devices="cpu")


@pytest.fixture
def restored(copy: workbench.Library, registry: Path) -> Iterator[workbench.Library]:
    """The copy; the files a test edits are put back and reloaded afterwards."""
    files = [*(registry / "layer_norm").iterdir(), registry.parent / "bindings" / "layer_norm.cpp"]
    before = {p: p.read_bytes() for p in files}
    yield copy
    for p, data in before.items():
        p.write_bytes(data)
    copy.reload()


def test_a_spec_with_a_python_backward_for_a_cpp_autograd_op_is_refused(
    restored: workbench.Library, registry: Path
) -> None:
    spec = registry / "layer_norm" / "spec.py"
    edit(spec, "cpp_autograd=True,", "backward=lambda ctx, g, *_: (g, None, None, None),")
    with pytest.raises(LoadError, match=r"op layer_norm: its spec \(.*spec\.py\) declares a "):
        restored.reload()
    x, w, b, g = _inputs()  # the last good spec and build stay
    got = torch.autograd.grad(restored.layer_norm(x, w, b, EPS)[0], (x, w, b), g)
    torch.testing.assert_close(got[0], _reference_grads(x, w, b, g)[0])
    with pytest.raises(LoadError, match="declares a Python backward"):  # a first load too
        workbench.load(registry, namespace=f"{NS}b", devices="cpu")


def test_a_routed_family_keeps_its_cpp_autograd_above_the_routers(
    restored: workbench.Library, capfd: pytest.CaptureFixture[str]
) -> None:
    """Routed (as `wb tune` winners are), the public op's autograd kernel calls the public
    forward and backward ops below autograd, which reach the routers."""
    from workbench.tuning import route

    handle = loader.live_handles(NS)["layer_norm"]
    os.environ["WB_ROUTE_TRACE"] = "1"  # read by each router as it is made
    try:
        assert route.apply(NS, handle, {"ops": {}, "variants": {}})  # every call: the plain build
    finally:
        del os.environ["WB_ROUTE_TRACE"]
    try:
        dump = torch._C._dispatch_dump(f"{NS}::layer_norm")
        assert "bindings/layer_norm.cpp" in next(
            line for line in dump.splitlines() if line.startswith("Autograd")
        )
        x, w, b, g = _inputs()
        capfd.readouterr()
        got = torch.autograd.grad(restored.layer_norm(x, w, b, EPS)[0], (x, w, b), g)
        traced = capfd.readouterr().err
        for op in ("layer_norm", "layer_norm_backward"):
            assert f"wb route: {NS}::{op} numel=96 Double -> {NS}__layer_norm__home_" in traced
        for a, e in zip(got, _reference_grads(x, w, b, g), strict=True):
            torch.testing.assert_close(a, e)
    finally:
        assert route.apply(NS, handle, None)
    got = torch.autograd.grad(restored.layer_norm(x, w, b, EPS)[0], (x, w, b), g)
    torch.testing.assert_close(got[2], _reference_grads(x, w, b, g)[2])


# Run in a child process, so that a library unmapped under a live graph fails this test alone.
RELOAD_SCRIPT = """
import gc, json, sys
from pathlib import Path
import torch, workbench
from workbench import loader

kernels, ns = Path(sys.argv[1]), sys.argv[2]
binding = kernels.parent / "bindings" / "layer_norm.cpp"
original = binding.read_text()
lib = workbench.load(kernels, namespace=ns, devices="cpu")

def build_scaling_dx_by(k):
    dx = "out[0] = std::get<0>(d)"
    binding.write_text(original.replace(dx, f"{dx}.mul({k})"))
    lib.reload()
    return loader.live_handles(ns)["layer_norm"]

x = torch.randn(4, 24, dtype=torch.float64, requires_grad=True)
w, b = torch.randn(24, dtype=torch.float64), torch.randn(24, dtype=torch.float64)
g = torch.randn(4, 24, dtype=torch.float64)
(want,) = torch.autograd.grad(torch.nn.functional.layer_norm(x, (24,), w, b, 1e-5), x, g)
out = {}
second = build_scaling_dx_by(2)  # the first build stays mapped anyway: it defined the ops
with torch.no_grad():
    lib.layer_norm(x, w, b, 1e-5)
out["no_grad_recorded"] = second.recorded_graphs()
y = lib.layer_norm(x, w, b, 1e-5)[0]  # a graph whose node is the second build's
out["recorded"] = second.recorded_graphs()
third = build_scaling_dx_by(3)
out["second_kept"] = any(c is second.cdll for c in loader._retired)
(old,) = torch.autograd.grad(y, x, g, retain_graph=True)
(new,) = torch.autograd.grad(lib.layer_norm(x, w, b, 1e-5)[0], x, g)
out["old_is_2x"] = torch.allclose(old, 2 * want)
out["new_is_3x"] = torch.allclose(new, 3 * want)
del y
gc.collect()
print(json.dumps(out))
"""


def test_a_graph_recorded_by_an_old_build_runs_after_reloads(
    restored: workbench.Library, registry: Path
) -> None:
    """A graph made under one build; two reloads later (its library retired), its backward runs
    that build's code, and dropping it destroys its node: the library stayed mapped."""
    proc = subprocess.run(
        [*script(RELOAD_SCRIPT), str(registry), f"{NS}r"],
        env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["no_grad_recorded"] is False and out["recorded"] is True
    assert out["second_kept"] is True
    assert out["old_is_2x"] is True and out["new_is_3x"] is True


def test_an_edited_spec_gets_the_gate_in_front_of_its_new_formula(
    restored: workbench.Library, registry: Path
) -> None:
    """layer_norm_backward's formula is Python: a spec.py edit that leaves the build as it is
    registers the formula anew, and the library's gate goes back in front of it."""
    spec = registry / "layer_norm" / "spec.py"
    spec.write_text(spec.read_text() + "\n# edited: the same build, a new spec module\n")
    restored.reload()
    dump = torch._C._dispatch_dump(f"{NS}::layer_norm_backward")
    (active,) = [line for line in dump.splitlines() if line.startswith("Autograd[alias]:")]
    assert "registry.cpp" in active, dump
    x, w, b, g = _inputs()
    y = restored.layer_norm(x, w, b, EPS)[0]
    (gx,) = torch.autograd.grad(y, (x,), g, create_graph=True)
    (ggx,) = torch.autograd.grad(gx.sum(), (x,))  # through layer_norm_backward's formula
    yr = F.layer_norm(x, x.shape[-1:], w, b, EPS)
    (rx,) = torch.autograd.grad(yr, (x,), g, create_graph=True)
    (rrx,) = torch.autograd.grad(rx.sum(), (x,))
    torch.testing.assert_close(ggx, rrx)
