"""wb profile without a GPU: ncu's CSV read by metric name, the command line it is run with, and
what the user is told when ncu is missing, may not read the counters, hangs or is interrupted.

tests/data/ncu/raw_matmul_wgmma.csv is a format sample (ncu's raw page, written by hand; its
numbers are illustrative): tests/test_profile_cuda.py reads a real ncu run. Where ncu cannot
exist here, a small executable named ncu on PATH stands in for it, only for the error paths: it
prints what ncu prints and exits as ncu does, and the thing under test is our message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench import knobs
from workbench.errors import WorkbenchError
from workbench.profile import child, ncu
from workbench.profile.report import extra_columns, parse_raw, short_name, table
from workbench.profile.run import child_command, implicated

DATA = Path(__file__).parent / "data" / "ncu"
ROOT = Path(__file__).resolve().parent.parent


def _kernels():  # type: ignore[no-untyped-def]
    return parse_raw((DATA / "raw_matmul_wgmma.csv").read_text())


def test_the_raw_page_is_read_by_metric_name() -> None:
    wgmma, copy = _kernels()
    assert short_name(wgmma.name) == "wgmma_kernel<BKMajor<__nv_bfloat16>>"
    # ncu's names of kernels in an anonymous namespace (an H200 run printed the first)
    simt = "void unnamed>::simt_kernel<float, 128, 128, 8, 8, 8>(View<T1>, View<T1>, T1 *, long)"
    assert short_name(simt) == "simt_kernel<float, 128, 128, 8, 8, 8>"
    norm = "void wb::layer_norm::<unnamed>::layer_norm_regs_kernel<4, 4, float>(const T3 *, int)"
    assert short_name(norm) == "layer_norm_regs_kernel<4, 4, float>"
    anon = "void wb::(anonymous namespace)::mma_kernel<wb::bf16, 4>(const T1 *)"
    assert short_name(anon) == "mma_kernel<bf16, 4>"
    # an anonymous namespace inside the template arguments (a bracket left unbalanced there)
    op = "void wb::softmax::warp_kernel<wb::softmax::unnamed>::Fwd<float, 2>>(T1, long, long)"
    assert short_name(op) == "warp_kernel<Fwd<float, 2>>"
    assert short_name(copy.name) == "elementwise_kernel<128, 2, void gpu_kerne..."
    assert wgmma.device == "NVIDIA H100 80GB HBM3"
    assert wgmma.duration_ns == 612448.0  # "612,448" nsecond
    assert (wgmma.grid, wgmma.block) == ("(132, 1, 1)", "(384, 1, 1)")
    assert wgmma.registers == 168 and copy.registers == 16
    assert wgmma.smem_bytes == 197696  # static + dynamic
    assert wgmma.local_bytes == 0
    assert wgmma.tensor_pct == pytest.approx(84.91) and copy.tensor_pct == 0.0
    assert copy.value("launch__grid_size") == 16384.0  # "16,384"
    s = wgmma.summary()
    assert (s["occupancy_pct"], s["dram_pct"], s["sm_pct"], s["l2_hit_pct"]) == (
        18.73,
        5.43,
        83.52,
        71.18,
    )
    # "selected" is the issue itself, not a stall; n/a is no number
    assert wgmma.stalls[:3] == [("wait", 3.86), ("barrier", 0.41), ("long_scoreboard", 0.37)]
    assert copy.stalls[0] == ("long_scoreboard", 38.12)
    assert wgmma.metrics["smsp__average_warps_issue_stalled_membar_per_issue_active.ratio"] is None
    assert wgmma.units["gpu__time_duration.sum"] == "nsecond"


def test_other_units_and_families_of_names_are_read_too() -> None:
    """Without --print-units base ncu scales units (usecond, Kbyte); newer ncu calls DRAM's
    throughput gpu__dram_throughput; spills may come as sectors of 32 bytes; stalls as
    smsp__average_warp_latency_issue_stalled_*."""
    text = "\n".join(
        [
            '"ID","Kernel Name","Block Size","Grid Size","gpu__time_duration.sum",'
            '"launch__shared_mem_per_block_static","gpu__dram_throughput.avg.pct_of_peak_'
            'sustained_elapsed","l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",'
            '"l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",'
            '"smsp__average_warp_latency_issue_stalled_wait.ratio",'
            '"smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio"',
            '"","","","","usecond","Kbyte/block","%","sector","sector","",""',
            '"3","k(float *)","(256, 1, 1)","(1,024, 2, 1)","1,234.5","48","91.5","10","2",'
            '"1.5","7.25"',
        ]
    )
    (k,) = parse_raw("some output of the application\n" + text)
    assert k.duration_ns == pytest.approx(1_234_500)
    assert k.smem_bytes == 48_000
    assert k.summary()["dram_pct"] == 91.5
    assert k.local_bytes == 12 * 32
    assert k.stalls == [("long_scoreboard", 7.25), ("wait", 1.5)]
    assert k.registers is None and k.tensor_pct is None


def test_no_header_is_no_kernels() -> None:
    assert parse_raw("==WARNING== No kernels were profiled.\n") == []


def test_the_table_has_a_row_per_kernel_and_asked_columns() -> None:
    kernels = _kernels()
    extra = extra_columns(kernels, ["launch__grid_size", "regex:^sm__pipe_tensor_op_"])
    assert extra == [
        "launch__grid_size",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    ]
    lines = table(kernels, extra).splitlines()
    assert lines[0].split()[:4] == ["kernel", "time", "us", "grid"]
    assert len(lines) == 4  # header, rule, two kernels
    wgmma = lines[2]
    assert wgmma.startswith("wgmma_kernel<") and "612.4" in wgmma and " 132 " in wgmma
    assert "193.1Ki" in wgmma and "wait 3.9, barrier 0.4, long_scoreboard 0.4" in wgmma
    assert lines[3].split()[-3:] == ["16384", "0", "0"]  # the asked-for columns


def test_the_command_line_profiles_only_the_call_with_the_tables_metrics(tmp_path: Path) -> None:
    log = tmp_path / "ncu.csv"
    kid = child_command("matmul", tmp_path / "s.json", {"size": "4096", "path": None})
    cmd = ncu.command(
        "/opt/ncu",
        kid,
        log,
        metrics=[*ncu.METRICS, "sm__inst_executed.sum"],
        sections=["SpeedOfLight", "Occupancy"],
        ncu_args=["--clock-control=none"],
    )
    assert cmd[0] == "/opt/ncu"
    joined = " ".join(cmd)
    assert "--clock-control" not in cmd  # the caller's --clock-control=none stands alone
    for option in (
        "--profile-from-start off",
        "--target-processes application-only",
        "--csv --page raw --print-units base",
        f"--log-file {log}",
        "--section SpeedOfLight --section Occupancy",
    ):
        assert option in joined
    metrics = cmd[cmd.index("--metrics") + 1].split(",")  # ncu splits the list at commas
    assert metrics == [*ncu.METRICS, "sm__inst_executed.sum"]
    assert "gpu__time_duration.sum" in metrics and "launch__registers_per_thread" in metrics
    assert any(m.startswith("regex:^smsp__average_warps_issue_stalled_") for m in metrics)
    # ncu's own arguments, then the child, which gets its options back as given
    assert cmd[cmd.index("--clock-control=none") + 1 :] == kid
    assert kid[:3] == [sys.executable, "-m", "workbench.profile.child"]
    args = child.parser().parse_args(kid[3:])
    assert (args.op, args.size, args.path, args.status) == (
        "matmul",
        "4096",
        None,
        tmp_path / "s.json",
    )


def test_the_clocks_are_left_alone_unless_asked(tmp_path: Path) -> None:
    cmd = ncu.command("ncu", ["python"], tmp_path / "log")
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    cmd = ncu.command("ncu", ["python"], tmp_path / "log", ncu_args=["--clock-control", "base"])
    assert cmd.count("--clock-control") == 1 and cmd[-3:] == ["--clock-control", "base", "python"]


def test_a_profiler_that_cannot_start_is_named() -> None:
    said = "==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n"
    with pytest.raises(WorkbenchError, match=r"ncu could not start its profiler on this machine"):
        ncu.check(ncu.Outcome(1, said, "", "", 1.0))


def test_metrics_this_ncu_lacks_are_matched_to_ours() -> None:
    ours = list(ncu.METRICS)
    said = [r"regex:^lts__t_sector_hit_rate\.(sum|avg|pct)$", ours[-1]]
    assert implicated(ours, said) == ["lts__t_sector_hit_rate.pct", ours[-1]]
    assert implicated(ours, ["my__typo.sum"]) == []


def test_what_ncu_says_of_a_metric_it_lacks_is_read() -> None:
    said = (
        "==PROF== Connected to process 7 (python)\n==ERROR== Failed to find metric my__typo.sum\n"
    )
    outcome = ncu.Outcome(1, said, "", "", 1.0)
    assert ncu.unknown_metrics(outcome) == ["my__typo.sum"]
    with pytest.raises(WorkbenchError, match=r"^ncu does not know the metric\(s\) my__typo.sum on"):
        ncu.check(outcome)
    with pytest.raises(WorkbenchError, match=r"^ncu exited with status 1:\nboom$"):
        ncu.check(ncu.Outcome(1, "", "", "boom\n", 1.0))


def test_a_size_is_a_label_or_a_square_or_a_count() -> None:
    labels = ["4096x4096x4096", "8192x8192x8192", "16x4096x4096"]
    assert child.pick(labels, [3, 9, 2], "16x4096x4096", "matmul") == 2
    assert child.pick(labels, [3, 9, 2], "4096", "matmul") == 0
    assert child.pick(labels, [3, 9, 2], None, "matmul") == 1  # the largest
    assert child.pick(["4Ki", "16Mi"], [1, 2], str(16 << 20), "histogram") == 1
    with pytest.raises(WorkbenchError, match=r"^matmul: no size '512' in its sweep; sizes: 4096x"):
        child.pick(labels, [3, 9, 2], "512", "matmul")


def test_a_path_is_a_name_a_number_or_all() -> None:
    choices = [("simt", 1), ("mma", 2), ("wgmma", 3)]
    assert child.choose_path(choices, "mma", "matmul") == ("mma", 2)
    assert child.choose_path(choices, "3", "matmul") == ("wgmma", 3)
    assert child.choose_path(choices, "all", "matmul") == ("simt", 1)
    with pytest.raises(WorkbenchError, match=r"no path 'tma' here; paths: simt \(1\), mma \(2\)"):
        child.choose_path(choices, "tma", "matmul")


def test_paths_are_read_from_the_path_variants_samples() -> None:
    """matmul's paths come from matmul_path's own samples (its last argument, its label's last
    word); an op with no X_path has none. The specs are the bundled ones, read without a build."""
    import types

    import torch

    from workbench import specfile

    module = specfile.load_module(
        "matmul", "wbprofiletest", ROOT / "kernels" / "matmul" / "spec.py"
    )
    assert module is not None
    lib = types.SimpleNamespace(specs={s.name: s for s in module.OPS})
    cpu = torch.device("cpu")
    assert child.path_choices(lib, "matmul", torch.float32, cpu) == [("auto", 0)]
    with pytest.raises(WorkbenchError, match=r"^matmul_path has no paths to choose: --path needs"):
        child.path_choices(lib, "matmul_path", torch.float32, cpu)


# --- the command, in a process of its own -----------------------------------------------------


def _wb(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workbench", "profile", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment less any ncu: PATH holds only tmp/bin, CUDA_HOME an empty folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "cuda").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("WB_NCU", "CUDA_PATH")}
    env.update(PATH=str(bin_dir), CUDA_HOME=str(tmp_path / "cuda"), **extra)
    env["PYTHONPATH"] = str(ROOT)
    return env


def _fake_ncu(tmp_path: Path, body: str) -> None:
    """An executable named ncu on the test's PATH: ``body`` runs with LOG set to the file
    given after --log-file (where ncu writes its own output)."""
    script = tmp_path / "bin" / "ncu"
    script.write_text(
        "#!/bin/sh\n"
        "PATH=/usr/bin:/bin\n"  # its own tools; the test's PATH holds only this script
        'LOG=""\n'
        'while [ $# -gt 0 ]; do [ "$1" = --log-file ] && LOG="$2"; shift; done\n' + body
    )
    script.chmod(0o755)


def test_without_ncu_it_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    with knobs.override(CUDA_HOME=env["CUDA_HOME"], CUDA_PATH=None, WB_NCU=None):
        system = [p for p in ncu.candidates() if os.access(p, os.X_OK) and p.is_file()]
    if system:
        pytest.skip(f"this host has ncu outside PATH ({system[0]}), which wb profile finds")
    done = _wb("matmul", env=env)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert err.startswith("wb profile: error: Nsight Compute (ncu) was not found on PATH")
    assert "CUDA toolkit" in err and "WB_NCU=/path/to/ncu" in err
    assert len(err.splitlines()) == 1


def test_wb_ncu_must_name_an_executable(tmp_path: Path) -> None:
    done = _wb("matmul", env=_env(tmp_path, WB_NCU=str(tmp_path / "no-ncu")))
    assert done.returncode == 2
    assert f"WB_NCU={tmp_path / 'no-ncu'} is not an executable file" in done.stderr


def test_counters_not_permitted_say_the_fix(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _fake_ncu(
        tmp_path,
        'echo "==PROF== Connected to process 4242 (/usr/bin/python3)" >> "$LOG"\n'
        'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA '
        "GPU Performance Counters on the target device 0. For instructions on enabling "
        'permissions and to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM"'
        ' >> "$LOG"\n'
        'echo "==PROF== Disconnected from process 4242" >> "$LOG"\n'
        "exit 1\n",
    )
    done = _wb("matmul", env=env)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith("wb profile: error: Nsight Compute may not read this GPU's performance")
    assert "as root" in err and "NVreg_RestrictProfilingToAdminUsers=0" in err
    assert "/etc/modprobe.d/" in err and ncu.PERMISSION_URL in err


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; its parent (init, here) reaps it


HANGS = 'sleep 300 &\necho $! > "$(dirname "$LOG")/../sleeper.pid"\nwait\n'


def _sleeper(tmp_path: Path) -> int:
    """The pid the hanging stand-in started: it writes it into TMPDIR (tmp/runs), the folder
    that holds the run's temporary folder and so ncu's log."""
    found = tmp_path / "runs" / "sleeper.pid"
    text = found.read_text().strip() if found.is_file() else ""
    return int(text) if text else 0


def test_a_run_past_the_timeout_is_ended_whole(tmp_path: Path) -> None:
    env = _env(tmp_path, WB_PROFILE_TIMEOUT="1", TMPDIR=str(tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    _fake_ncu(tmp_path, 'echo "==PROF== Connected to process 1" >> "$LOG"\n' + HANGS)
    start = time.perf_counter()
    done = _wb("matmul", env=env)
    assert time.perf_counter() - start < 60
    assert done.returncode == 2, done.stderr
    assert "ncu ran past 1 s (WB_PROFILE_TIMEOUT) and was stopped" in done.stderr
    assert "==PROF== Connected to process 1" in done.stderr  # the tail of what it said
    sleeper = _sleeper(tmp_path)
    assert sleeper and not _alive(sleeper)


def _as_a_shell_starts_it() -> None:
    """The command's SIGINT as a terminal's shell leaves it (the default action, unblocked),
    whatever an earlier test in this worker process did with its own."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_state(pid: int) -> str:
    """What the kernel says of a process's signals and where it waits (for a failure's message)."""
    lines = []
    for name in ("status", "wchan"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text()
        except OSError as e:
            text = str(e)
        lines += [
            ln for ln in text.splitlines() if name == "wchan" or ln.startswith(("State", "Sig"))
        ]
    return "; ".join(lines)


def test_ctrl_c_ends_ncu_and_its_child(tmp_path: Path) -> None:
    env = _env(tmp_path, TMPDIR=str(tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    _fake_ncu(tmp_path, HANGS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "profile", "matmul"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_shell_starts_it,
    )
    deadline = time.monotonic() + 60
    while not _sleeper(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    sleeper = _sleeper(tmp_path)
    assert sleeper and _alive(sleeper)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        state = _signal_state(proc.pid)
        proc.kill()
        proc.communicate()
        pytest.fail(f"wb profile did not end within 120 s of SIGINT: {state}")
    assert proc.returncode == 130 and "wb profile: interrupted" in err
    assert not _alive(sleeper)


def test_the_cpu_is_refused_before_ncu_is_looked_for(tmp_path: Path) -> None:
    done = _wb("matmul", "--device", "cpu", env=_env(tmp_path))
    assert done.returncode == 2
    assert "--device cpu: wb profile measures GPU kernels with Nsight Compute" in done.stderr
    done = _wb("matmul", "--device", "tpu:0", env=_env(tmp_path))
    assert done.returncode == 2 and "expected cuda or cuda:N" in done.stderr


def test_an_unknown_op_is_named_with_the_known_ones(tmp_path: Path) -> None:
    done = _wb("nosuch", env=_env(tmp_path))
    assert done.returncode == 2
    err = done.stderr.strip()
    assert err.startswith("wb profile: error: no op 'nosuch' in ") and "matmul_path" in err


def test_no_gpu_is_said_by_the_profiled_process(tmp_path: Path) -> None:
    """A stand-in ncu that runs the application unprofiled, as ncu runs it when no kernel is in
    range: the child's error (no CUDA device) reaches the user through its status file."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the child would profile")
    env = _env(tmp_path)
    script = tmp_path / "bin" / "ncu"
    script.write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys\n"
        "args = sys.argv[1:]\n"
        "log = args[args.index('--log-file') + 1]\n"
        f"code = subprocess.call(args[args.index({sys.executable!r}):])\n"
        "open(log, 'a').write('==WARNING== No kernels were profiled.\\n')\n"
        "sys.exit(code)\n"
    )
    script.chmod(0o755)
    done = _wb("matmul", env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "wb profile: error: no CUDA device here (torch.cuda.is_available() is False): wb "
        "profile runs the op on a GPU under Nsight Compute"
    )
