"""A family this cache has loaded before is registered with torch at the first lookup of one of
its ops (workbench.deferred), through every way Python looks an op up; ``eager`` opts out."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import workbench
from workbench import deferred, knobs, loader, runtime, scaffold
from workbench.errors import LoadError

_count = iter(range(1_000_000))


def _ns() -> str:
    return f"wbdefer{next(_count)}_{os.getpid()}"


# Run in a child process, so that this one has never mapped the libraries: a test here then
# opens them for the first time, as a new process would (and may replace one on disk).
SETUP = r"""
import os, sys, time
from pathlib import Path
import workbench
from workbench import scaffold
root, count, devices = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None
kernels = scaffold.write_registry(root, count)
first = workbench.load(kernels, namespace="wbdefersetup", devices=devices)
t = time.time() - 60  # older than the racy-timestamp window: the index records every file
for p in [*root.rglob("*"), *(b.library for b in first.families.values())]:
    if p.is_file():
        os.utime(p, (t, t))
workbench.load(kernels, namespace="wbdefersetup2", devices=devices)  # what each declared
print(kernels)
"""


def _known(root: Path, count: int, devices: str = "cpu") -> Path:
    """A registry of ``count`` template families, built and loaded twice in another process
    (the second load records what each library declared), so the next load defers them all."""
    env = {**os.environ, "WB_CACHE_DIR": str(knobs.cache_dir()), "WB_QUIET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SETUP, str(root), str(count), devices],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        return _known(tmp_path_factory.mktemp("deferred"), 3)


def _has_cpu_kernel(ns: str, op: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{op}", "CPU")
    except RuntimeError:  # "operator ... does not exist": not defined yet
        return False


def test_each_family_is_registered_at_the_first_lookup_of_its_op(known: Path) -> None:
    ns = _ns()
    lib = workbench.load(known, namespace=ns, devices="cpu")
    assert sorted(lib.last.deferred) == ["op00", "op01", "op02"]
    assert lib.ops == ["op00", "op01", "op02"]  # known without opening a library
    assert not any(_has_cpu_kernel(ns, op) for op in lib.ops)
    assert type(getattr(torch.ops, ns)) is not torch._ops._OpNamespace  # the hook

    x = torch.arange(4.0, requires_grad=True)
    out = getattr(torch.ops, ns).op01(x, 2.0)  # family op01 registers here, alone
    assert torch.equal(out, 2.0 * x + 1.0)
    assert sorted(deferred.pending(ns)) == ["op00", "op02"]
    assert _has_cpu_kernel(ns, "op01") and not _has_cpu_kernel(ns, "op00")
    (grad,) = torch.autograd.grad(out.sum(), x)  # its spec's backward, from the stand-in
    assert torch.equal(grad, torch.full((4,), 2.0))
    assert torch.equal(lib.op02(torch.ones(2), 1.0), torch.full((2,), 3.0))  # lib.<op> too

    lib.register_all()  # for callers that look ops up in the dispatcher by name
    assert deferred.pending(ns) == {} and _has_cpu_kernel(ns, "op00")
    assert type(getattr(torch.ops, ns)) is torch._ops._OpNamespace  # torch's class again
    assert set(loader.handles(ns)) == {"op00", "op01", "op02"}


@pytest.mark.parametrize("how", ["argument", "knob"])
def test_eager_registers_every_family_at_load(known: Path, how: str) -> None:
    ns = _ns()
    if how == "argument":
        lib = workbench.load(known, namespace=ns, devices="cpu", eager=True)
    else:
        with knobs.override(WB_EAGER="1"):
            lib = workbench.load(known, namespace=ns, devices="cpu")
    assert lib.last.deferred == [] and deferred.pending(ns) == {}
    assert all(_has_cpu_kernel(ns, op) for op in ("op00", "op01", "op02"))


def test_torchscript_dynamo_and_fake_tensors_reach_a_deferred_op(known: Path) -> None:
    ns = _ns()
    workbench.load(known, namespace=ns, devices="cpu")
    ops = getattr(torch.ops, ns)

    # Each looks its op up through the namespace object while the op's family is deferred.
    def f(x: torch.Tensor) -> torch.Tensor:
        return ops.op00(x, 3.0)

    x = torch.arange(3.0)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), 3.0 * x)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = ops.op01(mode.from_tensor(torch.empty(5)), 1.0)
    assert tuple(fake.shape) == (5,)
    assert sorted(deferred.pending(ns)) == ["op02"]

    def g(x: torch.Tensor) -> torch.Tensor:
        return ops.op02(x, 1.0)

    scripted = torch.jit.script(g)
    assert torch.equal(scripted(x), x + 2.0)
    assert deferred.pending(ns) == {}


def test_threads_that_look_the_same_op_up_at_once_register_it_once(
    known: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = _ns()
    workbench.load(known, namespace=ns, devices="cpu")
    opened: list[str] = []
    real = runtime.open_library

    def slow_open(path: Path):  # type: ignore[no-untyped-def]
        opened.append(os.fspath(path))
        time.sleep(0.05)  # the others arrive while it registers
        return real(path)

    monkeypatch.setattr(runtime, "open_library", slow_open)
    results: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(getattr(torch.ops, ns).op01(torch.ones(3), 2.0))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 8 and all(torch.equal(r, torch.full((3,), 3.0)) for r in results)
    assert len(opened) == 1


def test_a_library_that_cannot_open_at_the_first_lookup_names_its_family_and_is_retried(
    tmp_path: Path,
) -> None:
    kernels = _known(tmp_path, 3)  # a registry of its own: none of its libraries mapped here
    ns = _ns()
    lib = workbench.load(kernels, namespace=ns, devices="cpu")
    library = lib.families["op02"].library
    assert library is not None
    kept = library.with_name("kept.so")
    library.rename(kept)  # never opened by this process: replaced, not written in place
    library.write_bytes(b"not a library")
    try:
        with pytest.raises(LoadError, match="op02"):
            _ = getattr(torch.ops, ns).op02  # the lookup registers the family
        assert "op02" in lib.failed and "op02" in deferred.pending(ns)  # tried again next time
    finally:
        kept.replace(library)
    assert torch.equal(getattr(torch.ops, ns).op02(torch.zeros(2), 1.0), torch.full((2,), 2.0))
    assert "op02" not in lib.failed


def test_a_library_removed_from_the_cache_before_the_first_lookup_is_built_again(
    tmp_path: Path,
) -> None:
    kernels = _known(tmp_path, 1)
    ns = _ns()
    lib = workbench.load(kernels, namespace=ns, devices="cpu")
    library = lib.families["op00"].library
    assert library is not None and lib.last.deferred == ["op00"]
    library.unlink()  # as wb gc or wb clean would
    assert torch.equal(getattr(torch.ops, ns).op00(torch.ones(2), 2.0), torch.full((2,), 2.0))
    assert library.exists() and deferred.pending(ns) == {}


def test_an_edit_to_a_deferred_family_is_registered_at_reload(tmp_path: Path) -> None:
    kernels = _known(tmp_path, 2)
    ns = _ns()
    lib = workbench.load(kernels, namespace=ns, devices="cpu")
    assert sorted(lib.last.deferred) == ["op00", "op01"]
    scaffold.write_family(kernels, "op01", shift=7.0, layout="device")
    report = lib.reload()
    assert report.swapped == ["op01"] and report.deferred == ["op00"]
    assert _has_cpu_kernel(ns, "op01") and sorted(deferred.pending(ns)) == ["op00"]
    assert torch.equal(lib.op01(torch.zeros(2), 1.0), torch.full((2,), 7.0))
    (kernels / "op00").rename(tmp_path / "op00.removed")
    (kernels.parent / "bindings" / "op00.cpp").unlink()
    report = lib.reload()
    assert report.removed == ["op00"] and deferred.pending(ns) == {}
    assert lib.ops == ["op01"]


@pytest.mark.cuda
def test_a_device_only_edit_of_a_deferred_family_compiles_at_load_and_runs_at_first_call(
    tmp_path: Path,
) -> None:
    """The launchers' library is untouched, so the family stays deferred; its device-only TU is
    compiled by the load (an error would show there), and loaded at the op's first call."""
    kernels = _known(tmp_path, 2, devices="")
    tu = kernels / "op01" / "op01.kernel.cu"
    body = "return apply(x, alpha);"
    assert body in tu.read_text()
    tu.write_text(tu.read_text().replace(body, "return apply(x, alpha) + A(10);"))
    ns = _ns()
    lib = workbench.load(kernels, namespace=ns)
    assert sorted(lib.last.deferred) == ["op00", "op01"]
    assert [p.name for p in lib.last.device_compiled] == ["op01.kernel.cu"]
    x = torch.ones(4, device="cuda")
    assert torch.equal(lib.op01(x, 2.0), torch.full((4,), 13.0, device="cuda"))
    assert torch.equal(lib.op00(x, 2.0), torch.full((4,), 2.0, device="cuda"))
    assert deferred.pending(ns) == {}


def test_a_spec_that_disagrees_with_its_library_on_autograd_is_refused_at_load(
    tmp_path: Path,
) -> None:
    """The deferring load checks the edited spec against what the library declared, so the error
    shows at load, as an eager load's does, not at the op's first lookup."""
    kernels = _known(tmp_path, 1)
    spec = kernels / "op00" / "spec.py"
    old = "        backward=op00_backward,\n        setup_context=op00_setup_context,\n"
    assert old in spec.read_text()  # a valid spec, whose claim the library contradicts
    spec.write_text(spec.read_text().replace(old, "        cpp_autograd=True,\n"))
    assert "cpp_autograd=True" in spec.read_text()
    ns = _ns()
    with pytest.raises(LoadError, match="cpp_autograd"):
        workbench.load(kernels, namespace=ns, devices="cpu")
    assert deferred.pending(ns) == {}
