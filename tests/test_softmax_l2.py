"""softmax's l2 path (WB_SOFTMAX_PATH=l2, kernels/softmax/softmax_l2.cuh): its plan and switches
(host code, run on the CPU), its kernels within their launch bounds without spills, and on a GPU
softmax and softmax_backward through it against torch at the long-row goal shapes, tails, special
values and every exponential mode, the same bits every call and in a CUDA graph's replays, and the
rows it leaves to the other paths."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import compile_cubin, host_program
from tests.test_softmax_paths import (
    assert_exp_mode_softmax,
    exp_mode_rows,
    kernels_run,
    special_rows,
)
from workbench.project import BUNDLED_KERNELS

_L2_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "softmax/softmax.h"
#include "softmax/softmax_rows.cuh"

// stdin, a request a line:
//   plan ROWS NVEC TENSORS RESIDENT KEEP_BYTES CAPACITY  ->  l2_plan: "grid span keep_from slots"
//   path VALUE                                           ->  parse_long_path ("-": empty)
//   keep VALUE                                           ->  l2_keep() with WB_SOFTMAX_L2_KEEP
//                                                            set to VALUE ("-": unset)
int main() {
  char what[16], value[64];
  while (std::scanf("%15s", what) == 1) {
    if (std::strcmp(what, "plan") == 0) {
      long long rows = 0, nvec = 0, resident = 0, keep = 0, capacity = 0;
      int tensors = 0;
      std::scanf("%lld %lld %d %lld %lld %lld", &rows, &nvec, &tensors, &resident, &keep,
                 &capacity);
      int64_t grid = 0;
      const wb::softmax::L2Plan p =
          wb::softmax::l2_plan(rows, nvec, tensors, resident, keep, capacity, &grid);
      std::printf("%lld %lld %lld %d\n", static_cast<long long>(grid),
                  static_cast<long long>(p.span), static_cast<long long>(p.keep_from), p.slots);
    } else if (std::strcmp(what, "keep") == 0) {
      std::scanf("%63s", value);
      if (std::strcmp(value, "-") == 0) {
        unsetenv("WB_SOFTMAX_L2_KEEP");
      } else {
        setenv("WB_SOFTMAX_L2_KEEP", value, 1);
      }
      std::printf("%d\n", wb::softmax::l2_keep());
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
def l2_main(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The l2 path's host logic in a host program built by nvcc (it calls no CUDA API)."""
    return host_program(tmp_path_factory.mktemp("softmax_l2"), _L2_MAIN)


def _ask(program: Path, lines: list[str]) -> list[list[int]]:
    run = subprocess.run(
        [program], input="".join(f"{line}\n" for line in lines), capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return [[int(v) for v in line.split()] for line in run.stdout.splitlines()]


_H100_RESIDENT = 264  # blocks of 512 threads, two an SM on 132 SMs
_KEEP = 50 * 2**20 * 75 // 100  # 75% of an H100's L2
_CAPACITY = 132 * 4 * 2 * 20 // 8  # float partials in the workspace on 132 SMs (softmax.cu)


@pytest.mark.nvcc
def test_the_l2_plan_spreads_the_vectors_evenly(l2_main: Path) -> None:
    """Spans of whole cache lines (8 vectors) as even as they allow over the resident blocks, a
    slot for each row a span touches, and phase 1's last keep bytes (over the tensors read)
    loaded to stay in L2: all of a span where the tensors read fit."""
    cases = [
        # (rows, vectors a row, tensors) -> (grid, span, keep_from, slots)
        ((64, 65536, 1), (264, 15888, 15888 - _KEEP // (264 * 16), 2)),  # float32 64 x 262144
        ((256, 8192, 1), (264, 7944, 0, 2)),  # bfloat16 256 x 65536: 32 MiB, all kept
        ((64, 32768, 1), (264, 7944, 0, 2)),  # bfloat16 64 x 262144
        ((64, 32768, 2), (264, 7944, 7944 - _KEEP // (264 * 32), 2)),  # its backward: 64 MiB
        ((3, 65537, 1), (262, 752, 0, 2)),  # 196611 vectors: the last span shorter
        ((1, 4097, 1), (257, 16, 0, 2)),  # fewer lines than blocks: a line or two a block
    ]
    lines = [f"plan {r} {n} {t} {_H100_RESIDENT} {_KEEP} {_CAPACITY}" for (r, n, t), _ in cases]
    got = _ask(l2_main, lines)
    assert [tuple(g) for g in got] == [want for _, want in cases]
    for ((rows, nvec, _), _), (grid, span, _, slots) in zip(cases, got, strict=True):
        total = rows * nvec
        assert span % 8 == 0 and grid <= _H100_RESIDENT
        assert (grid - 1) * span < total <= grid * span  # every block has vectors
        assert slots >= -(-span // nvec) + 1  # the rows a span touches


@pytest.mark.nvcc
def test_the_l2_plan_declines_what_it_cannot_hold(l2_main: Path) -> None:
    """span 0 (the launcher takes the default's path): more partials than the workspace holds,
    no resident block, or a row of 2^30 vectors."""
    lines = [
        f"plan 4096 4096 1 {_H100_RESIDENT} {_KEEP} {_CAPACITY}",  # 17 slots a block
        f"plan 64 65536 1 0 {_KEEP} {_CAPACITY}",
        f"plan 1 {1 << 30} 1 {_H100_RESIDENT} {_KEEP} {1 << 40}",
    ]
    assert [g[:2] for g in _ask(l2_main, lines)] == [[0, 0]] * 3


@pytest.mark.nvcc
def test_wb_softmax_path_l2_and_l2_keep_values(l2_main: Path) -> None:
    """WB_SOFTMAX_PATH=l2 is its own value (9, after the invalid one's 8, so the others keep their
    numbers); WB_SOFTMAX_L2_KEEP: unset 75, a percent 0 to 100 as given, else -1."""
    assert _ask(l2_main, ["path l2", "path L2", "path deep"]) == [[9], [8], [7]]
    keep = [("-", 75), ("0", 0), ("40", 40), ("100", 100), ("101", -1), ("-1", -1), ("5x", -1)]
    assert _ask(l2_main, [f"keep {v}" for v, _ in keep]) == [[want] for _, want in keep]


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("source", ["softmax.cu", "softmax_backward.cu"])
def test_the_l2_kernels_fit_their_launch_bounds(tmp_path: Path, arch: str, source: str) -> None:
    """Two blocks of 512 threads an SM: at most 64 registers a thread, no spills."""
    kernels = compile_cubin(tmp_path, BUNDLED_KERNELS / "softmax" / source, arch)
    l2 = [k for name, k in kernels.items() if "l2_kernel" in name]
    assert len(l2) == 3  # float32, float16, bfloat16
    for k in l2:
        assert k.registers <= 64 and k.frame == 0 and k.spill_stores == 0, k


# --- on a GPU ---------------------------------------------------------------------------------

_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _vec(cols: int, dtype: torch.dtype) -> bool:
    return cols % (16 // torch.empty((), dtype=dtype).element_size()) == 0


@pytest.fixture
def l2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WB_SOFTMAX_PATH", "l2")


@pytest.mark.cuda
@pytest.mark.usefixtures("l2")
@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize(
    ("rows", "cols"),
    [(64, 262144), (256, 65536), (3, 262147), (5, 131080), (600, 16388), (7, 65544)],
)
def test_the_l2_path_matches_torch(lib: Any, dtype: torch.dtype, rows: int, cols: int) -> None:
    """softmax and softmax_backward through the l2 path against torch, special rows included (an
    all -Inf row, a NaN, an +Inf, -Inf in part); rows of 16-byte vectors run l2_kernel, the others
    (a tail of single elements) the default's paths."""
    gen = torch.Generator("cuda").manual_seed(rows + cols)
    x = special_rows(torch.randn(rows, cols, device="cuda", generator=gen)).to(dtype)
    grad = torch.randn(rows, cols, device="cuda", generator=gen).to(dtype)
    lib.softmax(x, -1)  # the launch's one-time queries outside the profile
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert any("l2_kernel" in n for n in names) == _vec(cols, dtype), names
    low = dtype != torch.float32
    y = lib.softmax(x, -1)
    want_y = torch.softmax(x.float(), -1)
    tol = {"rtol": 1.6e-2 if low else 2e-5, "atol": 1e-9}
    torch.testing.assert_close(y.float(), want_y, equal_nan=True, **tol)
    masked = (x.float() == float("-inf")) & ~want_y.isnan()
    assert (y.float()[masked] == 0).all()
    y = want_y.nan_to_num(0.0).to(dtype)
    dx = lib.softmax_backward(grad, y, -1)
    want_dx = torch._softmax_backward_data(grad.float(), y.float(), -1, torch.float32)
    scale = float(want_dx.abs().max())
    tol = {"rtol": 1.6e-2, "atol": 1e-2 * scale} if low else {"rtol": 1e-4, "atol": 1e-6 * scale}
    torch.testing.assert_close(dx.float(), want_dx, **tol)


@pytest.mark.cuda
@pytest.mark.usefixtures("l2")
@pytest.mark.parametrize("mode", ["fma", "poly", "twice", ""])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "cols"), [(6, 65536), (5, 131080)])
def test_the_l2_path_in_every_exp_mode(
    lib: Any, monkeypatch: pytest.MonkeyPatch, mode: str, dtype: torch.dtype, rows: int, cols: int
) -> None:
    """WB_SOFTMAX_EXP (softmax_exp.cuh) on the l2 path: torch's softmax within the dtype's
    rounding, special rows, a max past the largest float / log2(e) and values near 60000."""
    monkeypatch.setenv("WB_SOFTMAX_EXP", mode)
    x = exp_mode_rows(rows, cols, dtype, seed=rows + cols)
    assert_exp_mode_softmax(x, lib.softmax(x, -1))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "cols"), [(64, 262144), (256, 65536)])
def test_the_l2_path_gives_the_same_bits_every_call(
    lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int, cols: int
) -> None:
    """The same bits every call, and whatever share of L2 phase 1 keeps (the hints move no
    value); within torch of the default path's result."""
    gen = torch.Generator("cuda").manual_seed(cols)
    x = torch.randn(rows, cols, device="cuda", generator=gen).to(dtype)
    grad = torch.randn(rows, cols, device="cuda", generator=gen).to(dtype)
    y0 = torch.softmax(x.float(), -1).to(dtype)
    default = lib.softmax(x, -1)
    monkeypatch.setenv("WB_SOFTMAX_PATH", "l2")
    y, dx = lib.softmax(x, -1), lib.softmax_backward(grad, y0, -1)
    for keep in ("", "0", "100", "", ""):
        monkeypatch.setenv("WB_SOFTMAX_L2_KEEP", keep)
        assert torch.equal(lib.softmax(x, -1), y)
        assert torch.equal(lib.softmax_backward(grad, y0, -1), dx)
    tol = {"rtol": 1.6e-2, "atol": 1e-9} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(y, default, **tol)


@pytest.mark.cuda
@pytest.mark.usefixtures("l2")
@pytest.mark.parametrize("cols", [65536, 262144])
def test_the_l2_path_replays_in_a_graph_and_runs_on_two_streams(lib: Any, cols: int) -> None:
    """No state outlives a launch (the partials are the op's workspace, written before they are
    read): a captured forward and backward replay on new inputs with the eager calls' bits, and
    two launches on two streams at once give what each gives alone."""
    gen = torch.Generator("cuda").manual_seed(cols)
    rows = (16 << 20) // cols
    x = torch.randn(rows, cols, device="cuda", generator=gen)
    grad = torch.randn(rows, cols, device="cuda", generator=gen)
    y = lib.softmax(x, -1)
    lib.softmax_backward(grad, y, -1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = lib.softmax(x, -1)
        dx_graph = lib.softmax_backward(grad, y_graph, -1)
    for replay in range(2):
        x.copy_(torch.randn(rows, cols, device="cuda", generator=gen) * (1 + replay))
        grad.copy_(torch.randn(rows, cols, device="cuda", generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_graph, lib.softmax(x, -1))
        assert torch.equal(dx_graph, lib.softmax_backward(grad, y_graph, -1))
        torch.testing.assert_close(y_graph, torch.softmax(x, -1))
    x2 = torch.randn(rows, cols, device="cuda", generator=gen) * 3
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


@pytest.mark.cuda
@pytest.mark.usefixtures("l2")
def test_the_l2_path_leaves_float64_and_short_rows_to_the_others(lib: Any) -> None:
    """float64 (summed in double) and rows a block holds do not take it, and still match torch."""
    for rows, cols, dtype in ((4, 65536, torch.float64), (64, 4096, torch.float32)):
        x = torch.randn(rows, cols, device="cuda", dtype=dtype)
        lib.softmax(x, -1)
        names = kernels_run(lambda x=x: lib.softmax(x, -1))
        assert not any("l2_kernel" in n for n in names), names
        torch.testing.assert_close(lib.softmax(x, -1), torch.softmax(x, -1))


@pytest.mark.cuda
@pytest.mark.usefixtures("l2")
def test_a_bad_l2_keep_is_named(lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WB_SOFTMAX_L2_KEEP", "most")
    with pytest.raises(RuntimeError, match="WB_SOFTMAX_L2_KEEP"):
        lib.softmax(torch.randn(64, 65536, device="cuda"), -1)
        torch.cuda.synchronize()
