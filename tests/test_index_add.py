"""index_add(x, dim, index, source): against the reference, the op contract, errors, and the
oracle's bound on colliding indices."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.bundled_cubin import cuda_kernels_run
from tests.conftest import DEVICES
from tests.op_contract import (
    assert_contract,
    assert_gradcheck,
    assert_matches_reference,
    assert_opcheck,
)
from workbench.verify import check_call


@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(lib: Any, device: str) -> None:
    assert_matches_reference(lib, "index_add", device)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(lib: Any, device: str) -> None:
    assert_opcheck(lib, "index_add", device)


@pytest.mark.parametrize("device", DEVICES)
def test_compile(lib: Any, device: str) -> None:
    assert_contract(lib, "index_add", device, "compile")


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(lib: Any, device: str) -> None:
    assert_gradcheck(lib, "index_add", device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_colliding_indices_stay_within_the_oracle_bound(
    lib: Any, device: str, dtype: torch.dtype
) -> None:
    """100000 rows into 3, so that each element of x sums about 33000 terms: well within the
    bound of the float64 truth (float16 and bfloat16 sum in float32 and round once)."""
    gen = torch.Generator().manual_seed(5)
    index = torch.randint(0, 3, (100_000,), generator=gen)
    x = torch.randn(3, 16, generator=gen).to(device, dtype)
    source = torch.randn(100_000, 16, generator=gen).to(device, dtype)
    verdict = check_call(lib.index_add, lib.specs["index_add"], (x, 0, index.to(device), source))
    assert verdict.passed and verdict.ratio < 0.5, verdict


def _slices(rows: int, size: int, count: int, dtype: torch.dtype) -> int:
    """Blocks a row takes on the CUDA slice path (kernels/index_add/index_add.cu), 0 for none: rows
    and index of 1024 or more, a row in at most 4 blocks' shared memory as accumulators, and the
    rows' blocks at least the SMs."""
    acc = 8 if dtype == torch.float64 else 4
    props = torch.cuda.get_device_properties(0)
    slices = -(-size // (props.shared_memory_per_block_optin // acc))
    fill = rows * slices >= props.multi_processor_count
    return slices if size >= 1024 and count >= 1024 and slices <= 4 and fill else 0


@pytest.mark.cuda
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str
)
@pytest.mark.parametrize(
    ("rows", "size", "count"),
    [
        (256, 100_000, 65_536),
        (200, 1024, 1024),
        (140, 58_001, 4000),
        (70, 230_000, 3000),
        (8, 131_072, 20_000),
        (400, 900, 5000),
    ],
)
def test_the_last_dimension_adds_in_shared_memory_slices(
    lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int, size: int, count: int
) -> None:
    """Along the last dimension, rows and index of 1024 or more whose row at most 4 blocks' shared
    memory hold, a block an SM at least, take index_add_slice_kernel (a row's slices in shared
    memory, the output written once from them); indices on every slice's edges and repeated ones;
    within the oracle's bound of the float64 truth. Longer rows, shorter ones, too few blocks and
    WB_INDEX_ADD=atomic take the atomic kernel, which gives the same within the bound."""
    gen = torch.Generator().manual_seed(size + count)
    slices = _slices(rows, size, count, dtype)
    width = -(-size // max(slices, 1))
    edges = [0, size - 1] + [j for i in range(1, slices) for j in (i * width - 1, i * width)]
    index = torch.randint(0, size, (count,), generator=gen)
    index[: len(edges)] = torch.tensor(edges)
    index[len(edges) : len(edges) + 64] = size // 2  # one column many times
    x = torch.randn(rows, size, generator=gen).to("cuda", dtype)
    source = torch.randn(rows, count, generator=gen).to("cuda", dtype)
    args = (x, -1, index.cuda(), source)
    for atomic in (False, True):
        if atomic:
            monkeypatch.setenv("WB_INDEX_ADD", "atomic")
        names = cuda_kernels_run(lambda: lib.index_add(*args))
        sliced = "index_add_slice_kernel" in names
        assert sliced == (slices > 0 and not atomic), names
        verdict = check_call(lib.index_add, lib.specs["index_add"], args)
        assert verdict.passed, verdict


@pytest.mark.cuda
def test_a_bad_index_add_path_is_named(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WB_INDEX_ADD", "shared")
    x = torch.zeros(2, 4096, device="cuda")
    with pytest.raises(RuntimeError, match="WB_INDEX_ADD"):
        lib.index_add(x, 1, torch.zeros(2048, dtype=torch.int64, device="cuda"), x[:, :2048])
        torch.cuda.synchronize()


def test_cpu_adds_in_index_order_like_pytorch(lib: Any) -> None:
    """On the CPU the terms are added in index order: float32 gives PyTorch's bits."""
    gen = torch.Generator().manual_seed(6)
    index = torch.randint(0, 5, (3000,), generator=gen)
    for dim, shape in ((0, (5, 33)), (-1, (7, 5))):
        x = torch.randn(shape, generator=gen)
        s_shape = list(shape)
        s_shape[dim] = 3000
        source = torch.randn(s_shape, generator=gen)
        assert torch.equal(lib.index_add(x, dim, index, source), x.index_add(dim, index, source))


def test_many_threads_add_like_one(lib: Any) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(300, 1000, generator=gen)
    index = torch.randint(0, 300, (600,), generator=gen)
    source = torch.randn(600, 1000, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = lib.index_add(x, 0, index, source)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(lib.index_add(x, 0, index, source), one)


def test_the_inputs_are_left_alone(lib: Any) -> None:
    x = torch.randn(4, 3).mul(8).round()  # whole numbers: adding 1 twice is exactly adding 2
    before = x.clone()
    out = lib.index_add(x, 0, torch.tensor([1, 1]), torch.ones(2, 3))
    assert torch.equal(x, before)
    assert torch.equal(out[1], before[1] + 2)


_X = torch.randn(4, 6)
_I = torch.tensor([0, 3, 3])


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((_X, 0, torch.tensor([0, 4, 1]), torch.randn(3, 6)), RuntimeError,
         r"index_add: expected every index in \[0, 4\) \(x.size\(dim\)\), got values from 0 to 4"),
        ((_X, 1, torch.tensor([-1]), torch.randn(4, 1)), RuntimeError,
         r"index_add: expected every index in \[0, 6\) .*got values from -1 to -1"),
        ((_X, 2, _I, torch.randn(4, 3)), RuntimeError,
         r"index_add: expected dim in \[-2, 1\] for x of shape \[4, 6\], got 2"),
        ((_X, 0, _I.view(3, 1), torch.randn(3, 6)), RuntimeError,
         r"index_add: expected index to be 1-d, got shape \[3, 1\]"),
        ((_X, 0, _I.float(), torch.randn(3, 6)), TypeError,
         r"index_add: expected index to have dtype int64 or int32, got Float"),
        ((_X, 0, _I, torch.randn(3, 6, dtype=torch.float64)), TypeError,
         r"index_add: expected source to have the same dtype as x \(Float\), got Double"),
        ((_X, 0, _I, torch.randn(3, 5)), RuntimeError,
         r"index_add: expected source.size\(1\) == 6 \(x's size\), got 5"),
        ((_X, 0, _I, torch.randn(2, 6)), RuntimeError,
         r"index_add: expected source.size\(0\) == 3 \(index.numel\(\)\), got 2"),
        ((_X, 0, _I, torch.randn(3, 6, 1)), RuntimeError,
         r"index_add: expected source to have x's 2 dimensions, got shape \[3, 6, 1\]"),
        ((torch.tensor(1.0), 0, _I, torch.randn(3)), RuntimeError,
         r"index_add: expected x to have at least 1 dimension"),
        ((torch.zeros(4, dtype=torch.int32), 0, _I, torch.zeros(3, dtype=torch.int32)), TypeError,
         r"index_add: x has dtype Int, which is not supported"),
    ],
)  # fmt: skip
def test_bad_input_is_named(lib: Any, args: tuple[Any, ...], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        lib.index_add(*args)
