"""The process that ``wb profile`` runs under Nsight Compute.

It loads the registry, builds the bench's inputs for the op (the spec's size sweep with the
bench's seed, on the GPU, as ``wb bench`` builds them), picks one size, calls the op a few times
outside the profiled range (the first call loads modules and warms caches), then exactly once
between ``torch.cuda.profiler.start()`` and ``stop()``: ncu, started with ``--profile-from-start
off``, profiles the kernels of that one call and nothing else.

``--path P`` calls the op's path variant instead: an op ``X`` whose registry also holds
``X_path(..., int path)`` (matmul and matmul_path) runs ``X_path(*inputs, P)`` on ``X``'s inputs.
The paths are the ones ``X_path``'s own samples visit on this device and dtype, each named by
the last word of its label (``simt``, ``mma``, ``wgmma``); ``--path all`` runs the first and
reports them all, for the parent to run the rest.

What it ran, or the error that stopped it, goes as JSON to the ``--status`` file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

# Exit status of a run stopped by a WorkbenchError (its message is in the status file).
FAILED = 3


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench.profile.child")
    p.add_argument("op")
    p.add_argument("--status", type=Path, required=True)
    p.add_argument("--size")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device-index", type=int, default=0)
    p.add_argument("--path")
    p.add_argument("--kernels")
    p.add_argument("--namespace")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    return p


def _nbytes(args: tuple[Any, ...]) -> int:
    return sum(a.numel() * a.element_size() for a in args if hasattr(a, "element_size"))


def pick(labels: list[str], sizes: list[int], size: str | None, op: str) -> int:
    """The index of the sample ``size`` names in the sweep: its label exactly; a number N for
    the label whose every dimension is N (``4096`` -> ``4096x4096x4096``) or whose count is N
    (``16777216`` -> ``16Mi``). No size: the sweep's largest (by the bytes of its inputs)."""
    if size is None:
        return max(range(len(labels)), key=lambda i: (sizes[i], -i))
    if size in labels:
        return labels.index(size)
    if size.isdigit():
        from workbench.spec import size_label

        for i, label in enumerate(labels):
            if set(label.split("x")) == {size} or label == size_label(int(size)):
                return i
    raise WorkbenchError(f"{op}: no size {size!r} in its sweep; sizes: {', '.join(labels)}")


def path_choices(lib: Any, op: str, dtype: Any, device: Any) -> list[tuple[str, int]]:
    """(name, number) of each path ``op``'s path variant takes on this device and dtype."""
    import torch

    from workbench.benchmark.run import spec_for

    variant = f"{op}_path"
    if variant not in lib.specs:
        raise WorkbenchError(
            f"{op} has no paths to choose: --path needs an op {variant}(..., int path) in the "
            f"registry beside {op}; ops with specs: {', '.join(sorted(lib.specs))}"
        )
    spec = spec_for(lib, variant, device, dtype)
    found: dict[str, int] = {}
    for s in spec.samples(dtype, device, torch.Generator().manual_seed(0)):
        last = s.args[-1] if s.args else None
        if isinstance(last, int) and not isinstance(last, bool):
            found.setdefault(s.label.split()[-1], last)
    return list(found.items())


def choose_path(choices: list[tuple[str, int]], path: str, op: str) -> tuple[str, int]:
    """The path ``path`` names (a name or a number; ``all``: the first)."""
    for name, number in choices:
        if path in (name, str(number)) or (path == "all" and choices):
            return name, number
    listing = ", ".join(f"{n} ({k})" for n, k in choices) or "none"
    raise WorkbenchError(f"{op}: no path {path!r} here; paths: {listing}, or all")


def _call(lib: Any, name: str, args: tuple[Any, ...]) -> Callable[[], Any]:
    from workbench.verify.runner import invoker

    fn = invoker(getattr(lib, name))
    return lambda: fn(*args)


def profile_one(args: argparse.Namespace, seconds: dict[str, float]) -> dict[str, Any]:
    """Load, build the inputs, warm up, then call the op once inside the profiled range."""
    start = time.perf_counter()
    import torch

    from workbench.api import load
    from workbench.benchmark.run import resolve_dtype, spec_for, sweep

    seconds["import"] = time.perf_counter() - start
    if not torch.cuda.is_available():
        raise WorkbenchError(
            "no CUDA device here (torch.cuda.is_available() is False): wb profile runs the op on "
            "a GPU under Nsight Compute"
        )
    count = torch.cuda.device_count()
    if not 0 <= args.device_index < count:
        raise WorkbenchError(
            f"--device cuda:{args.device_index}: this machine has {count} CUDA device(s), "
            f"cuda:0 to cuda:{count - 1}"
        )
    torch.cuda.set_device(args.device_index)
    device = torch.device("cuda", args.device_index)
    mark = time.perf_counter()
    lib = load(args.kernels, namespace=args.namespace)
    if not lib.config.with_cuda:
        raise WorkbenchError(f"the registry was built without CUDA ({lib.config.cpu_reason})")
    dtype = resolve_dtype(args.dtype)
    spec = spec_for(lib, args.op, device, dtype)
    seconds["load"] = time.perf_counter() - mark
    mark = time.perf_counter()
    samples = sweep(spec, dtype, device, args.seed)
    labels = [s.label for s in samples]
    sample = samples[pick(labels, [_nbytes(s.args) for s in samples], args.size, args.op)]
    status: dict[str, Any] = {"op": args.op, "called": args.op, "size": sample.label}
    status.update(sizes=labels, path=None, dtype=args.dtype, warmup=args.warmup)
    call = _call(lib, args.op, sample.args)
    if args.path is not None:
        choices = path_choices(lib, args.op, dtype, device)
        name, number = choose_path(choices, args.path, args.op)
        status.update(called=f"{args.op}_path", path=name, paths=[n for n, _ in choices])
        call = _call(lib, f"{args.op}_path", (*sample.args, number))
    seconds["inputs"] = time.perf_counter() - mark
    mark = time.perf_counter()
    for _ in range(args.warmup):  # outside the profiled range: module loads, caches, clocks
        call()
    torch.cuda.synchronize()
    seconds["warmup"] = time.perf_counter() - mark
    mark = time.perf_counter()
    torch.cuda.profiler.start()  # type: ignore[no-untyped-call]
    try:
        call()
        torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()  # type: ignore[no-untyped-call]
    seconds["profiled"] = time.perf_counter() - mark
    status["device"] = torch.cuda.get_device_name(device)
    return status


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    seconds: dict[str, float] = {}
    try:
        status = profile_one(args, seconds)
        code = 0
    except WorkbenchError as e:
        status, code = {"error": str(e)}, FAILED
    except Exception as e:  # the op itself failed: say which, and keep the traceback in stderr
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]
        status, code = {"error": f"{args.op} raised {type(e).__name__}: {first}"}, FAILED
    status["seconds"] = seconds
    args.status.write_text(json.dumps(status, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
