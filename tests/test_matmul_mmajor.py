"""matmul with a column-major a (a = x.t(), m-major: the weight gradient's x^T @ dy) read in
place by the wgmma path's whole-k kernel (kernels/matmul/matmul_wgmma.kernel.cu, AMMajor): a TMA
box of 64 m x 64 k per consumer warpgroup and wgmma's transpose-A form, as b's n-major layout is
read. The split-k and narrow routes of a few-rows shape read a row-major a alone: there
Path::automatic copies a (bindings/matmul.cpp, wgmma_takes_mmajor_a), and a forced wgmma path
refuses such an a by name, as it does a column-major a whose columns are not 16-byte aligned.

Without a GPU: the m-major kernels compile for sm_90a without spills, with the transpose-A
immediate set where a is m-major and the transpose-B one where b is n-major.
On a Hopper GPU (marked cuda): right against torch.mm with tails in m, n and k on both layouts
of b and both 2-byte dtypes; the whole-k shapes run with no copy of a, the few-rows ones copy it;
a forced wgmma path runs an m-major a; the epilogue and cluster variants give the default's bits;
a CUDA graph replays the call.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import (
    assert_matmul_graph_replays,
    assert_within_matmul_bound,
    cuda_kernels_run,
    hopper,
    nvcc_sm90a,
    whole_k_instances,
    whole_k_line,
)

# (m, n, k): few-rows shapes (fewer 128 x 256 tiles than SMs: split-k or narrow, a copied) and
# whole-k ones (a read in place) with tails: m 8 or 104 rows past a tile (a consumer's 64-row
# chunk wholly or partly past m), n 8 past a tile, k 8 past a 64-k step.
FEW = [(300, 520, 264), (257, 129, 72)]
WHOLE = [(4096, 4096, 4096), (1544, 2824, 200), (1640, 2824, 72)]


def _mmajor_instances(folder: Path) -> Path:
    """The wgmma TU with wgmma_kernel instantiated for bfloat16 on each layout of a and b."""
    lines = [
        whole_k_line("wgmma_kernel", ("bf16", bk, am))
        for bk in ("true", "false")
        for am in ("true", "false")
    ]
    return whole_k_instances(folder, "mmajor_instances.cu", lines)


@pytest.mark.nvcc
def test_the_mmajor_kernels_transpose_a_and_compile_without_spills(tmp_path: Path) -> None:
    """Each wgmma of an entry carries transpose-A = AMMajor and transpose-B = !BKMajor."""
    source = _mmajor_instances(tmp_path)
    ptx = tmp_path / "mmajor.ptx"
    done = nvcc_sm90a(tmp_path, "--ptx", "-o", str(ptx), source=source)
    assert done.returncode == 0, done.stderr
    entries = re.split(r"\n(?:.visible )?.entry ", ptx.read_text())[1:]
    assert len(entries) == 4
    seen = set()
    for entry in entries:
        name = re.match(r"\w+wgmma_kernelI\w+?ELb([01])ELb([01])EE", entry)
        assert name is not None, entry[:200]
        bk, am = name.groups()
        flags = set(re.findall(r"wgmma\.mma_async[^;]*, p, 1, 1, ([01]), ([01]);", entry))
        assert flags == {(am, "1" if bk == "0" else "0")}, (bk, am, flags)
        seen.add((bk, am))
    assert len(seen) == 4
    cubin = tmp_path / "mmajor.cubin"
    done = nvcc_sm90a(tmp_path, "-cubin", "-Xptxas", "-v", "-o", str(cubin), source=source)
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == 4 and all(s == ("0", "0") for s in spills), done.stderr


# --- on a Hopper GPU ------------------------------------------------------------------------


def _up8(x: int) -> int:
    return (x + 7) // 8 * 8


def _operands(m: int, n: int, k: int, col: bool, dtype: Any = torch.bfloat16) -> tuple[Any, Any]:
    """a [m, k] column-major (x[:, :m].t() of x [k, m rounded up to 8]: 16-byte aligned columns
    whatever m) and b [k, n] row-major or column-major, its rows (columns) padded likewise."""
    gen = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k)

    def randn(rows: int, cols: int) -> torch.Tensor:
        x = torch.randn(rows, _up8(cols), device="cuda", dtype=dtype, generator=gen)
        return x[:, :cols]

    a = randn(k, m).t()
    b = randn(n, k).t() if col else randn(k, n)
    return a, b


def _within_tolerance(lib: Any, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    assert_within_matmul_bound(lib, got, a, b)
    torch.testing.assert_close(got.float(), torch.mm(a, b).float(), rtol=2e-2, atol=0.5)


def _skip_off_hopper() -> None:
    if not hopper():
        pytest.skip("the wgmma path runs on sm_90")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), FEW + WHOLE)
def test_an_mmajor_a_is_right(lib: Any, m: int, n: int, k: int, col: bool, dtype: Any) -> None:
    _skip_off_hopper()
    a, b = _operands(m, n, k, col, dtype)
    assert a.stride(0) == 1 and a.stride(1) % 8 == 0
    _within_tolerance(lib, lib.matmul(a, b), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
def test_only_the_few_rows_routes_copy_a(lib: Any, col: bool) -> None:
    """The whole-k shapes launch the wgmma kernel and no copy; the few-rows ones copy a first."""
    _skip_off_hopper()
    a, b = _operands(*WHOLE[1], col)
    ran = cuda_kernels_run(lambda: lib.matmul(a, b))  # past a wave: the 192 x 128 square tile
    assert re.search(r"wgmma_(square_)?kernel", ran) and not re.search(r"copy|elementwise", ran)
    a, b = _operands(*FEW[0], col)
    assert re.search(r"copy|elementwise", cuda_kernels_run(lambda: lib.matmul(a, b)))


@pytest.mark.cuda
@pytest.mark.parametrize("col", [False, True])
def test_a_forced_wgmma_path_runs_an_mmajor_a(lib: Any, col: bool) -> None:
    _skip_off_hopper()
    for m, n, k in WHOLE:
        a, b = _operands(m, n, k, col)
        _within_tolerance(lib, lib.matmul_path(a, b, 3), a, b)


@pytest.mark.cuda
def test_a_forced_wgmma_path_names_what_it_cannot_read(lib: Any) -> None:
    """Columns not 16-byte aligned (a stride of m + 2 elements, or a start 2 bytes in) and an
    m-major a on a few-rows shape: refused, naming the requirement; Path::automatic copies a and
    is right."""
    _skip_off_hopper()
    m, n, k = WHOLE[1]
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    odd_stride = torch.randn(k, m + 2, device="cuda", dtype=torch.bfloat16)[:, :m].t()
    odd_start = torch.randn(k, m + 8, device="cuda", dtype=torch.bfloat16)[:, 1 : m + 1].t()
    for a in (odd_stride, odd_start):
        with pytest.raises(RuntimeError, match=r"path 3 cannot run here: .*column-major with "
                           r"16-byte aligned columns"):  # fmt: skip
            lib.matmul_path(a, b, 3)
        _within_tolerance(lib, lib.matmul(a, b), a, b)
    a, b = _operands(*FEW[0], False)
    with pytest.raises(RuntimeError, match=r"path 3 cannot run here: .*only where it runs k whole"):
        lib.matmul_path(a, b, 3)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "variant",
    [{"WB_WGMMA_STORE": "direct"}, {"WB_WGMMA_STORE": "bulk"}, {"WB_WGMMA_CLUSTER": "2"}],
)
def test_the_variants_give_the_defaults_bits(
    lib: Any, monkeypatch: pytest.MonkeyPatch, variant: dict[str, str]
) -> None:
    """The other epilogues, and clusters of two sharing b (each block copying its own a, the
    lower tile of the last pair past m): the same sums, the same bits."""
    _skip_off_hopper()
    cases = [_operands(m, n, k, col) for m, n, k in WHOLE[1:] for col in (False, True)]
    default = [lib.matmul(a, b) for a, b in cases]
    for name, value in variant.items():
        monkeypatch.setenv(name, value)
    for (a, b), ours in zip(cases, default, strict=True):
        theirs = lib.matmul(a, b)
        assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16)), (a.shape, variant)


@pytest.mark.cuda
def test_a_bad_switch_still_names_itself(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A few-rows shape's route switch with a bad value: the copy decision reads it as no, and
    the call then fails naming it."""
    _skip_off_hopper()
    monkeypatch.setenv("WB_WGMMA_FEW", "fast")
    with pytest.raises(RuntimeError, match="WB_WGMMA_FEW"):
        lib.matmul(*_operands(*FEW[0], False))


@pytest.mark.cuda
def test_a_cuda_graph_replays_an_mmajor_a(lib: Any) -> None:
    _skip_off_hopper()
    assert_matmul_graph_replays(lib, *_operands(*WHOLE[1], False))
