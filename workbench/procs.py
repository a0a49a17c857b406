"""Compiler processes that end with the build that started them.

A notebook's stop button, or a signal sent to the Python process alone, interrupts Python and
not its children. When Python killed only the process it started, the compiler under it
(``g++`` -> ``cc1plus``, ninja -> ``sh`` -> ``nvcc`` -> ``cicc``) kept running, orphaned, for as
long as its compile took: a precompiled torch header's minutes of a core each time.

Here every command runs in a process group of its own. On any exception while it runs
(KeyboardInterrupt included), :func:`stop` ends the command and everything under it. ninja puts
each of its jobs in a group of its own, so :func:`stop` signals every group found under the
command: SIGTERM first (ninja forwards it to its jobs and waits for them), then SIGKILL for any
group still there after :data:`GRACE` seconds. Standard library only; the descendants are read
from ``/proc`` (where it is absent only the command's own group is signalled).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

GRACE = 5.0  # seconds between SIGTERM and SIGKILL


def run(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, stdin=DEVNULL)``, with the command
    in a process group of its own that :func:`stop` ends on any exception (a timeout raises
    ``subprocess.TimeoutExpired`` once it has)."""
    with subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            stop(proc)
            raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def lines(proc: subprocess.Popen[str], poll: float = 0.1) -> Iterator[str]:
    """The lines of ``proc``'s stdout as they come, read on a thread of their own so that this
    thread wakes every ``poll`` seconds: a signal handler (KeyboardInterrupt) then runs within
    that time even where SIGINT's handler was installed with SA_RESTART, which restarts a read
    of the pipe instead of interrupting it (a build that then noticed a notebook's stop button
    only when its compile ended)."""
    assert proc.stdout is not None
    stream = proc.stdout
    got: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        try:
            for line in stream:
                got.put(line)
        except (OSError, ValueError):  # the pipe closed under the reader: the build was stopped
            pass
        finally:
            got.put(None)

    threading.Thread(target=read, name="wb-procs-lines", daemon=True).start()
    while True:
        try:
            line = got.get(timeout=poll)
        except queue.Empty:
            continue
        if line is None:
            return
        yield line


def stop(proc: subprocess.Popen[Any]) -> None:
    """End ``proc`` and every process under it: SIGTERM to each of their process groups (never
    the caller's own), then SIGKILL to them where any is left after GRACE seconds; reap ``proc``."""
    if proc.poll() is not None:
        return
    groups = _groups_under(proc.pid)
    _signal(groups, signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline and (proc.poll() is None or _alive(groups)):
        time.sleep(0.02)
    if proc.poll() is None or _alive(groups):
        _signal(groups, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _signal(groups: list[int], sig: signal.Signals) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


def _groups_under(pid: int) -> list[int]:
    """The process groups of ``pid`` and of every process under it, the caller's own left out
    (a command started without a group of its own shares it)."""
    own = os.getpgrp()
    tree = _process_table()
    found, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _) in tree.items():
            if ppid == parent and child not in found:
                found.add(child)
                frontier.append(child)
    groups = {tree[p][1] for p in found if p in tree}
    if pid not in tree:  # no /proc: the command's own group, where it leads one
        groups.add(pid)
    return sorted(g for g in groups if g != own and g > 0)


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group), from /proc ({} where it is absent)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":  # a zombie holds no CPU and no files: nothing to end
            table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def _alive(groups: list[int]) -> bool:
    """Whether a live (not zombie) process is left in any of ``groups``."""
    if not groups:
        return False
    left = {g for _, g in _process_table().values()}
    return any(g in left for g in groups)
