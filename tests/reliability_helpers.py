"""Helpers for the reliability tests: child Python processes, wrappers, private namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from workbench import knobs

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this test's cache, this checkout first on the path."""
    env = dict(os.environ, WB_CACHE_DIR=str(knobs.cache_dir()), WB_QUIET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def script(code: str) -> list[str]:
    return [PYTHON, "-c", textwrap.dedent(code)]


def wb(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m workbench ARGS`` in a child process."""
    return subprocess.run(
        [PYTHON, "-m", "workbench", *args],
        env=env or child_env(),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def share_pch(cache_dir: Path) -> None:
    """Point a fresh cache's precompiled-header folder at the session cache's.

    The torch PCH is a toolchain artifact, not a build of any family; sharing it keeps a test
    with an empty cache from spending a minute precompiling torch headers.
    """
    session_pch = knobs.cache_dir() / "v1" / "pch"
    session_pch.mkdir(parents=True, exist_ok=True)
    (cache_dir / "v1").mkdir(parents=True, exist_ok=True)
    (cache_dir / "v1" / "pch").symlink_to(session_pch)


def user_namespace_works() -> bool:
    """Whether ``unshare -rm`` can give a test its own mounts (tmpfs, read-only binds)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run(
        [
            unshare,
            "-rm",
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || "
            "mount -t tmpfs -o size=64k tmpfs /tmp",
        ],
        capture_output=True,
    )
    return probe.returncode == 0


def write_compiler_wrapper(path: Path, version: str, slow_env: str | None = None) -> None:
    """A C++ compiler that is g++ but reports ``version``; replaced atomically (new inode).

    With ``slow_env`` set, each TU compile (``-c``; not the header precompile) sleeps after g++
    when that variable is set, so that a test can kill the build while the edge is in flight.
    """
    slow = (
        f'case " $* " in *" -c "*) [ -n "${{{slow_env}:-}}" ] && sleep 120;; esac\n'
        if slow_env
        else ""
    )
    text = (
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then echo "g++ (wb-test) {version}"; exit 0; fi\n'
        'g++ "$@"\nrc=$?\n' + slow + "exit $rc\n"
    )
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)


def edit(path: Path, old: str, new: str) -> None:
    """Replace ``old`` (which must be there) with ``new`` in the file at ``path``."""
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has ended), read from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"
