"""The bundled ops on shapes and layouts outside the goal table, each against its eager peer.

The goal table (``python -m bench kernel_goals``) names the shapes an issue set. Users bring
others: sizes one off a tile (4095, k odd), operands transposed, rows of a vocabulary's length,
one huge row, a histogram of one bin or a million, norms over a prime number of columns. This
sweep times each such case against PyTorch's own op on the same tensors (cuBLAS through
``torch.mm``, ``torch.softmax``, ``torch.histc``, ``F.layer_norm``, ``F.rms_norm``, ``a * b + c``,
``index_add``), interleaved in one run with the L2 flushed, checks our output against the peer's
first, and marks every case under ``--floor`` times the peer's speed (0.8 by default): a cliff a
user would hit. Timing and switches (``--variant``) are kernel_goals's, with one change: each side
is timed as one CUDA-graph replay of its call (``ours us`` / ``peer us``), and the eager calls'
times are noted. The replays leave out the host's launches between a call's kernels as well as
its dispatch (which kernel_goals's spin keeps out of the eager times: before it, the same
1000x1000 softmax measured 7 and 57 us eager on one host in one hour). An op that cannot be
captured is judged on its eager calls.

Usage: python -m bench shapes [--ops matmul,softmax,histogram,norms,elementwise,backward,tall]
       [--reps 20]
       [--floor 0.8] [--variant LABEL:NAME=VALUE[,...]]... [--out DIR]
Writes shapes.md and shapes.json into --out ($OUT, else the current folder) and prints the table
last. Needs a CUDA GPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import parser
from bench.kernel_goals import (
    DEFAULT,
    Row,
    Timer,
    Variant,
    parse_variants,
    rel_err,
    run_ops,
)

OPS = ("matmul", "softmax", "histogram", "norms", "elementwise", "backward", "tall", "batched")


def _rows(
    timer: Timer, op: str, case: str, dtype: Any, ours: Callable[[], Any], peer: Callable[[], Any],
    peer_name: str, agree: Callable[[Any, Any], bool], floor: float, note: str = "",
) -> list[Row]:  # fmt: skip
    """Our fn (under each variant) and the peer timed interleaved, ours judged against the
    peer's output first; one row a variant."""
    want = peer()
    runs, (t_peer,) = timer.ours(ours, lambda got: (agree(got, want), note), peer)
    ran = [v for v, t, _, _ in runs if t > 0]  # a variant whose call raised is not timed
    graphed = graph_us(timer, [(v, ours) for v in ran] + [(DEFAULT, peer)])
    replays = dict(zip([v.label for v in ran], graphed[:-1], strict=True)) if graphed else {}
    dt = str(dtype).replace("torch.", "")
    rows = []
    for v, t, ok, n in runs:
        times = (t, t_peer)
        if v.label in replays:  # judged on the replays, the eager pair noted
            times = (replays[v.label], graphed[-1])
            n = "; ".join(filter(None, [n, f"eager {t:.1f} / {t_peer:.1f} us"]))
        ratio = times[1] / times[0] if times[0] else 0.0
        rows.append(Row(v.name(op), case, dt, times[0], peer_name, times[1], ratio, "x", floor,
                        ok, n))  # fmt: skip
    return rows


def _within(tol: float) -> Callable[[Any, Any], bool]:
    """Ours agrees with the peer's output within ``tol`` of its largest element."""
    return lambda got, want: rel_err(got, want.float()) <= tol


def _within_each(tol: float) -> Callable[[Any, Any], bool]:
    """Each of ours (a tuple) agrees with the peer's of its place, as :func:`_within`."""
    each = _within(tol)
    return lambda got, want: all(each(g, w) for g, w in zip(got, want, strict=True))


def _matmul(
    lib: Any, timer: Timer, a: Any, b: Any, case: str, floor: float
) -> list[Row]:  # fmt: skip
    """matmul(a, b) against torch.mm, within twice cuBLAS's own error against a float64 truth."""
    import torch

    ref = a.double() @ b.double()
    err = rel_err(torch.mm(a, b), ref)
    return _rows(timer, "matmul", case, a.dtype, lambda: lib.matmul(a, b),
                 lambda: torch.mm(a, b), "cuBLAS",
                 lambda got, _w: rel_err(got, ref) <= 2 * err + 1e-3, floor)  # fmt: skip


def graph_us(timer: Timer, fns: list[tuple[Variant, Callable[[], Any]]]) -> list[float]:
    """Each fn's time as one CUDA-graph replay (the same protocol: interleaved, L2 flushed), each
    captured under its variant's switches, which leaves out the host's dispatch and launch costs
    that an eager call of a small op is bound by. Empty where a capture fails."""
    import torch

    graphs = []
    try:
        for variant, fn in fns:
            with variant.applied():
                fn()  # warm: first-call allocations and module loads stay out of the capture
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
            graphs.append(g)
    except Exception:  # an op that cannot be captured: the eager times stand alone
        torch.cuda.synchronize()
        return []
    return timer.us(*(g.replay for g in graphs))


def matmul_rows(lib: Any, timer: Timer, floor: float) -> list[Row]:
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    bf, hf, f32 = torch.bfloat16, torch.float16, torch.float32
    # (m, n, k, dtype, layout): layout "t" gives a column-major a, "bt" a column-major b.
    cases = [(4095, 4095, 4095, bf, ""), (4096, 4096, 4095, bf, ""), (4096, 4095, 4096, bf, ""),
             (4097, 4096, 4096, bf, ""), (4095, 4095, 4095, hf, ""), (4096, 4096, 4096, bf, "t"),
             (4096, 4096, 4096, bf, "bt"), (1000, 1000, 1000, bf, ""), (2048, 2048, 2048, bf, ""),
             (512, 512, 512, bf, ""), (128, 128, 128, bf, ""), (4096, 11008, 4096, bf, ""),
             (4096, 4096, 11008, bf, ""), (3, 4096, 4096, bf, ""), (7, 4096, 4096, bf, ""),
             (32, 4096, 4096, bf, ""), (256, 4096, 4096, bf, ""), (4096, 16, 4096, bf, ""),
             (4096, 4096, 16, bf, ""), (1, 4095, 4095, bf, ""), (8192, 8192, 8192, hf, ""),
             (4096, 64, 4096, bf, ""), (4096, 128, 4096, bf, ""), (16384, 32, 4096, bf, ""),
             (8192, 1, 8192, bf, ""), (2048, 48, 2048, hf, ""), (1152, 1152, 1152, bf, ""),
             (768, 1536, 768, bf, ""), (1536, 768, 4096, bf, ""), (4096, 384, 4096, bf, ""),
             (2048, 1024, 2048, bf, ""), (1024, 2048, 8192, hf, ""),
             (2048, 2048, 2048, f32, ""), (1000, 1000, 1000, f32, "")]  # fmt: skip
    rows: list[Row] = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for m, n, k, dt, layout in cases:
            a = torch.randn(m, k, device="cuda", dtype=dt, generator=gen)
            b = torch.randn(k, n, device="cuda", dtype=dt, generator=gen)
            if layout == "t":
                a = a.t().contiguous().t()
            if layout == "bt":
                b = b.t().contiguous().t()
            case = f"{m}x{n}x{k}" + {"t": ", a column-major", "bt": ", b column-major"}.get(
                layout, ""
            )
            rows += _matmul(lib, timer, a, b, case, floor)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return rows


def tall_rows(lib: Any, timer: Timer, floor: float) -> list[Row]:
    """Outputs of few columns and many rows (LoRA's x @ A): m 1024 to 8192, n 16 to 128."""
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    rows: list[Row] = []
    for m in (1024, 2048, 4096, 6144, 8192):
        for n in (16, 32, 64, 96, 128):
            a = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16, generator=gen)
            b = torch.randn(4096, n, device="cuda", dtype=torch.bfloat16, generator=gen)
            rows += _matmul(lib, timer, a, b, f"{m}x{n}x4096", floor)
    return rows


def batched_rows(lib: Any, timer: Timer, floor: float) -> list[Row]:
    """Batched products, a [batch, m, k] @ b [batch, k, n], against torch.matmul (cuBLAS's batched
    GEMM), long k included (the Hopper kernel's slices of k); the note gives matmul_path(a, b,
    0)'s time, which takes the batch a slice at a time."""
    import torch

    bf, hf, f32 = torch.bfloat16, torch.float16, torch.float32
    cases = [(256, 64, 64, 64, bf), (512, 32, 64, 64, hf), (64, 128, 128, 128, bf),
             (32, 256, 256, 256, bf), (8, 512, 512, 512, bf), (4, 1024, 1024, 1024, bf),
             (32, 16, 1024, 1024, bf), (48, 100, 72, 120, bf), (2, 2048, 2048, 2048, bf),
             (96, 512, 512, 64, bf), (96, 512, 512, 64, bf, "b^T"), (96, 512, 64, 512, bf),
             (96, 64, 512, 512, bf, "a^T"),
             (16, 384, 384, 384, hf),
             (16, 128, 128, 8192, bf), (16, 128, 128, 8192, bf, "a^T"), (4, 512, 512, 4096, bf),
             (8, 256, 256, 8192, bf), (2, 1024, 512, 8192, hf),
             (256, 64, 64, 64, f32), (32, 256, 256, 256, f32), (8, 512, 512, 512, f32)]  # fmt: skip
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 against float32, as ours is
    try:
        return _batched_cases(lib, timer, floor, cases)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _batched_cases(lib: Any, timer: Timer, floor: float, cases: list[tuple[Any, ...]]) -> list[Row]:
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    rows: list[Row] = []
    for batch, m, n, k, dt, *layout in cases:
        a = torch.randn(batch, m, k, device="cuda", dtype=dt, generator=gen)
        if layout == ["a^T"]:  # a's slices column-major, as in a gradient a^T @ g
            a = torch.randn(batch, k, m, device="cuda", dtype=dt, generator=gen).transpose(1, 2)
        if layout == ["b^T"]:  # b's slices column-major, as k^T in attention's q @ k^T
            b = torch.randn(batch, n, k, device="cuda", dtype=dt, generator=gen).transpose(1, 2)
        else:
            b = torch.randn(batch, k, n, device="cuda", dtype=dt, generator=gen)
        ref = a.double() @ b.double()
        err = rel_err(torch.matmul(a, b), ref)
        (sliced,) = timer.us(lambda a=a, b=b: lib.matmul_path(a, b, 0))

        def agree(got: Any, _want: Any, ref: Any = ref, err: float = err) -> bool:
            return rel_err(got, ref) <= 2 * err + 1e-3

        case = f"{batch}x{m}x{n}x{k} (batch x m x n x k{''.join(', ' + t for t in layout)})"
        rows += _rows(timer, "matmul", case, dt,
                      lambda a=a, b=b: lib.matmul(a, b), lambda a=a, b=b: torch.matmul(a, b),
                      "cuBLAS", agree, floor, f"a slice at a time {sliced:.1f} us")  # fmt: skip
    return rows


def softmax_rows(lib: Any, timer: Timer, floor: float) -> list[Row]:
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    shapes = [(1, 1 << 20), (2, 1 << 22), (8, 100000), (32, 50257), (1000, 1000), (4096, 4097),
              (100000, 10), (65536, 128), (1024, 32000), (65536, 333), (16384, 1001),
              (8192, 3001), (2048, 12289), (1024, 20001), (131072, 271), (65536, 50),
              (65536, 67), (65536, 135)]  # fmt: skip
    rows: list[Row] = []
    for dt in (torch.float32, torch.bfloat16):
        tol = 1e-4 if dt == torch.float32 else 2e-2
        for r, c in shapes:
            x = torch.randn(r, c, device="cuda", dtype=dt, generator=gen) * 3
            agree = _within(tol)
            rows += _rows(timer, "softmax", f"{r}x{c}", dt, lambda x=x: lib.softmax(x, -1),
                          lambda x=x: torch.softmax(x, -1), "torch", agree, floor)  # fmt: skip
        x = torch.randn(4096, 1024, device="cuda", dtype=dt, generator=gen)
        agree = _within(tol)
        rows += _rows(timer, "softmax", "4096x1024, dim 0", dt, lambda x=x: lib.softmax(x, 0),
                      lambda x=x: torch.softmax(x, 0), "torch", agree, floor)  # fmt: skip
        for r, c in ((32, 50257), (8, 100000), (2, 1 << 22)):
            g = torch.randn(r, c, device="cuda", dtype=dt, generator=gen)
            y = torch.softmax(torch.randn(r, c, device="cuda", dtype=dt, generator=gen), -1)
            rows += _rows(timer, "softmax_backward", f"{r}x{c}", dt,
                          lambda g=g, y=y: lib.softmax_backward(g, y, -1),
                          lambda g=g, y=y: torch._softmax_backward_data(g, y, -1, y.dtype),
                          "torch", agree, floor)  # fmt: skip
    return rows


def histogram_rows(lib: Any, timer: Timer, floor: float) -> list[Row]:
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    rows: list[Row] = []
    # "edges": float32 holding bfloat16 values, a quarter of them on a bin edge at 256 bins over
    # [-4, 4] (each takes the exact rule's double division: bench/results/kernels.md, twentieth
    # pass)
    for n, bins, kind in ((4096, 256, ""), (1_000_003, 100, ""), (1 << 24, 1, ""),
                          (1 << 24, 256, ""), (1 << 24, 1000, ""), (1 << 24, 4096, ""),
                          (1 << 24, 20000, ""), (1 << 24, 1 << 20, ""), (100_000_000, 256, ""),
                          (1 << 24, 256, "edges"), (1 << 24, 4096, "edges")):  # fmt: skip
        x = torch.randn(n, device="cuda", generator=gen)
        if kind == "edges":
            x = x.bfloat16().float()
        want = lib.specs["histogram"].reference(x, bins, -4.0, 4.0)
        case = f"{n:,} elements, {bins:,} bins" + (f", {kind}" if kind else "")
        # torch.histc bins in float32, the spec's reference in float64: judged against the latter
        rows += _rows(timer, "histogram", case, torch.float32,
                      lambda x=x, b=bins: lib.histogram(x, b, -4.0, 4.0),
                      lambda x=x, b=bins: torch.histc(x, b, -4.0, 4.0), "torch.histc",
                      lambda got, _w, w=want: torch.equal(got, w), floor)  # fmt: skip
    return rows


def norms_rows(lib: Any, timer: Timer, floor: float) -> list[Row]:
    import torch
    import torch.nn.functional as F

    gen = torch.Generator("cuda").manual_seed(0)
    rows: list[Row] = []
    for dt in (torch.float32, torch.bfloat16):
        tol = 1e-4 if dt == torch.float32 else 2e-2
        for r, c in ((4095, 4095), (7, 100003), (100000, 100), (32, 4096), (16384, 768),
                     (1, 1 << 20)):  # fmt: skip
            x = torch.randn(r, c, device="cuda", dtype=dt, generator=gen) + 1
            w = torch.randn(c, device="cuda", dtype=dt, generator=gen)
            b = torch.randn(c, device="cuda", dtype=dt, generator=gen)
            agree = _within(tol)
            rows += _rows(timer, "layer_norm", f"{r}x{c}", dt,
                          lambda x=x, w=w, b=b: lib.layer_norm(x, w, b, 1e-5)[0],
                          lambda x=x, w=w, b=b, c=c: F.layer_norm(x, (c,), w, b, 1e-5),
                          "F.layer_norm", agree, floor)  # fmt: skip
            rows += _rows(timer, "rms_norm", f"{r}x{c}", dt,
                          lambda x=x, w=w: lib.rms_norm(x, w, 1e-6),
                          lambda x=x, w=w, c=c: F.rms_norm(x, (c,), w, 1e-6),
                          "F.rms_norm", agree, floor)  # fmt: skip
    return rows


def elementwise_rows(lib: Any, timer: Timer, floor: float) -> list[Row]:
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    rows: list[Row] = []
    for dt in (torch.float32, torch.bfloat16):
        tol = 1e-6 if dt == torch.float32 else 1e-2
        for shape, layout in (((1_000_003,), ""), ((100_000_000,), ""), ((8192, 8191), "t")):
            a = torch.randn(*shape, device="cuda", dtype=dt, generator=gen)
            b = torch.randn(*shape, device="cuda", dtype=dt, generator=gen)
            if layout:
                a, b = a.t(), b.t()
            case = "x".join(map(str, a.shape)) + (", transposed" if layout else "")
            agree = _within(tol)
            rows += _rows(timer, "muladd", case, dt, lambda a=a, b=b: lib.muladd(a, b, 0.5),
                          lambda a=a, b=b: a * b + 0.5, "a * b + c", agree, floor)  # fmt: skip
    x = torch.zeros(100_000, 256, device="cuda")
    src = torch.randn(1 << 20, 256, device="cuda", generator=gen)
    idx = torch.randint(0, 100_000, (1 << 20,), device="cuda", generator=gen)
    # Sums of floats in another order: compared with a tolerance of the largest output
    rows += _rows(timer, "index_add", "100000x256, 1 Mi rows added", torch.float32,
                  lambda: lib.index_add(x, 0, idx, src), lambda: x.index_add(0, idx, src),
                  "index_add", lambda got, want: rel_err(got, want) <= 1e-5, floor)  # fmt: skip
    return rows


def backward_rows(lib: Any, timer: Timer, floor: float) -> list[Row]:
    """layer_norm's backward against ATen's native_layer_norm_backward (from the same saved mean
    and rstd), softmax's against _softmax_backward_data, index_add in 2-byte floats and along
    dim 1."""
    import torch

    gen = torch.Generator("cuda").manual_seed(0)
    rows: list[Row] = []
    for dt in (torch.float32, torch.bfloat16):
        tol = 1e-4 if dt == torch.float32 else 2e-2
        for r, c in ((4095, 4095), (16384, 768), (32, 4096), (100000, 100), (7, 100003)):
            x = torch.randn(r, c, device="cuda", dtype=dt, generator=gen) + 1
            w = torch.randn(c, device="cuda", dtype=dt, generator=gen)
            b = torch.randn(c, device="cuda", dtype=dt, generator=gen)
            g = torch.randn(r, c, device="cuda", dtype=dt, generator=gen)
            _, mean, rstd = torch.ops.aten.native_layer_norm(x, [c], w, b, 1e-5)
            rows += _rows(timer, "layer_norm_backward", f"{r}x{c}", dt,
                          lambda g=g, x=x, m=mean, s=rstd, w=w: lib.layer_norm_backward(
                              g, x, m.view(-1), s.view(-1), w),
                          lambda g=g, x=x, m=mean, s=rstd, w=w, b=b, c=c:
                              torch.ops.aten.native_layer_norm_backward(
                                  g, x, [c], m, s, w, b, [True, True, True]),
                          "native_layer_norm_backward", _within_each(tol), floor)  # fmt: skip
        for r, c in ((4096, 4097), (16384, 1001), (100000, 10), (1, 1 << 20), (64, 262144)):
            y = torch.softmax(torch.randn(r, c, device="cuda", dtype=dt, generator=gen), -1)
            g = torch.randn(r, c, device="cuda", dtype=dt, generator=gen)
            agree = _within(tol)
            rows += _rows(timer, "softmax_backward", f"{r}x{c}", dt,
                          lambda g=g, y=y: lib.softmax_backward(g, y, -1),
                          lambda g=g, y=y: torch._softmax_backward_data(g, y, -1, y.dtype),
                          "torch", agree, floor)  # fmt: skip
        for dim, shape, n in ((0, (100_000, 256), 1 << 20), (1, (256, 100_000), 1 << 16)):
            x = torch.zeros(*shape, device="cuda", dtype=dt)
            src_shape = (n, 256) if dim == 0 else (256, n)
            src = torch.randn(*src_shape, device="cuda", dtype=dt, generator=gen)
            idx = torch.randint(0, shape[dim], (n,), device="cuda", generator=gen)
            # sums in another order, and 2-byte sums rounded at each add on PyTorch's side
            agree = _within(5 * tol)
            rows += _rows(timer, "index_add", f"{shape[0]}x{shape[1]}, dim {dim}, {n} added",
                          dt, lambda x=x, d=dim, i=idx, s=src: lib.index_add(x, d, i, s),
                          lambda x=x, d=dim, i=idx, s=src: x.index_add(d, i, s), "index_add",
                          agree, floor)  # fmt: skip
    return rows


RUNS: dict[str, Callable[[Any, Timer, float], list[Row]]] = {
    "matmul": matmul_rows,
    "softmax": softmax_rows,
    "histogram": histogram_rows,
    "norms": norms_rows,
    "elementwise": elementwise_rows,
    "backward": backward_rows,
    "tall": tall_rows,
    "batched": batched_rows,
}


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--reps", type=int, default=20, help="timed calls of each kernel and peer")
    p.add_argument("--floor", type=float, default=0.8, help="peer time over ours to pass")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:NAME=VALUE[,...]")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise SystemExit(f"--ops: unknown {', '.join(bad) or '(none)'}; choose from {OPS}")
    if args.reps < 3:
        raise SystemExit(f"--reps must be at least 3, got {args.reps}")
    if args.floor <= 0:
        raise SystemExit(f"--floor must be above 0 (peer time over ours), got {args.floor}")
    variants = parse_variants(args.variant)
    import torch

    if not torch.cuda.is_available():
        print("python -m bench shapes: needs a CUDA GPU (this host has none)", file=sys.stderr)
        return 2
    import workbench

    lib = workbench.load()
    timer = Timer(args.reps, variants)
    note = "; the goal column is the floor (peer time over ours) under which a case is a cliff"
    runs = [lambda op=op: RUNS[op](lib, timer, args.floor) for op in ops]
    rows = run_ops(runs, ops, timer, note, args.out, "shapes", "cases at or above the floor")
    return 0 if all(r.ok for r in rows) else 1
