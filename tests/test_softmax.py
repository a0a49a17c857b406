"""softmax(x, dim) and softmax_backward(grad, y, dim): against the reference, the op contract,
special rows on every launch path, bad input, and a check that catches a softmax without the
max subtraction."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench
from tests.bundled_cubin import host_program
from tests.conftest import DEVICES
from tests.op_contract import (
    assert_contract,
    assert_gradcheck,
    assert_matches_reference,
    assert_opcheck,
)
from workbench.verify import check_call

OPS = ["softmax", "softmax_backward"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_matches_reference(lib: Any, name: str, device: str) -> None:
    assert_matches_reference(lib, name, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_opcheck(lib: Any, name: str, device: str) -> None:
    assert_opcheck(lib, name, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_gradcheck(lib: Any, name: str, device: str) -> None:
    """softmax's backward runs the softmax_backward kernel; softmax_backward's own backward is
    softmax_backward again (for grad) and a formula (for y)."""
    assert_gradcheck(lib, name, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_compiles_with_no_graph_break(lib: Any, name: str, device: str) -> None:
    assert_contract(lib, name, device, "compile")


# Row lengths that take each launch path for some dtype (kernels/softmax/softmax_rows.cuh): a
# warp per row, by 4, 16 or 32 lanes, with 16-byte vectors or single elements, 2 or up to 8
# slots a lane; a block; on a GPU the wide path (rows of 16-byte vectors on sm_90+: a cluster a
# row) or the split path (a team of blocks a row; on a device without cooperative launch a
# cluster of 2, 9 and 16 blocks, or the stream path). tests/test_softmax_paths.py runs each.
_PATH_COLS = [1, 3, 16, 60, 128, 131, 256, 1024, 4096, 16388, 65537, 262144, 600000]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two float32 tensors hold the same bits (NaNs included, which torch.equal calls
    unequal even to themselves)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _special_rows(cols: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Nine rows: normal; all -Inf; one +Inf; one NaN; the first half -Inf; the last half -Inf;
    -Inf but one element; the dtype's largest and smallest finite values; values of +-1000."""
    gen = torch.Generator().manual_seed(cols)
    x = torch.randn(9, cols, generator=gen, dtype=torch.float64)
    inf, mid, info = float("inf"), cols // 2, torch.finfo(dtype)
    x[1] = -inf
    x[2, mid] = inf
    x[3, cols - 1 - mid] = float("nan")
    x[4, : max(mid, 1)] = -inf
    x[5, mid:] = -inf
    x[6] = -inf
    x[6, cols // 3] = 0.5
    x[7, cols // 4] = info.max
    x[7, cols - 1] = info.min
    x[8] *= 1000
    return x.to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("cols", _PATH_COLS)
def test_special_rows_give_what_torch_gives(
    lib: Any, device: str, dtype: torch.dtype, cols: int
) -> None:
    """+Inf, NaN, masked (-Inf) rows and halves, extreme values: the oracle's verdict against
    torch.softmax in float64, on every path; softmax_backward on the same rows' softmax."""
    x = _special_rows(cols, dtype, device)
    verdict = check_call(lib.softmax, lib.specs["softmax"], (x, -1))
    assert verdict.passed, f"softmax, cols={cols}: {verdict.reason}: {verdict.detail}"
    y = torch.softmax(x.to(torch.float32), -1).to(dtype)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    verdict = check_call(lib.softmax_backward, lib.specs["softmax_backward"], (grad, y, -1))
    assert verdict.passed, f"softmax_backward, cols={cols}: {verdict.reason}: {verdict.detail}"


# Long rows through the default long-row path: wide for rows of 16-byte vectors on sm_90+
# (softmax_wide.cuh), else split in 2-byte dtypes (kernels/softmax/softmax_split.cuh: a team of
# blocks of a cooperative grid a row, the rows in rounds): one row over many blocks, few rows,
# and more rows than one round holds (several rounds, so that both register buffers and both
# slots of the partials serve); lengths a multiple of the vector width (16-byte loads) and odd
# ones (single elements), and shares that do not fill a block's last vector slot (131075,
# 200001).
_LONG_SHAPES = [
    (1, 65537),
    (5, 131075),
    (600, 16388),
    (160, 65537),
    (48, 200001),
    (48, 262144),
    (700, 65536),
]


def _rows_with_specials(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Normal rows with the nine special rows of _special_rows spread among them (so that they
    fall in later rounds and on other teams), or the first `rows` of them."""
    special = _special_rows(cols, dtype, "cpu")
    if rows <= special.shape[0]:
        return special[:rows].contiguous()
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows)).to(dtype)
    x[torch.arange(9) * (rows - 1) // 8] = special
    return x


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("rows", "cols"), _LONG_SHAPES)
def test_long_rows_through_the_split_path(
    lib: Any, dtype: torch.dtype, rows: int, cols: int
) -> None:
    """Each row against the reference (special rows included), forward and backward."""
    x = _rows_with_specials(rows, cols, dtype).to("cuda")
    verdict = check_call(lib.softmax, lib.specs["softmax"], (x, -1))
    assert verdict.passed, f"softmax, {rows}x{cols}: {verdict.reason}: {verdict.detail}"
    y = torch.softmax(x.to(torch.float32), -1).to(dtype)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to("cuda")
    verdict = check_call(lib.softmax_backward, lib.specs["softmax_backward"], (grad, y, -1))
    assert verdict.passed, f"softmax_backward, {rows}x{cols}: {verdict.reason}: {verdict.detail}"


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [65536, 65537])
def test_long_rows_match_torch_and_replay_in_a_cuda_graph(lib: Any, cols: int) -> None:
    """The long-row paths against torch.softmax and its backward, also when captured in a CUDA graph
    and replayed twice on new inputs (no host sync or allocation in the launch, and no state
    left behind by one replay for the next)."""
    gen = torch.Generator().manual_seed(cols)
    x = torch.randn(300, cols, generator=gen).cuda()
    grad = torch.randn(300, cols, generator=gen).cuda()
    y = lib.softmax(x, -1)  # first calls outside the capture (the launch's one-time queries)
    dx = lib.softmax_backward(grad, y, -1)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    torch.testing.assert_close(dx, torch._softmax_backward_data(grad, y, -1, x.dtype))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = lib.softmax(x, -1)
        dx_graph = lib.softmax_backward(grad, y_graph, -1)
    for replay in range(2):
        x.copy_(torch.randn(300, cols, generator=gen) * (1 + replay))
        x[7 * replay + 3] = float("-inf")  # an all -Inf row: NaN, in a different row each time
        grad.copy_(torch.randn(300, cols, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        y = lib.softmax(x, -1)
        assert same_bits(y_graph, y)  # the NaN row too (torch.equal calls NaN unequal)
        assert torch.isnan(y[7 * replay + 3]).all()
        torch.testing.assert_close(y, torch.softmax(x, -1), equal_nan=True)
        assert same_bits(dx_graph, lib.softmax_backward(grad, y, -1))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "cols"), [(1024, 65536), (256, 65536), (64, 262144), (8, 262147)])
def test_few_long_rows_take_the_dtypes_long_row_path(
    lib: Any, dtype: torch.dtype, rows: int, cols: int
) -> None:
    """The bench's long-row sizes run, on sm_90+, the wide kernel forward and backward in rows of
    16-byte vectors (the profiler's kernel names), few rows too, and the ragged kernel in rows of
    another length (262147); before sm_90 the split kernel; and match torch.softmax and its
    backward."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    grad = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    lib.softmax(x, -1)  # the one-time queries outside the profile
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        y = lib.softmax(x, -1)
        dx = lib.softmax_backward(grad, y, -1)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    if hopper and cols % (16 // x.element_size()) == 0:
        assert sum("wide_kernel" in n for n in names) == 2, names
    elif hopper:
        assert sum("ragged_kernel" in n for n in names) == 2, names
    else:
        assert sum("split_kernel" in n for n in names) == 2, names
    tol = {"rtol": 1.6e-2, "atol": 1e-5} if dtype == torch.bfloat16 else {}
    want = torch.softmax(x.float(), -1)
    torch.testing.assert_close(y.float(), want, **tol)
    want_dx = torch._softmax_backward_data(grad.float(), y.float(), -1, torch.float32)
    torch.testing.assert_close(dx.float(), want_dx, **tol)


@pytest.mark.cuda
def test_a_row_longer_than_the_grid_holds_is_streamed(lib: Any) -> None:
    """A row of 4M float32 elements is more than the resident blocks of an H100 or H200 hold in
    registers (about 2M): it takes the stream path, and still matches torch.softmax."""
    x = torch.randn(2, 1 << 22, generator=torch.Generator().manual_seed(0)).cuda()
    x[1, :1000] = float("-inf")
    torch.testing.assert_close(lib.softmax(x, -1), torch.softmax(x, -1))
    g = torch.randn_like(x)
    y = torch.softmax(x, -1)
    torch.testing.assert_close(
        lib.softmax_backward(g, y, -1), torch._softmax_backward_data(g, y, -1, x.dtype)
    )


_SPLIT_PLAN_MAIN = r"""
#include <cstdio>

#include "softmax/softmax.h"
#include "softmax/softmax_rows.cuh"

// stdin: lines of rows nvec k resident. stdout: per line, split_plan's chunks, per and teams.
int main() {
  long long rows = 0, nvec = 0, resident = 0;
  int k = 0;
  while (std::scanf("%lld %lld %d %lld", &rows, &nvec, &k, &resident) == 4) {
    int64_t teams = 0;
    const wb::softmax::SplitPlan p = wb::softmax::split_plan(rows, nvec, k, resident, &teams);
    std::printf("%d %lld %lld\n", p.chunks, static_cast<long long>(p.per),
                static_cast<long long>(teams));
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def split_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """softmax_split.cuh's split_plan (the host side of the split path's launch) in a host
    program built by nvcc; it calls no CUDA API, so it runs without a GPU."""
    return host_program(tmp_path_factory.mktemp("split_plan"), _SPLIT_PLAN_MAIN)


# (rows, vectors a row, vectors a thread, resident blocks): the bench's long rows as float32
# forward takes them on an H100 (132 SMs x 2 blocks), a row over many blocks, odd counts, more
# rows than a round holds, and a row longer than the grid holds.
_PLANS = [
    (1024, 16384, 4, 264),
    (256, 16384, 4, 264),
    (64, 65536, 4, 264),
    (1, 65536, 4, 264),
    (5, 32769, 8, 264),
    (600, 4097, 4, 264),
    (48, 200001, 8, 264),
    (3, 150000, 4, 7),
    (1, 1048576, 4, 264),
    (2, 600000, 2, 528),
]


@pytest.mark.nvcc
def test_the_split_plan_covers_each_row_within_the_resident_grid(split_plan: Path) -> None:
    """Every row's vectors fall in its team's shares (each within a thread's slots), the grid
    fits the resident blocks, and the rows take as few rounds as the teams that fit allow,
    spread evenly; a row longer than the grid holds is refused (chunks 0)."""
    stdin = "".join(f"{r} {n} {k} {res}\n" for r, n, k, res in _PLANS)
    run = subprocess.run([split_plan], input=stdin, capture_output=True, text=True, check=True)
    got = [tuple(int(v) for v in line.split()) for line in run.stdout.splitlines()]
    assert len(got) == len(_PLANS)
    for (rows, nvec, k, resident), (chunks, per, teams) in zip(_PLANS, got, strict=True):
        least = math.ceil(nvec / (512 * k))
        if least > resident:
            assert chunks == 0, (rows, nvec)
            continue
        assert chunks >= least and per <= 512 * k and per * chunks >= nvec, (rows, nvec, per)
        assert 1 <= teams <= rows and teams * chunks <= resident, (rows, nvec, teams)
        rounds = math.ceil(rows / teams)
        assert rounds == math.ceil(rows / (resident // chunks)), (rows, nvec, teams)
        assert teams - (rows - (rounds - 1) * teams) < rounds  # no round far lighter than another
    assert got[:4] == [(8, 2048, 32), (8, 2048, 32), (32, 2048, 8), (128, 512, 1)]
    assert got[8][0] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_fully_masked_row_is_nan_as_in_torch(lib: Any, device: str) -> None:
    x = torch.tensor([[float("-inf")] * 5, [0.0, float("-inf"), 1.0, 2.0, float("-inf")]])
    x = x.to(device)
    got, want = lib.softmax(x, -1), torch.softmax(x, -1)
    assert torch.isnan(got[0]).all()
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(5, 1), (2, 262144), (3, 262147)])
def test_rows_of_one_and_of_262144(lib: Any, device: str, shape: tuple[int, int]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device)
    want = torch.softmax(x.double(), -1).float()
    torch.testing.assert_close(lib.softmax(x, -1), want, rtol=1e-5, atol=1e-7)
    if shape[1] == 1:
        assert bool((lib.softmax(x, -1) == 1).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_any_dim_matches_torch_and_the_fake_layout(lib: Any, device: str, dim: int) -> None:
    """dim is moved last and back: values as torch.softmax, strides as the fake function's."""
    x = torch.randn(6, 7, 9, dtype=torch.float64, device=device)
    got = lib.softmax(x, dim)
    torch.testing.assert_close(got, torch.softmax(x, dim))
    fake = lib.specs["softmax"].fake(x, dim)
    assert got.shape == fake.shape and got.stride() == fake.stride()
    g = torch.randn_like(x)
    torch.testing.assert_close(
        lib.softmax_backward(g, got, dim), torch._softmax_backward_data(g, got, dim, x.dtype)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_matches_torch_to_second_order(lib: Any, device: str) -> None:
    x = torch.randn(4, 33, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(4, 33, dtype=torch.float64, device=device)
    (gx,) = torch.autograd.grad((lib.softmax(x, 1) * w).sum(), x, create_graph=True)
    (ex,) = torch.autograd.grad((torch.softmax(x, 1) * w).sum(), x, create_graph=True)
    torch.testing.assert_close(gx, ex)
    (ggx,) = torch.autograd.grad(gx.pow(2).sum(), x)
    (egx,) = torch.autograd.grad(ex.pow(2).sum(), x)
    torch.testing.assert_close(ggx, egx)


def test_traces_with_backward_under_torch_compile(lib: Any) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return lib.softmax(x * 2, 0) * x

    x = torch.randn(12, 40, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    expected, got = f(x), compiled(x)
    torch.testing.assert_close(got, expected)
    (gx,) = torch.autograd.grad(got.sum(), x)
    (ex,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(gx, ex)


@pytest.mark.parametrize(
    ("op", "args", "error", "message"),
    [
        (
            "softmax",
            (torch.randn(4, 8), 2),
            RuntimeError,
            r"softmax: expected dim in \[-2, 1\] for x of 2 dimension\(s\), got 2",
        ),
        (
            "softmax",
            (torch.tensor(1.0), -2),
            RuntimeError,
            r"softmax: expected dim in \[-1, 0\] for x of 0 dimension\(s\), got -2",
        ),
        (
            "softmax",
            (torch.arange(6).reshape(2, 3), -1),
            TypeError,
            r"softmax: x has dtype Long, which is not supported; expected one of Float, Double, "
            r"Half, BFloat16",
        ),
        (
            "softmax_backward",
            (torch.randn(4, 7), torch.rand(4, 8), -1),
            RuntimeError,
            r"softmax_backward: expected grad to have the same shape as y \[4, 8\], got \[4, 7\]",
        ),
        (
            "softmax_backward",
            (torch.randn(4, 8, dtype=torch.float64), torch.rand(4, 8), -1),
            TypeError,
            r"softmax_backward: expected grad to have the same dtype as y \(Float\), got Double",
        ),
        (
            "softmax_backward",
            (torch.randn(4, 8), torch.rand(4, 8), -3),
            RuntimeError,
            r"softmax_backward: expected dim in \[-2, 1\] for y of 2 dimension\(s\), got -3",
        ),
        (
            "softmax_backward",
            (torch.ones(2, 3, dtype=torch.int32), torch.ones(2, 3, dtype=torch.int32), -1),
            TypeError,
            r"softmax_backward: y has dtype Int, which is not supported",
        ),
    ],
)
def test_bad_input_is_named(
    lib: Any, op: str, args: tuple[Any, ...], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        getattr(lib, op)(*args)


# --- the check catches a softmax that skips the max subtraction --------------------------------

_NAIVE: dict[str, Any] = {}


def naive_softmax() -> Any:
    """exp(x) / sum(exp(x)) in float32, without subtracting the row's max: right while every
    exp(x) and their sum are finite. A torch.library op can be defined once per process."""
    if not _NAIVE:

        @torch.library.custom_op("wbimp_softmax::naive", mutates_args=())
        def naive(x: torch.Tensor, dim: int) -> torch.Tensor:
            e = torch.exp(x.to(torch.float32))
            return (e / e.sum(dim, keepdim=True)).to(x.dtype).contiguous()

        naive.register_fake(lambda x, dim: torch.empty_like(x))
        _NAIVE["op"] = naive
    return _NAIVE["op"]


def test_a_softmax_without_the_max_subtraction_fails_on_large_logits(lib: Any) -> None:
    """Finite normal logits pass; the large ones fail. Near 86 every exp(x) is finite but their
    sum overflows, so the impostor writes zeros ("values"); at +-300 exp(x) itself overflows and
    Inf / Inf puts NaN where the truth is finite (the oracle names that "unwritten": outputs
    are poisoned with NaN)."""
    spec = dataclasses.replace(
        lib.specs["softmax"], name="naive_softmax", dtypes=(torch.float32,), backward=None
    )
    report = workbench.check(naive_softmax(), spec, device="cpu", trials=1, contract=False)
    failed = {r.label: r.reason for r in report.failures}
    assert failed.get("shifted") in ("values", "nonfinite"), str(report)
    assert failed.get("wide_range") in ("values", "nonfinite", "unwritten"), str(report)
    # and the derived range sample (values scaled up to 1e6), which catches it too
    assert set(failed) <= {"shifted", "wide_range", "specials", "range"}, str(report)
    real = workbench.check(lib.softmax, lib.specs["softmax"], device="cpu", dtypes=[torch.float32],
                           trials=1, contract=False)  # fmt: skip
    assert real.passed, str(real)
    assert {"shifted", "wide_range"} <= {r.label for r in real.rows}
