"""Libraries opened in a thread while a load works through them (workbench.loader.Prefetch)."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import pytest
import torch

import workbench
from workbench import loader, scaffold
from workbench.api import BuildWarning


def _mapped(path: Path) -> bool:
    with open("/proc/self/maps") as maps:
        return str(path) in maps.read()


def _copies(lib: workbench.Library, folder: Path, count: int) -> list[Path]:
    """Copies of the bundled libraries under new names: mapped by nobody yet."""
    built = [b.library for b in lib.families.values() if b.library is not None][:count]
    assert len(built) == count
    out = []
    for i, library in enumerate(built):
        copy = folder / f"libcopy{i}.so"
        shutil.copy(library, copy)
        out.append(copy)
    return out


def test_prefetch_maps_libraries_and_drops_its_references(
    lib: workbench.Library, tmp_path: Path
) -> None:
    copies = _copies(lib, tmp_path, 4)
    missing = tmp_path / "libmissing.so"
    prefetch = loader.Prefetch([*map(os.fspath, copies), os.fspath(missing)])
    for path in [*copies, missing]:
        prefetch.wait(os.fspath(path))
    assert all(_mapped(p) for p in copies)
    kept = ctypes.CDLL(os.fspath(copies[0]), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    prefetch.close()
    # The library the caller opened stays; the ones only the thread opened are unmapped.
    assert _mapped(copies[0])
    assert not any(_mapped(p) for p in copies[1:])
    assert kept.wb_abi_version() > 0


def test_a_load_prefetches_its_libraries_and_leaves_none_behind(
    lib: workbench.Library, tmp_path: Path
) -> None:
    seen: list[list[str]] = []
    inner = loader.Prefetch.__init__

    def spy(self: loader.Prefetch, paths: list[str]) -> None:
        seen.append(list(paths))
        inner(self, paths)

    loader.Prefetch.__init__ = spy  # type: ignore[method-assign]
    try:
        # eager: a load that registers families at the first lookup of an op opens none of them
        other = workbench.load(namespace="wbprefetch", eager=True)
    finally:
        loader.Prefetch.__init__ = inner  # type: ignore[method-assign]
    opened = {os.fspath(b.library) for b in other.families.values() if b.library is not None}
    assert len(opened) >= loader.PREFETCH_MIN
    assert len(seen) == 1 and set(seen[0]) == opened  # one thread, for every library it opened
    assert loader._prefetch is None  # closed with the load
    assert all(_mapped(Path(p)) for p in opened)


def test_a_library_that_cannot_open_is_named_while_the_others_load(tmp_path: Path) -> None:
    """Four families, so the load opens them in a thread; one library has an undefined symbol
    (its kernel template is declared but never instantiated): the loader's own open still
    fails with the demangled symbol and the usual cause, and the other three load."""
    kernels = tmp_path / "kernels"
    good = ("pf_a", "pf_b", "pf_c")
    for name in (*good, "pf_bad"):
        scaffold.write_family(kernels, name, shift=2.0)
    source = kernels / "pf_bad" / "pf_bad.cpp"
    text = source.read_text()
    assert "WB_INSTANTIATE(" in text
    source.write_text(
        "\n".join(line for line in text.splitlines() if "WB_INSTANTIATE(" not in line) + "\n"
    )
    with pytest.warns(BuildWarning, match="pf_bad"):
        lib = workbench.load(kernels, namespace="wbprefetch_bad", devices="cpu", on_error="warn")
    assert loader._prefetch is None
    assert sorted(lib.families) == list(good)
    error = str(lib.failed["pf_bad"])
    assert "pf_bad_cpu" in error and "WB_INSTANTIATE" in error, error
    ops = torch.ops.wbprefetch_bad
    for name in good:
        assert torch.equal(getattr(ops, name)(torch.zeros(2), 1.0), torch.full((2,), 2.0))
