"""gc and clean against a process about to open a library: the use lock (real processes).

A loader is held, by a hook, between finding its library in the cache and opening it (where a
removal would make its dlopen fail). ``wb gc`` must skip the library and ``wb clean`` must wait;
the loader then opens it. A loader killed while it holds the lock holds nothing: locks are
flocks and die with their holder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.registry_fixture import write_registry
from tests.reliability_helpers import PYTHON, ROOT, child_env, script, share_pch, wb

# The loader: held by the hook until the file "go" exists, then it opens the library and runs.
LOADER = """
import sys, time
from pathlib import Path
import torch, workbench
from workbench import api

folder = Path(sys.argv[1])

def hold(built):
    (folder / "ready").write_text(" ".join(str(b.library) for b in built))
    while not (folder / "go").exists():
        time.sleep(0.02)

api.before_open_hooks.append(hold)
lib = workbench.load(folder / "kernels", namespace="wbuse")
print(lib.add_offset(torch.zeros(2)).tolist())
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A cache of the test's own (gc --keep 0 empties it), sharing the session's torch PCH."""
    cache = tmp_path / "cache"
    share_pch(cache)
    return child_env(WB_CACHE_DIR=str(cache))


def _start_loader(root: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*script(LOADER), str(root)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (root / "ready").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the loader never reached the library"
        time.sleep(0.02)
    return proc


def test_gc_skips_and_clean_waits_for_a_library_being_opened(
    tmp_path: Path, env: dict[str, str]
) -> None:
    kernels = write_registry(tmp_path, offset=5)
    built = wb("--kernels", str(kernels), "build", env=env)  # built; no process has it mapped
    assert built.returncode == 0, built.stderr
    loader = _start_loader(tmp_path, env)
    library = Path((tmp_path / "ready").read_text())
    assert library.is_file()

    gc = wb("gc", "--keep", "0", env=env)
    assert gc.returncode == 0, gc.stderr
    assert "tiny" in gc.stdout and "being loaded now" in gc.stdout
    assert library.is_file()

    clean = subprocess.Popen(
        [PYTHON, "-m", "workbench", "--kernels", str(kernels), "clean"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)
    assert clean.poll() is None, clean.communicate()  # waiting for the loader
    assert library.is_file()
    (tmp_path / "go").write_text("")
    out, err = loader.communicate(timeout=120)
    assert loader.returncode == 0, err
    assert out.strip() == "[5.0, 5.0]"
    cleaned, waited = clean.communicate(timeout=120)
    assert clean.returncode == 0, waited
    assert "waiting for a process loading tiny" in waited
    assert "removed 1 build(s)" in cleaned  # after the loader had mapped it


def test_a_killed_loader_leaves_no_lock_behind(tmp_path: Path, env: dict[str, str]) -> None:
    kernels = write_registry(tmp_path, offset=6)
    assert wb("--kernels", str(kernels), "build", env=env).returncode == 0
    loader = _start_loader(tmp_path, env)
    library = Path((tmp_path / "ready").read_text())
    loader.send_signal(signal.SIGKILL)
    loader.wait(timeout=30)
    gc = wb("gc", "--keep", "0", env=env)
    assert gc.returncode == 0 and "being loaded" not in gc.stdout, gc.stdout + gc.stderr
    assert not library.exists()


def test_use_locks_are_per_family_bytes_of_one_file() -> None:
    """A load's shared use locks stop an exclusive lock on those families only; each lock is
    held by its own open file, so it conflicts inside one process too, and goes with the file."""
    from workbench import cache

    with cache.use_locks(["alpha", "beta", "alpha"]):
        for family, free in (("alpha", False), ("beta", False), ("gamma", True)):
            with cache.use_lock_exclusive(family, wait=False) as got:
                assert got is free, family
        with cache.use_locks(["beta"]):  # shared: loads never wait for each other
            pass
    with cache.use_lock_exclusive("alpha", wait=False) as got:
        assert got
        with cache.use_locks(["gamma"]):  # another family's byte
            pass
    names = os.listdir(cache.root() / "locks")
    assert "use.lock" in names and not [n for n in names if n.startswith("use-")], names
