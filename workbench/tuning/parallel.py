"""``wb tune --devices``: a host's GPUs check and time a tune run's variants side by side.

The run builds every variant once, in its own process, as a one-GPU run does (the cache holds
them). One worker process per GPU, started with the run (``python -m
workbench.tuning.parallel``), pins itself to its GPU (``torch.cuda.set_device`` before any CUDA
work: the same GPUs stay visible, so its build configuration, and every key, is the run's), opens
the family from the cache while the variants build, and then gets its share of the variants: it
checks them and times them (:mod:`workbench.tuning.measure`), each variant wholly on its GPU,
beside the default variant, which every worker times (the first times it twice: the A/A pair of
the noise band); the variants are dealt so that each GPU times as many candidates.

The run merges the workers' tables into one: the first worker's as measured, every other
worker's variants scaled by the ratio of the default's time on the first GPU to its time on
theirs, size by size (the same model of GPU differs by a few percent between cards). The noise
band is the first worker's A/A band; the choice of winners is a one-GPU run's.

A worker that dies (a crash, a lost CUDA context) is reported with the tail of its stderr, and
its variants go to a new worker on the same GPU once, less those now remembered as crashing;
when that one dies too they are reported as failed. Ctrl-C (any exception) kills every worker.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench import knobs
from workbench.benchmark.stats import Measurement, Stats
from workbench.errors import WorkbenchError
from workbench.tuning.report import TuneSize, VariantResult

if TYPE_CHECKING:
    from workbench import build

# Knobs a worker reads as the run does (a test's scoped override reaches it too).
_KNOBS = ("WB_CACHE_DIR", "WB_NVRTC", "WB_DEVICES", "WB_QUIET", "WB_NVCC_PIPELINE", "WB_JOBS")
_TAIL = 20  # lines of a dead worker's stderr that the run shows


def devices_of(devices: str | Sequence[str] | None, dev: torch.device) -> list[int] | None:
    """The GPU indices ``devices`` names ('all', 'cuda:0,cuda:1', '0,1' or a list of those);
    None where it is left out. A WorkbenchError names a bad value and the fix."""
    if devices is None:
        return None
    text = devices if isinstance(devices, str) else ",".join(devices)
    named: list[int] = []
    if text.strip() != "all":
        for part in (p.strip() for p in text.split(",")):
            index = part.removeprefix("cuda:")
            if not index.isdigit():
                raise WorkbenchError(
                    f"--devices: {part!r} is not a GPU: name them as cuda:N, comma-separated "
                    "(cuda:0,cuda:1), or say 'all'"
                )
            if int(index) in named:
                raise WorkbenchError(f"--devices names cuda:{index} twice")
            named.append(int(index))
    if not torch.cuda.is_available():
        raise WorkbenchError(
            f"--devices {text}: this host has no CUDA GPU (torch.cuda.is_available() is False); "
            "leave --devices out to tune on the CPU, or run on a host with GPUs"
        )
    if dev.type != "cuda":
        raise WorkbenchError(
            f"--devices {text} times on GPUs, but the run is on {dev.type}: use --device cuda "
            "(or leave --device out)"
        )
    count = torch.cuda.device_count()
    for gpu in named:
        if gpu >= count:
            raise WorkbenchError(
                f"--devices: cuda:{gpu} is not a GPU of this host (it has cuda:0 to "
                f"cuda:{count - 1})"
            )
    return named or list(range(count))


class Worker:
    """One worker process on one device (``cuda:N``; ``cpu`` serves the tests of the pool on a
    host without GPUs): its stderr relayed line by line, its last lines kept."""

    def __init__(self, device: str, kernels: Path, namespace: str, family: str) -> None:
        self.device = device
        env = dict(os.environ)
        for name in _KNOBS:
            value = knobs.get(name)
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        root = str(Path(__file__).resolve().parents[2])  # where the workbench package is
        env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "workbench.tuning.parallel", device, str(kernels)]
        self.proc = subprocess.Popen(
            [*cmd, namespace, family],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the run, which ends every worker
        )
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
        self.expired: str | None = None  # why the wait for its answer was cut short
        self.say: Callable[[str], None] = lambda line: None
        self.reader = threading.Thread(target=self._relay, daemon=True)
        self.reader.start()

    def _relay(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail.append(line.rstrip())
            self.say(f"{self.device}: {line.rstrip()}")

    def run(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send the request and wait for the answer; None when the worker died, or gave none in
        WB_TUNE_WORKER_TIMEOUT seconds (then it is stopped, with any process it started, and its
        last stderr line says so)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        limit = knobs.tune_worker_timeout()
        timer = threading.Timer(limit, self._expire, args=(limit,))
        timer.daemon = True
        timer.start()
        try:
            try:
                self.proc.stdin.write(json.dumps(request))
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):  # it died before it read: its stderr says why
                pass
            out = self.proc.stdout.read()
            self.proc.wait()
        finally:
            timer.cancel()
        self.reader.join(timeout=5)
        if self.expired is not None:
            self.tail.append(self.expired)
        if self.proc.returncode != 0:
            return None
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None
        return answer if isinstance(answer, dict) else None

    def _expire(self, limit: float) -> None:
        """No answer in time: end the worker's whole session (a process it started could hold
        its output open), so that the wait for its answer ends."""
        self.expired = f"no answer in {limit:g} s: stopped (WB_TUNE_WORKER_TIMEOUT sets the limit)"
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Pool:
    """The workers of a run, one per device, started at once (they load while the run builds)."""

    def __init__(self, devices: list[str], kernels: Path, namespace: str, family: str) -> None:
        self.devices, self.kernels = devices, kernels
        self.namespace, self.family = namespace, family
        self.workers: list[Worker] = []
        self.compiled: dict[str, list[str]] = {}  # per device, the TUs its worker compiled
        try:
            self.workers = [Worker(d, kernels, namespace, family) for d in devices]
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        for w in self.workers:
            w.kill()

    def measure(
        self,
        request: dict[str, Any],
        variants: list[VariantResult],
        say: Callable[[str], None],
        crashed: Callable[[], dict[str, str]],
        keys: dict[str, str],
        phases: dict[str, float],
    ) -> tuple[list[TuneSize], int]:
        """Check and time ``variants`` (built, one per build key) on the pool's GPUs; their
        status and device are set. ``request``: what every worker is asked besides its share
        (see :func:`main`). ``crashed``/``keys``: the builds remembered as crashing, and each
        variant's build key, for a worker's second try. ``phases`` gets the longest check and
        timing of any worker. (sizes, rounds done)"""
        default = request["default"]
        has_default = any(v.label == default for v in variants)
        shares = _shares([v for v in variants if v.label != default], len(self.workers))
        point = {v.label: v.point for v in variants}
        answers: list[dict[str, Any] | None] = [None] * len(self.workers)

        def ask(i: int, worker: Worker, share: list[VariantResult]) -> None:
            labels = [default] * has_default + [v.label for v in share]
            asked = {**request, "variants": [{"label": n, "point": point[n]} for n in labels]}
            asked["aa"] = i == 0  # the noise band's A/A pair: on the first GPU only
            worker.say = say
            answers[i] = worker.run(asked)

        first = list(self.workers)
        _each(ask, list(enumerate(zip(first, shares, strict=True))))
        for i, worker in enumerate(first):
            if answers[i] is not None:
                continue
            say(_died(worker))
            if worker.expired is not None:  # a second worker would wait as long: none
                for v in shares[i]:
                    v.status, v.detail = "timed out", f"{worker.device}: {worker.expired}"
                continue
            bad = crashed()
            share = [v for v in shares[i] if keys[v.label] not in bad]
            for v in shares[i]:
                if keys[v.label] in bad:
                    v.status, v.detail = "crashed", f"crashed its worker: {bad[keys[v.label]]}"
            if not share:
                continue
            say(f"{worker.device}: {len(share)} variants to a new worker")
            again = Worker(worker.device, self.kernels, self.namespace, self.family)
            self.workers.append(again)
            ask(i, again, share)
            if answers[i] is None:
                say(_died(again))
                last = next((x for x in reversed(again.tail) if x.strip()), "no output")
                for v in share:
                    v.status, v.detail = "worker died", f"{worker.device}: {last}"
        for worker, answer in zip(first, answers, strict=True):
            self.compiled[worker.device] = list((answer or {}).get("compiled", []))
            if self.compiled[worker.device]:  # the run builds every variant: a worker should not
                say(f"{worker.device} compiled {', '.join(self.compiled[worker.device])}")
        names = {a["device"] for a in answers if a is not None}
        if len(names) > 1:
            say(f"the GPUs differ ({', '.join(sorted(names))}): times are scaled by the default's")
        for answer in answers:
            for phase, seconds in (answer or {}).get("phases", {}).items():
                phases[phase] = max(phases.get(phase, 0.0), seconds)
        return merge(answers, variants, default, self.devices)


def _shares(variants: list[VariantResult], workers: int) -> list[list[VariantResult]]:
    """The variants dealt out so that every worker times as many candidates as the others: each
    times the default too, and the first times it twice (its A/A pair)."""
    load = [2] + [1] * (workers - 1)
    out: list[list[VariantResult]] = [[] for _ in range(workers)]
    for v in variants:
        i = min(range(workers), key=lambda w: (load[w], w))
        out[i].append(v)
        load[i] += 1
    return out


def _died(worker: Worker) -> str:
    tail = "\n".join(worker.tail) or "(no output)"
    return f"the worker on {worker.device} died (exit {worker.proc.returncode}):\n{tail}"


def _each(fn: Callable[..., None], items: list[tuple[int, tuple[Worker, list[Any]]]]) -> None:
    """``fn(i, worker, share)`` for every worker at once (each waits on its own process)."""
    threads = [threading.Thread(target=fn, args=(i, w, s)) for i, (w, s) in items]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # join with a timeout: Ctrl-C reaches this thread between waits
            t.join(0.2)


def merge(
    answers: list[dict[str, Any] | None],
    variants: list[VariantResult],
    default: str,
    devices: list[str],
) -> tuple[list[TuneSize], int]:
    """The workers' answers (None for a worker that died), one per device: their statuses set
    on ``variants`` and their tables merged into one (see the module docstring)."""
    by_label = {v.label: v for v in variants}
    tables: list[list[TuneSize]] = []
    done = None
    for device, answer in zip(devices, answers, strict=True):
        if answer is None:
            continue
        for row in answer["variants"]:
            v = by_label[row["label"]]
            if v.label == default and v.status == "checked":
                continue  # checked by an earlier worker too
            v.status, v.detail, v.device = row["status"], row["detail"], device
        if answer["sizes"]:
            tables.append([_size(s) for s in answer["sizes"]])
            done = answer["rounds"] if done is None else min(done, answer["rounds"])
    if not tables:
        return [], 0
    first, rest = tables[0], tables[1:]
    for size in first:
        for table in rest:
            other = next(s for s in table if s.label == size.label)
            scale = 1.0
            if size.time(size.ref) and other.time(other.ref) and size.ref == other.ref:
                scale = size.time(size.ref) / other.time(other.ref)  # type: ignore[operator]
            for name in other.variants:
                if name != other.ref:
                    size.times[name] = _scaled(other.times[name], scale)
                    size.rounds[name] = [r * scale for r in other.rounds.get(name, [])]
    return first, done or 0


def _scaled(m: Measurement, factor: float) -> Measurement:
    s = m.stats
    stats = Stats(s.median * factor, s.q1 * factor, s.q3 * factor, s.n)
    wall = m.wall_per_call * factor if m.wall_per_call is not None else None
    return Measurement(stats, m.method, list(m.warnings), wall)


def _measurement(m: Measurement) -> dict[str, Any]:
    s = m.stats
    return {"stats": [s.median, s.q1, s.q3, s.n], "method": m.method, "warnings": m.warnings,
            "wall": m.wall_per_call}  # fmt: skip


def _size_record(s: TuneSize) -> dict[str, Any]:
    times = {c: _measurement(m) for c, m in s.times.items()}
    return {"label": s.label, "numel": s.numel, "ref": s.ref, "rounds": s.rounds, "times": times}


def _size(d: dict[str, Any]) -> TuneSize:
    times = {
        c: Measurement(Stats(*m["stats"]), m["method"], list(m["warnings"]), m["wall"])
        for c, m in d["times"].items()
    }
    return TuneSize(d["label"], d["numel"], times, d["rounds"], d["ref"])


# --- the worker ---------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """``python -m workbench.tuning.parallel DEVICE KERNELS NAMESPACE FAMILY``: pin to DEVICE
    (``cuda:N``), open the family, then read one request (JSON on stdin: op, dtype, seed,
    min_time, rounds, seconds, sizes, default, only, variants) and answer it (JSON, the last
    line of stdout)."""
    dev, kernels, namespace, family_name = torch.device(argv[1]), argv[2], argv[3], argv[4]
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # before any CUDA work: its context is on this GPU alone
        torch.zeros(1, device=dev)  # CUDA starts while the run builds
    from workbench import api, events

    compiled: list[str] = []  # what this worker compiled: nothing, when the run built it all
    events.compile_hooks.append(lambda family, source: compiled.append(str(source)))
    # Registered now (not at the first lookup of an op): its live handle names the kernels of
    # its device-only TUs, which a variant's modules are compiled for (as the run's are).
    lib = api.load(kernels, namespace=namespace, families=[family_name], eager=True)
    request = json.loads(sys.stdin.read())
    phases: dict[str, float] = {}
    sizes, answer_rows, done = _check_and_time(lib, family_name, dev, request, phases)
    answer = {
        "variants": answer_rows,
        "phases": phases,
        "compiled": compiled,
        "rounds": done,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "sizes": [_size_record(s) for s in sizes],
    }
    print(json.dumps(answer), flush=True)
    return 0


def _check_and_time(
    lib: Any, family_name: str, dev: torch.device, request: dict[str, Any], phases: dict[str, float]
) -> tuple[list[TuneSize], list[dict[str, str]], int]:
    from workbench import build as build_mod
    from workbench.benchmark.run import pick_sizes, resolve_dtype, spec_for, sweep
    from workbench.tuning import measure
    from workbench.tuning.space import variant

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    dt = resolve_dtype(request["dtype"])
    op = request["op"]
    spec = spec_for(lib, op, dev, dt)
    samples = pick_sizes(sweep(spec, dt, dev, request["seed"]), request["sizes"], op)
    family = lib.project.family(family_name)
    variants = [VariantResult(v["label"], dict(v["point"])) for v in request["variants"]]
    built: dict[str, build.Built] = {}
    for v in variants:  # from the cache: the run built them
        built[v.label] = build_mod.ensure(lib.project, variant(family, v.point), lib.config, 1)
        v.status = "built"
    only = request["only"]
    only_set = {(str(f), str(n)) for f, n in only} if only is not None else None
    start = time.perf_counter()
    deadline = None if request["seconds"] is None else start + request["seconds"]
    ops = measure.check_all(lib, spec, dev, dt, variants, built, say, family, only_set)
    phases["check"] = time.perf_counter() - start
    rows = [{"label": v.label, "status": v.status, "detail": v.detail} for v in variants]
    if not ops:
        return [], rows, 0
    start = time.perf_counter()
    sizes, done = measure.time_all(
        spec, dev, dt, ops, request["default"], samples, request["seed"], request["min_time"],
        request["rounds"], deadline, say, request.get("aa", True),
    )  # fmt: skip
    phases["time"] = time.perf_counter() - start
    return sizes, rows, done


if __name__ == "__main__":
    sys.exit(main(sys.argv))
