"""NVRTC in worker processes, for compiles of many programs at once (``wb tune``'s sweeps).

Threads of one process compile NVRTC programs side by side, but scale worse than processes do:
on a 16-core H100 host, 42 programs of the wgmma matmul took 1.75 s in 16 threads and 1.30 s in
16 processes, against 10.1 s one after another (``python -m bench nvrtc_parallel``). A reload
compiles a few programs and keeps to threads (a process costs ~0.1 s to start); a tune sweep of
tens of programs starts its workers first (while the plain build runs its inputs) and hands
each program to an idle one.

The workers are ``python -m workbench.nvrtc_worker``, not ``multiprocessing``: a spawned or
forked child would import the caller's ``__main__`` (a research script without a ``__main__``
guard would run again in every worker) or inherit locks another thread holds mid-compile.

Protocol, one JSON line each way per program: the parent sends ``{"source", "arch", "names",
"options", "out"}``; the worker writes the cubin to ``out`` and answers ``{"lowered", "log",
"seconds"}``, or ``{"error", "log"}`` when NVRTC refused the program.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from workbench.errors import BuildError


class Workers:
    """``count`` worker processes, started at once; :meth:`compile` is thread-safe and takes
    an idle worker (waiting for one). Use as a context manager: leaving it ends the workers."""

    def __init__(self, count: int, library: str) -> None:
        env = dict(os.environ, WB_NVRTC=library)  # the parent's NVRTC, whatever its knobs say
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
        )
        self._procs: list[subprocess.Popen[bytes]] = []
        self._idle: queue.Queue[subprocess.Popen[bytes]] = queue.Queue()
        for _ in range(max(1, count)):
            proc = subprocess.Popen(
                [sys.executable, "-m", "workbench.nvrtc_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            self._procs.append(proc)
            self._idle.put(proc)

    def compile(
        self, source: Path, arch: str, names: list[str], options: list[str], out: Path
    ) -> tuple[dict[str, str], str, float]:
        """Compile in a worker, the cubin written to ``out``: (lowered names, log, seconds).
        The worker is this thread's until it answers."""
        proc = self._idle.get()
        job = {"source": str(source), "arch": arch, "names": names, "options": options}
        try:
            reply = _exchange(proc, {**job, "out": str(out)})
        finally:
            self._idle.put(proc)
        if reply is None:
            code = proc.poll()
            raise BuildError(
                f"the NVRTC worker process compiling {source} for {arch} ended "
                f"(exit code {code}) before it answered"
            )
        if "error" in reply:
            raise BuildError(str(reply["error"]), str(reply.get("log", "")))
        return dict(reply["lowered"]), str(reply["log"]), float(reply["seconds"])

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The worker processes, in start order (a test kills one to see the error)."""
        return list(self._procs)

    def close(self) -> None:
        for proc in self._procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):  # a worker that died: its pipe is broken
                    proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exchange(proc: subprocess.Popen[bytes], job: dict[str, Any]) -> dict[str, Any] | None:
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None
    try:
        stdin.write(json.dumps(job).encode() + b"\n")
        stdin.flush()
    except (BrokenPipeError, OSError):
        return None
    line = stdout.readline()
    return json.loads(line) if line else None


def _serve(lines: IO[bytes], answers: IO[bytes]) -> None:
    from workbench import nvrtc

    nvrtc.library()  # loaded before the first job arrives
    for line in lines:
        job = json.loads(line)
        start = time.perf_counter()
        try:
            result = nvrtc.compile(Path(job["source"]), job["arch"], job["names"], job["options"])
        except BuildError as e:
            reply: dict[str, Any] = {"error": str(e), "log": e.log}
        else:
            with open(job["out"], "wb") as f:
                f.write(result.cubin)
            reply = {"lowered": result.lowered, "log": result.log}
            reply["seconds"] = time.perf_counter() - start
        answers.write(json.dumps(reply).encode() + b"\n")
        answers.flush()


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)
