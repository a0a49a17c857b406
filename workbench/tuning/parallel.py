"""``wb tune --devices``: a host's GPUs check and time a tune run's variants side by side.

The run builds every variant once, in its own process, as a one-GPU run does (the cache holds
them). One worker process per GPU (``python -m workbench.tuning.parallel``) pins itself to its
GPU (``torch.cuda.set_device`` before any CUDA work: the same GPUs stay visible, so its build
configuration, and every key, is the run's), opens the family from the cache while the variants
build, and then answers requests, one JSON line each: it checks its share of the variants and
times them (:mod:`workbench.tuning.measure`), each variant wholly on its GPU, beside the default,
which every worker times (the first times it twice: the A/A pair of the noise band); the
variants are dealt so that each GPU times as many candidates. The workers are kept for the
library's life (:func:`pool_for`): a later tune of the family on those GPUs finds them with
CUDA started and the variants they timed open (a worker reloads the family when the run's
plain build changed).

The run merges the workers' tables into one: the first worker's as measured, every other
worker's variants scaled by the ratio of the default's time on the first GPU to its time on
theirs, size by size (the same model of GPU differs by a few percent between cards). With
WB_TUNE_PLAYOFF set (a fraction, 0.05 say), where the best variants of two GPUs' shares come
within it of each other at a size, which scaling cannot tell apart, the first GPU times the other
GPUs' best there too (the playoff) and those times replace the scaled ones, so that the winner is
chosen from times of one card as in a one-GPU run. Off by default: it costs a round of timings
(12 s of a 66 s tune of scale on two H200s). The noise band is the first worker's A/A band.

A worker that dies (a crash, a lost CUDA context) is reported with the tail of its stderr, and
its variants go to a new worker on the same GPU once, less those now remembered as crashing;
when that one dies too they are reported as failed. Ctrl-C (any exception) kills every worker.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench import knobs
from workbench.benchmark.stats import Measurement, Stats
from workbench.errors import WorkbenchError
from workbench.tuning.report import TuneSize, VariantResult

if TYPE_CHECKING:
    from workbench import build
    from workbench.api import Library

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
        self.checking: str | None = None  # the variant being checked, as it last said
        self.say: Callable[[str], None] = lambda line: None
        self.reader = threading.Thread(target=self._relay, daemon=True)
        self.reader.start()

    def _relay(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail.append(line.rstrip())
            self.say(f"{self.device}: {line.rstrip()}")

    def run(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send the request (a line) and wait for its answer (a line); None when the worker died,
        or gave none in WB_TUNE_WORKER_TIMEOUT seconds (then it is stopped, with any process it
        started, and its last stderr line says so)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        limit = knobs.tune_worker_timeout()
        timer = threading.Timer(limit, self._expire, args=(limit,))
        timer.daemon = True
        timer.start()
        try:
            try:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):  # it died before it read: its stderr says why
                pass
            self.checking = None
            answer = self._answer()
        finally:
            timer.cancel()
        if answer is None:
            self.kill()
            self.reader.join(timeout=5)
            if self.expired is not None:
                self.tail.append(self.expired)
            return None
        return answer

    def _answer(self) -> dict[str, Any] | None:
        """The answer line, after the variants' names as each one's check starts (the last one
        named when the worker died is the variant whose check ended it)."""
        assert self.proc.stdout is not None
        while line := self.proc.stdout.readline():
            try:
                said = json.loads(line)
            except ValueError:
                return None
            if not isinstance(said, dict):
                return None
            if "checking" not in said:
                return said
            self.checking = said["checking"]
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

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

    def end(self, grace: float = 10.0) -> None:
        """Close its requests (it exits when stdin ends), then kill it if it has not exited
        within ``grace`` seconds."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        self.kill()


class Pool:
    """The workers of a run, one per device, started at once (they load while the run builds)."""

    def __init__(self, devices: list[str], kernels: Path, namespace: str, family: str) -> None:
        self.devices, self.kernels = devices, kernels
        self.namespace, self.family = namespace, family
        self.workers: list[Worker] = []
        self.compiled: dict[str, list[str]] = {}  # per device, the TUs its worker compiled
        try:
            self.workers = [self._start(d) for d in devices]
        except BaseException:
            self.close()
            raise

    def _start(self, device: str) -> Worker:
        return Worker(device, self.kernels, self.namespace, self.family)

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
        timing of any worker, and the playoff's seconds. (sizes, rounds done)"""
        default = request["default"]
        has_default = any(v.label == default for v in variants)
        shares = _shares([v for v in variants if v.label != default], len(self.workers))
        point = {v.label: v.point for v in variants}
        answers: list[dict[str, Any] | None] = [None] * len(self.workers)
        for i, worker in enumerate(self.workers):  # one that died since the last run: anew
            if not worker.alive():
                self.workers[i] = self._start(worker.device)

        def ask(i: int, share: list[VariantResult]) -> None:
            labels = [default] * has_default + [v.label for v in share]
            asked = {**request, "variants": [{"label": n, "point": point[n]} for n in labels]}
            asked["aa"] = i == 0  # the noise band's A/A pair: on the first GPU only
            self.workers[i].say = say
            answers[i] = self.workers[i].run(asked)

        _each(ask, list(enumerate(shares)))
        for i, worker in enumerate(list(self.workers)):
            if answers[i] is not None:
                continue
            say(_died(worker))
            self.workers[i] = self._start(worker.device)  # for what is left, and the next run
            if worker.expired is not None:  # a second worker would wait as long: none
                for v in shares[i]:
                    v.status, v.detail = "timed out", f"{worker.device}: {worker.expired}"
                continue
            bad = crashed()
            last = next((x for x in reversed(worker.tail) if x.strip()), "no output")
            if worker.checking is not None:  # it died checking this one
                bad[keys[worker.checking]] = f"{worker.device}: its check ended the worker: {last}"
            share = [v for v in shares[i] if keys[v.label] not in bad]
            for v in shares[i]:
                if keys[v.label] in bad:
                    v.status, v.detail = "crashed", f"crashed its worker: {bad[keys[v.label]]}"
            if not share:
                continue
            say(f"{worker.device}: {len(share)} variants to a new worker")
            ask(i, share)
            if answers[i] is None:
                again = self.workers[i]
                say(_died(again))
                last = next((x for x in reversed(again.tail) if x.strip()), "no output")
                for v in share:
                    v.status, v.detail = "worker died", f"{worker.device}: {last}"
        for device, answer in zip(self.devices, answers, strict=True):
            self.compiled[device] = list((answer or {}).get("compiled", []))
            if self.compiled[device]:  # the run builds every variant: a worker should not
                say(f"{device} compiled {', '.join(self.compiled[device])}")
        names = {a["device"] for a in answers if a is not None}
        if len(names) > 1:
            say(f"the GPUs differ ({', '.join(sorted(names))}): times are scaled by the default's")
        for answer in answers:
            for phase, seconds in (answer or {}).get("phases", {}).items():
                phases[phase] = max(phases.get(phase, 0.0), seconds)
        sizes, done = merge(answers, variants, default, self.devices)
        band = knobs.tune_playoff()
        if answers[0] is not None and len(self.devices) > 1 and band > 0:
            start = time.perf_counter()
            owner = {v.label: i for i, share in enumerate(shares) for v in share}
            self._playoff(request, sizes, variants, owner, band, say)
            phases["playoff"] = time.perf_counter() - start
        return sizes, done

    def _playoff(
        self,
        request: dict[str, Any],
        sizes: list[TuneSize],
        variants: list[VariantResult],
        owner: dict[str, int],
        band: float,
        say: Callable[[str], None],
    ) -> None:
        """Where the best of two GPUs' shares are within ``band`` (WB_TUNE_PLAYOFF) of each other
        at a size, time the other GPUs' best there on the first GPU, and put those times in the
        table (see the module docstring). ``owner``: the worker that timed each variant (the
        default: the first). A variant that fails its check on the first GPU is disqualified."""
        by_label = {v.label: v for v in variants}
        first = self.devices[0]
        asked: dict[str, list[str]] = {}
        for size in sizes:
            names = [n for n in size.variants if by_label[n].status == "checked"]
            if not names:
                continue
            t = {n: size.times[n].stats.median for n in names}
            best_of: dict[int, str] = {}  # worker -> its share's best
            for n in sorted(names, key=t.__getitem__):
                best_of.setdefault(owner.get(n, 0), n)
            close = [n for n in best_of.values() if t[n] <= min(t.values()) * (1 + band)]
            others = [n for n in close if owner.get(n, 0) != 0]
            if len(close) > 1 and others:
                asked[size.label] = others
        if not asked:
            return
        labels = sorted({n for names in asked.values() for n in names})
        say(f"playoff on {first}: {', '.join(labels)} at {', '.join(asked)}")
        request = {**request, "sizes": list(asked), "aa": False}
        request["variants"] = [{"label": n, "point": by_label[n].point} for n in labels]
        answer = self.workers[0].run(request)
        if answer is None:
            say(_died(self.workers[0]) + "\n(the playoff's variants keep their scaled times)")
            self.workers[0] = self._start(first)
            return
        for row in answer["variants"]:
            if row["status"] != "checked":
                v = by_label[row["label"]]
                v.status, v.detail = row["status"], f"{first}: {row['detail']}"
                for size in sizes:
                    size.times.pop(v.label, None)
                    size.rounds.pop(v.label, None)
        for timed in (_size(d) for d in answer["sizes"]):
            size = next(s for s in sizes if s.label == timed.label)
            for name in asked.get(timed.label, []):
                if name in timed.times and name in size.times:
                    size.times[name] = timed.times[name]
                    size.rounds[name] = timed.rounds.get(name, [])


_pools: dict[tuple[Any, ...], Pool] = {}


def pool_for(lib: Library, devices: list[str], family: str) -> Pool:
    """The workers of ``lib`` on ``devices`` for ``family``: started by its first tune there,
    kept for the next ones (with CUDA started and the variants they timed open) until the
    library is collected, :func:`close_pools` or the process ends."""
    key = (id(lib), lib.namespace, family, tuple(devices), *(knobs.get(n) for n in _KNOBS))
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = Pool(devices, lib.project.kernels_dir, lib.namespace, family)
        weakref.finalize(lib, _drop, key)
    return pool


def _drop(key: tuple[Any, ...]) -> None:
    pool = _pools.pop(key, None)
    if pool is not None:
        pool.close()


def close_pools() -> None:
    """End every kept worker (their GPU memory is freed): each is asked to exit, and killed
    where it has not within a few seconds."""
    pools = [_pools.pop(key) for key in list(_pools)]
    workers = [w for pool in pools for w in pool.workers]
    _each(Worker.end, [(w,) for w in workers])


atexit.register(close_pools)


@contextlib.contextmanager
def closed_on_error(pool: Pool | None) -> Iterator[None]:
    """Any exception (Ctrl-C included) ends the pool's workers and forgets the pool."""
    try:
        yield
    except BaseException:
        for key in [k for k, p in _pools.items() if p is pool]:
            del _pools[key]
        if pool is not None:
            pool.close()
        raise


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


def _each(fn: Callable[..., None], items: Sequence[tuple[Any, ...]]) -> None:
    """``fn(*item)`` for every item at once, a thread each (each waits on its own process)."""
    threads = [threading.Thread(target=fn, args=item) for item in items]
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
    (``cuda:N``), open the family, then answer requests until stdin ends: each a JSON line (op,
    dtype, seed, min_time, rounds, seconds, sizes, default, only, variants, build, aa), each
    answer a JSON line on the process's stdout. Anything else written to stdout (a print, a
    kernel's printf) goes to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
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
    while line := sys.stdin.readline():
        request = json.loads(line)
        if request.get("build") not in (None, lib.families[family_name].key):
            lib.reload()  # the run's plain build changed since this worker opened it
        compiled.clear()
        phases: dict[str, float] = {}

        def starting(label: str | None) -> None:  # the variant whose check may end this worker
            print(json.dumps({"checking": label}), file=answers, flush=True)

        sizes, answer_rows, done = _check_and_time(lib, family_name, dev, request, phases, starting)
        answer = {
            "variants": answer_rows,
            "phases": phases,
            "compiled": list(compiled),
            "rounds": done,
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "sizes": [_size_record(s) for s in sizes],
            "build": lib.families[family_name].key,  # the plain build it timed beside
        }
        print(json.dumps(answer), file=answers, flush=True)
    return 0


def _check_and_time(
    lib: Any,
    family_name: str,
    dev: torch.device,
    request: dict[str, Any],
    phases: dict[str, float],
    starting: Callable[[str | None], None],
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
    ops = measure.check_all(lib, spec, dev, dt, variants, built, say, family, only_set, starting)
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
