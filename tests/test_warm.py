"""The warm-start index: an untouched registry skips planning and hashing; any edit is seen."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import workbench
from tests.registry_fixture import write_registry
from workbench import build

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
    real = build._plan

    def spy(project, family, config):  # type: ignore[no-untyped-def]
        names.append(family.name)
        return real(project, family, config)

    monkeypatch.setattr(build, "_plan", spy)
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
    """A warm start defers torch's autograd kernel for each formula to the op's first call
    (with or without grad: the Autograd dispatch key runs either way)."""
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
    assert sorted(made) == ["mul", "muladd", "rms_norm"]  # muladd's backward calls mul
    fresh.muladd(x, y, 0.5)  # made once per op, then reused
    fresh.mul(x, y)
    assert sorted(made) == ["mul", "muladd", "rms_norm"]
