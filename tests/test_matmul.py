"""matmul(a, b) = a @ b and matmul_path: against the reference, the op contract, and each path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.bundled_cubin import cuda_kernel_names
from tests.conftest import DEVICES
from tests.op_contract import (
    assert_contract,
    assert_gradcheck,
    assert_matches_reference,
    assert_opcheck,
)

OPS = ["matmul", "matmul_path"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_matches_reference(lib: Any, name: str, device: str) -> None:
    if name == "matmul":
        assert_matches_reference(lib, name, device)
        return
    from workbench.verify import Options, check_op

    rows = check_op(lib.matmul_path, lib.specs[name], device, options=Options(contract=False))
    failed = [f"{r.dtype} {r.label}: {r.reason} {r.detail}" for r in rows if not r.passed]
    assert rows and not failed, failed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_opcheck(lib: Any, name: str, device: str) -> None:
    assert_opcheck(lib, name, device)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(lib: Any, device: str) -> None:
    assert_gradcheck(lib, "matmul", device)


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_with_no_graph_break(lib: Any, device: str) -> None:
    assert_contract(lib, "matmul", device, "compile")


@pytest.mark.parametrize("device", DEVICES)
def test_traces_forward_and_backward_under_torch_compile(lib: Any, device: str) -> None:
    """The fake and the autograd formula (which calls matmul itself) trace with no graph break."""

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return lib.matmul(lib.matmul(a, b), b.t())

    a = torch.randn(12, 40, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(40, 24, dtype=torch.float64, device=device, requires_grad=True)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    expected, got = f(a, b), compiled(a, b)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got.sum(), (a, b))
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), (a, b)))
    torch.testing.assert_close(grads, torch.autograd.grad((a @ b @ b.t()).sum(), (a, b)))


def test_reads_transposed_operands_in_place(lib: Any) -> None:
    """Every layout of a and b gives a @ b (the CPU kernel reads strides; nothing is copied)."""
    a, b = torch.randn(33, 70, dtype=torch.float64), torch.randn(70, 21, dtype=torch.float64)
    every_other = torch.empty(70, 42, dtype=torch.float64)[:, ::2].copy_(b)
    for x in (a, a.t().contiguous().t()):
        for y in (b, b.t().contiguous().t(), every_other):
            torch.testing.assert_close(lib.matmul(x, y), a @ b)


@pytest.mark.parametrize(
    ("a", "b", "error", "message"),
    [
        (torch.randn(4, 8), torch.randn(7, 3), RuntimeError,
         r"matmul: expected a.size\(1\) \(8\) to equal b.size\(0\) \(7\)"),
        (torch.randn(2, 2, 4, 8), torch.randn(8, 3), RuntimeError,
         r"matmul: expected a to be 2-d \[m, k\] or 3-d \[batch, m, k\], got shape \[2, 2, 4, 8\]"),
        (torch.randn(4, 8), torch.randn(8), RuntimeError,
         r"matmul: expected b to be 2-d \[k, n\] or 3-d \[batch, k, n\], got shape \[8\]"),
        (torch.randn(4, 8), torch.randn(2, 8, 3), RuntimeError,
         r"matmul: a 2-d a takes a 2-d b; .* give a as \[2, 4, 8\]"),
        (torch.randn(3, 4, 8), torch.randn(2, 8, 3), RuntimeError,
         r"matmul: expected b.size\(0\) \(2\) to equal a.size\(0\) \(3\)"),
        (torch.randn(3, 4, 8), torch.randn(3, 7, 3), RuntimeError,
         r"matmul: expected a.size\(2\) \(8\) to equal b.size\(1\) \(7\)"),
        (torch.randn(4, 8), torch.randn(8, 3, dtype=torch.float64), TypeError,
         r"matmul: expected b to have the same dtype as a \(Float\), got Double"),
        (torch.arange(4).view(2, 2), torch.arange(4).view(2, 2), TypeError,
         r"matmul: a has dtype Long, which is not supported"),
        (torch.zeros(0, 5, 8, dtype=torch.long), torch.zeros(0, 8, 3, dtype=torch.long), TypeError,
         r"matmul: a has dtype Long, which is not supported"),
    ],
)  # fmt: skip
def test_bad_input_is_named(
    lib: Any, a: torch.Tensor, b: torch.Tensor, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        lib.matmul(a, b)


# Batched operands (bindings/matmul.cpp, batched): a slice at a time (or, on CUDA, small
# float16 / bfloat16 slices in one launch: the tests at the end), one product of a's rows
# where the batch shares b (folded, or copied where a's strides do not fold), an empty batch, and
# sizes past a tensor-core tile.
_BATCHED = [
    ((3, 17, 40), (3, 40, 24)),
    ((4, 30, 72), (72, 48)),
    ((5, 1, 64), (64, 40)),
    ((0, 5, 8), (0, 8, 3)),
    ((2, 300, 264), (2, 264, 520)),
    ((2, 300, 264), (264, 520)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("a_shape", "b_shape"), _BATCHED)
@pytest.mark.parametrize("transposed", [False, True])
def test_batched_operands_match_torch_matmul(
    lib: Any,
    device: str,
    dtype: torch.dtype,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    transposed: bool,
) -> None:
    """a [batch, m, k] with b [k, n] or [batch, k, n] gives torch.matmul's [batch, m, n],
    contiguous, within the dtype's rounding of a float64 truth; a given as a transposed view
    (rows that do not fold into one matrix) too."""
    gen = torch.Generator().manual_seed(sum(a_shape) + sum(b_shape))
    if transposed:
        a = torch.randn(*a_shape[:-2], a_shape[-1], a_shape[-2], generator=gen).transpose(-1, -2)
    else:
        a = torch.randn(*a_shape, generator=gen)
    b = torch.randn(*b_shape, generator=gen)
    a, b = a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype)
    c = lib.matmul(a, b)
    want = torch.matmul(a.double(), b.double())
    assert c.shape == want.shape and c.dtype == dtype and c.is_contiguous()
    scale = float(want.abs().max()) if want.numel() else 1.0
    tol = {"rtol": 8e-3, "atol": 1e-3 * scale}
    if dtype == torch.float32:
        tol = {"rtol": 1e-5, "atol": 1e-5 * scale}
    torch.testing.assert_close(c.double(), want, **tol)
    if device == "cuda" and a.shape[0] > 0:  # every path takes a batch too
        torch.testing.assert_close(lib.matmul_path(a, b, 1).double(), want, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("a_shape", "b_shape"), _BATCHED[:3])
def test_batched_gradients_match_torch(
    lib: Any, device: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    """The backward of a batched call: grad_a a slice at a time, grad_b a slice at a time for a
    batched b and summed over the batch for a shared one, as torch.matmul's autograd gives."""
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(*a_shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(*b_shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    g = torch.randn(*a_shape[:-1], b_shape[-1], generator=gen, dtype=torch.float64).to(device)
    got = torch.autograd.grad(lib.matmul(a, b), (a, b), g)
    want = torch.autograd.grad(torch.matmul(a, b), (a, b), g)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_an_expanded_b_is_one_product_of_as_rows(lib: Any, device: str, dtype: torch.dtype) -> None:
    """b [batch, k, n] expanded from one matrix (batch stride 0) is the shared b it is: one product
    of a's batch * m rows, as b [k, n] gives (on CUDA the same kernels as that 2-d call), right,
    with gradients as torch.matmul's (grad_b summed over the batch by the expand)."""
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(6, 40, 72, generator=gen).to(device=device, dtype=dtype)
    b0 = torch.randn(72, 136, generator=gen).to(device=device, dtype=dtype)
    b = b0.expand(6, -1, -1)
    c = lib.matmul(a, b)
    want = torch.matmul(a.double(), b.double())
    assert c.shape == (6, 40, 136) and c.is_contiguous()
    rtol = {torch.float32: 1e-5, torch.float64: 1e-12}.get(dtype, 8e-3)
    torch.testing.assert_close(c.double(), want, rtol=rtol, atol=rtol * float(want.abs().max()))
    if device == "cuda":
        flat = a.reshape(240, 72)
        lib.matmul(flat, b0)
        assert cuda_kernel_names(lambda: lib.matmul(a, b)) == cuda_kernel_names(
            lambda: lib.matmul(flat, b0)
        )
    if dtype == torch.float64:
        a.requires_grad_()
        leaf = b0.clone().requires_grad_()
        g = torch.randn(6, 40, 136, generator=gen, dtype=dtype).to(device)
        got = torch.autograd.grad(lib.matmul(a, leaf.expand(6, -1, -1)), (a, leaf), g)
        want_grads = torch.autograd.grad(torch.matmul(a, leaf.expand(6, -1, -1)), (a, leaf), g)
        torch.testing.assert_close(got, want_grads)


def test_a_cpu_path_other_than_automatic_is_refused(lib: Any) -> None:
    with pytest.raises(RuntimeError, match=r"matmul_path: the CPU has one path; expected path=0"):
        lib.matmul_path(torch.randn(2, 2), torch.randn(2, 2), 1)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_cuda_path_is_taken_and_right(lib: Any, dtype: torch.dtype) -> None:
    """The automatic choice runs the path the device has (profiler kernel names), and every
    path agrees with the automatic one within the dtype's rounding."""
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(300, 264, device="cuda", dtype=dtype)
    b = torch.randn(264, 520, device="cuda", dtype=dtype)
    major, minor = torch.cuda.get_device_capability()
    # sm_90: one of the wgmma kernels (this short a takes the narrow route by default)
    expected = "wb::matmul::wgmma_" if (major, minor) == (9, 0) else "mma_kernel"
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        lib.matmul(a, b)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events())
    assert expected in names, names
    ref = (a.double() @ b.double()).to(dtype)
    paths = [1, 2] + ([3] if (major, minor) == (9, 0) else [])
    for path in paths:
        got = lib.matmul_path(a, b, path)
        torch.testing.assert_close(got, ref, atol=0.05, rtol=0.02, msg=f"path {path}")
    # b column-major: the wgmma path reads it as it is; the automatic choice copies for mma.
    bt = b.t().contiguous().t()
    torch.testing.assert_close(lib.matmul(a, bt), ref, atol=0.05, rtol=0.02)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("m", "n", "k", "layout"),
    [(300, 520, 263, ""), (300, 517, 264, ""), (257, 129, 71, "a column-major"),
     (1, 4095, 4095, ""), (5, 1001, 999, "b column-major"), (4095, 4095, 4095, "")],
)  # fmt: skip
def test_sizes_off_a_multiple_of_8_run_on_the_tensor_cores(
    lib: Any, dtype: torch.dtype, m: int, n: int, k: int, layout: str
) -> None:
    """k or n not a multiple of 8 leaves rows off 16 bytes, which the tensor-core paths cannot
    read: such an operand is copied with its rows padded (the SIMT kernel it used to fall to was
    10x slower than cuBLAS at 4095^3), or read in place by the GEMV route's unaligned kernel (one
    row of a), and the answer stays right."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator("cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
    if layout == "a column-major":
        a = a.t().contiguous().t()
    if layout == "b column-major":
        b = b.t().contiguous().t()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        got = lib.matmul(a, b)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events())
    assert "simt_kernel" not in names and "wb::matmul::" in names, names
    ref = a.double() @ b.double()
    scale = ref.abs().max().item()
    assert (got.double() - ref).abs().max().item() <= 8e-3 * scale, "wrong answer"


@pytest.mark.cuda
@pytest.mark.parametrize("swap", ["", "0", "1"])
@pytest.mark.parametrize(("m", "n", "k"), [(4096, 16, 4096), (2048, 1, 520), (3000, 64, 136)])
def test_an_output_of_few_columns_is_right_computed_either_way(
    lib: Any, monkeypatch: pytest.MonkeyPatch, swap: str, m: int, n: int, k: int
) -> None:
    """Few columns and many rows: one column by default (on sm_90) computed as c^T = b^T a^T;
    WB_MATMUL_SWAP=0 / =1 force either way, and every way gives a @ b, contiguous."""
    monkeypatch.setenv("WB_MATMUL_SWAP", swap)
    g = torch.Generator("cuda").manual_seed(n)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g)
    got = lib.matmul(a, b)
    assert got.shape == (m, n) and got.is_contiguous()
    ref = a.double() @ b.double()
    assert (got.double() - ref).abs().max().item() <= 8e-3 * ref.abs().max().item()


@pytest.mark.cuda
def test_a_bad_swap_switch_is_named(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WB_MATMUL_SWAP", "yes")
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="WB_MATMUL_SWAP must be 0"):
        lib.matmul(a, a)


@pytest.mark.cuda
def test_a_path_the_device_lacks_is_named(lib: Any) -> None:
    a = torch.randn(8, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"matmul_path: path 3 cannot run here: .*float16"):
        lib.matmul_path(a, a, 3)


@pytest.mark.parametrize("k", [1024, 8192])
def test_cpu_float32_error_grows_with_k_as_torchs_does(lib: Any, k: int) -> None:
    """Against a float64 truth, float32 on the CPU within 2x torch's own error at every k up to
    8192 (one running sum over k was 7x torch's at k = 8192; each k-slice is now summed from
    zero before it joins the total)."""
    g = torch.Generator().manual_seed(k)
    a, b = torch.randn(64, k, generator=g), torch.randn(k, 64, generator=g)
    truth = a.double() @ b.double()
    ours = (lib.matmul(a, b).double() - truth).abs().max().item()
    theirs = ((a @ b).double() - truth).abs().max().item()
    assert ours <= 2 * theirs, (ours, theirs)


def _kernel_launches(fn: Any) -> list[str]:
    """The names of the CUDA kernels one call of fn launched (copies and memsets left out)."""
    names = cuda_kernel_names(fn)
    return [n for n in names if "Memcpy" not in n and "Memset" not in n]


def _batch_close(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    want = torch.matmul(a.double(), b.double())
    assert c.shape == want.shape and c.dtype == a.dtype and c.is_contiguous()
    scale = float(want.abs().max())
    rtol = {torch.float32: 1e-5, torch.float64: 1e-12}.get(a.dtype, 8e-3)
    torch.testing.assert_close(c.double(), want, rtol=rtol, atol=rtol / 4 * scale)


def _batch_kernel(dtype: torch.dtype) -> str:
    """The kernel a batch of small slices runs in: the mma path's, or for float32 and float64
    the SIMT path's."""
    half = dtype in (torch.float16, torch.bfloat16)
    if half and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the mma path needs sm_80")
    return "mma_kernel" if half else "simt_kernel"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_a_batch_of_small_slices_is_one_launch(
    lib: Any, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b [batch, k, n] of slices too small to fill the GPU (bindings/matmul.cpp,
    matmul_cuda_whole_batch): one launch for the whole batch, not one a slice (the mma path's,
    on its 64 x 64 tile for small slices or its 128 x 128 one; the SIMT path's for float32 and
    float64); slices whose rows are not 16-byte aligned (copied, padded), a batch given as a
    strided view and a b shared through a zero batch stride give the same products. The Hopper
    kernel's batch has tests of its own (test_matmul_batched.py): the mma path's is forced here."""
    kernel = _batch_kernel(dtype)
    monkeypatch.setenv("WB_MATMUL_BATCH", "mma")
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(64, 48, 40, generator=gen).to(device="cuda", dtype=dtype)
    b = torch.randn(64, 40, 72, generator=gen).to(device="cuda", dtype=dtype)
    lib.matmul(a, b)  # the launch's one-time queries outside the profile
    names = _kernel_launches(lambda: lib.matmul(a, b))
    assert len(names) == 1 and kernel in names[0], names
    _batch_close(lib.matmul(a, b), a, b)
    odd_a = torch.randn(40, 33, 21, generator=gen).to(device="cuda", dtype=dtype)
    odd_b = torch.randn(40, 21, 13, generator=gen).to(device="cuda", dtype=dtype)
    _batch_close(lib.matmul(odd_a, odd_b), odd_a, odd_b)
    _batch_close(lib.matmul(a[::2], b[1::2]), a[::2], b[1::2])
    shared = b[0].expand(64, -1, -1)
    _batch_close(lib.matmul(a, shared), a, shared)
    # Slices of 72 128 x 128 tiles, twice: more than the SMs in all, the batch's 128 x 128 tile.
    wide_a = torch.randn(2, 1100, 200, generator=gen).to(device="cuda", dtype=dtype)
    wide_b = torch.randn(2, 200, 1000, generator=gen).to(device="cuda", dtype=dtype)
    lib.matmul(wide_a, wide_b)
    names = _kernel_launches(lambda: lib.matmul(wide_a, wide_b))
    assert len(names) == 1 and kernel in names[0], names
    _batch_close(lib.matmul(wide_a, wide_b), wide_a, wide_b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_batch_past_the_grids_limit_and_large_slices(lib: Any, dtype: torch.dtype) -> None:
    """70000 slices (a batch's grid takes 65535 a launch: two launches, the last slices right),
    and slices that fill the GPU alone or few slices of a long k (a launch a slice, on the route
    a 2-d call takes)."""
    kernel = _batch_kernel(dtype)
    gen = torch.Generator().manual_seed(12)
    a = torch.randn(70000, 4, 8, generator=gen).to(device="cuda", dtype=dtype)
    b = torch.randn(70000, 8, 16, generator=gen).to(device="cuda", dtype=dtype)
    lib.matmul(a, b)
    names = _kernel_launches(lambda: lib.matmul(a, b))
    assert len(names) == 2 and all(kernel in n for n in names), names
    _batch_close(lib.matmul(a, b), a, b)
    big_a = torch.randn(3, 2048, 1024, generator=gen).to(device="cuda", dtype=dtype)
    big_b = torch.randn(3, 1024, 2048, generator=gen).to(device="cuda", dtype=dtype)
    lib.matmul(big_a, big_b)
    assert len(_kernel_launches(lambda: lib.matmul(big_a, big_b))) >= 3
    _batch_close(lib.matmul(big_a, big_b), big_a, big_b)
    # Two small slices of a long k: too few blocks for the batch's kernels (k whole), so a slice
    # at a time on the route that splits k.
    long_a = torch.randn(2, 64, 16384, generator=gen).to(device="cuda", dtype=dtype)
    long_b = torch.randn(2, 16384, 64, generator=gen).to(device="cuda", dtype=dtype)
    lib.matmul(long_a, long_b)
    assert len(_kernel_launches(lambda: lib.matmul(long_a, long_b))) >= 2
    _batch_close(lib.matmul(long_a, long_b), long_a, long_b)
