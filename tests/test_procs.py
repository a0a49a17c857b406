"""A build interrupted while a compiler runs leaves no process behind it.

Each command here starts a grandchild (``sleep``, standing in for ``cc1plus`` under ``g++`` or
``cicc`` under nvcc) that records its pid and outlives its parent unless its group is ended.
A real SIGINT is sent to the test's main thread while the command runs (as a notebook's stop
button sends one to the kernel's process); the build must raise KeyboardInterrupt and the
grandchild must be gone, not left running as an orphan.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.reliability_helpers import running
from workbench import ninja, procs


def _script(pidfile: Path) -> str:
    """A shell that starts a long sleep, writes its pid, then waits on it."""
    return f"sleep 300 & echo $! > {pidfile}; wait"


def _pid_from(pidfile: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"the command never wrote {pidfile}")


@contextmanager
def sigint_once(pidfile: Path, restart: bool = False) -> Iterator[None]:
    """SIGINT to this (the main) thread once the grandchild's pid is written. ``restart``: its
    handler with SA_RESTART meanwhile (as some hosts install it), so that a read of a pipe is
    restarted, not interrupted."""
    main = threading.main_thread().ident
    assert main == threading.get_ident()

    def send() -> None:
        _pid_from(pidfile)
        time.sleep(0.1)
        assert main is not None
        signal.pthread_kill(main, signal.SIGINT)

    sender = threading.Thread(target=send, daemon=True)
    signal.siginterrupt(signal.SIGINT, not restart)
    sender.start()
    try:
        yield
    finally:
        sender.join()
        signal.siginterrupt(signal.SIGINT, True)


def _assert_gone(*pids: int) -> None:
    left = [pid for pid in pids if running(pid)]
    for pid in left:  # not to leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not left, f"pids {left} still ran: orphans of the interrupted build"


@pytest.mark.parametrize("restart", [False, True], ids=["eintr", "sa_restart"])
def test_an_interrupted_command_ends_with_what_it_started(tmp_path: Path, restart: bool) -> None:
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), sigint_once(pidfile, restart):
        procs.run(["sh", "-c", _script(pidfile)])
    assert time.monotonic() - start < procs.GRACE + 30  # not the sleep's 300 s
    _assert_gone(_pid_from(pidfile))


def test_a_timed_out_command_ends_with_what_it_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        procs.run(["sh", "-c", _script(pidfile)], timeout=1.0)
    assert time.monotonic() - start < procs.GRACE + 10
    _assert_gone(_pid_from(pidfile))


def test_a_finished_command_reads_as_subprocess_run_does(tmp_path: Path) -> None:
    done = procs.run(["sh", "-c", "echo out; echo err >&2; exit 3"], cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


@pytest.mark.parametrize("restart", [False, True], ids=["eintr", "sa_restart"])
def test_an_interrupted_ninja_build_ends_its_jobs_and_their_children(
    tmp_path: Path, restart: bool
) -> None:
    """ninja runs each job in a process group of its own: killing ninja alone left them
    running, as it left cc1plus under g++ after a notebook's stop button. With SA_RESTART the
    build, blocked reading ninja's output, heard the interrupt only when the jobs ended."""
    pidfiles = [tmp_path / f"pid{i}" for i in range(2)]
    jobs = [
        ninja.Job(tmp_path / f"out{i}.o", tmp_path / f"src{i}.cpp", ("sh", "-c", _script(p)))
        for i, p in enumerate(pidfiles)
    ]
    for job in jobs:
        job.source.touch()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), sigint_once(pidfiles[1], restart):
        ninja.run(tmp_path, jobs, parallel=2)
    assert time.monotonic() - start < procs.GRACE + 30  # not the sleep's 300 s
    _assert_gone(*(_pid_from(p) for p in pidfiles))
