"""Crash-safe builds, each proven with real processes and the real compiler (issue 6, 1-8).

1 a build killed with SIGKILL mid-compile; 2 eight processes on an empty cache; 3 a corrupted
library; 4 an unusable cache directory; 5 a toolchain change; 6 a compile error; 7 one base
name in two folders; 8 a full disk. bench/results/reliability.md records what each proved.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import workbench
from tests.registry_fixture import write_registry
from tests.reliability_helpers import (
    child_env,
    script,
    share_pch,
    user_namespace_works,
    wb,
    write_compiler_wrapper,
)
from workbench import build, cache, knobs
from workbench.config import make_config
from workbench.errors import BuildError, CacheError
from workbench.project import discover

_count = iter(range(1_000_000))


def _ns() -> str:
    return f"wbrel{next(_count)}_{os.getpid()}"


# The TUs of the registry's one family: its kernel and binding, and the registry TU.
EVERY_TU = ["bindings/registry.cpp", "bindings/tiny.cpp", "tiny/tiny.cpp"]


def _sources(compiled: list[Path] | list[str]) -> list[str]:
    """Compiled sources as 'folder/file', sorted."""
    return sorted(Path(p).relative_to(Path(p).parents[1]).as_posix() for p in compiled)


def _wait_for(predicate, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


# 1 ---------------------------------------------------------------------------------------
LOAD_AND_REPORT = """
import json, sys, torch, workbench
lib = workbench.load(sys.argv[1], namespace="wbkilled")
b = lib.families["tiny"]
ok = torch.equal(lib.add_offset(torch.zeros(2)), torch.ones(2))
print(json.dumps({"ok": ok, "compiled": [str(p) for p in b.compiled]}))
"""


def _live_build(tag: str) -> dict[int, int]:
    """pid -> process group of each live process (zombies left out) whose command line names
    ``tag`` (ninja's build folder), and of every process in those processes' groups."""
    table: dict[int, tuple[str, int, str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # ended while we looked
            continue
        state, _ppid, pgrp = text.rpartition(")")[2].split()[:3]
        table[int(stat.parent.name)] = (state, int(pgrp), cmdline)
    groups = {g for state, g, cmd in table.values() if tag in cmd and state != "Z"}
    return {pid: g for pid, (state, g, _) in table.items() if g in groups and state != "Z"}


def test_1_a_build_killed_mid_compile_never_blocks_the_next_load(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path / "project")
    cxx = tmp_path / "g++-wrap"
    write_compiler_wrapper(cxx, "12.2.0-wb", slow_env="WB_TEST_SLOW_COMPILE")
    env = child_env(CXX=str(cxx), WB_QUIET="0")
    holder = subprocess.Popen(
        [*script(LOAD_AND_REPORT), str(kernels)],
        env={**env, "WB_TEST_SLOW_COMPILE": "1"},
        start_new_session=True,  # its orphaned compilers are cleaned up by group below
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tmp_root = knobs.cache_dir() / "v1" / "tmp"
    try:
        # (a new toolchain: the first build precompiles the torch headers, then runs ninja)
        _wait_for(lambda: any(tmp_root.glob(f"tiny-{holder.pid}-*/build.ninja")), 600)
        second = subprocess.Popen(
            [*script(LOAD_AND_REPORT), str(kernels)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert second.stderr is not None
        line = second.stderr.readline()  # blocks until the second process waits on the lock
        assert "waiting for another process building tiny" in line, line
        assert holder.poll() is None, "the first build ended before it could be killed"
        os.kill(holder.pid, signal.SIGKILL)  # the Python process only: ninja is orphaned
        holder.wait()
        out, err = second.communicate(timeout=600)
        # The killed build's orphans (ninja, and its compile that sleeps 120 s, each in a
        # process group of its own) still run: the second load built and returned without
        # waiting for them, so nothing the dead process left behind held the lock (a lock
        # inherited by ninja would have outlived it). A SIGKILL leaves the dead process no
        # chance to end them (an interrupt does: tests/test_procs.py).
        orphans = _live_build(f"tiny-{holder.pid}-")
    finally:
        for group in {holder.pid, *_live_build(f"tiny-{holder.pid}-").values()}:
            with contextlib.suppress(ProcessLookupError):  # none left: they ended on their own
                os.killpg(group, signal.SIGKILL)
        holder.wait()
    assert second.returncode == 0, err
    report = json.loads(out)
    assert report["ok"]
    assert _sources(report["compiled"]) == EVERY_TU  # the killed build stored no object
    assert orphans, "the killed build's compile ended before the second load did"


def test_1_a_killed_lock_holder_releases_the_lock_at_once() -> None:
    code = """
        import sys, time
        from workbench import cache
        with cache.lock("victim"):
            print("locked", flush=True)
            time.sleep(60)
        """
    holder = subprocess.Popen(script(code), env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with cache.try_lock("victim") as free:
            assert not free  # held by a live process: try_lock answers at once, without it
        assert cache.lock_holder("victim") == holder.pid
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    # The first try after the holder is gone finds the lock free: nothing waits for it to go
    # stale, and try_lock never waits.
    with cache.try_lock("victim") as free:
        assert free
    assert cache.lock_holder("victim") is None


# 2 ---------------------------------------------------------------------------------------
RACER = """
import json, os, sys, time, torch, workbench
from workbench import build
log = sys.argv[2]
def hook(family, source):
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {source}\\n")
build.compile_hooks.append(hook)
print("ready", flush=True)
while not os.path.exists(sys.argv[3]):
    time.sleep(0.005)
lib = workbench.load(sys.argv[1], namespace="wbrace")
x = torch.arange(5.0)
print(json.dumps({"ok": torch.equal(lib.add_offset(x), x + 1),
                  "compiled": len(lib.families["tiny"].compiled)}))
"""


def test_2_eight_processes_on_an_empty_cache_compile_once(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path / "project")
    fresh = tmp_path / "empty-cache"
    share_pch(fresh)
    log, go = tmp_path / "compiles.log", tmp_path / "go"
    env = child_env(WB_CACHE_DIR=str(fresh))
    procs = [
        subprocess.Popen(
            [*script(RACER), str(kernels), str(log), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()  # all eight start loading at once
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    lines = log.read_text().splitlines()
    sources = sorted(
        Path(line.split()[1]).relative_to(Path(line.split()[1]).parents[1]).as_posix()
        for line in lines
    )
    assert sources == ["bindings/registry.cpp", "bindings/tiny.cpp", "tiny/tiny.cpp"]
    assert len({line.split()[0] for line in lines}) == 1  # one process compiled, once each
    assert sorted(r["compiled"] > 0 for r in results) == [False] * 7 + [True]


# 3 ---------------------------------------------------------------------------------------
def _replace_file(path: Path, data: bytes) -> None:
    """Give ``path`` new bytes in a new inode: this process may have the old one mapped."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.parametrize("damage", ["truncated", "bytes flipped"])
def test_3_a_damaged_library_is_detected_and_rebuilt(tmp_path: Path, damage: str) -> None:
    kernels = write_registry(tmp_path)
    built = workbench.load(kernels, namespace=_ns()).families["tiny"]
    assert built.library is not None
    data = bytearray(built.library.read_bytes())
    if damage == "truncated":
        data = data[:1000]
    else:
        data[len(data) // 2 : len(data) // 2 + 16] = bytes(
            b ^ 0xFF for b in data[len(data) // 2 : len(data) // 2 + 16]
        )
    _replace_file(built.library, bytes(data))
    assert build.find_cached(discover(kernels).family("tiny"), built.key) is None
    code = """
        import sys, torch, workbench
        lib = workbench.load(sys.argv[1], namespace="wbdamaged")
        assert torch.equal(lib.add_offset(torch.zeros(1)), torch.ones(1))
        print(lib.families["tiny"].library)
    """
    out = subprocess.run(
        [*script(code), str(kernels)], env=child_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr  # never a crash
    assert out.stdout.strip() == str(built.library)  # rebuilt in place (a relink: objects stay)
    manifest = json.loads((built.library.parent / "manifest.json").read_text())
    assert manifest["sha256"] == build.file_digest(str(built.library))


# 4 ---------------------------------------------------------------------------------------
def _readonly_prefix(folder: Path) -> list[str]:
    """A command prefix under which ``folder`` is read-only, even for root (a ro bind mount)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    if not user_namespace_works():
        pytest.skip("running as root without user namespaces: cannot make a folder read-only")
    remount = (
        f'mount --bind "{folder}" "{folder}" && mount -o remount,ro,bind "{folder}" "{folder}"'
    )
    return ["unshare", "-rm", "sh", "-c", f'{remount} && exec "$@"', "sh"]


@pytest.mark.parametrize("case", ["read-only", "missing under a read-only folder"])
def test_4_an_unusable_cache_dir_is_a_clear_error(tmp_path: Path, case: str) -> None:
    kernels = write_registry(tmp_path / "project")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    target = readonly if case == "read-only" else readonly / "missing" / "cache"
    cmd = [
        *_readonly_prefix(readonly),
        *script("import sys, workbench; workbench.load(sys.argv[1], namespace='wbro')"),
        str(kernels),
    ]
    out = subprocess.run(
        cmd, env=child_env(WB_CACHE_DIR=str(target)), capture_output=True, text=True
    )
    assert out.returncode != 0
    assert "CacheError" in out.stderr and "Traceback" in out.stderr  # the library raises it
    message = out.stderr.strip().splitlines()[-1]
    assert f"cache directory {target} is not" in message and "set WB_CACHE_DIR" in message
    cli = subprocess.run(
        [
            *_readonly_prefix(readonly),
            sys.executable,
            "-m",
            "workbench",
            "--kernels",
            str(kernels),
            "build",
        ],
        env=child_env(WB_CACHE_DIR=str(target)),
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and "Traceback" not in cli.stderr  # the CLI: one clear line
    assert str(target) in cli.stderr and "WB_CACHE_DIR" in cli.stderr


def test_4_a_missing_cache_dir_in_a_writable_folder_is_created(tmp_path: Path) -> None:
    target = tmp_path / "new" / "cache"
    with knobs.override(WB_CACHE_DIR=str(target)):
        assert knobs.cache_dir() == target
        assert not (tmp_path / "new").exists()  # reading where the cache goes makes nothing
        root = cache.root()
    assert root == target / "v1"  # WB_CACHE_DIR, then the layout's version
    assert sorted(p.name for p in root.iterdir()) == sorted(cache.SUBDIRS)
    assert [p.name for p in target.iterdir()] == ["v1"]
    assert all(os.access(root / sub, os.W_OK) for sub in cache.SUBDIRS)


def test_4_a_cache_path_through_a_file_names_the_dir_and_the_knob(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with knobs.override(WB_CACHE_DIR=str(blocker / "cache")), pytest.raises(CacheError) as info:
        cache.root()
    assert str(blocker / "cache") in str(info.value)
    assert "WB_CACHE_DIR" in str(info.value)


# 5 ---------------------------------------------------------------------------------------
def test_5_a_toolchain_or_knob_change_rebuilds_and_wb_why_names_it(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path / "project")
    cxx = tmp_path / "g++-wrap"
    write_compiler_wrapper(cxx, "12.2.0-wb")
    with knobs.override(CXX=str(cxx), NVCC_APPEND_FLAGS=None):
        first = workbench.load(kernels, namespace=_ns()).families["tiny"]
        old_pch = make_config().pch_file
    write_compiler_wrapper(cxx, "13.9.9-wb")  # "upgraded" in place: same path, new binary
    env = child_env(CXX=str(cxx), NVCC_APPEND_FLAGS="-lineinfo")
    why = wb("--kernels", str(kernels), "why", "tiny", env=env)
    assert why.returncode == 0, why.stderr
    old, new = f"{cxx} (g++ (wb-test) 12.2.0-wb)", f"{cxx} (g++ (wb-test) 13.9.9-wb)"
    assert f"C++ compiler changed from {old} to {new}" in why.stdout
    assert "env knob NVCC_APPEND_FLAGS set to '-lineinfo' (was unset)" in why.stdout
    assert "file changed" not in why.stdout  # no source changed
    with knobs.override(CXX=str(cxx), NVCC_APPEND_FLAGS="-lineinfo"):
        second = workbench.load(kernels, namespace=_ns()).families["tiny"]
        new_pch = make_config().pch_file
    assert second.key != first.key
    # The toolchain is in every TU's key (build.TU.compute_key hashes config.id), so every
    # object is new: the kernel, the binding and the registry TU, each compiled once.
    assert _sources(second.compiled) == _sources(first.compiled) == EVERY_TU
    old_keys = {t["key"] for t in first.manifest["tus"]}
    assert not old_keys & {t["key"] for t in second.manifest["tus"]}
    # and the bindings' precompiled torch header is the new compiler's, made beside the old one
    assert new_pch != old_pch and new_pch.exists() and old_pch.exists()
    assert wb("--kernels", str(kernels), "why", "tiny", env=env).stdout.startswith("tiny is fresh")


# 6 ---------------------------------------------------------------------------------------
def test_6_a_compile_error_shows_file_line_and_text_and_leaves_no_entry(tmp_path: Path) -> None:
    # A cache of its own: it counts the cache's entries, which another test worker's builds of
    # a family named tiny would add to (the session's torch header is shared, not rebuilt).
    own = tmp_path / "cache"
    share_pch(own)
    with knobs.override(WB_CACHE_DIR=str(own)):
        _compile_error_leaves_no_entry(tmp_path)


def _compile_error_leaves_no_entry(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path / "registry")
    lib = workbench.load(kernels, namespace=_ns())
    entries = set((cache.root() / "lib" / "tiny").iterdir())
    objects = set((cache.root() / "obj").glob("*/*"))
    source = kernels / "tiny" / "tiny.cpp"
    source.write_text(source.read_text().replace("out[i] = x[i]", "out[i] = x[i] +* ;"))
    with pytest.raises(BuildError) as info:
        lib.reload()
    assert f"{source}:8:" in str(info.value)
    assert "error: expected primary-expression" in str(info.value)  # the compiler's own text
    assert set((cache.root() / "lib" / "tiny").iterdir()) == entries
    assert set((cache.root() / "obj").glob("*/*")) == objects
    assert not list((cache.root() / "tmp").glob(f"tiny-{os.getpid()}-*"))
    assert torch.equal(lib.add_offset(torch.zeros(1)), torch.ones(1))  # last good build
    status = wb("--kernels", str(kernels), "status", "--json")
    (row,) = json.loads(status.stdout)
    assert row["state"] == "failed" and f"{source}:8:" in row["error"]
    write_registry(tmp_path / "registry", delta=2)
    lib.reload()
    assert torch.equal(lib.add_offset(torch.zeros(1)), torch.full((1,), 3.0))
    (row,) = json.loads(wb("--kernels", str(kernels), "status", "--json").stdout)
    assert row["state"] == "fresh"


# 7 ---------------------------------------------------------------------------------------
TWIN_KERNEL = """\
#include "{family}/kernel.h"
namespace {family} {{
template <typename T>
void fill(T* out, int64_t n) {{
  for (int64_t i = 0; i < n; ++i) out[i] = T(VALUE);
}}
WB_INSTANTIATE(WB_FLOAT32_64, fill)
}}  // namespace {family}
"""
TWIN_HEADER = """\
#pragma once
#include "wb/dtypes.h"
#define VALUE {value}
namespace {family} {{
template <typename T>
void fill(T* out, int64_t n);
}}
"""
TWIN_BINDING = """\
#include "{family}/kernel.h"
#include "wb/binding.h"

WB_DEF("{family}_value(Tensor x) -> Tensor");

static at::Tensor value(const at::Tensor& x) {{
  at::Tensor out = at::empty(x.sizes(), x.options());
  WB_DISPATCH(WB_FLOAT32_64, x.scalar_type(), "{family}_value", "x", [&] {{
    {family}::fill(wb::data<scalar_t>(out), out.numel());
  }});
  return out;
}}

WB_IMPL(CPU, m) {{ m.impl("{family}_value", &value); }}
"""


def test_7_one_base_name_in_two_folders_never_collides(tmp_path: Path) -> None:
    for family, value in (("alpha", 1), ("beta", 2)):
        folder = tmp_path / "kernels" / family
        folder.mkdir(parents=True)
        (folder / "kernel.cpp").write_text(TWIN_KERNEL.format(family=family))
        (folder / "kernel.h").write_text(TWIN_HEADER.format(family=family, value=value))
        (tmp_path / "bindings").mkdir(exist_ok=True)
        (tmp_path / "bindings" / f"{family}.cpp").write_text(TWIN_BINDING.format(family=family))
    lib = workbench.load(tmp_path / "kernels", namespace=_ns())
    x = torch.zeros(3)
    assert torch.equal(lib.alpha_value(x), torch.full((3,), 1.0))
    assert torch.equal(lib.beta_value(x), torch.full((3,), 2.0))
    keys = {
        f: {Path(t["source"]).name: t["key"] for t in lib.families[f].manifest["tus"]}
        for f in ("alpha", "beta")
    }
    assert keys["alpha"]["kernel.cpp"] != keys["beta"]["kernel.cpp"]
    (tmp_path / "kernels" / "beta" / "kernel.h").write_text(
        TWIN_HEADER.format(family="beta", value=5)
    )
    report = lib.reload()
    # beta's kernel and binding include beta/kernel.h; nothing of alpha is rebuilt
    rebuilt = sorted(p.relative_to(tmp_path).as_posix() for p in report.compiled)
    assert rebuilt == ["bindings/beta.cpp", "kernels/beta/kernel.cpp"]
    assert torch.equal(lib.alpha_value(x), torch.full((3,), 1.0))
    assert torch.equal(lib.beta_value(x), torch.full((3,), 5.0))


# 8 ---------------------------------------------------------------------------------------
DISK_FULL = """
import errno, json, os, resource, signal, sys, torch, workbench
from pathlib import Path
from workbench import build, cache, pch
from workbench.config import make_config
from workbench.errors import WorkbenchError
kernels, mode = sys.argv[1], sys.argv[2]
pch.ensure(make_config(), None)  # a toolchain artifact, made before the disk fills
root = cache.root()
filler = root.parent / "filler"
if mode == "tmpfs":  # fill the little filesystem, then give back 64 KiB
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    os.truncate(filler, os.path.getsize(filler) - 65536)
else:  # every file this process and its compilers write stops at 64 KiB (EFBIG)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited: compilers get EFBIG, not killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
try:
    workbench.load(kernels, namespace="wbfull")
    error = None
except WorkbenchError as e:
    error = f"{type(e).__name__}: {e}"
entries = sorted(p.name for p in (root / "lib").glob("tiny/*"))
objects = [(p.name, p.read_bytes()[:4] == b"\\x7fELF", p.with_suffix(".json").exists())
           for p in (root / "obj").glob("*/*.o")]
tmp = [p.name for p in (root / "tmp").iterdir()]
if mode == "tmpfs":
    filler.unlink()
else:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
lib = workbench.load(kernels, namespace="wbfull")
ok = torch.equal(lib.add_offset(torch.zeros(2)), torch.ones(2))
print(json.dumps({"error": error, "entries": entries, "objects": objects, "tmp": tmp, "ok": ok}))
"""


@pytest.mark.parametrize("mode", ["tmpfs", "file-size limit"])
def test_8_a_full_disk_is_a_clear_error_and_leaves_no_corrupt_entry(
    tmp_path: Path, mode: str
) -> None:
    kernels = write_registry(tmp_path / "project")
    fresh = tmp_path / "cache"
    fresh.mkdir()
    session_pch = knobs.cache_dir() / "v1" / "pch"
    session_pch.mkdir(parents=True, exist_ok=True)
    # The PCH folder stays outside the small filesystem (a symlink costs no room).
    setup = f'mkdir -p "{fresh}/v1" && ln -s "{session_pch}" "{fresh}/v1/pch"'
    prefix: list[str] = []
    if mode == "tmpfs":
        if not user_namespace_works():
            pytest.skip("no user namespaces here to mount a tmpfs")
        setup = f'mount -t tmpfs -o size=8m tmpfs "{fresh}" && {setup}'
        prefix = ["unshare", "-rm"]
    child = [*script(DISK_FULL), str(kernels), "tmpfs" if mode == "tmpfs" else "rlimit"]
    cmd = [*prefix, "sh", "-c", f'{setup} && exec "$@"', "sh", *child]
    env = child_env(WB_CACHE_DIR=str(fresh))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    error = report["error"]
    assert error is not None, "the build did not run out of room"
    assert f"no space left for the cache in {fresh}" in error and "WB_CACHE_DIR" in error
    assert report["entries"] == []  # no library entry, complete or not
    assert all(elf and log for _, elf, log in report["objects"])  # only whole objects
    assert report["tmp"] == []  # the build folder went with the failure
    assert report["ok"]  # with room again, the same build succeeds
