"""Launcher variants of scale (or muladd) against eager, each timed several times per size.

``workbench.bench`` times each callable in three rounds on a GPU (and the kernel twice a round,
for its A/A band). Gaps of under 1% between kernel variants need more: this script times every
candidate ``--repeats`` times per size, in a shuffled order, each time with the harness's own GPU
protocol
(``workbench.benchmark.timer_cuda``: graph replay over input copies spanning 2x L2 below about
20 us, L2-flushed events above), and prints the median of the repeats, their spread
((max - min) / min) and eager's time over the candidate's (above 1: the candidate is faster).
Each candidate's output is first checked bit for bit against eager's at every size.

Variants are those of scripts/elementwise_variants.py, built as temporary families.

Usage, on a CUDA machine (about a minute for three variants):
  python3 scripts/bench_launcher_repeats.py current,coherent [--repeats 6] [--op muladd]
      [--sizes 4096,67108864]
      [--method graph]

``--op scale`` (default) times ``scale_<variant>(x, s)`` against ``x * s``; ``--op muladd``
times ``muladd_<variant>(a, b, c)`` against ``a * b + c`` (eager: two kernels).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402
from elementwise_variants import variant, write_registry  # noqa: E402

import workbench  # noqa: E402
from workbench.benchmark.timer_cuda import method_for, probe, time_cuda  # noqa: E402

SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
S = 0.3
C = -0.75


def _muladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    return a * b + c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", help="comma-separated names from scripts/elementwise_variants.py")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--op", choices=("scale", "muladd"), default="scale")
    p.add_argument(
        "--method",
        choices=("auto", "graph", "events"),
        default="auto",
        help="auto: the harness's choice per size (graph replay below about 20 us)",
    )
    p.add_argument("--sizes", help="comma-separated element counts (default: 4 Ki to 16 Mi)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_launcher_repeats: needs a CUDA GPU")
    names = args.variants.split(",")
    kernels = write_registry(Path(tempfile.mkdtemp()), tuple(variant(n) for n in names))
    lib = workbench.load(kernels, namespace="wb_ew_repeats")
    dev = torch.device("cuda")
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES
    what = "x * 0.3" if args.op == "scale" else "a * b - 0.75"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, float32, {what}")
    for n in sizes:
        x = torch.randn(n, device=dev)
        inputs = (x, S) if args.op == "scale" else (x, torch.randn(n, device=dev), C)
        cands = {v: getattr(lib, f"{args.op}_{v}") for v in names}
        cands["eager"] = torch.mul if args.op == "scale" else _muladd
        want = cands["eager"](*inputs)
        for v in names:
            # scale is exact; muladd's kernel may fuse a * b + c into one rounding
            exact = {"rtol": 0, "atol": 0} if args.op == "scale" else {}
            torch.testing.assert_close(cands[v](*inputs), want, **exact)
        method = args.method
        if method == "auto":
            method = method_for(probe(cands[names[0]], inputs, dev))
        plan = [c for c in cands for _ in range(args.repeats)]
        random.Random(n).shuffle(plan)
        got: dict[str, list[float]] = {c: [] for c in cands}
        for c in plan:
            got[c].append(time_cuda(cands[c], inputs, dev, method).stats.median * 1e6)
        med = {c: statistics.median(t) for c, t in got.items()}
        cells = [
            f"{c} {med[c]:.3f} us ({(max(t) - min(t)) / min(t) * 100:.1f}%) "
            f"eager/this {med['eager'] / med[c]:.4f}"
            for c, t in got.items()
        ]
        print(f"{n:>9} {method.split(',')[0]:<9} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
