"""matmul's wgmma tiles forced one at a time on a grid of shapes, beside the default and cuBLAS.

Each shape (bfloat16 or float16, a and b row-major, random normal) is timed as the default route,
as each variant (a set of the kernels' switches; by default each tile of the wave rule forced:
the built 128 x 256 tile by WB_WGMMA_SQUARE=off, 192 x 128 and 256 x 128 by =square192 and
=square256) and as torch.mm (cuBLAS), interleaved, L2 flushed, CUDA events around each call
(kernel_goals' Timer). Every output is held to twice cuBLAS's largest error against the float64
product (cuBLAS is not the truth at every shape: its error is the yardstick). Prints a table,
microseconds and each column's share of cuBLAS's speed (cuBLAS's time over its own).

Usage: python -m bench matmul_tiles --shapes 4096x4160x4096,2048x6272x4096 [--variant
LABEL:NAME=VALUE[,...]] [--dtype bfloat16] [--reps 20] [--out F]   (needs a sm_90 GPU)
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.common import environment, markdown_table, parser, write_text
from bench.kernel_goals import Timer, Variant, parse_variants

TILES = [
    "128x256:WB_WGMMA_SQUARE=off",
    "192x128:WB_WGMMA_SQUARE=square192",
    "256x128:WB_WGMMA_SQUARE=square256",
]


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``MxNxK,...``: each size a positive whole number."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--shapes: {item.strip()!r} is not MxNxK (three positive sizes)")
        m, n, k = (int(p) for p in parts)
        shapes.append((m, n, k))
    if not shapes:
        raise SystemExit("--shapes: give at least one MxNxK")
    return shapes


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--shapes", required=True, help="comma-separated MxNxK")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE[,...]",
        help="time our op under these switches (repeatable); default: each tile of the wave rule",
    )
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--reps", type=int, default=20, help="timed calls of each column")
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    variants = parse_variants(args.variant or TILES)
    labels = [v.label for v in variants]
    if args.reps < 3:
        raise SystemExit(f"--reps must be at least 3, got {args.reps}")
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("python -m bench matmul_tiles: needs an sm_90 GPU (wgmma)", file=sys.stderr)
        return 2
    import workbench

    lib = workbench.load(families=["matmul"])
    dtype = getattr(torch, args.dtype)
    timer = Timer(args.reps, variants)
    columns = [Variant(), *variants]
    rows, wrong = [], []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        exact = torch.mm(a.double(), b.double())
        bound = 2 * (torch.mm(a, b).double() - exact).abs().max().item()
        for v in columns:
            with v.applied():
                error = (lib.matmul(a, b).double() - exact).abs().max().item()
            if not error <= bound:
                wrong.append(f"{m}x{n}x{k} {v.label or 'default'}: error {error:.3g} > {bound:.3g}")
        ours, theirs = (lambda a=a, b=b: lib.matmul(a, b)), (lambda a=a, b=b: torch.mm(a, b))
        times = timer.us(*[(v, ours) for v in columns], theirs)
        peer = times[-1]
        rows.append(
            [f"{m}x{n}x{k}"] + [f"{t:.1f} ({peer / t:.2f}x)" for t in times[:-1]] + [f"{peer:.1f}"]
        )
    head = ["m x n x k", "default, us", *(f"{label}, us" for label in labels), "cuBLAS, us"]
    report = "\n".join(
        [
            f"{environment().line()}; {args.dtype}, medians of {args.reps}, L2 flushed",
            "",
            markdown_table(head, rows, "l" + "r" * (len(head) - 1)),
            *(["", "Outside twice cuBLAS's error:", *wrong] if wrong else []),
        ]
    )
    print(report)
    write_text(args.out, report)
    return 1 if wrong else 0
