"""``wb tune`` on a real family (tests/tune_fixture.py): build every variant, disqualify the wrong
one, report the one that does not compile, time the rest, pick a winner per bucket, route the op
to it in C++, remember it for new processes, and forget it when the sources change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import workbench
from tests.tune_fixture import LARGE, SMALL, traced, write_tuned_registry
from workbench import knobs
from workbench.errors import WorkbenchError
from workbench.tuning import store
from workbench.tuning.space import TuneError
from workbench.tuning.store import PLAIN

ROOT = Path(__file__).resolve().parent.parent
NS = f"wbtunerun{os.getpid()}"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tuned_registry(tmp_path_factory.mktemp("tuned"))


@pytest.fixture(scope="module")
def tuned(registry: Path, cache_dir: Path) -> tuple[workbench.Library, object]:
    with knobs.override(WB_CACHE_DIR=str(cache_dir), WB_QUIET="1"):
        lib = workbench.load(registry, namespace=NS)
        result = workbench.tune("add_offset", lib=lib, device="cpu", min_time=0.05)
    return lib, result


def _env(cache_dir: Path, trace: Path) -> dict[str, str]:
    env = dict(os.environ, WB_CACHE_DIR=str(cache_dir), WB_QUIET="1", TINY_TRACE=str(trace))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_each_variant_is_built_checked_or_reported(tuned: tuple) -> None:
    _, result = tuned
    status = {v.label: v for v in result.variants}
    assert {k: v.status for k, v in status.items()} == {
        "MODE=0": "checked",
        "MODE=1": "checked",
        "MODE=2": "checked",
        "MODE=3": "wrong",
        "MODE=4": "build failed",
    }
    # The wrong one is shown with its worst element and was never timed.
    assert "got" in status["MODE=3"].detail and "expected" in status["MODE=3"].detail
    assert all("MODE=3" not in s.times and "MODE=4" not in s.times for s in result.sizes)
    # The one that does not compile is shown with its first compiler error.
    assert (
        "tiny.cpp" in status["MODE=4"].detail and "mode 4 does not build" in status["MODE=4"].detail
    )
    text = str(result)
    assert "MODE=3" in text and "wrong" in text and "noise band" in text


def test_a_winner_per_bucket(tuned: tuple) -> None:
    _, result = tuned
    assert result.winners == ["MODE=2", "MODE=1"]  # small inputs, then large ones
    assert len(result.bounds) == 1 and SMALL < result.bounds[0] <= LARGE
    small, large = sorted(result.sizes, key=lambda s: s.numel)
    assert small.best == "MODE=2" and large.best == "MODE=1"
    assert small.verdict("MODE=0") == "slower" and large.verdict("MODE=2") == "slower"


def test_the_op_routes_to_the_winner_of_its_bucket_in_process(
    tuned: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib, _ = tuned
    trace = tmp_path / "trace"
    monkeypatch.setenv("TINY_TRACE", str(trace))
    for n, mode in [(SMALL, 2), (LARGE, 1), (10, 2), (3 << 22, 1)]:
        x = torch.randn(n)
        assert torch.equal(lib.add_offset(x), x + 1)
        assert traced(trace) == [mode], n
    # Another dtype has no table: the plain build serves it (its #ifndef default, MODE 0).
    lib.add_offset(torch.randn(SMALL, dtype=torch.float64))
    assert traced(trace) == [0]
    # torch.compile sees the one op; the router still picks by bucket inside it.
    compiled = torch.compile(lambda x: getattr(torch.ops, NS).add_offset(x) * 2, backend="eager")
    x = torch.randn(SMALL)
    assert torch.equal(compiled(x), (x + 1) * 2)
    assert traced(trace) == [2]


def test_a_new_process_dispatches_to_the_winners_without_timing_or_compiling(
    tuned: tuple, registry: Path, cache_dir: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    code = f"""
import json, sys, torch, workbench
lib = workbench.load({str(registry)!r}, namespace="wbtunechild")
print(json.dumps({{"compiled": [str(p) for p in lib.last.compiled], "tuned": lib.last.tuned}}))
lib.add_offset(torch.randn({SMALL}))
lib.add_offset(torch.randn({LARGE}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(cache_dir, trace)
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"compiled": [], "tuned": ["tiny"]}
    assert traced(trace) == [2, 1]


def test_a_second_tune_compiles_nothing_and_vs_last_says_what_changed(
    tuned: tuple, cache_dir: Path
) -> None:
    lib, _ = tuned
    again = workbench.tune("add_offset", lib=lib, device="cpu", min_time=0.05, vs="last")
    assert again.compiled == 0
    assert again.previous is not None and again.winners == ["MODE=2", "MODE=1"]
    lines = "\n".join(again.vs_lines())
    assert "same winners" in lines and "best MODE=1" in lines


def test_an_edit_of_the_family_drops_its_choice(
    tuned: tuple, registry: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib, _ = tuned
    kernel = registry / "tiny" / "tiny.cpp"
    old_key = lib.families["tiny"].key
    original = kernel.read_text()
    trace = tmp_path / "trace"
    monkeypatch.setenv("TINY_TRACE", str(trace))
    try:
        kernel.write_text(original + "// an edit\n")
        report = lib.reload()
        assert report.swapped == ["tiny"] and report.tuned == []
        lib.add_offset(torch.randn(SMALL))
        assert traced(trace) == [0]  # the plain build: untuned until tuned again
        assert store.lookup("tiny", old_key) is not None  # the old build's choice is kept
        assert store.lookup("tiny", lib.families["tiny"].key) is None
    finally:
        kernel.write_text(original)
        report = lib.reload()
    assert report.tuned == ["tiny"]  # back to the tuned sources: back to the winners
    lib.add_offset(torch.randn(LARGE))
    assert traced(trace) == [1]


def test_declared_buckets_and_an_empty_bucket(tuned: tuple) -> None:
    _, result = tuned
    result.choose((16, 1 << 20, 1 << 30))
    # numel < 16: nothing timed there, so the plain build; the rest as measured. A bucket that
    # no size reached beyond the last one keeps the plain build as well.
    assert result.bounds == [16, 1 << 20, 1 << 30]
    assert result.winners == [PLAIN, "MODE=2", "MODE=1", PLAIN]


def test_forget_and_the_cli(tuned: tuple, registry: Path, cache_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    env = _env(cache_dir, trace)
    wb = [sys.executable, "-m", "workbench", "--kernels", str(registry), "--namespace", "wbcli"]
    out = subprocess.run(
        [*wb, "tune", "add_offset", "--sizes", "n1024", "--min-time", "0.05", "--no-save"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "winners" in out.stdout and "MODE=2" in out.stdout and "build failed" in out.stdout
    forget = subprocess.run(
        [*wb, "tune", "add_offset", "--forget"], capture_output=True, text=True, env=env
    )
    assert forget.returncode == 0 and "forgot the winners of add_offset" in forget.stdout
    child = subprocess.run(
        [sys.executable, "-c", f"import workbench; print(workbench.load({str(registry)!r}, "
         "namespace='wbf').last.tuned)"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert child.stdout.strip() == "[]", child.stderr


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": 0}, "budget must be a positive"),
        ({"jobs": 0}, "jobs must be >= 1"),
        ({"vs": "yesterday"}, "vs must be 'last'"),
        ({"sizes": ["n3"]}, r"no sizes \['n3'\]"),
        ({"device": "tpu"}, "device must be 'cpu' or 'cuda'"),
    ],
)
def test_bad_arguments_are_named(tuned: tuple, kwargs: dict, message: str) -> None:
    lib, _ = tuned
    with pytest.raises(WorkbenchError, match=message):
        workbench.tune("add_offset", lib=lib, **kwargs)


def test_an_op_without_a_space_says_how_to_declare_one(lib: workbench.Library) -> None:
    with pytest.raises(TuneError, match="declares no tuning space: add TUNE = TuneSpace"):
        workbench.tune("rms_norm", lib=lib, device="cpu")


def test_a_space_that_reaches_no_tu_here_says_so(lib: workbench.Library) -> None:
    # scale's space tunes the CUDA launcher; its CPU kernel reads none of it, so on a CPU build
    # every point is the plain library: checked once, and nothing to tune.
    with pytest.raises(TuneError, match="every point of the space builds the same library here"):
        workbench.tune("scale", lib=lib, device="cpu", min_time=0.05)


def test_the_result_shows_itself_in_a_notebook(tuned: tuple, tmp_path: Path) -> None:
    _, result = tuned
    page = result._repr_html_()
    assert "MODE=2" in page and "noise band" in page and "winners" in page
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # the text tables still show; the heatmap names what it needs
        assert "<svg" not in page
        with pytest.raises(WorkbenchError, match="matplotlib"):
            result.plot(tmp_path / "heat.png")
        return
    assert "<svg" in page  # the heatmap: variant x size, time over the best of the size
    result.plot(tmp_path / "heat.png")
    assert (tmp_path / "heat.png").read_bytes()[:4] == b"\x89PNG"
