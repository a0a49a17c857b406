"""softmax's tma path (kernels/softmax/softmax_tma.cuh, WB_SOFTMAX_PATH=tma): its plan and its
switches (host code, run on the CPU), and on a GPU softmax and softmax_backward through it
against torch at the few-long-rows shapes and odd lengths in three dtypes, special rows, the same
bits every call, a CUDA graph's replay, forced plans, and the rows it leaves to other paths."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import host_program
from tests.test_softmax_paths import kernels_run, special_rows

_TMA_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "softmax/softmax.h"
#include "softmax/softmax_rows.cuh"

// stdin, a request a line:
//   plan ROWS NVEC TENSORS FORCE_C FORCE_B CAP R1..R16  ->  tma_plan: "size buffers clusters",
//        where clusters of c blocks of at most CAP bytes of shared memory are R<c> resident
//   env NAME VALUE  ->  tma_forced() once NAME is VALUE ("-": unset)
int main() {
  char what[16];
  while (std::scanf("%15s", what) == 1) {
    if (std::strcmp(what, "plan") == 0) {
      long long rows = 0, nvec = 0, cap = 0;
      int tensors = 0, fc = 0, fb = 0, res[wb::softmax::kMaxCluster + 1] = {};
      std::scanf("%lld %lld %d %d %d %lld", &rows, &nvec, &tensors, &fc, &fb, &cap);
      for (int c = 1; c <= wb::softmax::kMaxCluster; ++c) std::scanf("%d", &res[c]);
      int buffers = 0;
      int64_t clusters = 0;
      const int size = wb::softmax::tma_plan(
          rows, nvec, tensors, fc, fb, wb::softmax::kTmaMaxSmem - wb::softmax::kTmaStaticSmem,
          [&](int c, int64_t smem) { return smem <= cap ? res[c] : 0; }, &buffers, &clusters);
      std::printf("%d %d %lld\n", size, size == 0 ? 0 : buffers,
                  size == 0 ? 0LL : static_cast<long long>(clusters));
    } else {
      char name[64], value[64];
      std::scanf("%63s %63s", name, value);
      if (std::strcmp(value, "-") == 0) {
        unsetenv(name);
      } else {
        setenv(name, value, 1);
      }
      std::printf("%d\n", wb::softmax::tma_forced());
    }
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def tma_main(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tma path's host logic in a host program built by nvcc (no CUDA API is called)."""
    return host_program(tmp_path_factory.mktemp("softmax_tma"), _TMA_MAIN)


def _ask(program: Path, lines: list[str]) -> list[int]:
    run = subprocess.run(
        [program], input="".join(f"{line}\n" for line in lines), capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return [int(v) for v in run.stdout.split()]


_LIMIT = 227 * 1024 - 1024  # kTmaMaxSmem - kTmaStaticSmem
# Resident clusters of c = 1..16 blocks, one an SM, 132 SMs (the GPCs ignored).
_ONE = tuple(132 // c for c in range(1, 17))


@pytest.mark.nvcc
def test_the_tma_plan_ends_soonest_with_two_buffers_where_they_fit(tma_main: Path) -> None:
    """Of the cluster sizes whose blocks hold two slices (else one), the fewest rounds of rows
    times the slice each moves, the smallest size of equals; the grid spreads the rows evenly;
    none where no resident cluster holds a slice or the forced plan does not fit."""
    none = (0,) * 16
    cases = [
        # (rows, vectors a row, tensors, forced size, forced buffers, cap, resident)
        #   -> (size, buffers, grid)
        ((64, 65536, 1, 0, 0, _LIMIT, _ONE), (16, 2, 8)),  # float32 262144: 8 rounds of 64 KiB
        ((64, 32768, 1, 0, 0, _LIMIT, _ONE), (8, 2, 16)),  # bfloat16 262144: 4 rounds, 6 ties
        ((256, 8192, 1, 0, 0, _LIMIT, _ONE), (2, 2, 64)),  # bfloat16 65536: 4 rounds of 64 KiB
        ((64, 65536, 2, 0, 0, _LIMIT, _ONE), (16, 1, 8)),  # float32 backward: two do not fit
        ((64, 65536, 1, 8, 0, _LIMIT, _ONE), (8, 1, 16)),  # forced 8: one 128 KiB slice
        ((64, 65536, 1, 4, 2, _LIMIT, _ONE), (0, 0, 0)),  # forced 4 with two buffers: 512 KiB
        ((3, 65536, 1, 0, 0, _LIMIT, _ONE), (16, 2, 3)),  # one round: the smallest slice
        ((64, 65536, 1, 0, 0, 100 * 1024, _ONE), (16, 1, 8)),  # two 64 KiB slices not resident
        ((2, 1 << 20, 1, 0, 0, _LIMIT, _ONE), (0, 0, 0)),  # 4M float32: no cluster holds it
        ((64, 65536, 1, 0, 0, _LIMIT, none), (0, 0, 0)),  # nothing resident
    ]
    lines = [
        f"plan {r} {n} {t} {fc} {fb} {cap} {' '.join(map(str, res))}"
        for (r, n, t, fc, fb, cap, res), _ in cases
    ]
    got = _ask(tma_main, lines)
    triples = [tuple(got[3 * i : 3 * i + 3]) for i in range(len(cases))]
    assert triples == [w for _, w in cases]
    for ((rows, nvec, tensors, _, _, _, res), _), (size, buffers, grid) in zip(
        cases, triples, strict=True
    ):
        if size:
            per = -(-nvec // size)
            assert per * 16 * tensors * buffers <= _LIMIT
            rounds = -(-rows // min(rows, res[size - 1]))
            assert grid <= res[size - 1] and -(-rows // grid) == rounds


@pytest.mark.nvcc
def test_wb_softmax_tma_switches(tma_main: Path) -> None:
    """tma_forced(): 4 * cluster + buffers (0 each where unset), -1 for a bad value of either."""
    lines = [
        "env WB_SOFTMAX_TMA_CLUSTER -",
        "env WB_SOFTMAX_TMA_BUFFERS -",
        "env WB_SOFTMAX_TMA_CLUSTER 8",
        "env WB_SOFTMAX_TMA_BUFFERS 1",
        "env WB_SOFTMAX_TMA_CLUSTER 16",
        "env WB_SOFTMAX_TMA_BUFFERS 3",
        "env WB_SOFTMAX_TMA_BUFFERS 2",
        "env WB_SOFTMAX_TMA_CLUSTER 17",
        "env WB_SOFTMAX_TMA_CLUSTER 0",
        "env WB_SOFTMAX_TMA_CLUSTER 8x",
        "env WB_SOFTMAX_TMA_CLUSTER -",
    ]
    assert _ask(tma_main, lines) == [0, 0, 32, 33, 65, -1, 66, -1, -1, -1, 2]


# --- on a GPU ---------------------------------------------------------------------------------


def _sm90() -> bool:
    return torch.cuda.get_device_capability() >= (9, 0)


def _check(lib: Any, x: torch.Tensor, grad: torch.Tensor) -> None:
    """softmax(x) and its backward at grad against torch (float32 references)."""
    low = x.dtype != torch.float32
    y = lib.softmax(x, -1)
    want_y = torch.softmax(x.float(), -1)
    rtol = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}.get(x.dtype, 2e-5)
    atol = 6e-8 if x.dtype == torch.float16 else 1e-9
    torch.testing.assert_close(y.float(), want_y, equal_nan=True, rtol=rtol, atol=atol)
    y = want_y.nan_to_num(0.0).to(x.dtype)
    dx = lib.softmax_backward(grad, y, -1)
    want_dx = torch._softmax_backward_data(grad.float(), y.float(), -1, torch.float32)
    scale = float(want_dx.abs().max())
    tol = {"rtol": 1.6e-2, "atol": 1e-2 * scale} if low else {"rtol": 1e-4, "atol": 1e-6 * scale}
    torch.testing.assert_close(dx.float(), want_dx, **tol)


def _inputs(rows: int, cols: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(rows + cols)
    x = torch.randn(rows, cols, generator=gen, device="cuda")
    grad = torch.randn(rows, cols, generator=gen, device="cuda")
    return special_rows(x).to(dtype), grad.to(dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "cols"), [(64, 262144), (256, 65536), (8, 262144), (5, 131080)])
def test_the_tma_path_matches_torch(
    lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int, cols: int
) -> None:
    """Forward and backward through the tma path (its own kernel on sm_90) against torch,
    special rows included (an all -Inf row, NaN, +Inf, -Inf in part)."""
    monkeypatch.setenv("WB_SOFTMAX_PATH", "tma")
    x, grad = _inputs(rows, cols, dtype)
    y = torch.softmax(x.float(), -1).nan_to_num(0.0).to(dtype)
    lib.softmax(x, -1)  # the launch's one-time queries outside the profile
    lib.softmax_backward(grad, y, -1)
    names = kernels_run(lambda: (lib.softmax(x, -1), lib.softmax_backward(grad, y, -1)))
    if _sm90():
        assert sum("tma_kernel" in n for n in names) == 2, names
    _check(lib, x, grad)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("cluster", "buffers"), [("16", "2"), ("16", "1"), ("8", "1"), ("12", ""), ("", "1")]
)
def test_forced_tma_plans_match_torch(
    lib: Any, monkeypatch: pytest.MonkeyPatch, cluster: str, buffers: str
) -> None:
    """WB_SOFTMAX_TMA_CLUSTER / _BUFFERS: each plan that fits gives torch's result (a size whose
    slice does not divide the row evenly included: 12)."""
    monkeypatch.setenv("WB_SOFTMAX_PATH", "tma")
    monkeypatch.setenv("WB_SOFTMAX_TMA_CLUSTER", cluster)
    monkeypatch.setenv("WB_SOFTMAX_TMA_BUFFERS", buffers)
    for dtype in (torch.float32, torch.bfloat16):
        x, grad = _inputs(64, 262144, dtype)
        _check(lib, x, grad)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("rows", "cols", "dtype"),
    [
        (3, 262147, torch.float32),  # not 16-byte vectors: the split path's rows
        (4, 131075, torch.bfloat16),
        (2, 1 << 22, torch.float32),  # 16 MiB a row: no cluster holds a slice of it
        (7, 8200, torch.float16),  # short rows: the block paths, not long-row paths
    ],
)
def test_rows_the_tma_path_refuses_go_to_another_path(
    lib: Any, monkeypatch: pytest.MonkeyPatch, rows: int, cols: int, dtype: torch.dtype
) -> None:
    monkeypatch.setenv("WB_SOFTMAX_PATH", "tma")
    x, grad = _inputs(rows, cols, dtype)
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert not any("tma_kernel" in n for n in names), names
    _check(lib, x, grad)


@pytest.mark.cuda
def test_a_forced_plan_that_does_not_fit_goes_to_another_path(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WB_SOFTMAX_PATH", "tma")
    monkeypatch.setenv("WB_SOFTMAX_TMA_CLUSTER", "2")  # 512 KiB slices of float32 262144
    x, grad = _inputs(64, 262144, torch.float32)
    names = kernels_run(lambda: lib.softmax(x, -1))
    assert not any("tma_kernel" in n for n in names), names
    _check(lib, x, grad)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["WB_SOFTMAX_TMA_CLUSTER", "WB_SOFTMAX_TMA_BUFFERS"])
def test_a_bad_tma_switch_is_named(lib: Any, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    if not _sm90():
        pytest.skip("the tma path needs sm_90")
    monkeypatch.setenv("WB_SOFTMAX_PATH", "tma")
    monkeypatch.setenv(name, "32")
    with pytest.raises(RuntimeError, match=name):
        lib.softmax(torch.randn(64, 65536, device="cuda"), -1)
        torch.cuda.synchronize()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int32 if a.element_size() == 4 else torch.int16
    return a.shape == b.shape and torch.equal(a.view(view), b.view(view))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tma_path_gives_the_same_bits_every_call(
    lib: Any, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    monkeypatch.setenv("WB_SOFTMAX_PATH", "tma")
    x, grad = _inputs(64, 262144, dtype)
    y = lib.softmax(x, -1)
    dx = lib.softmax_backward(grad, y.nan_to_num(0.0), -1)
    for _ in range(3):
        assert _same_bits(lib.softmax(x, -1), y)
        assert _same_bits(lib.softmax_backward(grad, y.nan_to_num(0.0), -1), dx)


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [65536, 262144])
def test_the_tma_path_replays_in_a_graph(
    lib: Any, monkeypatch: pytest.MonkeyPatch, cols: int
) -> None:
    """A captured forward and backward replay on new inputs as eager calls give them."""
    monkeypatch.setenv("WB_SOFTMAX_PATH", "tma")
    gen = torch.Generator(device="cuda").manual_seed(cols)
    rows = (16 << 20) // cols
    x = torch.randn(rows, cols, generator=gen, device="cuda")
    grad = torch.randn(rows, cols, generator=gen, device="cuda")
    y = lib.softmax(x, -1)
    lib.softmax_backward(grad, y, -1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = lib.softmax(x, -1)
        dx_graph = lib.softmax_backward(grad, y_graph, -1)
    for replay in range(2):
        x.copy_(torch.randn(rows, cols, generator=gen, device="cuda") * (1 + replay))
        grad.copy_(torch.randn(rows, cols, generator=gen, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert _same_bits(y_graph, lib.softmax(x, -1))
        assert _same_bits(dx_graph, lib.softmax_backward(grad, y_graph, -1))
        torch.testing.assert_close(y_graph, torch.softmax(x, -1))
