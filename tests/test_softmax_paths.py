"""softmax's long-row paths (kernels/softmax/softmax_rows.cuh): the wide path's plan and the
switches' values (host code, run on the CPU), and on a GPU every path (wide, split, cluster,
stream, chunks) against torch.softmax and its backward at long and odd row lengths, in a CUDA
graph and on two streams at once, and WB_SOFTMAX_EXP's ways of taking the 2-byte dtypes'
exponentials on the paths that use them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import cuda_kernel_names, host_program

_PATHS_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "softmax/softmax.h"
#include "softmax/softmax_rows.cuh"

// stdin, a request a line:
//   path VALUE                      ->  parse_long_path ("-" for an empty value)
//   wide NVEC K FORCED              ->  wide_cluster_size: "size threads"
//   env NAME VALUE                  ->  block_mode() once NAME is VALUE ("-": unset)
int main() {
  char what[16], value[64];
  while (std::scanf("%15s", what) == 1) {
    if (std::strcmp(what, "wide") == 0) {
      long long nvec = 0;
      int k = 0, forced = 0, threads = 0;
      std::scanf("%lld %d %d", &nvec, &k, &forced);
      const int size = wb::softmax::wide_cluster_size(nvec, k, forced, &threads);
      std::printf("%d %d\n", size, size == 0 ? 0 : threads);
    } else if (std::strcmp(what, "env") == 0) {
      char name[64];
      std::scanf("%63s %63s", name, value);
      if (std::strcmp(value, "-") == 0) {
        unsetenv(name);
      } else {
        setenv(name, value, 1);
      }
      std::printf("%d\n", wb::softmax::block_mode());
    } else {
      std::scanf("%63s", value);
      const char* s = std::strcmp(value, "-") == 0 ? "" : value;
      std::printf("%d\n", static_cast<int>(wb::softmax::parse_long_path(s)));
    }
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def paths_main(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The long-row paths' host logic in a host program built by nvcc (no CUDA API is called,
    so it runs without a GPU)."""
    return host_program(tmp_path_factory.mktemp("softmax_paths"), _PATHS_MAIN)


def _ask(program: Path, lines: list[str]) -> list[int]:
    run = subprocess.run(
        [program], input="".join(f"{line}\n" for line in lines), capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return [int(v) for v in run.stdout.split()]


@pytest.mark.nvcc
def test_wb_softmax_path_values(paths_main: Path) -> None:
    """Unset: the dtype's default (0); the five paths in order; else invalid, the removed bulk,
    pipe and deep paths' names included (a run that still sets one is told, not timed as another
    path)."""
    values = ("-", "split", "cluster", "stream", "wide", "chunks")
    invalid = ("x", "bulk", "pipe", "deep", "Wide")
    got = _ask(paths_main, [f"path {v}" for v in (*values, *invalid)])
    assert got == [*range(len(values)), *[len(values)] * len(invalid)]


@pytest.mark.nvcc
def test_wb_softmax_block_values(paths_main: Path) -> None:
    """WB_SOFTMAX_BLOCK (softmax_held.cuh): unset 3 (the default: held for a 2-byte forward),
    convert 0, held 1, held64 2, else -1."""
    block = [("-", 3), ("convert", 0), ("held", 1), ("held64", 2), ("held32", -1), ("HELD", -1)]
    got = _ask(paths_main, [f"env WB_SOFTMAX_BLOCK {v}" for v, _ in block])
    assert got == [want for _, want in block]


@pytest.mark.nvcc
def test_the_wide_path_takes_the_fewest_blocks_that_hold_a_row(paths_main: Path) -> None:
    """Blocks of 512 threads while 16 of them hold the row, else of 1024; WB_SOFTMAX_WIDE_THREADS
    forces one width (none where 16 such blocks do not hold the row)."""
    cases = [
        # (vectors a row, vectors a thread, forced width) -> (blocks, threads)
        ((8192, 8, 0), (2, 512)),  # bfloat16 forward 65536
        ((32768, 8, 0), (8, 512)),  # bfloat16 forward 262144
        ((32768, 4, 0), (16, 512)),  # bfloat16 backward 262144
        ((65536, 4, 0), (16, 1024)),  # float32 backward 262144
        ((65536, 2, 0), (0, 0)),  # 2 vectors a thread: 16 blocks of 1024 hold half the row
        ((8192, 8, 1024), (1, 1024)),  # forced: one block of 1024 a row
        ((65536, 4, 512), (0, 0)),  # forced 512 where 16 of them do not hold it
        ((2049, 8, 0), (1, 512)),  # 16392 bfloat16: one block, 257 threads with a vector
        ((4098, 4, 0), (3, 512)),
    ]
    lines = [f"wide {n} {k} {f}" for (n, k, f), _ in cases]
    got = _ask(paths_main, lines)
    assert [tuple(got[2 * i : 2 * i + 2]) for i in range(len(cases))] == [w for _, w in cases]


# --- on a GPU: each path against torch --------------------------------------------------------


def special_rows(x: torch.Tensor) -> torch.Tensor:
    """x with an all -Inf row, a row holding NaN, one holding +Inf and one with -Inf in part."""
    x = x.clone()
    rows = x.shape[0]
    x[0] = float("-inf")
    if rows > 3:
        x[1, 5] = float("nan")
        x[2, -1] = float("inf")
        x[3, : x.shape[1] // 2] = float("-inf")
    return x


kernels_run = cuda_kernel_names  # what one call ran on the GPU (test_softmax_* import it)


@pytest.mark.cuda
@pytest.mark.parametrize("path", ["wide", "split", "cluster", "stream", "chunks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "cols"), [(64, 262144), (3, 262147), (256, 65536), (5, 131080), (600, 16388)]
)
def test_every_path_matches_torch(
    lib: Any, monkeypatch: pytest.MonkeyPatch, path: str, dtype: torch.dtype, rows: int, cols: int
) -> None:
    """softmax and softmax_backward through the path WB_SOFTMAX_PATH names, against torch (special
    rows included); rows of 16-byte vectors run the path's own kernel."""
    monkeypatch.setenv("WB_SOFTMAX_PATH", path)
    gen = torch.Generator().manual_seed(rows + cols)
    x = special_rows(torch.randn(rows, cols, generator=gen)).to(dtype).cuda()
    grad = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    lib.softmax(x, -1)  # the launch's one-time queries outside the profile
    names = kernels_run(lambda: lib.softmax(x, -1))
    vec = cols % (16 // x.element_size()) == 0
    want = {"split": "split_kernel", "stream": "stream_kernel", "chunks": "chunk_write_kernel"}
    if vec:
        want["wide"] = "wide_kernel"
    if path in want and torch.cuda.get_device_capability() >= (9, 0):
        assert any(want[path] in n for n in names), names
    # Tolerances against float32 references at rows of tiny values (about 1 / cols): relative,
    # with an absolute floor far below them.
    bf16 = dtype == torch.bfloat16
    y = lib.softmax(x, -1)
    want_y = torch.softmax(x.float(), -1)
    tol = {"rtol": 1.6e-2 if bf16 else 2e-5, "atol": 1e-9}
    torch.testing.assert_close(y.float(), want_y, equal_nan=True, **tol)
    y = want_y.nan_to_num(0.0).to(dtype)
    dx = lib.softmax_backward(grad, y, -1)
    want_dx = torch._softmax_backward_data(grad.float(), y.float(), -1, torch.float32)
    scale = float(want_dx.abs().max())
    tol = {"rtol": 1.6e-2, "atol": 1e-2 * scale} if bf16 else {"rtol": 1e-4, "atol": 1e-6 * scale}
    torch.testing.assert_close(dx.float(), want_dx, **tol)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("dtype", "cols"),
    [(torch.float32, 1 << 22), (torch.float32, (1 << 22) + 3), (torch.float64, 3 << 20)],
)
def test_few_rows_longer_than_any_path_holds_take_the_chunks_path(
    lib: Any, dtype: torch.dtype, cols: int
) -> None:
    """Rows longer than every path that reads a row once holds (the split path's registers: about
    2M float32 elements on an H100) take the chunks path by default, a block a chunk of every row
    in two launches, where the stream path ran one block a row; forward and backward against
    torch in float64, special rows included, and the same bits twice."""
    gen = torch.Generator().manual_seed(cols)
    x = special_rows(torch.randn(4, cols, generator=gen, dtype=dtype)).cuda()
    grad = torch.randn(4, cols, generator=gen, dtype=dtype).cuda()
    lib.softmax(x, -1)  # the launch's one-time queries outside the profile
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert any("chunk_partial_kernel" in n for n in names), names
    assert not any("stream_kernel" in n for n in names), names
    y = lib.softmax(x, -1)
    assert torch.equal(y.nan_to_num(7.0), lib.softmax(x, -1).nan_to_num(7.0))
    tol = {"rtol": 2e-5, "atol": 1e-12} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 0}
    want_y = torch.softmax(x.double(), -1)
    torch.testing.assert_close(y.double(), want_y, equal_nan=True, **tol)
    y = want_y.nan_to_num(0.0).to(dtype)
    names = kernels_run(lambda: lib.softmax_backward(grad, y, -1))
    assert any("chunk_write_kernel" in n for n in names), names
    want_dx = torch._softmax_backward_data(grad.double(), y.double(), -1, torch.float64)
    scale = float(want_dx.abs().max())
    got_dx = lib.softmax_backward(grad, y, -1).double()
    torch.testing.assert_close(got_dx, want_dx, rtol=1e-4, atol=1e-6 * scale)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["fast", "deep"])
def test_a_bad_path_name_is_named(lib: Any, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("WB_SOFTMAX_PATH", name)
    with pytest.raises(RuntimeError, match="WB_SOFTMAX_PATH"):
        lib.softmax(torch.randn(2, 65536, device="cuda"), -1)
        torch.cuda.synchronize()


@pytest.mark.cuda
def test_a_bad_wide_block_width_is_named(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wide path needs sm_90")
    monkeypatch.setenv("WB_SOFTMAX_PATH", "wide")
    monkeypatch.setenv("WB_SOFTMAX_WIDE_THREADS", "256")
    with pytest.raises(RuntimeError, match="WB_SOFTMAX_WIDE_THREADS"):
        lib.softmax(torch.randn(2, 65536, device="cuda"), -1)
        torch.cuda.synchronize()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "cols"), [(3, 65536), (70, 49160), (2, 16392)])
@pytest.mark.parametrize("width", ["512", "1024"])
def test_the_wide_path_at_either_block_width(
    lib: Any,
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
    rows: int,
    cols: int,
    width: str,
) -> None:
    """WB_SOFTMAX_WIDE_THREADS picks blocks of 512 or 1024 threads (clusters of half as many
    blocks, or one block a row); either matches torch (special rows included), also where the
    blocks of a row are only partly filled (16392 elements: 2049 or 4098 vectors)."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wide path needs sm_90")
    monkeypatch.setenv("WB_SOFTMAX_PATH", "wide")
    monkeypatch.setenv("WB_SOFTMAX_WIDE_THREADS", width)
    gen = torch.Generator().manual_seed(rows * cols)
    x = special_rows(torch.randn(rows, cols, generator=gen)).to(dtype).cuda()
    grad = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    y = torch.softmax(x.float(), -1).nan_to_num(0.0).to(dtype)
    lib.softmax(x, -1)  # the launch's one-time queries outside the profile
    names = kernels_run(lambda: (lib.softmax(x, -1), lib.softmax_backward(grad, y, -1)))
    assert sum("wide_kernel" in n for n in names) == 2, names
    bf16 = dtype == torch.bfloat16
    tol = {"rtol": 1.6e-2 if bf16 else 2e-5, "atol": 1e-9}
    got = lib.softmax(x, -1).float()
    torch.testing.assert_close(got, torch.softmax(x.float(), -1), equal_nan=True, **tol)
    want_dx = torch._softmax_backward_data(grad.float(), y.float(), -1, torch.float32)
    scale = float(want_dx.abs().max())
    tol = {"rtol": 1.6e-2, "atol": 1e-2 * scale} if bf16 else {"rtol": 1e-4, "atol": 1e-6 * scale}
    torch.testing.assert_close(lib.softmax_backward(grad, y, -1).float(), want_dx, **tol)


@pytest.mark.cuda
@pytest.mark.parametrize("path", ["wide", "chunks"])
@pytest.mark.parametrize("cols", [65536, 262144])
def test_the_long_paths_replay_in_a_graph_and_run_on_two_streams(
    lib: Any, monkeypatch: pytest.MonkeyPatch, path: str, cols: int
) -> None:
    """No state outlives a launch: a captured forward and backward replay on new inputs, and two
    launches on two streams at once give what each gives alone."""
    monkeypatch.setenv("WB_SOFTMAX_PATH", path)
    gen = torch.Generator().manual_seed(cols)
    rows = (8 << 20) // cols
    x = torch.randn(rows, cols, generator=gen).cuda()
    grad = torch.randn(rows, cols, generator=gen).cuda()
    y = lib.softmax(x, -1)
    lib.softmax_backward(grad, y, -1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = lib.softmax(x, -1)
        dx_graph = lib.softmax_backward(grad, y_graph, -1)
    for replay in range(2):
        x.copy_(torch.randn(rows, cols, generator=gen) * (1 + replay))
        grad.copy_(torch.randn(rows, cols, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y_graph, torch.softmax(x, -1))
        want = torch._softmax_backward_data(grad, y_graph, -1, x.dtype)
        torch.testing.assert_close(dx_graph, want)
    x2 = torch.randn(rows, cols, generator=gen).cuda() * 3
    alone = (lib.softmax(x, -1), lib.softmax(x2, -1))
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    outs = []
    torch.cuda.synchronize()
    for s, inp in zip(streams, (x, x2), strict=True):
        with torch.cuda.stream(s):
            outs.append([lib.softmax(inp, -1) for _ in range(4)])
    torch.cuda.synchronize()
    for got, want in zip(outs, alone, strict=True):
        for g in got:
            assert torch.equal(g, want)


def exp_mode_rows(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A 2-byte x on the GPU for the exponential modes: special_rows, a row of values near 60000
    in row 3's second half (where rounding m * log2(e) would cost float16's output 8 ulps) and,
    in bfloat16, +-3e38 in row 4 (a max past the largest float / log2(e))."""
    gen = torch.Generator().manual_seed(seed)
    x = special_rows(torch.randn(rows, cols, generator=gen) * 4)
    x[3, cols // 2 :] = 60000 + 16 * torch.randn(cols - cols // 2, generator=gen).clamp(-4, 4)
    if dtype == torch.bfloat16:
        x[4, 7] = 3e38
        x[4, 9] = -3e38
    return x.to(dtype).cuda()


def assert_exp_mode_softmax(x: torch.Tensor, got: torch.Tensor) -> None:
    """got, softmax(x) of a 2-byte x, within torch's softmax by half an ulp of the output's
    rounding and the exponent's error (softmax_exp.cuh) besides (float16's subnormals, below
    6.1e-5, are 6e-8 apart); -Inf elements give 0 exactly."""
    want = torch.softmax(x.float(), -1)
    bf16 = x.dtype == torch.bfloat16
    tol = {"rtol": 1.6e-2, "atol": 1e-9} if bf16 else {"rtol": 2e-3, "atol": 6e-8}
    torch.testing.assert_close(got.float(), want, equal_nan=True, **tol)
    masked = (x.float() == float("-inf")) & ~want.isnan()
    assert (got.float()[masked] == 0).all()


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["keep", "fma", "poly", "twice", ""])
@pytest.mark.parametrize("path", ["wide", "split"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "cols"), [(6, 65536), (5, 131080)])
def test_the_exp_modes_match_torch(
    lib: Any,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    path: str,
    dtype: torch.dtype,
    rows: int,
    cols: int,
) -> None:
    """WB_SOFTMAX_EXP=keep (the default, ""), fma, poly or twice (kernels/softmax/softmax_exp.cuh)
    on each path that takes a 2-byte row's exponentials from its values as loaded: torch's softmax
    within the dtype's rounding, special rows included, a row whose max is past the largest float
    / log2(e) and one of values near 60000 (where rounding m * log2(e) would cost float16's output
    8 ulps: both take twice's formula); the backward does not use it."""
    monkeypatch.setenv("WB_SOFTMAX_PATH", path)
    monkeypatch.setenv("WB_SOFTMAX_EXP", mode)
    x = exp_mode_rows(rows, cols, dtype, seed=rows + cols)
    assert_exp_mode_softmax(x, lib.softmax(x, -1))


@pytest.mark.cuda
def test_a_bad_exp_mode_is_named(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WB_SOFTMAX_EXP", "fast")
    with pytest.raises(RuntimeError, match="WB_SOFTMAX_EXP"):
        lib.softmax(torch.randn(2, 65536, device="cuda", dtype=torch.bfloat16), -1)
        torch.cuda.synchronize()
