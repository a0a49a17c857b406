"""Launcher variants of scale against eager ``x * s``, each timed several times per size.

``workbench.bench`` times each callable once (and the kernel twice, for its A/A band). Gaps of
under 1% between two kernels need more: this script times every candidate ``--repeats`` times
per size, in a shuffled order, each time with the harness's own GPU protocol
(``workbench.benchmark.timer_cuda``: graph replay over input copies spanning 2x L2 below about
20 us, L2-flushed events above), and prints the median of the repeats, their spread
((max - min) / min) and eager's time over the candidate's (above 1: the candidate is faster).
Each candidate's output is first checked bit for bit against eager's at every size.

Variants are those of scripts/elementwise_variants.py, built as temporary families.

Usage, on a CUDA machine (about a minute for three variants):
  python3 scripts/bench_launcher_repeats.py current,coherent [--repeats 6]
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", help="comma-separated names from scripts/elementwise_variants.py")
    p.add_argument("--repeats", type=int, default=6)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_launcher_repeats: needs a CUDA GPU")
    names = args.variants.split(",")
    kernels = write_registry(Path(tempfile.mkdtemp()), tuple(variant(n) for n in names))
    lib = workbench.load(kernels, namespace="wb_ew_repeats")
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, float32, x * {S}")
    for n in SIZES:
        x = torch.randn(n, device=dev)
        cands = {v: getattr(lib, f"scale_{v}") for v in names}
        cands["eager"] = torch.mul
        for v in names:
            torch.testing.assert_close(cands[v](x, S), x * S, rtol=0, atol=0)
        method = method_for(probe(cands[names[0]], (x, S), dev))
        plan = [c for c in cands for _ in range(args.repeats)]
        random.Random(n).shuffle(plan)
        got: dict[str, list[float]] = {c: [] for c in cands}
        for c in plan:
            got[c].append(time_cuda(cands[c], (x, S), dev, method).stats.median * 1e6)
        med = {c: statistics.median(t) for c, t in got.items()}
        cells = [
            f"{c} {med[c]:.3f} us ({(max(t) - min(t)) / min(t) * 100:.1f}%) "
            f"eager/this {med['eager'] / med[c]:.4f}"
            for c, t in got.items()
        ]
        print(f"{n:>9} {method.split(',')[0]:<9} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
