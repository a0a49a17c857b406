"""The measurement runner, ``python -m bench``: listing, an unknown name, the environment every
report starts with, and that every measurement module is one the runner lists and can run."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import common

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(
    p.stem
    for p in (ROOT / "bench").glob("*.py")
    if p.stem not in ("__init__", "__main__", "common")
)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bench", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


def listed(stdout: str) -> dict[str, str]:
    rows = [re.match(r"  (\w+)\s+(.+)$", line) for line in stdout.splitlines()]
    return {m[1]: m[2] for m in rows if m}


@pytest.mark.parametrize("args", [(), ("--list",)])
def test_the_runner_lists_every_measurement_with_one_line(args: tuple[str, ...]) -> None:
    proc = bench(*args)
    assert proc.returncode == 0, proc.stderr
    names = listed(proc.stdout)
    assert sorted(names) == MODULES
    assert "warm_start" in names and "device_compile" in names
    assert all(summary and summary != "(no docstring)" for summary in names.values())
    assert names["warm_start"].startswith("Warm start of a registry in new processes")


def test_an_unknown_name_exits_2_naming_the_known_ones() -> None:
    proc = bench("warmstart")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "no measurement named 'warmstart'" in proc.stderr
    known = proc.stderr.split("known: ", 1)[1].strip().split(", ")
    assert known == MODULES


def test_a_measurement_takes_its_own_options() -> None:
    proc = bench("device_compile", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m bench device_compile")
    assert "--arch" in proc.stdout and "--tu" in proc.stdout
    proc = bench("device_compile", "--repeats", "0")
    assert proc.returncode == 1 and "--repeats must be at least 1" in proc.stderr


@pytest.mark.parametrize("name", MODULES)
def test_every_measurement_module_runs_from_the_runner(name: str) -> None:
    """A module of bench/ that is not shared code is a measurement: it has a ``main(argv)`` and a
    usage line naming the command that runs it, so a new one cannot be left out of the runner."""
    module = importlib.import_module(f"bench.{name}")
    assert callable(module.main)
    usage = rf"^Usage: (\w+=\S+ )*python -m bench {name}( |$)"  # after environment settings
    assert re.search(usage, module.__doc__ or "", re.MULTILINE), module.__doc__
    assert "scripts/bench" not in Path(module.__file__).read_text()


def test_the_environment_has_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WB_COMMIT", raising=False)
    env = common.environment()
    fields = env.to_dict()
    assert set(fields) == {"date", "host", "cpu", "gpu", "torch", "cuda", "commit"}
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", env.date)
    assert env.cpu.endswith(" cores") and env.torch and env.commit
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()  # fmt: skip
    assert env.commit == (head or "unknown")
    line = env.line("cpu")
    assert line.startswith(f"{env.date}, {env.cpu}, torch {env.torch}") and env.commit in line


def test_the_commit_given_by_wb_commit_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the tree may carry a .git that is not at the copied commit."""
    monkeypatch.setenv("WB_COMMIT", "abc1234")
    assert common.commit() == "abc1234"


def test_spread_and_table_helpers() -> None:
    s = common.Spread.of([3.0, 1.0, 2.0, 10.0])
    assert (s.min, s.median, s.max) == (1.0, 2.5, 10.0)
    assert s.scaled(1e3).to_dict() == {"min": 1e3, "median": 2.5e3, "max": 1e4}
    with pytest.raises(ValueError):
        common.Spread.of([])
    table = common.markdown_table(("a", "b"), [(1, "x")], align="lr")
    assert table == "| a | b |\n| --- | ---: |\n| 1 | x |"


@pytest.mark.parametrize(
    "result", sorted((ROOT / "bench" / "results").glob("*.md")), ids=lambda p: p.name
)
def test_every_result_names_the_command_that_regenerates_it(result: Path) -> None:
    """At its top; and every measurement a result names is one the runner knows."""
    text = result.read_text()
    assert text.splitlines()[2].startswith("Regenerate: "), result.name
    named = set(re.findall(r"python3? -m bench (\w+)", " ".join(text.split())))
    assert named <= set(MODULES), named - set(MODULES)


def test_the_reload_benches_edit_text_the_bundled_kernels_hold() -> None:
    """reload_matmul edits one line of each tensor-core kernel and waits for its effect: the line
    must stand exactly once in the bundled file (a refactor that moved it broke the bench on a GPU
    host, where nothing on this one noticed)."""
    from bench.reload_matmul import MATMUL_EDITS

    for name, (file, old, new) in MATMUL_EDITS.items():
        text = (common.ROOT / "kernels" / "matmul" / file).read_text()
        assert text.count(old) == 1, (name, file, old)
        assert "{k}" in new and new.format(k=3) != old, name
