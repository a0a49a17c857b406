"""A build interrupted with SIGINT (the notebook's stop button) leaves no lock and no entry."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.reliability_helpers import running
from workbench import cache, knobs

# A TU whose compile takes as long as SPIN says: constexpr evaluation in the compiler.
SLOW = """\
#include <pybind11/pybind11.h>
constexpr long spin(long n) { long s = 0; for (long i = 0; i < n; ++i) s += i % 7; return s; }
static_assert(spin(SPIN) >= 0, "spin");
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("spun", [] { return spin(SPIN); }); }
"""
FLAGS = ["-fconstexpr-ops-limit=100000000000", "-fconstexpr-loop-limit=2000000000"]


def _load_code(src: Path, spin: int) -> str:
    return textwrap.dedent(
        f"""
        import workbench
        m = workbench.load("slow_ext", [{str(src)!r}], extra_cflags={[*FLAGS, f"-DSPIN={spin}"]!r},
                           verbose=True)
        print("result", m.spun(), flush=True)
        """
    )


def test_sigint_mid_compile_leaves_no_lock_and_no_partial_entry(tmp_path: Path) -> None:
    src = tmp_path / "slow.cpp"
    src.write_text(SLOW)
    env = dict(os.environ, WB_CACHE_DIR=knobs.cache_dir().as_posix(), WB_JOBS="1")
    log = tmp_path / "load.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", _load_code(src, 1_000_000_000)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=_as_a_kernel_starts_it,
        )
        while not (compilers := _children_named(proc.pid, ("cc1plus",))):  # the compiler runs
            assert proc.poll() is None, f"the load ended before it compiled:\n{log.read_text()}"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)  # the process alone, as a notebook's stop button does
        proc.wait(timeout=120)
    out = log.read_text()
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in out
    # No compiler left running: not under the load (gone with it), nor orphaned (the pids seen).
    left = [pid for pid in compilers if running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the interrupted load left its compiler running"
    root = cache.root()
    assert not [p for p in (root / "tmp").iterdir() if p.name.startswith("compat-slow_ext")]
    assert not (root / "compat" / "slow_ext").exists() or not any(
        (root / "compat" / "slow_ext").iterdir()
    )
    lock = os.open(root / "locks" / "compat-slow_ext.lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody holds it
    finally:
        os.close(lock)
    done = subprocess.run(
        [sys.executable, "-c", _load_code(src, 1000)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "result" in done.stdout


def _as_a_kernel_starts_it() -> None:
    """SIGINT as a notebook kernel's process has it (the default action, unblocked), whatever an
    earlier test in this worker process left of its own."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    parents = {int(c): int(p) for c, p in (line.split() for line in out.splitlines())}
    found, frontier = [], {pid}
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        found += kids
        frontier = set(kids)
    return found


def _children_named(pid: int, names: tuple[str, ...]) -> list[int]:
    result = []
    for child in _descendants(pid):
        try:
            comm = Path(f"/proc/{child}/comm").read_text().strip()
        except OSError:
            continue
        if comm in names:
            result.append(child)
    return result
