"""Host cost of one eager call of a bundled op against PyTorch's own op, on tiny shapes.

What an eager call costs the host (argument parsing, the dispatcher, the autograd layer, the
binding's checks and allocations, the launch) is the whole of a call's time where its kernels are
short: a loop of calls on shapes whose kernels take a few microseconds is bound by it. Each case
times, in one process and interleaved: our op through ``torch.ops.<ns>.<op>.default`` (what
``lib.<op>`` calls), the same under ``torch.inference_mode`` (tensors made there carry no
autograd keys, so no autograd kernel runs: the floor of ours), and PyTorch's op alike. Each figure
is the best of 5 loops of ``--calls`` calls, divided by the calls; on CUDA the loop is not
synchronized (the GPU keeps up: the kernels are shorter than the host's work) and the queue is
drained between loops. ``--pad N`` sets N more environment variables first (each ``getenv`` a
launcher makes scans them all: how much the switches read at each call cost).

Usage: python -m bench dispatch [--device cpu|cuda] [--calls 3000] [--pad 0] [--out DIR]
Writes dispatch.md into --out ($OUT, else the current folder) and prints the table last.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.common import environment, markdown_table, out_dir, parser, write_text


def per_call(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    """The best of 5 loops of ``calls`` calls, in microseconds a call."""
    for _ in range(min(calls, 200)):
        fn()
    sync()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        sync()
    return best


def cases(device: str) -> list[tuple[str, str, Callable[..., Any], Callable[..., Any], tuple]]:
    """(name, shape, ours, torch's, the arguments both take) of each case."""
    import torch

    ops = torch.ops.wb
    half = torch.bfloat16 if device == "cuda" else torch.float32

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    return [
        ("matmul", f"64x64x64 {str(half).removeprefix('torch.')}", ops.matmul.default, torch.mm,
         (randn(64, 64, dtype=half), randn(64, 64, dtype=half))),
        ("softmax", "64x1024 float32", lambda x: ops.softmax.default(x), lambda x: x.softmax(-1),
         (randn(64, 1024),)),
        ("scale", "4096 float32", lambda x: ops.scale.default(x, 2.0), lambda x: x * 2.0,
         (randn(4096),)),
        ("muladd", "4096 float32", lambda a, b: ops.muladd.default(a, b, 1.0),
         lambda a, b: a * b + 1.0, (randn(4096), randn(4096))),
    ]  # fmt: skip


def time_case(
    ours: Callable[..., Any], theirs: Callable[..., Any], args: tuple[Any, ...], calls: int,
    sync: Callable[[], None],
) -> list[float]:  # fmt: skip
    """Ours and torch's on ``args``, then both on copies made under inference_mode."""
    import torch

    times = [per_call(lambda: ours(*args), calls, sync),
             per_call(lambda: theirs(*args), calls, sync)]  # fmt: skip
    with torch.inference_mode():
        floor = tuple(t.clone() for t in args)
        times += [per_call(lambda: ours(*floor), calls, sync),
                  per_call(lambda: theirs(*floor), calls, sync)]  # fmt: skip
    return times


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if any")
    p.add_argument("--calls", type=int, default=3000, help="calls a timed loop")
    p.add_argument("--pad", type=int, default=0, help="environment variables to add first")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import torch

    import workbench
    from workbench.project import BUNDLED_KERNELS

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("python -m bench dispatch: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 2
    for i in range(args.pad):
        os.environ[f"BENCH_PAD_{i:04d}"] = "x" * 16  # not WB_: as a user's variables
    families = ["matmul", "softmax", "scale", "muladd"]
    workbench.load(BUNDLED_KERNELS, families=families, devices=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for name, shape, ours, theirs, inputs in cases(device):
        times = time_case(ours, theirs, inputs, args.calls, sync)
        rows.append([name, shape, *(f"{t:.2f}" for t in times), f"{times[0] / times[1]:.2f}x"])
    env = environment()
    head = ["op", "shape", "ours us", "torch us", "ours, inference", "torch, inference",
            "ours / torch"]  # fmt: skip
    text = (
        f"{env.line(device)}; {device}, {len(os.environ)} environment variables; best of 5 loops "
        f"of {args.calls} calls, host time a call\n\n" + markdown_table(head, rows, "llrrrrr")
    )
    write_text(out_dir(args.out) / "dispatch.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
