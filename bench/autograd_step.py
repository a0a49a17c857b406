"""Host cost of a layer_norm training step: the bundled op against F.layer_norm, tiny tensors.

At a tiny size the kernels take a few microseconds, so what is timed is the host's work around
them: dispatch, the autograd kernel (C++ or Python), the graph and the backward engine. Three
cases, each the median of a ``blocked_autorange`` (the best of ``--repeats`` medians):

- step: the forward on inputs that require grad, then ``torch.autograd.grad`` of y;
- forward, grad enabled: the forward alone, recording the graph;
- forward, no_grad: the forward under ``torch.no_grad()``.

Gradients of the op and of F.layer_norm are compared before anything is timed.

Usage: python -m bench autograd_step [--rows 4] [--hidden 64] [--threads 1]
       [--device cpu|cuda] [--repeats 5]
Prints the environment line and a markdown table (microseconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from bench.common import environment, markdown_table, parser

EPS = 1e-5


def cases(op: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> dict:
    """name -> (F.layer_norm's function, the op's function)."""
    hidden = x.shape[-1]

    def eager(*a: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(a[0], (hidden,), a[1], a[2], EPS)

    def ours(*a: torch.Tensor) -> torch.Tensor:
        return op(*a, EPS)[0]

    def step(f: Callable[..., torch.Tensor]) -> Callable[[], Any]:
        return lambda: torch.autograd.grad(f(x, w, b), (x, w, b), g)

    def forward(f: Callable[..., torch.Tensor]) -> Callable[[], Any]:
        return lambda: f(x, w, b)

    def no_grad(f: Callable[..., torch.Tensor]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                return f(x, w, b)

        return run

    return {
        "step (forward + autograd.grad)": (step(eager), step(ours)),
        "forward, grad enabled": (forward(eager), forward(ours)),
        "forward, no_grad": (no_grad(eager), no_grad(ours)),
    }


def median_us(fn: Callable[[], Any], device: str, threads: int, repeats: int) -> float:
    def synchronized() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=threads, timer=synchronized)
    return min(timer.blocked_autorange(min_run_time=0.5).median for _ in range(repeats)) * 1e6


def main(argv: list[str] | None = None) -> None:
    import workbench

    p = parser(__name__, __doc__)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    workbench.load(families=["layer_norm"], devices=None if args.device == "cuda" else "cpu")
    op = torch.ops.wb.layer_norm
    shape = (args.rows, args.hidden)
    x, g = (torch.randn(shape, device=args.device) for _ in range(2))
    w, b = (torch.randn(args.hidden, device=args.device) for _ in range(2))
    for t in (x, w, b):
        t.requires_grad_()
    runs = cases(op, x, w, b, g)
    eager_step, our_step = runs["step (forward + autograd.grad)"]
    for a, e in zip(our_step(), eager_step(), strict=True):
        torch.testing.assert_close(a, e)
    print(environment().line(args.device))
    print(f"{args.device}, {args.rows}x{args.hidden} float32, {args.threads} thread(s), us")
    rows = []
    for name, (eager, ours) in runs.items():
        times = [median_us(f, args.device, args.threads, args.repeats) for f in (eager, ours)]
        rows.append((name, f"{times[0]:.1f}", f"{times[1]:.1f}"))
    print(markdown_table(("case", "F.layer_norm", "wb.layer_norm"), rows))
