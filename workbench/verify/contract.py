"""The op contract beyond values: poisoned outputs, untouched inputs, determinism, opcheck,
gradcheck, torch.compile, and on CUDA the caller's stream and CUDA graph capture.

Poisoning. The op allocates its own outputs, so the poison goes into the allocator:
``torch.use_deterministic_algorithms(True)`` with ``torch.utils.deterministic.
fill_uninitialized_memory`` (on by default) makes every ``at::empty`` on CPU and CUDA return
memory filled with NaN (the largest value for integer dtypes). A kernel that leaves an element
unwritten then returns NaN there, which the oracle reports as ``unwritten``.

Each check returns None when it passes, else a :class:`~workbench.verify.oracle.Verdict`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from workbench.verify.oracle import (
    MUTATED,
    NONDETERMINISTIC,
    Verdict,
    fail,
)

# Contract check names (the ``check`` column of a report).
OPCHECK = "opcheck"
GRADCHECK = "gradcheck"
COMPILE = "compile"
STREAM = "stream"
GRAPH = "graph"

# A side stream sleeps this many GPU cycles (milliseconds on any current GPU) before it writes
# the inputs, so a kernel launched on another stream reads them too early.
_SLEEP_CYCLES = 20_000_000


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Every tensor allocated inside comes back filled with NaN (or the int max)."""
    was_on = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]


def storage_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of every byte of ``t``'s storage (views see the whole buffer)."""
    return _raw(t).clone()


def snapshot(args: tuple[Any, ...]) -> list[torch.Tensor | None]:
    return [storage_copy(a) if isinstance(a, torch.Tensor) else None for a in args]


def mutated(args: tuple[Any, ...], before: list[torch.Tensor | None]) -> Verdict | None:
    """A failure naming the first argument whose storage changed."""
    for i, (a, saved) in enumerate(zip(args, before, strict=True)):
        if saved is not None and not torch.equal(storage_copy(a), saved):
            return fail(MUTATED, f"argument {i} changed: the op wrote into an input")
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() and t.element_size() in (2, 4, 8):
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
        return t.contiguous().view(ints[t.element_size()])
    return t


def bitwise_mismatch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where two same-shape tensors differ in any bit (NaN equals the same NaN)."""
    return _bits(a).cpu() != _bits(b).cpu()


def bitwise_equal(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_bits(a).cpu(), _bits(b).cpu()))


def same_again(first: torch.Tensor, second: Any, what: str) -> Verdict | None:
    """A ``nondeterministic`` failure when two runs on the same inputs differ in any bit."""
    if bitwise_equal(first, second):
        return None
    return fail(
        NONDETERMINISTIC,
        f"{what} differs in some bit from the first run on the same inputs; "
        "set nondeterministic=True in the spec if that is intended",
    )


def run_opcheck(op: Any, args: tuple[Any, ...]) -> Verdict | None:
    """torch.library.opcheck with its default tests."""
    target = getattr(op, "default", op)
    try:
        torch.library.opcheck(target, args)
    except Exception as e:
        return fail(OPCHECK, _first_line(e))
    return None


def run_gradcheck(
    op: Callable[..., Any], args: tuple[Any, ...], fast: bool = False
) -> Verdict | None:
    """float64 gradcheck of the registered backward (args are float64 samples).

    ``fast`` checks random projections of the Jacobian (``fast_mode``): a few calls however
    large the inputs, where the full check perturbs every element.
    """
    leaves = tuple(
        a.detach().clone().requires_grad_(True)
        if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a
        for a in args
    )
    tensors = tuple(a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad)

    def call(*xs: torch.Tensor) -> Any:
        it = iter(xs)
        return op(
            *(next(it) if isinstance(a, torch.Tensor) and a.requires_grad else a for a in leaves)
        )

    try:
        ok = torch.autograd.gradcheck(call, tensors, raise_exception=True, fast_mode=fast)
    except Exception as e:
        return fail(GRADCHECK, _first_line(e))
    return None if ok else fail(GRADCHECK, "gradcheck returned False")


def run_compiled(
    op: Callable[..., Any], args: tuple[Any, ...], eager: torch.Tensor, backend: str
) -> Any:
    """The op under torch.compile(fullgraph=True); returns its output (or a failed Verdict)."""
    import torch._dynamo

    def call(*xs: Any) -> Any:
        return op(*xs)

    compiled = torch.compile(call, backend=backend, fullgraph=True, dynamic=False)
    try:
        return compiled(*args)
    except Exception as e:
        return fail(
            COMPILE, f"torch.compile(fullgraph=True, backend={backend!r}): {_first_line(e)}"
        )
    finally:
        torch._dynamo.reset()


def same_layout_copy(t: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``t``'s values, sizes, strides and offset (expanded views included)."""
    buf = storage_copy(t)
    typed = torch.empty(0, dtype=t.dtype, device=t.device)
    return typed.set_(buf.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s storage as a uint8 tensor (a view: writes go to ``t``)."""
    raw = torch.empty(0, dtype=torch.uint8, device=t.device)
    return raw.set_(t.untyped_storage())


def run_on_side_stream(op: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """The op on a fresh stream whose inputs are written only after a GPU-side delay.

    The inputs first hold all-ones bytes (NaN in every float dtype), written on the caller's
    stream; then the side stream sleeps, writes the real values and calls the op. A kernel that
    launches on another stream than the current one reads the NaN and returns a wrong result.
    """
    main = torch.cuda.current_stream()
    staged = [same_layout_copy(a) if isinstance(a, torch.Tensor) else a for a in args]
    for t in staged:
        if isinstance(t, torch.Tensor):
            _raw(t).fill_(0xFF)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(_SLEEP_CYCLES)  # type: ignore[no-untyped-call]
        for a, t in zip(args, staged, strict=True):
            if isinstance(t, torch.Tensor):
                _raw(t).copy_(_raw(a))
        out = op(*staged)
    side.synchronize()
    main.synchronize()
    return out


def run_graph(op: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """The op captured into a CUDA graph (after a warm-up on a side stream) and replayed."""
    static = tuple(same_layout_copy(a) if isinstance(a, torch.Tensor) else a for a in args)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(*static)
    graph.replay()
    torch.cuda.synchronize()
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]
