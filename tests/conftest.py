"""Shared fixtures: one cache per test session, the bundled library, device parameters."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from workbench import build, knobs

HAS_CUDA = torch.cuda.is_available()
HAS_NVCC = shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _sigint_state() -> tuple[object, bool]:
    return signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(
        signal.SIG_BLOCK, []
    )


def _a_share_of_the_cores() -> None:
    """Under pytest-xdist, each worker's torch takes its share of the cores (one thread where there
    are as many workers as cores, or more), and so do the processes its tests start
    (OMP_NUM_THREADS): every worker running torch's default, a thread per core, oversubscribes the
    machine, and OpenMP's threads then wait on each other. On a 2-core machine with 2 workers a CPU
    check of layer_norm_backward took 64 s that way and 5 s with one thread. An OMP_NUM_THREADS
    the caller set is left as it is."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


_a_share_of_the_cores()

# As this process found it: a shell ignores SIGINT in a job it starts in the background.
SIGINT_AT_START = _sigint_state()


# The test files that take longest (compiles, mostly; seconds on a 2-core machine in CI), run
# first: pytest-xdist hands its workers whole files in collection order (scripts/test.sh passes
# --no-loadscope-reorder, which keeps it), so that none of these starts last while the other
# worker has run out of files. xdist's own order, most tests first, left test_cli_smoke (four
# tests, 435 s) to the end of the queue.
SLOW_FIRST = (
    "test_cli_smoke.py",  # every bundled kernel for every arch: 470 s
    "test_compat_pch.py",  # torch headers precompiled and compiled against: 250 s
    "test_reliability.py",
    "test_compat.py",
    "test_adopt.py",
    "test_compat_parity.py",
    "test_reload.py",
    "test_team_cache.py",
    "test_device_matmul.py",
    "test_compat_removed.py",
    "test_check_planted.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items[:] = sorted(items, key=lambda item: rank.get(item.path.name, len(rank)))  # stable
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU"))
        # On CI the CUDA smoke compile must run: a missing nvcc fails there instead of skipping.
        if "nvcc" in item.keywords and not HAS_NVCC and not os.environ.get("CI"):
            item.add_marker(pytest.mark.skip(reason="nvcc not found"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session: the precompiled torch header is built once.

    ``WB_TEST_CACHE_DIR`` names it instead of a new temporary folder: CI passes the folder its
    smoke-compile stage then reads, so that stage finds every object the tests compiled. Under
    pytest-xdist the workers share one (the cache's locks make that safe), so each build of the
    bundled kernels or the torch header happens once."""
    shared = os.environ.get("WB_TEST_CACHE_DIR")
    if shared:
        path = Path(shared).resolve()
    elif os.environ.get("PYTEST_XDIST_WORKER"):  # one cache for all workers: a build is shared
        path = tmp_path_factory.getbasetemp().parent / "wb-cache"
    else:
        return tmp_path_factory.mktemp("wb-cache")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(autouse=True)
def _sigint_as_python_leaves_it(request: pytest.FixtureRequest) -> None:
    """SIGINT handled by Python's default handler and unblocked before each test: a child process
    inherits an ignored or blocked SIGINT, and the tests that interrupt one (Ctrl-C, a notebook's
    stop button) then wait for a process that never hears it (twice in runs of CI started as a
    background job). Where a test left it otherwise, a warning names the test it was found
    changed before."""
    if threading.current_thread() is not threading.main_thread():
        return
    state = _sigint_state()
    if state != (signal.default_int_handler, False):
        if state != SIGINT_AT_START:
            handler, blocked = state
            warnings.warn(
                f"SIGINT was {handler!r}{', blocked' if blocked else ''} before "
                f"{request.node.nodeid}: restored",
                stacklevel=1,
            )
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture(autouse=True)
def _session_cache(cache_dir: Path) -> Iterator[None]:
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        yield


@pytest.fixture(scope="session")
def lib(cache_dir: Path):  # type: ignore[no-untyped-def]
    """The bundled registry, loaded once for the session."""
    import workbench

    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        return workbench.load()


@pytest.fixture
def compiled() -> Iterator[list[str]]:
    """'folder/file' of every TU compiled while the test runs (the build's compile hook)."""
    names: list[str] = []

    def hook(family: str, source: Path) -> None:
        names.append(f"{source.parent.name}/{source.name}")

    build.compile_hooks.append(hook)
    yield names
    build.compile_hooks.remove(hook)
