"""The bundled kernels against their goals: each a ratio to its peer in one run, L2 flushed.

One row per goal shape: the default route of our op (no tune table, no environment switch)
against its peer timed interleaved with it in the same process: cuBLAS through ``torch.mm``
for matmul, a device copy of the same bytes for softmax (the share of that copy's time),
``torch.histc`` for histogram, ``torch.compile`` of the reference training step for layer_norm
(through ``wb bench --backward``). Every timed output is compared with its peer's first: a wrong
kernel is marked, not timed as a win. matmul float32 also gets its error against a float64 truth
over cuBLAS's own. Times are medians of CUDA-event pairs after 0.2 s of warm-up rounds, each call
after a write and a read of a buffer twice the L2 (so the call reads from DRAM and pays no
write-back of the flush) and a spin of the GPU (so the events time the call's kernels, not the
host's dispatch of it: the time an op's dispatch costs the host is a measurement of its own).

A/B of a kernel's switches: each ``--variant LABEL:NAME=VALUE[,NAME=VALUE...]`` adds, for every
case, a row of our op run with those environment variables set (the bundled launchers read their
switches, such as WB_SOFTMAX_PATH, at each call), timed interleaved with the default and the peer
in the same repetitions and checked like the default. A name no bundled kernel source mentions is
refused (a typo would time the default twice).

Usage: python -m bench kernel_goals [--ops matmul,softmax,histogram,layer_norm] [--reps 30]
       [--variant LABEL:NAME=VALUE[,...]]... [--out DIR]
Writes kernel-goals.md and kernel-goals.json into --out ($OUT, else the current folder) and
prints the table last. Needs a CUDA GPU; the goals name Hopper (sm_90) figures.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import environment, markdown_table, out_dir, parser, write_json, write_text

OPS = ("matmul", "softmax", "histogram", "layer_norm")
SPIN_CYCLES = 200_000  # about 100 us of GPU clock: longer than a call's dispatch on the host
KERNELS = Path(__file__).resolve().parent.parent / "kernels"


@dataclass(frozen=True)
class Variant:
    """Our op under a set of environment switches; the default has no label and no switches."""

    label: str = ""
    env: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.env.items())

    def name(self, op: str) -> str:
        return f"{op} [{self.label}]" if self.label else op

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


DEFAULT = Variant()


def switches_read(kernels: Path = KERNELS) -> set[str]:
    """The WB_* names the bundled kernel sources mention (the switches their launchers read)."""
    names: set[str] = set()
    for path in kernels.rglob("*"):
        if path.suffix in (".cu", ".cuh", ".h", ".cpp"):
            names.update(re.findall(r"\bWB_[A-Z0-9_]+\b", path.read_text(errors="replace")))
    return names


def parse_variant(text: str, known: set[str]) -> Variant:
    """``LABEL:NAME=VALUE[,NAME=VALUE...]``, each NAME a switch a bundled kernel reads."""
    label, sep, rest = text.partition(":")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.+-]+", label.strip()):
        raise SystemExit(
            f"--variant {text!r}: write LABEL:NAME=VALUE[,NAME=VALUE...], e.g. "
            "wide:WB_SOFTMAX_PATH=wide (the label letters, digits, _ . + -)"
        )
    env: dict[str, str] = {}
    for item in rest.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or not name:
            raise SystemExit(f"--variant {text!r}: {item.strip()!r} is not NAME=VALUE")
        if name not in known:
            family = "_".join(name.split("_")[:2]) + "_"
            near = sorted(n for n in known if n.startswith(family)) or sorted(known)
            raise SystemExit(
                f"--variant {text!r}: no bundled kernel reads {name}; switches they read: "
                + ", ".join(near[:40])
            )
        env[name] = value
    return Variant(label.strip(), env)


@dataclass(frozen=True)
class Row:
    """One goal: ``value`` is peer time over ours ("x"), the share of a copy's time ("%"), or
    our error over the peer's ("err", where lower is better)."""

    op: str
    case: str
    dtype: str
    ours_us: float
    peer: str
    peer_us: float
    value: float
    kind: str  # "x", "%" or "err"
    goal: float
    ok: bool  # the output agreed with the peer's
    note: str = ""

    @property
    def met(self) -> bool:
        if not self.ok:
            return False
        return self.value <= self.goal if self.kind == "err" else self.value >= self.goal

    def cells(self) -> list[str]:
        if self.kind == "%":
            value, goal = f"{self.value:.0%}", f">= {self.goal:.0%}"
        elif self.kind == "err":
            value, goal = f"{self.value:.2f}x", f"<= {self.goal:.1f}x"
        else:
            value, goal = f"{self.value:.2f}x", f">= {self.goal:.2f}x"
        verdict = "**met**" if self.met else ("WRONG OUTPUT" if not self.ok else "not met")
        times = [f"{self.ours_us:.1f}", f"{self.peer_us:.1f}"] if self.kind != "err" else ["-"] * 2
        return [self.op, self.case, self.dtype, *times, self.peer, value, goal, verdict, self.note]


HEAD = ("op", "case", "dtype", "ours us", "peer us", "peer", "value", "goal", "", "note")


def render(rows: Sequence[Row], header: str) -> str:
    met = sum(r.met for r in rows)
    return "\n".join(
        [
            header,
            "",
            markdown_table(HEAD, [r.cells() for r in rows], align="rrrrrrrr"),
            "",
            f"{met} of {len(rows)} goals met.",
        ]
    )


def parse_variants(texts: Sequence[str]) -> list[Variant]:
    """Each ``--variant`` given (:func:`parse_variant`), every label once."""
    known = switches_read() if texts else set()
    variants = [parse_variant(v, known) for v in texts]
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"--variant: each label once, got {', '.join(labels)}")
    return variants


def parse_ops(text: str) -> list[str]:
    ops = [o.strip() for o in text.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise SystemExit(
            f"--ops: unknown op(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(OPS)}"
        )
    return ops


# --- timing ---------------------------------------------------------------------------------


class Timer:
    """Interleaved CUDA-event medians with the L2 flushed before every call."""

    def __init__(self, reps: int, variants: Sequence[Variant] = ()) -> None:
        import torch

        self.torch = torch
        self.reps = reps
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.variants = (DEFAULT, *variants)  # each case's rows of our op: the default first

    def us(self, *fns: Callable[[], Any] | tuple[Variant, Callable[[], Any]]) -> list[float]:
        """Median microseconds of each fn, one call of each in turn per repetition; a (variant,
        fn) pair runs with the variant's switches set (before its start event is recorded)."""
        from workbench.benchmark.timer_cuda import WARMUP_S, flush_l2

        torch = self.torch
        pairs = [f if isinstance(f, tuple) else (DEFAULT, f) for f in fns]
        # Warm-up rounds for WARMUP_S of wall time, as the bench's own timer does: one call each
        # left the clocks low on a freshly started host (both sides 1.5-2x slow, unequally).
        warm_until = time.perf_counter() + WARMUP_S
        while True:
            for variant, fn in pairs:
                with variant.applied():
                    fn()
            torch.cuda.synchronize()
            if time.perf_counter() >= warm_until:
                break
        marks: list[list[tuple[Any, Any]]] = [[] for _ in pairs]
        for _ in range(self.reps):
            for i, (variant, fn) in enumerate(pairs):
                with variant.applied():
                    flush_l2(self.device)  # a write, then a read, of twice the L2
                    # The GPU spins while the host issues the start event and the call, so that
                    # the interval holds the call's GPU work, not the host's dispatch of it: after
                    # a flush the GPU idled until the call's kernels arrived, and a small call
                    # (the few-rows matmuls' 17 us) measured the host's 15-23 us of dispatch,
                    # which swings with the host's load, instead of its kernels.
                    torch.cuda._sleep(SPIN_CYCLES)  # type: ignore[no-untyped-call]
                    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    start.record()
                    fn()
                    end.record()
                marks[i].append((start, end))
        torch.cuda.synchronize()
        return [1e3 * statistics.median(s.elapsed_time(e) for s, e in m) for m in marks]

    def ours(
        self,
        fn: Callable[[], Any],
        judge: Callable[[Any], tuple[bool, str]],
        *peers: Callable[[], Any],
    ) -> tuple[list[tuple[Variant, float, bool, str]], list[float]]:
        """Our fn under each variant, its output judged first by `judge` (-> agrees, note), and
        the peers, timed interleaved in one run: ([(variant, us, agrees, note)], [peer us]). A
        variant whose call raises (a bad switch value: the launcher names it) is reported with
        its error and not timed."""
        runs: list[tuple[Variant, bool, str, bool]] = []
        for variant in self.variants:
            with variant.applied():
                try:
                    ok, note = judge(fn())
                    runs.append((variant, ok, note, True))
                except Exception as e:
                    if variant is DEFAULT:
                        raise
                    runs.append((variant, False, f"{type(e).__name__}: {e}".splitlines()[0], False))
        times = iter(self.us(*[(v, fn) for v, _, _, ran in runs if ran], *peers))
        ours = [(v, next(times) if ran else 0.0, ok, note) for v, ok, note, ran in runs]
        return ours, list(times)


def rel_err(c: Any, ref: Any) -> float:
    return float((c.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# --- the ops --------------------------------------------------------------------------------


def matmul_rows(lib: Any, timer: Timer) -> list[Row]:
    import torch

    bf, hf, gen = torch.bfloat16, torch.float16, torch.Generator("cuda").manual_seed(0)

    def mma(a: Any, b: Any) -> Any:
        return lib.matmul_path(a, b, 2)  # the mma.sync path, what sm_80 to sm_89 GPUs run

    few = [
        ("default", lib.matmul, dt, m, 4096, 4096, 0.9) for m in (1, 16, 64, 128) for dt in (bf, hf)
    ]
    cases = [("default", lib.matmul, bf, 4096, 4096, 4096, 1.0),
             ("default", lib.matmul, hf, 4096, 4096, 4096, 1.0),
             ("default", lib.matmul, bf, 8192, 8192, 8192, 1.0),
             ("default", lib.matmul, bf, 8192, 8192, 1024, 0.9), *few,
             ("mma path", mma, bf, 4096, 4096, 4096, 0.5)]  # fmt: skip
    rows = []
    for name, fn, dt, m, n, k, goal in cases:
        a = torch.randn(m, k, device="cuda", dtype=dt, generator=gen)
        b = torch.randn(k, n, device="cuda", dtype=dt, generator=gen)
        ref = a.float() @ b.float()
        blas_err = rel_err(torch.mm(a, b), ref)

        def judge(c: Any, ref: Any = ref, blas_err: float = blas_err) -> tuple[bool, str]:
            err = rel_err(c, ref)
            return err <= 2 * blas_err + 1e-3, f"error {err:.1e} (cuBLAS {blas_err:.1e})"

        ours, (t_blas,) = timer.ours(
            lambda a=a, b=b, f=fn: f(a, b), judge, lambda a=a, b=b: torch.mm(a, b)
        )
        for v, t, ok, note in ours:
            rows.append(Row(v.name(f"matmul ({name})"), f"{m}x{n}x{k}", str(dt)[6:], t, "cuBLAS",
                            t_blas, t_blas / t if t else 0.0, "x", goal, ok, note))  # fmt: skip
    return rows + matmul_float32_rows(lib, timer)


def matmul_float32_rows(lib: Any, timer: Timer) -> list[Row]:
    """The SIMT kernel's speed against cuBLAS float32 (TF32 off), and its error against a float64
    truth over cuBLAS's own at k up to 8192."""
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    rows = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(4096, 4096, device="cuda", generator=gen)
        b = torch.randn(4096, 4096, device="cuda", generator=gen)
        want = torch.mm(a, b)
        ours, (t_blas,) = timer.ours(
            lambda: lib.matmul(a, b),
            lambda c: (torch.allclose(c, want, rtol=1e-3, atol=1e-2), "TF32 off"),
            lambda: torch.mm(a, b),
        )
        for v, t, ok, note in ours:
            rows.append(Row(v.name("matmul (default)"), "4096x4096x4096", "float32", t, "cuBLAS",
                            t_blas, t_blas / t if t else 0.0, "x", 0.7, ok, note))  # fmt: skip
        for out in (64, 1024):
            for k in (256, 1024, 4096, 8192):
                a = torch.randn(out, k, device="cuda", generator=gen)
                b = torch.randn(k, out, device="cuda", generator=gen)
                truth = a.double() @ b.double()
                blas = float((torch.mm(a, b).double() - truth).abs().max())
                for v in timer.variants:
                    with v.applied():
                        ours_err = float((lib.matmul(a, b).double() - truth).abs().max())
                    rows.append(Row(v.name("matmul error"), f"{out}x{out}, k = {k}", "float32",
                                    0.0, "cuBLAS", 0.0, ours_err / blas, "err", 2.0, True,
                                    f"max error {ours_err:.2e} (cuBLAS {blas:.2e})"))  # fmt: skip
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return rows


def softmax_rows(lib: Any, timer: Timer) -> list[Row]:
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    rows = []
    sizes = ((1024, 65536), (256, 65536), (64, 262144), (4096, 16384), (16384, 1024))
    for dt in (torch.float32, torch.bfloat16):
        for r, c in sizes:
            x = torch.randn(r, c, device="cuda", dtype=dt, generator=gen)
            g = torch.randn(r, c, device="cuda", dtype=dt, generator=gen)
            y = torch.softmax(x.float(), -1).to(dt)
            tol = 1e-4 if dt == torch.float32 else 2e-2  # of the largest output
            want_f = torch.softmax(x.float(), -1)
            want_b = torch._softmax_backward_data(g.float(), y.float(), -1, torch.float32)
            dst, src = torch.empty_like(x), torch.empty(r * c * 3 // 2, device="cuda", dtype=dt)
            src_out = torch.empty_like(src)
            forward, (cf_us,) = timer.ours(
                lambda x=x: lib.softmax(x, -1),
                lambda out, w=want_f, t=tol: (rel_err(out, w) <= t, ""),
                lambda d=dst, x=x: d.copy_(x),
            )
            backward, (cb_us,) = timer.ours(
                lambda g=g, y=y: lib.softmax_backward(g, y, -1),
                lambda out, w=want_b, t=tol: (rel_err(out, w) <= t, ""),
                lambda d=src_out, s=src: d.copy_(s),  # 3 bytes moved an element byte, as backward
            )
            for way, runs, cp in (("forward", forward, cf_us), ("backward", backward, cb_us)):
                for v, t, ok, note in runs:
                    rows.append(Row(v.name(f"softmax {way}"), f"{r}x{c}", str(dt)[6:], t, "copy",
                                    cp, cp / t if t else 0.0, "%", 0.85, ok, note))  # fmt: skip
    return rows


def copy_bandwidth(timer: Timer) -> float:
    """Bytes a microsecond of a 256 MiB device-to-device copy (read and write counted)."""
    import torch

    src = torch.empty(1 << 26, device="cuda")
    dst = torch.empty_like(src)
    (us,) = timer.us(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / us


def histogram_rows(lib: Any, timer: Timer) -> list[Row]:
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    bandwidth = copy_bandwidth(timer)
    rows = []
    for n, bins in ((1 << 24, 256), (1 << 24, 65536), (1 << 26, 256)):
        x = torch.randn(n, device="cuda", generator=gen)
        # Exact counts, binned in float64 (the spec's reference; torch.histc bins in float32)
        want = lib.specs["histogram"].reference(x, bins, -4.0, 4.0)
        runs, (histc, total) = timer.ours(
            lambda x=x, b=bins: lib.histogram(x, b, -4.0, 4.0),
            lambda out, w=want: (torch.equal(out, w), ""),
            lambda x=x, b=bins: torch.histc(x, b, -4.0, 4.0),
            lambda x=x: x.sum(),
        )
        read = n * 4 / bandwidth
        for v, ours, ok, err in runs:
            note = err or f"{read / ours:.0%} of copy; x.sum() {total:.1f} us ({read / total:.0%})"
            rows.append(Row(v.name("histogram"), f"{n >> 20} Mi, {bins} bins", "float32", ours,
                            "torch.histc", histc, histc / ours if ours else 0.0, "x", 3.4, ok,
                            note))  # fmt: skip
    return rows


def layer_norm_rows(lib: Any, timer: Timer) -> list[Row]:
    """The training step (forward and autograd.grad) through ``wb bench --backward``: wall clock
    and CUDA-graph replay, against torch.compile of the reference step."""
    from workbench.benchmark.result import COMPILED
    from workbench.benchmark.run import bench

    rows = []
    for v, dt in ((v, dt) for dt in ("float32", "bfloat16") for v in timer.variants):
        with v.applied():  # each variant its own wb bench run (its own compiled peer's timing)
            result = bench("layer_norm", lib=lib, device="cuda", dtype=dt, backward=True,
                           save=False, roofline=False, rounds=2)  # fmt: skip
        for r in result.ops:
            how = "graph" if "graph" in r.op else "wall clock"
            for s in r.sizes:
                got = s.against(COMPILED)
                if got is None:
                    continue
                speedup, verdict = got
                rows.append(Row(v.name(f"layer_norm step ({how})"), s.label, dt, s.kernel * 1e6,
                                "torch.compile", s.times[COMPILED].stats.median * 1e6, speedup,
                                "x", 1.0, True, verdict))  # fmt: skip
    return rows


RUNS: dict[str, Callable[[Any, Timer], list[Row]]] = {
    "matmul": matmul_rows,
    "softmax": softmax_rows,
    "histogram": histogram_rows,
    "layer_norm": layer_norm_rows,
}


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--reps", type=int, default=30, help="timed calls of each kernel and peer")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE[,...]",
        help="also time our op with these switches (repeatable), e.g. wide:WB_SOFTMAX_PATH=wide",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    ops = parse_ops(args.ops)
    variants = parse_variants(args.variant)
    if args.reps < 3:
        raise SystemExit(
            f"--reps must be at least 3 (a median of fewer says little), got {args.reps}"
        )
    import torch

    if not torch.cuda.is_available():
        print(
            "python -m bench kernel_goals: needs a CUDA GPU (this host has none)", file=sys.stderr
        )
        return 2
    import workbench

    lib = workbench.load()
    timer = Timer(args.reps, variants)
    rows = run_ops(
        [lambda op=op: RUNS[op](lib, timer) for op in ops], ops, timer, "", args.out, "kernel-goals"
    )
    return 0 if all(r.ok for r in rows) else 1


def run_ops(
    runs: Sequence[Callable[[], list[Row]]],
    names: Sequence[str],
    timer: Timer,
    note: str,
    out: Path | None,
    stem: str,
    met: str = "goals met",
) -> list[Row]:
    """Each run's rows in turn under one header (the date, the GPU, torch, the commit, the
    timing; ``note`` after it), the report (``stem``.md and .json in ``out``) rewritten after each
    run, so that a run cut short keeps what it timed, and printed last; the rows."""
    import torch

    props = torch.cuda.get_device_properties(0)
    env = environment()
    header = (
        f"{env.date}, {props.name} ({props.multi_processor_count} SMs), torch {env.torch}"
        f" (CUDA {env.cuda}), commit {env.commit}; medians of {timer.reps}, L2 flushed{note}"
        + "".join(f"; [{v.label}] = {v.describe()}" for v in timer.variants if v.label)
    )
    rows: list[Row] = []
    folder = out_dir(out)
    text = header
    for name, run in zip(names, runs, strict=True):
        rows += run()
        print(f"{name}: {len(rows)} rows so far", file=sys.stderr, flush=True)
        text = render(rows, header).replace("goals met", met)
        write_text(folder / f"{stem}.md", text)
        write_json(folder / f"{stem}.json", {"environment": env.to_dict(),
                                             "rows": [asdict(r) for r in rows]})  # fmt: skip
    print(text)
    return rows
