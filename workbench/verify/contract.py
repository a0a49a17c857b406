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

from workbench.spec import OpSpec
from workbench.verify.oracle import (
    ALIASED,
    LAYOUT,
    MUTATED,
    NONDETERMINISTIC,
    UNWRITTEN,
    Verdict,
    fail,
)
from workbench.verify.schema import Signature, flat_outputs, same_layout_copy
from workbench.verify.schema import raw as _raw
from workbench.verify.variants import relaid

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


def mutated(
    args: tuple[Any, ...], before: list[torch.Tensor | None], written: tuple[int, ...] = ()
) -> Verdict | None:
    """A failure naming the first argument changed against its schema.

    An argument the schema does not mark as written must keep every byte of its storage. One it
    marks (``Tensor(a!)``) may change only the elements of its view: the bytes of its storage
    outside the view (the rest of a larger buffer it is a slice of) must stay as they were.
    """
    for i, (a, saved) in enumerate(zip(args, before, strict=True)):
        if saved is None:
            continue
        if i not in written:
            if not torch.equal(storage_copy(a), saved):
                return fail(
                    MUTATED,
                    f"argument {i} changed: the op wrote into an input its schema does not "
                    "mark as written (Tensor(a!))",
                )
            continue
        expected = saved.clone()
        typed = torch.empty(0, dtype=a.dtype, device=a.device)
        view = typed.set_(expected.untyped_storage(), a.storage_offset(), a.size(), a.stride())
        view.copy_(a)
        if not torch.equal(storage_copy(a), expected):
            return fail(
                MUTATED,
                f"argument {i} (written) changed outside its view: the op wrote past the "
                "elements of the tensor it was given",
            )
    return None


def unwritten_argument(
    args: tuple[Any, ...], before: list[torch.Tensor | None], written: tuple[int, ...]
) -> Verdict | None:
    """A failure when an argument the schema marks as written (``Tensor(a!)``, an ``out=``)
    keeps every byte: the op wrote its result somewhere else (a fresh tensor) or not at all."""
    for i in written:
        a, saved = args[i], before[i]
        if not isinstance(a, torch.Tensor) or saved is None or a.numel() == 0:
            continue
        if torch.equal(storage_copy(a), saved):
            return fail(
                UNWRITTEN,
                f"argument {i} (written) was not written at all: its schema marks it "
                "Tensor(a!), so the op must write its result into that very tensor, not into "
                "a new one",
            )
    return None


def _storage_ptr(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr()) if t.numel() else 0


def aliased(args: tuple[Any, ...], returned: Any, sig: Signature) -> Verdict | None:
    """A failure when a return the schema does not mark as an alias shares memory with an
    argument (a view of the input, or the input itself, where the schema promises a new
    tensor: autograd, torch.compile and the caller may then write one through the other)."""
    rets = [] if returned is None else flat_outputs(returned)
    declared = sig.aliased_returns
    for k, r in enumerate(rets):
        if not isinstance(r, torch.Tensor) or (k < len(declared) and declared[k] is not None):
            continue
        ptr = _storage_ptr(r)
        for i, a in enumerate(args):
            if ptr and isinstance(a, torch.Tensor) and _storage_ptr(a) == ptr:
                return fail(
                    ALIASED,
                    f"return {k} shares memory with argument {i}: the schema says it is a new "
                    "tensor (no alias annotation such as Tensor(a)), so return a copy",
                )
    return None


def layout(spec: OpSpec, args: tuple[Any, ...], returned: Any, sig: Signature) -> Verdict | None:
    """A failure when a returned tensor's strides, device or dtype differ from what the spec's
    fake returns for the same arguments (torch.compile plans its graph with the fake's). A
    contiguous return is not failed for a fake of another layout: most kernels write contiguous
    outputs where the common ``empty_like`` fake keeps a strided input's layout, and the values
    are right; what fails is a kernel's own layout (a column-major return, say) that the fake
    does not give."""
    if sig.mutates or returned is None:
        return None  # a fake of an op that writes returns those arguments or nothing
    try:
        fake = sig.call(spec.fake, args)
    except Exception:
        return None  # opcheck reports a fake that fails
    got, want = flat_outputs(returned), flat_outputs(fake)
    for k, (g, w) in enumerate(zip(got, want, strict=False)):
        if not (isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)):
            continue
        if g.device != w.device:
            return fail(LAYOUT, f"return {k} is on {g.device}, the fake's on {w.device}")
        if g.shape != w.shape or g.numel() <= 1:
            continue  # the oracle reports a wrong shape (dtype: the oracle too)
        strides = [(st, n) for st, n in zip(g.stride(), g.shape, strict=True) if n > 1]
        fakes = [(st, n) for st, n in zip(w.stride(), w.shape, strict=True) if n > 1]
        if strides != fakes and not g.is_contiguous():
            return fail(
                LAYOUT,
                f"return {k} has strides {list(g.stride())} (non-contiguous), the spec's fake "
                f"gives {list(w.stride())}: torch.compile would read it with the fake's layout",
            )
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
    """Same type of result, and every tensor in it equal in every bit (tuples element by element;
    non-tensor outputs by ==)."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        if not (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))):
            return False
        return len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b, strict=True))
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        either = isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)
        return not either and bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_bits(a).cpu(), _bits(b).cpu()))


def same_again(first: Any, second: Any, what: str) -> Verdict | None:
    """A ``nondeterministic`` failure when two runs on the same inputs differ in any bit."""
    if bitwise_equal(first, second):
        return None
    return fail(
        NONDETERMINISTIC,
        f"{what} differs in some bit from the first run on the same inputs; "
        "set nondeterministic=True in the spec if that is intended",
    )


def run_opcheck(op: Any, args: tuple[Any, ...], sig: Signature | None = None) -> Verdict | None:
    """torch.library.opcheck with its default tests (on copies of the written arguments)."""
    target = getattr(op, "default", op)
    sig = sig or Signature()
    positional, named = sig.split(sig.fresh(args))
    try:
        torch.library.opcheck(target, positional, named)
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
    if not ok:
        return fail(GRADCHECK, "gradcheck returned False")
    return strided_grad_output(call, tensors)


def strided_grad_output(
    call: Callable[..., Any], inputs: tuple[torch.Tensor, ...]
) -> Verdict | None:
    """The input gradients for an upstream gradient in another layout (its dimensions stored in
    reverse order, off its buffer's start) must equal those for the same values contiguous:
    gradcheck passes only contiguous ones, and autograd hands a backward whatever layout the
    next op's gradient has (a transpose's, an expand's)."""

    def differentiable() -> list[torch.Tensor]:  # a fresh forward's outputs that take a gradient
        outs = flat_outputs(call(*inputs))
        return [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad and o.numel()]

    outs = differentiable()
    if not outs:
        return None
    gen = torch.Generator().manual_seed(0)
    ups = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
    relaid_ups = [relaid(u, "transposed") for u in ups]
    plain = torch.autograd.grad(outs, inputs, ups, allow_unused=True)
    strided = torch.autograd.grad(differentiable(), inputs, relaid_ups, allow_unused=True)
    for i, (p, q) in enumerate(zip(plain, strided, strict=True)):
        if p is None or q is None:
            continue
        if not torch.allclose(p, q, rtol=1e-9, atol=1e-12 * max(1.0, float(p.abs().max()))):
            worst = int((p - q).abs().flatten().argmax())
            return fail(
                GRADCHECK,
                f"the gradient of input {i} for a non-contiguous grad_output (strides "
                f"{[list(u.stride()) for u in relaid_ups]}) differs from the one "
                f"for the same values contiguous: flat element {worst}: "
                f"{float(q.flatten()[worst]):.6g} vs {float(p.flatten()[worst]):.6g}; the "
                "backward reads grad_output as if contiguous",
            )
    return None


def run_compiled(op: Callable[..., Any], args: tuple[Any, ...], backend: str) -> Any:
    """``op(*args)`` under torch.compile(fullgraph=True); returns its output (or a failed
    Verdict). ``op`` returns the call's outputs (:meth:`Signature.outputs`), ``args`` are fresh."""
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


def run_on_side_stream(op: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """The op on a fresh stream whose inputs are written only after a GPU-side delay.

    The inputs first hold all-ones bytes (NaN in every float dtype), written on the caller's
    stream; then the side stream sleeps, writes the real values and calls the op. A kernel that
    launches on another stream than the current one reads the NaN and returns a wrong result.
    """
    with on_device_of(args):
        return _run_on_side_stream(op, args)


def on_device_of(args: tuple[Any, ...]) -> contextlib.AbstractContextManager[Any]:
    """The first CUDA tensor argument's device made current: streams, graphs and events the
    caller makes are that device's, as the op's launches are (on cuda:1 under a current cuda:0
    a side stream or a graph capture of cuda:0's would see none of the op's work)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return torch.cuda.device(a.device)
    return contextlib.nullcontext()


def _run_on_side_stream(op: Callable[..., Any], args: tuple[Any, ...]) -> Any:
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
    """The op captured into a CUDA graph (after a warm-up on a side stream) and replayed.

    Every input is restored to its values before the replay, so an op that writes into its
    arguments replays on the same values as the eager call it is compared with.
    """
    with on_device_of(args):
        return _run_graph(op, args)


def _run_graph(op: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    static = tuple(same_layout_copy(a) if isinstance(a, torch.Tensor) else a for a in args)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # A capture stream of the current device: torch.cuda.graph's default is one stream for the
    # process, made on whichever device was current at the first capture.
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):  # type: ignore[no-untyped-call]
        out = op(*static)
    for a, t in zip(args, static, strict=True):
        if isinstance(t, torch.Tensor):
            _raw(t).copy_(_raw(a))
    graph.replay()
    torch.cuda.synchronize()
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]
