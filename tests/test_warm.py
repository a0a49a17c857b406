"""The warm-start index: an untouched registry skips planning and hashing; any edit is seen."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench
from tests.registry_fixture import write_registry
from workbench import build, toolchain

_count = iter(range(1_000_000))


def _load(kernels: Path) -> workbench.Library:
    return workbench.load(kernels, namespace=f"wbwarm{next(_count)}_{os.getpid()}")


def _age(path: Path, seconds: float) -> None:
    """Set a file's mtime ``seconds`` into the past (older than the racy-timestamp window)."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def _indexed_registry(root: Path) -> tuple[Path, Path]:
    """A built registry whose files are all old, loaded once more so the index records it."""
    kernels = write_registry(root)
    library = _load(kernels).families["tiny"].library
    assert library is not None
    for p in [*root.rglob("*.h"), *root.rglob("*.cpp"), library]:
        _age(p, 60)
    _load(kernels)  # a full check, which records the stamps
    return kernels, library


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The families that went through the full check (planning and hashing)."""
    names: list[str] = []
    real = build.plan_tus

    def spy(project, family, config):  # type: ignore[no-untyped-def]
        names.append(family.name)
        return real(project, family, config)

    monkeypatch.setattr(build, "plan_tus", spy)
    yield names


def test_an_untouched_registry_skips_the_full_check_and_an_edit_is_still_seen(
    tmp_path: Path, planned: list[str]
) -> None:
    kernels, _ = _indexed_registry(tmp_path)
    planned.clear()
    lib = _load(kernels)
    assert planned == []  # from the index
    assert torch.equal(lib.add_offset(torch.zeros(2)), torch.ones(2))

    # An edit that keeps the size, with an old timestamp: only the stamp tells it apart.
    header = kernels / "include" / "tiny_common.h"
    write_registry(tmp_path, offset=2)
    for p in [*tmp_path.rglob("*.cpp"), kernels / "tiny" / "tiny.h"]:
        _age(p, 60)
    _age(header, 30)
    lib = _load(kernels)
    assert set(planned) == {"tiny"}  # the full check (again under the lock, to rebuild)
    assert torch.equal(lib.add_offset(torch.zeros(2)), torch.full((2,), 2.0))


def test_a_warm_start_imports_nothing_of_the_build(tmp_path: Path, cache_dir: Path) -> None:
    """A new process that finds every family in the index plans nothing, so it imports none of
    ninja, the precompiled header, the team cache's launcher or sysconfig (each costs a new
    process milliseconds)."""
    import subprocess
    import sys

    kernels, _ = _indexed_registry(tmp_path)
    root = Path(__file__).resolve().parent.parent
    code = (
        "import sys, torch, workbench\n"
        "before = set(sys.modules)\n"
        f"lib = workbench.load({str(kernels)!r}, namespace='wbwarmimports')\n"
        "assert lib.last.built and all(b.hit for b in lib.last.built), lib.last\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    env = {**os.environ, "WB_CACHE_DIR": str(cache_dir), "WB_QUIET": "1", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = set(proc.stdout.strip("[]\n").replace("'", "").split(", "))
    assert {"workbench.api", "workbench.loader", "workbench.warm"} <= imported
    build_only = {"workbench.ninja", "workbench.pch", "workbench.launcher", "sysconfig"}
    assert imported.isdisjoint(build_only), sorted(imported & build_only)


def test_a_damaged_library_is_never_taken_from_the_index(
    tmp_path: Path, planned: list[str]
) -> None:
    kernels, library = _indexed_registry(tmp_path)
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    # A new file in its place (rewriting a mapped library in place could crash this process).
    damaged = library.with_name(library.name + ".damaged")
    damaged.write_bytes(bytes(data))
    os.replace(damaged, library)
    planned.clear()
    lib = _load(kernels)
    assert set(planned) == {"tiny"}
    assert lib.families["tiny"].library is not None
    assert torch.equal(lib.add_offset(torch.zeros(2)), torch.ones(2))


def test_an_autograd_formula_is_made_on_first_use_and_differentiates(
    lib: workbench.Library, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm start defers torch's autograd kernel for each formula to the op's first call that
    may record a graph: a call without one (no_grad, or no input that requires grad, as mul's
    inside muladd's backward) goes below autograd through the library's gate and makes none."""
    from torch._library import autograd as torch_autograd

    made: list[str] = []
    real = torch_autograd.make_autograd_impl
    ns = f"wblazy{os.getpid()}"

    def counting(op, info):  # type: ignore[no-untyped-def]
        if op._namespace == ns:  # torch makes its own ops' kernels through it too
            made.append(op._opname)
        return real(op, info)

    monkeypatch.setattr(torch_autograd, "make_autograd_impl", counting)
    fresh = workbench.load(lib.project.kernels_dir, namespace=ns, devices="cpu")
    assert made == []  # loading made none
    x = torch.randn(64, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    rows = x.detach().reshape(4, 16).requires_grad_()
    assert torch.autograd.gradcheck(lambda r, w: fresh.rms_norm(r, w, 1e-6), (rows, w))
    y = torch.randn(64, dtype=torch.float64)
    (grad,) = torch.autograd.grad(fresh.muladd(x, y, 0.5).sum(), x)
    torch.testing.assert_close(grad, y)
    assert sorted(made) == ["muladd", "rms_norm"]  # muladd's backward called mul without grad
    with torch.no_grad():
        fresh.mul(x, y)
    assert sorted(made) == ["muladd", "rms_norm"]
    fresh.mul(x, y)  # x requires grad: mul's kernel is made now
    fresh.muladd(x, y, 0.5)  # made once per op, then reused
    fresh.mul(x, y)
    assert sorted(made) == ["mul", "muladd", "rms_norm"]


def test_a_fake_function_names_its_own_source_and_traces(lib: workbench.Library) -> None:
    """The loader registers fakes without torch's caller lookup: torch still finds the fake,
    names where it is defined, and runs it under FakeTensorMode."""
    from torch._library import simple_registry
    from torch._subclasses.fake_tensor import FakeTensorMode

    # A lookup registers a deferred family (where the load deferred it: a CUDA host's warm load).
    assert getattr(torch.ops, lib.namespace).muladd.default is not None
    spec = lib.specs["muladd"]
    kernel = simple_registry.singleton.find(f"{lib.namespace}::muladd").fake_impl.kernel
    assert kernel is not None  # the spec's fake, or its stand-in (workbench.specfile)
    assert kernel.func is spec.fake or kernel.func.__name__ == "muladd_fake"
    code = spec.fake.__code__
    assert kernel.source == f"{code.co_filename}:{code.co_firstlineno}"
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(5, 3))
        out = lib.muladd(x, x, 0.5)
    assert out.shape == (5, 3) and out.dtype == torch.float32


def test_the_python_tag_is_sysconfigs_abi_tag() -> None:
    import sysconfig

    assert toolchain.python_tag() == sysconfig.get_config_var("SOABI")


def test_the_gpu_answer_is_kept_per_boot_and_per_set_of_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "gpus"
    monkeypatch.setattr(toolchain, "_NVIDIA_PROC", str(proc))
    assert toolchain._gpus_cache_file() is None  # no driver entries: ask NVML every time
    (proc / "0000:01:00.0").mkdir(parents=True)
    info = proc / "0000:01:00.0" / "information"
    info.write_text("Model: \t NVIDIA H100 80GB HBM3\nBus Location: \t 0000:01:00.0\n")
    one = toolchain._gpus_cache_file()
    assert one is not None and one == toolchain._gpus_cache_file()
    info.write_text("Model: \t NVIDIA H200\nBus Location: \t 0000:01:00.0\n")  # swapped
    two = toolchain._gpus_cache_file()
    (proc / "0000:02:00.0").mkdir()
    (proc / "0000:02:00.0" / "information").write_text("Model: \t NVIDIA H200\n")  # added
    assert len({one, two, toolchain._gpus_cache_file()}) == 3


@pytest.mark.cuda
def test_the_gpu_answer_kept_across_processes_is_torchs(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    if not Path(toolchain._NVIDIA_PROC).is_dir():
        pytest.skip("this driver has no /proc entries: NVML answers every time")
    code = (
        "import json, torch; from workbench import toolchain as t; "
        "print(json.dumps([str(t._gpus_cache_file()), t.gpu_capabilities()]))"
    )
    env = {
        **os.environ,
        "WB_CACHE_DIR": str(tmp_path),
        "PYTHONPATH": str(Path(__file__).parents[1]),
    }

    def run() -> tuple[Path, list[list[int]]]:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        kept, caps = json.loads(out.stdout)
        return Path(kept), caps

    kept, first = run()
    want = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    assert first == [list(c) for c in want]
    assert json.loads(kept.read_text()) == first
    kept.write_text("[[1, 0]]")  # the next process answers from the file, not from NVML
    assert run()[1] == [[1, 0]]


def test_the_warm_start_bench_reports_every_phase_and_its_spread(tmp_path: Path) -> None:
    """python -m bench warm_start in new processes: per phase min <= median <= max, the phases
    inside load() no more than the total, and the registry really loaded (it asserts its ops)."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "warm_start", "--families", "1", "--processes", "2",
         "--json", "--work", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    runs = [json.loads(line) for line in lines[:2]]
    report = json.loads(lines[2])
    summary = report["summary"]
    assert report["environment"]["commit"] and report["environment"]["torch"]
    phases = ("import", "index", "spec", "open", "define", "python", "kernels", "other", "call")
    for run in runs:
        # The family was loaded before: the load left it for the op's first call, which opened
        # and registered it (workbench.deferred); the other ops' first calls are outside the total.
        assert set(phases) <= set(run) and run["open"] == 0 and run["kernels"] == 0
        assert run["deferred"] == 1 and run["call"] > 0 and "rest" in run
        assert sum(run[p] for p in phases) <= run["total"] * 1.001
    for phase in (*phases, "total"):
        s = summary[phase]
        assert s["min"] <= s["median"] <= s["max"]
    *_, total, rest, checks = proc.stdout.splitlines()
    assert "| total |" in total and "| rest |" in rest
    # Each process's load left the op's spec.py unrun; its backward and fake ran from stand-ins.
    assert checks == (
        "spec_deferred: 2 of 2, grad_ok: 2 of 2, fake_ok: 2 of 2; "
        "families left for their first call by the load: 1"
    )
    assert all(run["spec_deferred"] and run["grad_ok"] and run["fake_ok"] for run in runs)


def test_a_spec_is_compiled_once_and_then_taken_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where Python keeps no bytecode (PYTHONDONTWRITEBYTECODE, a read-only checkout), a new
    process would compile every family's spec.py again; the loader keeps the code by content."""
    import builtins

    from workbench import knobs, specfile

    compiled: list[str] = []
    real = builtins.compile

    def counting(source: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        compiled.append(str(filename))
        return real(source, filename, *args, **kwargs)

    spec = tmp_path / "spec.py"
    text = b"from __future__ import annotations\nOPS: list[int] = []\nVALUE = 1\n"
    spec.write_bytes(text)
    with knobs.override(WB_CACHE_DIR=str(tmp_path / "cache")):
        monkeypatch.setattr(builtins, "compile", counting)
        first = specfile.spec_code(spec, text)
        again = specfile.spec_code(spec, text)
        edited = specfile.spec_code(spec, text.replace(b"VALUE = 1", b"VALUE = 2"))
        for stored in (tmp_path / "cache").rglob("*.code"):
            stored.write_bytes(b"not code")  # a damaged entry is compiled again, not trusted
        damaged = specfile.spec_code(spec, text)
    assert compiled == [str(spec), str(spec), str(spec)]
    namespace: dict[str, Any] = {}
    exec(again, namespace)
    assert namespace["VALUE"] == 1 and first.co_filename == str(spec)
    exec(edited, namespace)
    assert namespace["VALUE"] == 2
    exec(damaged, namespace)
    assert namespace["VALUE"] == 1
