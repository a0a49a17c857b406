"""The build cache with the real compiler: per-TU rebuilds and the shared libstdc++.

Crash safety (kills, races, corruption, errors, full disks) is in test_reliability.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

import workbench
from tests.registry_fixture import write_registry
from workbench import knobs

_count = iter(range(1_000_000))


def _load(kernels: Path) -> workbench.Library:
    # A namespace per test: ops of different tests never meet in the dispatcher.
    return workbench.load(kernels, namespace=f"wbtest{next(_count)}_{os.getpid()}")


def test_cold_build_then_cache_hit(tmp_path: Path, compiled: list[str]) -> None:
    kernels = write_registry(tmp_path)
    lib = _load(kernels)
    assert sorted(compiled) == ["bindings/registry.cpp", "bindings/tiny.cpp", "tiny/tiny.cpp"] or (
        sorted(compiled) == ["bindings/tiny.cpp", "tiny/tiny.cpp"]  # registry.o already cached
    )
    x = torch.arange(4.0)
    assert torch.equal(lib.add_offset(x), x + 1)
    key = lib.families["tiny"].key
    compiled.clear()
    again = _load(kernels)
    assert compiled == []
    assert again.families["tiny"].key == key


def test_an_edit_rebuilds_exactly_that_tu(tmp_path: Path, compiled: list[str]) -> None:
    kernels = write_registry(tmp_path)
    lib = _load(kernels)
    compiled.clear()
    write_registry(tmp_path, delta=10)
    lib.reload()
    assert compiled == ["tiny/tiny.cpp"]
    assert torch.equal(lib.add_offset(torch.zeros(3)), torch.full((3,), 11.0))


def test_a_header_edit_rebuilds_its_includers(tmp_path: Path, compiled: list[str]) -> None:
    kernels = write_registry(tmp_path)
    lib = _load(kernels)
    compiled.clear()
    write_registry(tmp_path, offset=5)
    lib.reload()
    assert compiled == ["tiny/tiny.cpp"]  # the binding does not include tiny_common.h
    assert torch.equal(lib.add_offset(torch.zeros(2)), torch.full((2,), 5.0))


def _needs_shared_libstdcxx(library: Path | None) -> bool:
    """Whether the library's dynamic section names the shared libstdc++."""
    assert library is not None
    dynamic = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return "libstdc++.so" in dynamic


def test_the_library_shares_torchs_libstdcxx(tmp_path: Path) -> None:
    """A private static libstdc++ in the library would crash beside torch's shared one."""
    built = _load(write_registry(tmp_path)).families["tiny"]
    assert _needs_shared_libstdcxx(built.library)


def test_a_driver_that_links_libstdcxx_statically_still_gets_the_shared_one(
    tmp_path: Path,
) -> None:
    """Seen on a GPU host: CXX's library folder held only libstdc++.a, and the op crashed."""
    wrapper = tmp_path / "g++-static"
    # Like that host's compiler: no shared libstdc++ to name, and -lstdc++ links statically.
    wrapper.write_text(
        "#!/bin/sh\nshared=0\n"
        '[ "$1" = -print-file-name=libstdc++.so ] && echo libstdc++.so && exit 0\n'
        'for a in "$@"; do shift; [ "$a" = -lstdc++ ] && continue; [ "$a" = -shared ] && shared=1;'
        ' set -- "$@" "$a"; done\n'
        '[ $shared = 1 ] && exec g++ "$@" -static-libstdc++\nexec g++ "$@"\n'
    )
    wrapper.chmod(0o755)
    with knobs.override(CXX=str(wrapper)):
        lib = _load(write_registry(tmp_path / "project"))
    assert _needs_shared_libstdcxx(lib.families["tiny"].library)
    # An error message is formatted through libstdc++'s streams: this crashed with two copies.
    with pytest.raises(TypeError, match="add_offset: x has dtype Long, which is not supported"):
        lib.add_offset(torch.zeros(2, dtype=torch.int64))
