"""Nsight Compute for ``wb profile``: where ``ncu`` is, the command line that profiles one call
of an op, running it in a process group that a timeout or Ctrl-C ends whole, and what its
failures mean.

The command line. ``--profile-from-start off`` leaves everything outside the child's
``cudaProfilerStart``/``cudaProfilerStop`` pair (``torch.cuda.profiler.start``/``stop``) unprofiled:
the imports, the load, the warm-up calls. ``--target-processes application-only`` keeps ncu out of
the compilers a cold build runs. ``--csv --page raw --print-units base`` prints one row per kernel
and one column per metric, in base units (nanoseconds, bytes), which ``profile.report`` reads by
metric name. Only the metrics of the table are collected (``METRICS``), so ncu replays each kernel
a few passes rather than the dozens of a full section set; the families whose members differ
between GPUs and ncu versions (warp stall reasons, tensor pipes, local memory) are asked for by
``regex:``, which ncu expands against the GPU's own list.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from workbench import knobs, procs
from workbench.errors import WorkbenchError

# The metrics of the table (profile.report reads them by these names).
METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    # DRAM's share of its peak: dram__throughput, called gpu__dram_throughput by newer ncu.
    r"regex:^(dram__|gpu__dram_)throughput\.avg\.pct_of_peak_sustained_elapsed$",
    # Local memory (register spills, and arrays the compiler could not keep in registers).
    r"regex:^l1tex__t_(bytes|sectors)_pipe_lsu_mem_local_op_(ld|st)\.sum$",
    # Tensor pipes: hmma (mma.sync), gmma (Hopper's wgmma), imma, dmma, and their sum.
    r"regex:^sm__pipe_tensor[a-z_]*_cycles_active\.avg\.pct_of_peak_sustained_active$",
    # Warp stalls: cycles a warp spends in each reason per instruction issued.
    r"regex:^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active\.ratio$",
)

PERMISSION_URL = "https://developer.nvidia.com/ERR_NVGPUCTRPERM"

MISSING = (
    "Nsight Compute (ncu) was not found on PATH, in $CUDA_HOME/bin, /usr/local/cuda*/bin, "
    "/opt/nvidia/nsight-compute/*/ or beside nvcc: install Nsight Compute (it comes with the "
    "CUDA toolkit, e.g. the cuda-nsight-compute-13-0 package of NVIDIA's repository, or "
    "from https://developer.nvidia.com/nsight-compute) or set WB_NCU=/path/to/ncu"
)

PERMISSION = (
    "Nsight Compute may not read this GPU's performance counters (ERR_NVGPUCTRPERM): run "
    "wb profile as root (sudo -E env PATH=$PATH wb profile ...; in a container, one started "
    "with --cap-add=SYS_ADMIN), or let every user profile: add the line `options nvidia "
    "NVreg_RestrictProfilingToAdminUsers=0` to a file in /etc/modprobe.d/ and reboot (or "
    f"reload the nvidia module). See {PERMISSION_URL}"
)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _version_key(path: Path) -> tuple[int, ...]:
    """(2025, 3, 1) from .../nsight-compute/2025.3.1/ncu or .../cuda-13.0/bin/ncu."""
    return tuple(int(n) for n in re.findall(r"\d+", str(path)))


def candidates() -> list[Path]:
    """Where ``ncu`` is looked for, in order: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, the
    newest /usr/local/cuda-*/bin and /opt/nvidia/nsight-compute/*/, and beside nvcc."""
    found: list[Path] = []
    on_path = shutil.which("ncu")
    if on_path:
        found.append(Path(on_path))
    home = knobs.cuda_home()
    if home:
        found.append(Path(home) / "bin" / "ncu")
    found.append(Path("/usr/local/cuda/bin/ncu"))
    for folder, pattern in ((Path("/usr/local"), "cuda-*/bin/ncu"),
                            (Path("/opt/nvidia/nsight-compute"), "*/ncu")):  # fmt: skip
        if folder.is_dir():
            found += sorted(folder.glob(pattern), key=_version_key, reverse=True)
    nvcc = shutil.which("nvcc")
    if nvcc:
        found.append(Path(nvcc).resolve().parent / "ncu")
    return found


def find() -> Path:
    """The ``ncu`` to run: WB_NCU where set, else the first of :func:`candidates` that is an
    executable; a WorkbenchError that says what to install where there is none."""
    explicit = knobs.ncu()
    if explicit:
        path = Path(explicit).expanduser()
        if not _executable(path):
            raise WorkbenchError(
                f"WB_NCU={explicit} is not an executable file: point it at Nsight Compute's "
                "ncu (e.g. /usr/local/cuda/bin/ncu), or unset it to look on PATH and in the CUDA "
                "toolkit"
            )
        return path
    for path in candidates():
        if _executable(path):
            return path
    raise WorkbenchError(MISSING)


def command(
    ncu: Path | str,
    child: Sequence[str],
    log: Path,
    *,
    metrics: Sequence[str] = METRICS,
    sections: Sequence[str] = (),
    ncu_args: Sequence[str] = (),
) -> list[str]:
    """The command line that profiles what ``child`` runs between its profiler start and stop:
    ``metrics`` (ours, then the caller's), ``sections`` (``--section`` each) and ``ncu_args``
    passed through as they are, ncu's own output (the CSV) to ``log``. The clocks are left as
    they are (``--clock-control none``, where ``ncu_args`` names no other): ncu's default locks
    them at base, which changes a shared card's settings and times kernels slower than the
    bench does."""
    cmd = [
        str(ncu),
        "--profile-from-start",
        "off",
        "--target-processes",
        "application-only",
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--log-file",
        str(log),
    ]
    if not any(a.startswith("--clock-control") for a in ncu_args):
        cmd += ["--clock-control", "none"]  # the GPU's clocks as wb bench finds them
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    for section in sections:
        cmd += ["--section", section]
    return [*cmd, *ncu_args, *child]


@dataclass
class Outcome:
    """What one ncu run left: its exit status, ncu's log (the CSV), the child's output."""

    returncode: int
    log: str
    stdout: str
    stderr: str
    seconds: float

    def text(self) -> str:
        return "\n".join((self.log, self.stdout, self.stderr))

    def tail(self, lines: int = 20) -> str:
        """The last lines of the child's stderr (ncu's errors where the child said nothing)."""
        for source in (self.stderr, self.log, self.stdout):
            kept = [line for line in source.strip().splitlines() if line.strip()]
            if kept:
                return "\n".join(kept[-lines:])
        return "(no output)"


def run(cmd: Sequence[str], log: Path, *, env: dict[str, str], timeout: float) -> Outcome:
    """Run ``cmd`` in a process group of its own (Ctrl-C reaches only this process, which ends
    the group), its output to files; past ``timeout`` seconds the group is ended and the error
    says so with the tail of its stderr."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc: subprocess.Popen[bytes] | None = None
        try:
            proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            assert proc is not None  # only its wait times out
            procs.stop(proc)
            outcome = _outcome(-1, log, out, err, start)
            raise WorkbenchError(
                f"ncu ran past {timeout:g} s (WB_PROFILE_TIMEOUT) and was stopped; raise it for a "
                f"cold build or a long kernel. Its last lines:\n{outcome.tail()}"
            ) from None
        except (
            BaseException
        ):  # Ctrl-C (also just as ncu started): nothing of it outlives the command
            if proc is not None:
                procs.stop(proc)
            raise
        return _outcome(code, log, out, err, start)


def _outcome(code: int, log: Path, out: IO[bytes], err: IO[bytes], start: float) -> Outcome:
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
    log_text = log.read_text(errors="replace") if log.is_file() else ""
    return Outcome(code, log_text, texts[0], texts[1], time.perf_counter() - start)


def unknown_metrics(outcome: Outcome) -> list[str]:
    """Metrics ncu said it does not know (``==ERROR== Failed to find metric NAME``)."""
    names = re.findall(r"Failed to find metric\S*\s+(\S+)", outcome.text())
    return list(dict.fromkeys(n.strip("'\".,") for n in names))


def check(outcome: Outcome) -> None:
    """Raise for what stops a run from giving numbers: counters not permitted, or ncu failing."""
    text = outcome.text()
    if "ERR_NVGPUCTRPERM" in text:
        raise WorkbenchError(PERMISSION)
    failed = re.search(r"Failed to initialize the profiler[^\n]*", text)
    if failed:
        raise WorkbenchError(
            f"ncu could not start its profiler on this machine ({failed.group(0).strip()}): the "
            "GPU's counters are out of its reach here, as in a gVisor sandbox; profile on a "
            "machine or VM that gives ncu the GPU (a plain host, or a Firecracker VM)"
        )
    unknown = unknown_metrics(outcome)
    if unknown:
        raise WorkbenchError(
            f"ncu does not know the metric(s) {', '.join(unknown)} on this GPU; list the ones it "
            "has with `ncu --query-metrics` (or --query-metrics-mode all)"
        )
    if outcome.returncode != 0:
        raise WorkbenchError(f"ncu exited with status {outcome.returncode}:\n{outcome.tail()}")


def warnings(outcome: Outcome) -> list[str]:
    """ncu's ``==WARNING==`` and ``==ERROR==`` lines, for an error that explains an empty run."""
    return [
        line.strip()
        for line in outcome.text().splitlines()
        if line.startswith(("==WARNING==", "==ERROR=="))
    ]
