"""matmul float32 on the SIMT path where c has fewer tiles than the GPU has SMs
(kernels/matmul/matmul_simt.cu): k cut into slices of whole 64-long chunks, one block a tile and
slice, each slice's sums in a float32 workspace the binding allocates (matmul_cuda_workspace), and
a second kernel adding the slices in slice order. Switches, read at each call: WB_SIMT_SPLITS=S
(S slices wherever; 1: k whole, the old behaviour), WB_SIMT_TILE=64 | 128 (the tile's rows).

Without a GPU: the kernels' compile (tests/test_matmul_float32.py, marked nvcc).
On a GPU (marked cuda): at the shapes that split (1000^3, 130 x 2053 x 136, 64 x 8192 x 64,
k tails) and one that does not (2048 x 520 x 1000: 128 tiles), matmul and the forced SIMT path
within the spec's float32 bound against the float64 truth; the split taken where the rule says
(its sum kernel runs) and not with WB_SIMT_SPLITS=1 or on a c of as many tiles as SMs; the same
bits every call, from a CUDA graph, and for every layout of a; forced slices and the 64-row tile
within the bound, the 64-row tile the same bits as the 128-row one under the same slices; a bad
switch value an error naming the switch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.bundled_cubin import assert_matmul_graph_replays, cuda_kernels_run
from workbench.verify import check_call

SWITCHES = ("WB_SIMT_SPLITS", "WB_SIMT_TILE")
# (m, k, n): c of 64 tiles (1000^3), of 4 and of 1 with long k, 128 tiles (no split on 132 SMs),
# and k past a chunk (64) or a step (16) by one, slices of unequal length.
SHAPES = [
    (1000, 1000, 1000),
    (130, 2053, 136),
    (64, 8192, 64),
    (2048, 520, 1000),
    (200, 1001, 72),
    (96, 4097, 80),
    (64, 257, 64),
    (33, 129, 17),
]


@pytest.fixture(autouse=True)
def _no_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)


def _pair(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(m * 7 + k * 3 + n)
    return torch.randn(m, k, generator=g).cuda(), torch.randn(k, n, generator=g).cuda()


def _within_bound(lib: Any, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    for name, op, args in (
        ("matmul", lib.matmul, (a, b)),
        ("matmul_path", lib.matmul_path, (a, b, 1)),
    ):
        verdict = check_call(op, lib.specs[name], args)
        assert verdict.passed, f"{what} {name}: {verdict.explained}"


def _sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@pytest.mark.cuda
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_on_a_gpu_split_shapes_are_within_the_bound(lib: Any, m: int, k: int, n: int) -> None:
    a, b = _pair(m, k, n)
    _within_bound(lib, a, b, f"{m}x{k}x{n}")
    assert torch.equal(lib.matmul(a, b), lib.matmul(a, b)), "not the same bits on a second call"


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("switches", "label"),
    [
        ({"WB_SIMT_SPLITS": "1"}, "k whole"),
        ({"WB_SIMT_SPLITS": "3"}, "3 slices"),
        ({"WB_SIMT_SPLITS": "1024"}, "a slice a chunk"),
        ({"WB_SIMT_TILE": "64"}, "64-row tile"),
        ({"WB_SIMT_TILE": "128"}, "128-row tile"),
    ],
)
def test_on_a_gpu_each_switch_is_within_the_bound(
    lib: Any, monkeypatch: pytest.MonkeyPatch, switches: dict[str, str], label: str
) -> None:
    for name, value in switches.items():
        monkeypatch.setenv(name, value)
    for m, k, n in ((1000, 1000, 1000), (130, 2053, 136), (300, 264, 520)):
        _within_bound(lib, *_pair(m, k, n), f"{label}, {m}x{k}x{n}")


@pytest.mark.cuda
def test_on_a_gpu_the_split_runs_where_the_rule_says(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1000^3 is 64 tiles of 128 x 128: split where the GPU has 128 SMs or more; 2048^3 (256
    tiles) is split only on a GPU of more SMs than that."""
    small, large = _pair(1000, 1000, 1000), _pair(2048, 2048, 2048)
    if _sms() >= 128:
        assert "simt_sum_slices_kernel" in cuda_kernels_run(lambda: lib.matmul(*small))
    if _sms() <= 256:
        assert "simt_sum_slices_kernel" not in cuda_kernels_run(lambda: lib.matmul(*large))
    monkeypatch.setenv("WB_SIMT_SPLITS", "1")
    assert "simt_sum_slices_kernel" not in cuda_kernels_run(lambda: lib.matmul(*small))
    monkeypatch.setenv("WB_SIMT_SPLITS", "2")
    assert "simt_sum_slices_kernel" in cuda_kernels_run(lambda: lib.matmul(*large))


@pytest.mark.cuda
@pytest.mark.parametrize("splits", ["1", "3"])
def test_on_a_gpu_the_64_row_tile_gives_the_128_row_tiles_bits(
    lib: Any, monkeypatch: pytest.MonkeyPatch, splits: str
) -> None:
    """A tile changes no element's order of sum: under the same slices, the same bits."""
    monkeypatch.setenv("WB_SIMT_SPLITS", splits)
    a, b = _pair(300, 1000, 260)
    monkeypatch.setenv("WB_SIMT_TILE", "128")
    wide = lib.matmul(a, b)
    monkeypatch.setenv("WB_SIMT_TILE", "64")
    assert torch.equal(lib.matmul(a, b), wide)


@pytest.mark.cuda
def test_on_a_gpu_every_layout_of_a_gives_the_split_bits(lib: Any) -> None:
    """Read 16 bytes at a time (row- or column-major) or element by element (misaligned, every
    other column): the same slices, so the same bits."""
    a, b = _pair(130, 2053, 136)
    first = lib.matmul(a, b)
    colmajor = a.t().contiguous().t()
    shifted = torch.empty(a.numel() + 1, device="cuda")[1:].view(a.shape).copy_(a)
    wide = torch.empty(a.shape[0], 2 * a.shape[1], device="cuda")[:, ::2].copy_(a)
    for name, x in (("column-major", colmajor), ("misaligned", shifted), ("every other", wide)):
        assert torch.equal(lib.matmul(x, b), first), name


@pytest.mark.cuda
def test_on_a_gpu_a_cuda_graph_replays_the_split(lib: Any) -> None:
    a, b = _pair(130, 2053, 136)
    assert_matmul_graph_replays(lib, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("name", "value"),
    [("WB_SIMT_SPLITS", "0"), ("WB_SIMT_SPLITS", "2x"), ("WB_SIMT_SPLITS", "1025"),
     ("WB_SIMT_TILE", "32")],
)  # fmt: skip
def test_on_a_gpu_a_bad_switch_is_named(
    lib: Any, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    a, b = _pair(64, 128, 64)
    with pytest.raises(RuntimeError, match=f"{name} must be"):
        lib.matmul(a, b)
