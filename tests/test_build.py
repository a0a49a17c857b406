"""The build cache with the real compiler: per-TU rebuilds, errors, corruption, locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import workbench
from tests.registry_fixture import write_registry
from workbench import build, cache, knobs
from workbench.errors import BuildError, CacheError

_count = iter(range(1_000_000))


@pytest.fixture
def compiled() -> Iterator[list[str]]:
    """The base names of the TUs compiled while the test runs."""
    names: list[str] = []

    def hook(family: str, source: Path) -> None:
        names.append(f"{source.parent.name}/{source.name}")

    build.compile_hooks.append(hook)
    yield names
    build.compile_hooks.remove(hook)


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


def test_a_compile_error_names_file_and_line_and_leaves_no_entry(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path)
    lib = _load(kernels)
    entries = set((cache.root() / "lib" / "tiny").iterdir())
    source = kernels / "tiny" / "tiny.cpp"
    source.write_text(source.read_text().replace("out[i] = x[i]", "out[i] = x[i] +* ;"))
    with pytest.raises(BuildError) as info:
        lib.reload()
    assert f"{source}:8:" in str(info.value)
    assert "error" in str(info.value)
    assert set((cache.root() / "lib" / "tiny").iterdir()) == entries
    assert not [p for p in (cache.root() / "tmp").iterdir() if p.name.startswith("tiny-")]
    assert torch.equal(lib.add_offset(torch.zeros(1)), torch.ones(1))  # last good build
    write_registry(tmp_path, delta=2)
    lib.reload()
    assert torch.equal(lib.add_offset(torch.zeros(1)), torch.full((1,), 3.0))


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


def test_same_base_name_in_two_folders_never_collides(tmp_path: Path) -> None:
    lib = _load(write_registry(tmp_path))
    tus = {
        Path(t["source"]).parent.name + "/" + Path(t["source"]).name: t["key"]
        for t in lib.families["tiny"].manifest["tus"]
    }  # type: ignore[union-attr]
    assert tus["tiny/tiny.cpp"] != tus["bindings/tiny.cpp"]
    assert all(build._object_path(k).exists() for k in tus.values())


def _replace_file(path: Path, data: bytes) -> None:
    """Give ``path`` new bytes in a new inode: this process may have the old one mapped."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_a_corrupted_library_is_detected_and_rebuilt(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path)
    built = _load(kernels).families["tiny"]
    assert built.library is not None
    data = bytearray(built.library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    _replace_file(built.library, bytes(data))
    code = textwrap.dedent(
        f"""
        import torch, workbench
        lib = workbench.load({str(kernels)!r}, namespace="wbcorrupt")
        assert torch.equal(lib.add_offset(torch.zeros(1)), torch.ones(1))
        print(lib.families["tiny"].library)
        """
    )
    env = dict(os.environ, WB_CACHE_DIR=knobs.cache_dir().as_posix(), WB_QUIET="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(built.library)
    assert build.find_cached(lib_family(kernels), built.key) is not None


def lib_family(kernels: Path):  # type: ignore[no-untyped-def]
    from workbench.project import discover

    return discover(kernels).family("tiny")


def test_a_truncated_library_is_not_used(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path)
    lib = _load(kernels)
    built = lib.families["tiny"]
    assert built.library is not None
    _replace_file(built.library, built.library.read_bytes()[:1000])
    assert build.find_cached(lib.project.family("tiny"), built.key) is None


def test_a_killed_lock_holder_releases_the_lock(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys, time
        from workbench import cache
        with cache.lock("victim"):
            print("locked", flush=True)
            time.sleep(60)
        """
    )
    env = dict(os.environ, WB_CACHE_DIR=knobs.cache_dir().as_posix())
    holder = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    start = time.monotonic()
    with cache.lock("victim"):
        waited = time.monotonic() - start
    assert waited < 2.0


def test_an_unusable_cache_dir_names_the_dir_and_the_knob(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with knobs.override(WB_CACHE_DIR=str(blocker / "cache")), pytest.raises(CacheError) as info:
        cache.root()
    assert str(blocker / "cache") in str(info.value)
    assert "WB_CACHE_DIR" in str(info.value)
