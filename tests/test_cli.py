"""The wb subcommands on a throwaway registry, with the real compiler and real processes."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import workbench
from tests.registry_fixture import write_registry
from tests.reliability_helpers import child_env, wb
from workbench import cache, inventory, knobs
from workbench.cli import main
from workbench.cli.progress import Progress

_count = iter(range(1_000_000))

SPEC = """\
import torch
from workbench.spec import OpSpec, Sample

def samples(dtype, device, gen):
    return [Sample((torch.arange(6, dtype=dtype, device=device),), "six")]

OPS = [OpSpec(name="add_offset", reference=lambda x: x + 1, samples=samples,
              fake=lambda x: torch.empty_like(x), dtypes=(torch.float32, torch.float64),
              devices=("cpu",))]
"""


def _ns() -> str:
    return f"wbcli{next(_count)}_{os.getpid()}"


def _cli(capsys: pytest.CaptureFixture[str], kernels: Path, *args: str) -> tuple[int, str]:
    code = main(["--kernels", str(kernels), "--namespace", _ns(), *args])
    return code, capsys.readouterr().out


def test_progress_line_names_the_tu_the_count_left_and_elapsed() -> None:
    stream = io.StringIO()
    p = Progress(stream, live=False)
    p.started("tiny", [Path("/k/tiny/tiny.cpp"), Path("/b/bindings/tiny.cpp")], parallel=1)
    assert p.status().startswith("tiny: compiling tiny/tiny.cpp · 2 of 2 left · ")
    p.finished("tiny", Path("/k/tiny/tiny.cpp"))
    assert p.status().startswith("tiny: compiling bindings/tiny.cpp · 1 of 2 left · ")
    assert p.status().endswith(" s")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "tiny: compiling 2 TU(s), -j 1"
    assert lines[1].startswith("tiny: [1/2 ") and lines[1].endswith("] tiny/tiny.cpp")


def test_wb_build_prints_plain_progress_lines_off_a_terminal(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path)
    out = wb("--kernels", str(kernels), "build", "add_offset", "-j", "1")  # an op name works
    assert out.returncode == 0, out.stderr
    assert "tiny: compiling " in out.stderr and "] tiny/tiny.cpp" in out.stderr
    assert "\r" not in out.stderr
    assert "tiny" in out.stdout and "built" in out.stdout
    again = wb("--kernels", str(kernels), "build", "--json")
    assert json.loads(again.stdout)[0]["state"] == "cached"


def test_status_and_why_follow_an_edit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kernels = write_registry(tmp_path)
    _, out = _cli(capsys, kernels, "status", "--json")
    assert json.loads(out)[0]["state"] == "never built"
    workbench.load(kernels, namespace=_ns())
    _, out = _cli(capsys, kernels, "status", "--json")
    (row,) = json.loads(out)
    devices = "cpu+cuda" if torch.cuda.is_available() else "cpu"
    assert row["state"] == "fresh" and row["devices"].startswith(devices) and row["size"] > 0
    write_registry(tmp_path, offset=7)  # a header edit
    _, out = _cli(capsys, kernels, "status", "--json")
    assert json.loads(out)[0]["state"] == "stale"
    code, out = _cli(capsys, kernels, "why", "add_offset")
    assert code == 0
    changes, _, paths = out.partition("how each TU builds:")
    assert f"file changed: {kernels / 'include' / 'tiny_common.h'}" in changes
    assert "tiny.cpp" not in changes and "toolchain" not in changes
    assert f"{kernels / 'tiny' / 'tiny.cpp'}: host compiler" in paths  # then how each TU builds


def test_gc_keeps_the_newest_and_what_a_process_has_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three builds: the oldest loaded by this process, the two newer built by child processes
    (which exit), so only the oldest is mapped. ``--keep 1`` removes the middle one; the newest
    stays as the newest, the oldest as loaded. ``--keep 0`` then removes the newest too."""
    from workbench.cli import gc

    kernels = write_registry(tmp_path / "registry")
    own = str(tmp_path / "cache")  # no other test's builds, and no other process maps these
    with knobs.override(WB_CACHE_DIR=own):
        lib = workbench.load(kernels, namespace=_ns())  # this process maps build 0
        for delta in (1, 2):
            write_registry(tmp_path / "registry", delta=delta)
            built = wb("--kernels", str(kernels), "build", env=child_env(WB_CACHE_DIR=own))
            assert built.returncode == 0, built.stderr
        newest, middle, oldest = inventory.entries("tiny", kernels.resolve())  # newest first
        assert oldest.library == lib.families["tiny"].library
        assert inventory.mapped_by([oldest.library]) and not inventory.mapped_by(
            [newest.library, middle.library]
        )
        size = gc.cache_size()
        code, out = _cli(capsys, kernels, "gc", "--keep", "1")
        assert code == 0 and "removed 1 build(s)" in out, out
        assert f"kept: tiny {oldest.key[:12]}: loaded by pid [{os.getpid()}]" in out
        left = inventory.entries("tiny", kernels.resolve())
        assert [e.key for e in left] == [newest.key, oldest.key]
        assert not middle.folder.exists() and gc.cache_size() < size
        code, out = _cli(capsys, kernels, "gc", "--keep", "0")
        assert code == 0 and "removed 1 build(s)" in out, out
        assert [e.key for e in inventory.entries("tiny", kernels.resolve())] == [oldest.key]
        assert torch.equal(lib.add_offset(torch.zeros(1)), torch.ones(1))  # still runs


def test_clean_removes_a_family_even_while_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = write_registry(tmp_path)
    import torch

    lib = workbench.load(kernels, namespace=_ns())
    code, out = _cli(capsys, kernels, "clean", "tiny")
    assert code == 0 and "removed 1 build(s)" in out
    assert "keeps its copy" in out  # Linux keeps the unlinked, mapped library alive
    assert inventory.entries("tiny", kernels.resolve()) == []
    assert torch.equal(lib.add_offset(torch.zeros(1)), torch.ones(1))  # still runs


def test_gc_max_size_brings_the_cache_under_the_limit_oldest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.cli import gc

    kernels = write_registry(tmp_path / "registry")
    own_cache = child_env(WB_CACHE_DIR=str(tmp_path / "cache"))  # nothing here maps its builds
    for delta in (0, 1, 2):
        write_registry(tmp_path / "registry", delta=delta)
        built = wb("--kernels", str(kernels), "build", env=own_cache)
        assert built.returncode == 0, built.stderr
    with knobs.override(WB_CACHE_DIR=str(tmp_path / "cache")):
        builds = inventory.entries("tiny", kernels.resolve())  # newest first
        assert len(builds) == 3
        size = gc.cache_size()
        limit = size - 1  # one byte too many: the oldest build must go, the newest must stay
        code, out = _cli(capsys, kernels, "gc", "--max-size", str(limit))
        assert code == 0 and "removed 1 build(s)" in out, out
        left = inventory.entries("tiny", kernels.resolve())
        assert [e.key for e in left] == [e.key for e in builds[:2]]
        assert gc.cache_size() <= limit
        code, out = _cli(capsys, kernels, "gc", "--max-size", "0")
        assert code == 0 and gc.cache_size() == 0  # nothing maps these builds: everything goes
        assert inventory.entries("tiny", kernels.resolve()) == []


def test_gc_rejects_bad_sizes() -> None:
    assert inventory.parse_size("2G") == 2 << 30 and inventory.parse_size("500MiB") == 500 << 20
    with pytest.raises(ValueError, match="bad size 'lots'"):
        inventory.parse_size("lots")
    with pytest.raises(SystemExit, match="--max-size: bad size"):
        main(["gc", "--max-size", "lots"])
    with pytest.raises(SystemExit, match="give --keep N"):
        main(["gc"])


def test_doctor_reports_each_check_and_fails_on_an_unusable_cache(tmp_path: Path) -> None:
    out = wb("doctor", "--json")
    assert out.returncode == 0, out.stdout
    checks = {f["check"]: f for f in json.loads(out.stdout)}
    for name in ("torch", "nvcc", "host compiler", "ninja", "GPU", "TORCH_CUDA_ARCH_LIST"):
        assert name in checks
    assert checks["cache dir"]["verdict"] == "OK"
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = wb("doctor", env=child_env(WB_CACHE_DIR=str(blocker / "c"), TORCH_CUDA_ARCH_LIST="x"))
    assert bad.returncode == 1
    assert "WB_CACHE_DIR" in bad.stdout and "bad CUDA arch 'x'" in bad.stdout


def test_compile_commands_are_the_real_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = write_registry(tmp_path)
    target = tmp_path / "cc.json"
    code, _ = _cli(capsys, kernels, "compile-commands", "-o", str(target))
    assert code == 0
    rows = {Path(r["file"]).as_posix(): r for r in json.loads(target.read_text())}
    kernel = rows[(kernels / "tiny" / "tiny.cpp").as_posix()]
    Path(kernel["output"]).parent.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(kernel["arguments"], cwd=kernel["directory"], capture_output=True)
    assert run.returncode == 0, run.stderr  # clangd sees what the build compiles
    assert sum("registry.cpp" in f for f in rows) == 1


def test_watch_rebuilds_and_rechecks_on_save(tmp_path: Path) -> None:
    kernels = write_registry(tmp_path)
    (kernels / "tiny" / "spec.py").write_text(SPEC)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench",
            "--kernels",
            str(kernels),
            "--namespace",
            "wbwatch",
            "watch",
            "--max-cycles",
            "2",
            "--interval",
            "0.1",
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("cycle 1: rebuilt") and " passed, 0 failed" in first, first
    time.sleep(0.01)
    write_registry(tmp_path, delta=10)  # a save that breaks the op: x + 11, not x + 1
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err
    second = out.splitlines()[0]
    assert second.startswith("cycle 2: rebuilt tiny/tiny.cpp in ")
    assert re.search(r"checks: \d+ passed, [1-9]\d* failed", second), second
    assert "FAIL add_offset cpu float32" in out
    # Both cycles' builds finished: the watcher left no build folder of its own behind.
    assert not list((cache.root() / "tmp").glob(f"*-{proc.pid}-*"))


def test_every_subcommand_parses_its_help() -> None:
    """A subcommand that adds an option the global ones already give breaks the whole parser."""
    from workbench.cli import COMMANDS, parser

    for name in COMMANDS:
        with pytest.raises(SystemExit) as done:
            parser().parse_args([name, "--help"])
        assert done.value.code == 0, name
