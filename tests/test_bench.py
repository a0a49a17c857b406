"""wb bench on the CPU: verify then time, A/A control, rounds, roofline, stored results, CLI
outputs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench
from tests.registry_fixture import write_registry
from workbench import knobs
from workbench.benchmark import calibrate, store
from workbench.benchmark.check import VerificationError
from workbench.benchmark.result import (
    EAGER,
    HEADERS,
    KERNEL,
    KERNEL_AA,
    Cache,
    OpResult,
    SizeResult,
    device_cache,
)
from workbench.benchmark.run import round_plans, shuffled_plan, time_rounds
from workbench.benchmark.stats import (
    Measurement,
    median_round,
    noise_band,
    round_spread,
    summarize,
    verdict,
)
from workbench.errors import WorkbenchError
from workbench.spec import Sample

ROOT = Path(__file__).resolve().parent.parent
FAST = {"compile": False, "min_time": 0.02}

# A spec for the throwaway registry's add_offset (out = x + OFFSET + delta): the reference
# says x + 1, so a registry written with offset 1 and delta 0 is right and any other is wrong.
TINY_SPEC = """\
import torch
from workbench.spec import OpSpec, Sample, randn

def reference(x):
    return x + 1

def samples(dtype, device, gen):
    return [Sample((randn((64,), dtype, device, gen),), "64")]

def bench_sizes(dtype, device, gen):
    return [Sample((randn((n,), dtype, device, gen),), str(n)) for n in (256, 4096)]

def fake(x):
    return torch.empty_like(x)

OPS = [OpSpec(name="add_offset", reference=reference, samples=samples, fake=fake,
              dtypes=(torch.float32, torch.float64), devices=("cpu",), bench_sizes=bench_sizes)]
"""


def _tiny(root: Path, delta: int = 0, comment: str = "") -> Path:
    kernels = write_registry(root, offset=1, delta=delta)
    (kernels / "tiny" / "spec.py").write_text(TINY_SPEC)
    if comment:
        header = kernels / "include" / "tiny_common.h"
        header.write_text(header.read_text() + f"// {comment}\n")
    return kernels


def test_summary_and_verdicts() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s.median, s.q1, s.q3, s.n) == (3.0, 2.0, 4.0, 5)
    a, b = summarize([1.00, 1.01, 0.99]), summarize([1.02, 1.03, 1.01])
    band = noise_band(a, b)
    assert band == pytest.approx(0.02)
    assert verdict(1.01, 1.0, band) == "noise"
    assert verdict(0.5, 1.0, band) == "faster"
    assert verdict(1.5, 1.0, band) == "slower"
    with pytest.raises(ValueError, match="no timing samples"):
        summarize([])


def test_a_difference_inside_the_baselines_spread_is_noise() -> None:
    tight = [1.0] * 8 + [1.001] * 8
    wide = [0.96] * 6 + [1.0] * 4 + [1.04] * 6  # relative IQR 8%

    def size(baseline: list[float]) -> SizeResult:
        times = {
            c: Measurement(summarize(t), "events")
            for c, t in ((KERNEL, tight), (KERNEL_AA, tight), (EAGER, baseline))
        }
        return SizeResult("1Ki", 4096, 1024, times)

    # The kernel is 1% slower than the median of either baseline; its own A/A band is 0.05%.
    assert size([0.99] * 16).against(EAGER) == (pytest.approx(0.99, abs=1e-3), "slower")
    assert size([x - 0.01 for x in wide]).against(EAGER) == (pytest.approx(0.99, abs=1e-3), "noise")


def _rounds_of(medians_us: list[float]) -> tuple[Measurement, list[float]]:
    """The median round's timing (IQR 0.2%) and the round medians, in seconds."""
    rounds = [
        Measurement(summarize([u * 0.999e-6, u * 1e-6, u * 1.001e-6]), "graph") for u in medians_us
    ]
    return median_round(rounds), [m.stats.median for m in rounds]


def test_a_difference_inside_a_timings_spread_between_rounds_is_noise() -> None:
    """Two levels between rounds, as graph replay shows between captures (3.05 or 3.42 us)."""
    kernel = [3.05, 3.06, 3.07]

    def size(eager: list[float]) -> SizeResult:
        timed = {
            c: _rounds_of(us) for c, us in ((KERNEL, kernel), (KERNEL_AA, kernel), (EAGER, eager))
        }
        times = {c: m for c, (m, _) in timed.items()}
        return SizeResult("1Ki", 4096, 1024, times, rounds={c: r for c, (_, r) in timed.items()})

    two_levels, tight = size([3.01, 3.38, 3.39]), size([3.37, 3.38, 3.39])
    assert two_levels.times[EAGER].stats.median == pytest.approx(3.38e-6)
    assert two_levels.spread(EAGER) == pytest.approx(0.38 / 3.01)
    assert two_levels.noise == tight.noise == pytest.approx(0.02 / 3.05)  # the kernel's rounds
    # The kernel's median round is 3.06 us, eager's 3.38 us: 10% apart either way.
    assert two_levels.against(EAGER) == (pytest.approx(3.38 / 3.06), "noise")
    assert tight.against(EAGER) == (pytest.approx(3.38 / 3.06), "faster")


def test_round_spread_and_median_round() -> None:
    assert round_spread([]) == round_spread([2.0]) == 0.0
    assert round_spread([2.0, 2.2, 2.1]) == pytest.approx(0.1)
    warned = Measurement(summarize([2.0]), "b", ["escaped"])
    picked = median_round(
        [Measurement(summarize([3.0]), "c"), warned, Measurement(summarize([1.0]), "a")]
    )
    assert picked.method == "b" and picked.warnings == ["round 2/3: escaped"]
    even = [
        Measurement(summarize([t]), m) for t, m in ((4.0, "d"), (1.0, "a"), (3.0, "c"), (2.0, "b"))
    ]
    assert median_round(even).method == "b"  # the lower median of an even count
    assert median_round([warned]) is warned


def test_plan_is_every_pair_once_in_a_random_order() -> None:
    cands = ["kernel", "kernel (A/A)", "eager", "compiled"]
    plan = shuffled_plan(5, cands, seed=0)
    nested = [(i, c) for i in range(5) for c in cands]
    assert sorted(plan) == sorted(nested) and len(plan) == len(nested)
    assert plan != nested
    assert plan != shuffled_plan(5, cands, seed=1)
    rounds = round_plans(5, cands, seed=7, rounds=3)
    assert len(rounds) == 3 * len(nested)
    for r in range(3):  # each round is a whole plan in its own order, one after another
        block = rounds[r * len(nested) : (r + 1) * len(nested)]
        assert {x for x, _, _ in block} == {r}
        assert [(i, c) for _, i, c in block] == shuffled_plan(5, cands, seed=7 + r)


def test_time_rounds_times_each_pair_per_round_and_stops_at_the_deadline() -> None:
    samples = [Sample((torch.ones(n),), f"{n}") for n in (4, 8)]
    timed: list[tuple[str, int]] = []

    def timer(fn: Any, args: tuple[Any, ...], method: str) -> Measurement:
        timed.append((fn(), args[0].numel()))
        return Measurement(summarize([1e-6 * len(timed)]), method)

    cands = {"a": lambda: "a", "b": lambda: "b"}
    times, done = time_rounds(cands, samples, timer, ["m", "m"], seed=3, n_rounds=3)
    assert done == 3 and len(timed) == 12
    assert [{c: len(v) for c, v in t.items()} for t in times] == [{"a": 3, "b": 3}] * 2
    timed.clear()
    lines: list[str] = []
    times, done = time_rounds(
        cands, samples, timer, ["m", "m"], 3, 3, deadline=0.0, say=lines.append
    )
    assert done == 1 and len(timed) == 4  # the first round always completes
    assert lines == ["round 1/3 timed (4 timings)", "budget spent after 1 of 3 rounds"]
    # A long round says how far it is, at most every PROGRESS_SECONDS (here: a clock that
    # moves 6 s per reading, so every second timing crosses the 10 s).
    ticks = iter(range(0, 10_000, 6))
    lines.clear()
    time_rounds(
        cands, samples, timer, ["m", "m"], 3, 1, say=lines.append, clock=lambda: next(ticks)
    )
    assert lines == ["round 1/1: 2/4 timed", "round 1/1 timed (4 timings)"]


def test_bench_times_kernel_eager_and_a_a_with_roofline(lib: Any) -> None:
    result = workbench.bench("muladd", lib=lib, device="cpu", sizes=["1Ki", "16Ki"], **FAST)
    (r,) = result.ops
    assert [s.label for s in r.sizes] == ["1Ki", "16Ki"]
    for s in r.sizes:
        assert set(s.times) == {"kernel", "kernel (A/A)", "eager"}
        assert all(m.method.startswith("blocked_autorange") for m in s.times.values())
        assert s.noise >= s.aa_spread >= 0
        assert {c: len(v) for c, v in s.rounds.items()} == dict.fromkeys(s.times, 1)  # cpu: 1
        assert s.round_spread == 0.0
        n = 1024 if s.label == "1Ki" else 16384
        assert (s.bytes, s.flops) == (3 * 4 * n, 2 * n)
        assert s.roofline(r.calibration) is not None
    wide = result.table(wide=True)
    assert "A/A" in wide and "vs eager" in wide and "blocked_autorange" in wide
    table = result.table()
    assert "vs eager" in table and "blocked_autorange" not in table and "A/A" not in table
    assert max(len(ln) for ln in table.splitlines() if not ln.startswith("warning:")) <= 120
    assert r.build_key == lib.families["muladd"].key


def test_every_pair_is_timed_in_rounds_and_reports_its_median_round(lib: Any) -> None:
    result = workbench.bench("muladd", lib=lib, device="cpu", sizes=["1Ki"], rounds=2, **FAST)
    s = result.ops[0].sizes[0]
    assert set(s.rounds) == set(s.times) == {KERNEL, KERNEL_AA, EAGER}
    for c, medians in s.rounds.items():
        assert len(medians) == 2 and s.times[c].stats.median == min(medians)  # the lower median
    assert s.noise >= max(s.aa_spread, s.spread(KERNEL), s.spread(KERNEL_AA))
    stored = s.to_dict(None)
    assert stored["times"][EAGER]["rounds_s"] == s.rounds[EAGER]
    assert stored["round_spread"] == s.round_spread
    assert HEADERS[HEADERS.index("A/A") + 1] == "noise"
    (row,) = result.rows()
    assert row[HEADERS.index("noise")] == f"{s.noise:.1%}"
    assert "noise" in result.table().splitlines()[1]


def test_compiled_reference_is_timed(lib: Any) -> None:
    result = workbench.bench(
        "scale", lib=lib, device="cpu", sizes=["1Ki"], min_time=0.02, roofline=False, save=False
    )
    s = result.ops[0].sizes[0]
    assert "compiled" in s.times
    speedup, word = s.against("compiled") or (0.0, "")
    assert speedup > 0 and word in ("faster", "slower", "noise")


def test_bad_arguments_are_named(lib: Any) -> None:
    with pytest.raises(WorkbenchError, match=r"no sizes \['3Ki'\] in its sweep; sizes: 1Ki, 16Ki"):
        workbench.bench("muladd", lib=lib, device="cpu", sizes=["3Ki"], **FAST)
    with pytest.raises(WorkbenchError, match="dtype 'float33' is not a torch dtype"):
        workbench.bench("muladd", lib=lib, device="cpu", dtype="float33", **FAST)
    with pytest.raises(WorkbenchError, match="no spec for op 'nope'"):
        workbench.bench("nope", lib=lib, device="cpu", **FAST)
    with pytest.raises(WorkbenchError, match="min_time must be positive"):
        workbench.bench("muladd", lib=lib, device="cpu", compile=False, min_time=0)
    with pytest.raises(WorkbenchError, match="rounds must be a whole number of 1 or more, got 0"):
        workbench.bench("muladd", lib=lib, device="cpu", rounds=0, **FAST)
    if not torch.cuda.is_available():
        with pytest.raises(WorkbenchError, match="no CUDA build to time"):
            workbench.bench("muladd", lib=lib, device="cuda", **FAST)


def test_calibration_is_measured_once_and_cached() -> None:
    cpu = torch.device("cpu")
    first = calibrate.load_or_measure(cpu)
    assert first.copy_bytes_per_s > 0 and first.matmul_flops_per_s > 0
    assert calibrate.load_or_measure(cpu) == first  # from the cache: same timestamp
    again = calibrate.load_or_measure(cpu, refresh=True)
    assert again.measured > first.measured
    assert calibrate.load_or_measure(cpu) == again


def test_verification_failure_stops_timing(tmp_path: Path) -> None:
    kernels = _tiny(tmp_path, delta=1)  # the kernel adds 2, the reference 1
    lib = workbench.load(kernels, namespace="wbbad")
    with pytest.raises(VerificationError, match=r"add_offset \[256, float32\] does not match"):
        workbench.bench("add_offset", lib=lib, device="cpu", **FAST)
    assert store.builds("add_offset", calibrate.device_name(torch.device("cpu")), "float32") == []


def test_results_are_stored_per_build_and_vs_last_finds_the_previous(tmp_path: Path) -> None:
    kernels = _tiny(tmp_path)
    lib = workbench.load(kernels, namespace="wbvs")
    first = workbench.bench("add_offset", lib=lib, device="cpu", roofline=False, **FAST).ops[0]
    assert first.previous is None
    _tiny(tmp_path, comment="an edit that changes the build, not the result")
    lib.reload()
    second = workbench.bench(
        "add_offset", lib=lib, device="cpu", roofline=False, vs="last", **FAST
    ).ops[0]
    assert second.build_key != first.build_key
    assert second.previous is not None and second.previous["build_key"] == first.build_key
    rows = second.vs_rows()
    assert [v["label"] for v in rows] == ["256", "4096"]
    assert all(v["verdict"] in ("faster", "slower", "noise") and v["noise"] > 0 for v in rows)
    with pytest.raises(WorkbenchError, match="no stored result of a build 'ffff'"):
        workbench.bench("add_offset", lib=lib, device="cpu", vs="ffff", roofline=False, **FAST)


def test_a_result_stored_before_rounds_is_still_compared() -> None:
    """Results written before rounds existed have no rounds_s and no round_spread."""
    m = Measurement(summarize([1.0e-6, 1.01e-6, 1.02e-6]), "events")
    old = {"label": "1Ki", "noise": 0.01, "times": {KERNEL: {"median_s": 2.0e-6}}}
    now = OpResult(
        "op", "cpu", "cpu", "float32", "new", [SizeResult("1Ki", 8, 1, {KERNEL: m})], None
    )
    now.previous = {"build_key": "old", "sizes": [old]}
    (row,) = now.vs_rows()
    assert row["verdict"] == "faster" and row["noise"] == pytest.approx(0.01)


def _wb(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, WB_CACHE_DIR=str(cache), WB_QUIET="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )


def test_cli_writes_json_and_compares_with_last(tmp_path: Path) -> None:
    """No plotting library needed: --json, --vs last, --wide and a bad --plot suffix."""
    cache = Path(str(knobs.cache_dir()))
    kernels = _tiny(tmp_path / "reg")
    args = ("--kernels", str(kernels), "--namespace", "wbcli", "bench", "add_offset")
    fast = ("--no-compile", "--min-time", "0.02", "--device", "cpu")
    out_json = tmp_path / "r.json"
    proc = _wb(*args, *fast, "--json", str(out_json), "--rounds", "2", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert "copy ceiling" in proc.stdout and "add_offset" in proc.stdout
    assert "blocked_autorange" not in proc.stdout.split("float32\n", 1)[1]  # not in the table
    data = json.loads(out_json.read_text())
    (op,) = data["ops"]
    assert [s["label"] for s in op["sizes"]] == ["256", "4096"]
    kernel = op["sizes"][0]["times"]["kernel"]
    assert kernel["median_s"] > 0 and len(kernel["rounds_s"]) == 2
    assert kernel["method"].startswith("blocked_autorange")  # the JSON has every column
    assert op["cache"]["name"] == "LLC" and "fits_in_cache" in op["sizes"][0]
    _tiny(tmp_path / "reg", comment="edited")
    proc = _wb(*args, *fast, "--vs", "last", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert f"against build {op['build_key'][:12]}" in proc.stdout
    wide = _wb(*args, *fast, "--wide", "--no-save", cache=cache)
    assert wide.returncode == 0, wide.stderr
    assert "A/A" in wide.stdout and "blocked_autorange" in wide.stdout.split("float32\n", 1)[1]
    bad = _wb(*args, *fast, "--plot", str(tmp_path / "r.gif"), cache=cache)
    assert bad.returncode == 2 and "must end in .png or .svg" in bad.stderr


def test_cli_draws_the_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    cache = Path(str(knobs.cache_dir()))
    kernels = _tiny(tmp_path / "reg")
    out_svg = tmp_path / "r.svg"
    proc = _wb(
        *("--kernels", str(kernels), "--namespace", "wbcliplot", "bench", "add_offset"),
        *("--no-compile", "--min-time", "0.02", "--device", "cpu", "--no-save"),
        *("--plot", str(out_svg)),
        cache=cache,
    )
    assert proc.returncode == 0, proc.stderr
    assert out_svg.read_text().lstrip().startswith("<?xml") and "<svg" in out_svg.read_text()


def test_cli_verification_failure_exits_2(tmp_path: Path) -> None:
    cache = Path(str(knobs.cache_dir()))
    kernels = _tiny(tmp_path, delta=1)
    proc = _wb(
        "--kernels",
        str(kernels),
        "--namespace",
        "wbclibad",
        "bench",
        "--no-compile",
        "--device",
        "cpu",
        cache=cache,
    )
    assert proc.returncode == 2
    assert "does not match its reference" in proc.stderr and "not timed" in proc.stderr


def test_result_shows_itself_as_html_with_every_column(lib: Any) -> None:
    result = workbench.bench(
        "scale", lib=lib, device="cpu", sizes=["1Ki"], roofline=False, save=False, **FAST
    )
    page = result._repr_html_()
    assert "<table>" in page and "scale" in page and "<th>method</th>" in page
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert ("<svg" in page) == has_matplotlib
    assert ("install matplotlib" in page) != has_matplotlib
    with pytest.raises(WorkbenchError, match=r"must end in \.png or \.svg"):
        result.plot("p.gif")


def test_result_draws_itself(lib: Any, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = workbench.bench(
        "scale", lib=lib, device="cpu", sizes=["1Ki"], roofline=False, save=False, **FAST
    )
    result.plot(tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_a_size_that_fits_in_the_last_level_cache_says_which_ceiling_applies(lib: Any) -> None:
    result = workbench.bench("muladd", lib=lib, device="cpu", sizes=["1Ki", "16Ki"], **FAST)
    (r,) = result.ops
    small, large = r.sizes  # 12 KiB and 192 KiB moved
    r.cache = Cache("LLC", small.bytes)  # as if the cache held the small one only
    assert r.roofline_cell(small).endswith("% LLC")
    assert r.roofline_cell(large).endswith("% mem")  # past the cache: the copy bandwidth
    table = result.table()
    note = table[table.index("note: muladd") :]  # after the note on the limit's tags
    assert note.startswith("note: muladd 1Ki: the bytes moved fit in the 12 KiB LLC;")
    assert "measured past it" in note and "16Ki" not in note
    sizes = result.to_dict()["ops"][0]["sizes"]
    assert [s["fits_in_cache"] for s in sizes] == [True, False]
    assert device_cache("cpu").bytes > 0  # this machine's sysfs lists its caches
