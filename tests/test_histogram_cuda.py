"""histogram on CUDA, every kernel the launcher can take (WB_HISTOGRAM_KERNEL, _SLICE, _MERGE,
_CLUSTER, _HALF, _ZERO pick them at each call): exactly the reference everywhere, exactly
torch.histc where both bin exactly (dyadic values, a power-of-two range and bin count), graph
capture, concurrent streams; the read probes; and the kernels' registers and spills on every
target architecture (nvcc only).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bundled_cubin import compile_cubin
from workbench import cubin
from workbench.project import BUNDLED_KERNELS

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")
SOURCE = BUNDLED_KERNELS / "histogram" / "histogram.cu"
THREADS = 1024  # kThreads

# The environment of each kernel choice (the launcher reads it at every call): the kernels before
# the cluster path (a memset, then the kernel); the default (the shared path in one cooperative
# launch that clears counts itself, its loads of the next loop step in flight while counting, the
# chunked path beyond one block, or the wide kernel above 24 Ki bins on sm_90); the default after a
# memset; the chunked path with the half path off (the paths other than the wide kernel's with
# WB_HISTOGRAM_WIDE=0, which turns its default off); the cluster path with clusters
# of 8, and with 8 binning float elements one at a time (no count_deferred); the half path with
# clusters of 2 and 4; each loop step's loads counted once they land (plain); x streamed through
# shared memory by bulk copies (bulk); the chunked path binning float elements 16 at a time
# (slice_defer: count_deferred_slice); the blocks of a slice merged in clusters of 2 and 8 through
# distributed shared memory (above 16 Ki bins on sm_90); the wide kernel (float32: 16-bit counters
# of every bin in one block, taken back at 0x8000, bins by two directed-rounding fmas) alone and in
# clusters of 2, 4, 8, 16 with its loads in registers, and fed by a cp.async ring (wide1r, wide8r:
# its default loads).
ENV = (
    "WB_HISTOGRAM_KERNEL",
    "WB_HISTOGRAM_CLUSTER",
    "WB_HISTOGRAM_HALF",
    "WB_HISTOGRAM_ZERO",
    "WB_HISTOGRAM_SLICE",
    "WB_HISTOGRAM_MERGE",
    "WB_HISTOGRAM_WIDE",
    "WB_HISTOGRAM_WIDE_LOADS",
)
CHOICES = {
    "base": {"WB_HISTOGRAM_KERNEL": "base"},
    "default": {},
    "memset": {"WB_HISTOGRAM_ZERO": "memset", "WB_HISTOGRAM_WIDE": "0"},
    "chunked": {"WB_HISTOGRAM_HALF": "0", "WB_HISTOGRAM_WIDE": "0"},
    "cluster8": {"WB_HISTOGRAM_HALF": "0", "WB_HISTOGRAM_CLUSTER": "8", "WB_HISTOGRAM_WIDE": "0"},
    "cluster8_nodefer": {
        "WB_HISTOGRAM_HALF": "0",
        "WB_HISTOGRAM_KERNEL": "nodefer",
        "WB_HISTOGRAM_CLUSTER": "8",
    },
    "half2": {"WB_HISTOGRAM_HALF": "2", "WB_HISTOGRAM_WIDE": "0"},
    "half4": {"WB_HISTOGRAM_HALF": "4", "WB_HISTOGRAM_WIDE": "0"},
    "plain": {"WB_HISTOGRAM_KERNEL": "plain"},
    "bulk": {"WB_HISTOGRAM_KERNEL": "bulk"},
    "slice_defer": {"WB_HISTOGRAM_SLICE": "defer", "WB_HISTOGRAM_WIDE": "0"},
    "merge2": {"WB_HISTOGRAM_MERGE": "2", "WB_HISTOGRAM_WIDE": "0"},
    "merge8": {"WB_HISTOGRAM_MERGE": "8", "WB_HISTOGRAM_WIDE": "0"},
    "wide1": {"WB_HISTOGRAM_WIDE": "1", "WB_HISTOGRAM_WIDE_LOADS": "regs"},
    "wide2": {"WB_HISTOGRAM_WIDE": "2", "WB_HISTOGRAM_WIDE_LOADS": "regs"},
    "wide4": {"WB_HISTOGRAM_WIDE": "4", "WB_HISTOGRAM_WIDE_LOADS": "regs"},
    "wide8": {"WB_HISTOGRAM_WIDE": "8", "WB_HISTOGRAM_WIDE_LOADS": "regs"},
    "wide16": {"WB_HISTOGRAM_WIDE": "16", "WB_HISTOGRAM_WIDE_LOADS": "regs"},
    "wide1r": {"WB_HISTOGRAM_WIDE": "1", "WB_HISTOGRAM_WIDE_LOADS": "ring"},
    "wide8r": {"WB_HISTOGRAM_WIDE": "8", "WB_HISTOGRAM_WIDE_LOADS": "ring"},
}
# Bin counts across every path: replicated small histograms, one copy, the cluster and half paths
# (above 16 Ki bins on sm_90), the chunked path beyond one block (65537), and more bins than
# cluster 2 fits (200000: cluster 4 and 8 only, half 8 not at all, else the global path).
BINS = [1, 2, 7, 255, 256, 257, 4096, 16384, 16385, 20000, 65536, 65537, 100000, 200000]


@pytest.fixture(params=list(CHOICES))
def choice(request: pytest.FixtureRequest) -> Iterator[str]:
    saved = {k: os.environ.get(k) for k in ENV}
    for k in ENV:
        os.environ[k] = CHOICES[request.param].get(k, "")
    yield request.param
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _reference(lib: Any, x: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor:
    return lib.specs["histogram"].reference(x, bins, lo, hi)


def _assert_equal(got: torch.Tensor, want: torch.Tensor, label: str) -> None:
    assert got.dtype == torch.int64 and got.shape == want.shape, label
    if not torch.equal(got.cpu(), want.cpu()):
        i = int((got.cpu() != want.cpu()).nonzero()[0])
        raise AssertionError(f"{label}: bin {i}: got {int(got[i])}, expected {int(want[i])}")


def _dyadic(n: int, gen: torch.Generator) -> torch.Tensor:
    """Normal-looking values k / 1024 in [-5, 5]: every step of both binnings is exact."""
    k = (torch.randn(n, generator=gen) * 1024).round().clamp_(-5120, 5120)
    return (k / 1024).to(torch.float32).cuda()


@pytest.mark.cuda
@pytest.mark.parametrize("bins", BINS)
def test_every_path_equals_the_reference(lib: Any, choice: str, bins: int) -> None:
    gen = torch.Generator().manual_seed(bins)
    for n in (bins - 1, bins, 3 * bins + 5, 1 << 20):
        x = (torch.randn(max(n, 0), generator=gen) * 1.5).cuda()
        _assert_equal(
            lib.histogram(x, bins, -4.0, 4.0),
            _reference(lib, x, bins, -4.0, 4.0),
            f"{choice} n={n} bins={bins}",
        )


@pytest.mark.cuda
@pytest.mark.parametrize("bins", [256, 65536])
def test_the_timed_sizes_equal_torch_histc(lib: Any, choice: str, bins: int) -> None:
    x = _dyadic(1 << 24, torch.Generator().manual_seed(7))
    got = lib.histogram(x, bins, -4.0, 4.0)
    _assert_equal(got, torch.histc(x, bins, -4.0, 4.0).to(torch.int64), f"{choice} histc")
    _assert_equal(got, _reference(lib, x, bins, -4.0, 4.0), f"{choice} reference")


@pytest.mark.cuda
@pytest.mark.parametrize("bins", [256, 20000, 65536])
def test_edges_and_specials(lib: Any, choice: str, bins: int) -> None:
    """Every edge and its float neighbours, lo and hi, NaN, +-Inf, values outside, unaligned and
    non-contiguous views."""
    lo, hi = -3.0, 5.0
    edges = torch.tensor([lo + k * (hi - lo) / bins for k in range(bins + 1)], dtype=torch.float64)
    e = edges.to(torch.float32)
    values = torch.cat(
        [e.nextafter(torch.tensor(-math.inf)), e, e.nextafter(torch.tensor(math.inf))]
    )
    specials = torch.tensor([math.nan, math.inf, -math.inf, lo, hi, lo - 1, hi + 1, -0.0, 0.0])
    x = torch.cat([values, specials.repeat(1000)])
    x = x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(1))].cuda()
    for label, v in (
        ("all", x),
        ("unaligned", x[3:]),
        ("strided", x[::3]),
        ("2d", x[: x.numel() // 4 * 4].view(-1, 4).t()),
    ):
        _assert_equal(
            lib.histogram(v, bins, lo, hi),
            _reference(lib, v, bins, lo, hi),
            f"{choice} {label} bins={bins}",
        )


def _near_edges(bins: int, lo: float, hi: float, ulps: int) -> list[torch.Tensor]:
    """Every edge of the range as a float32, and the floats up to `ulps` either side of each."""
    edges = torch.tensor([lo + k * (hi - lo) / bins for k in range(bins + 1)], dtype=torch.float64)
    e = edges.to(torch.float32)
    parts, up, down = [e], e, e
    for _ in range(ulps):
        up, down = up.nextafter(torch.tensor(math.inf)), down.nextafter(torch.tensor(-math.inf))
        parts += [up, down]
    return parts


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("bins", "lo", "hi"),
    [
        (7, -3.0, 3.0),
        (1000, 0.1, 0.7),
        (256, 100.0, 108.0),
        (4096, -3.0, 3.0),
        (65536, -3.7, 4.1),
        # Far from zero against its width: the float offset's rounding is near a bin (the tight
        # bounds do not hold; 256 bins take bin_bounds's wide margin, most elements bin_of).
        (256, 300000.1, 300002.1),
    ],
)
def test_inexact_ranges_near_every_edge(
    lib: Any, choice: str, bins: int, lo: float, hi: float
) -> None:
    """Ranges whose scale, offset or edges are no floats (the tight bounds' slack for their
    roundings): float32 values up to 8 ulps either side of every edge, and random ones, 1 Mi
    elements so that every block counts some."""
    parts = _near_edges(bins, lo, hi, 8)
    u = torch.rand(1 << 20, generator=torch.Generator().manual_seed(bins), dtype=torch.float64)
    parts.append((lo + (u * 1.2 - 0.1) * (hi - lo)).to(torch.float32))
    x = torch.cat(parts)
    x = x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(2))].cuda()
    _assert_equal(
        lib.histogram(x, bins, lo, hi), _reference(lib, x, bins, lo, hi), f"{choice} bins={bins}"
    )


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("bins", "lo", "hi"),
    [(256, -4.0, 4.0), (1000, -3.7, 4.1), (4096, -3.0, 3.0), (256, 300.1, 302.1)],
)
def test_two_byte_floats_near_every_edge(
    lib: Any, choice: str, dtype: torch.dtype, bins: int, lo: float, hi: float
) -> None:
    """float16 and bfloat16 x: random values over and around the range, every edge in the dtype
    and its neighbours (many of a 2-byte dtype's values lie on an edge), specials, from an
    aligned and an unaligned start; the last range lies far from zero against its width."""
    edges = torch.tensor([lo + k * (hi - lo) / bins for k in range(bins + 1)], dtype=torch.float64)
    e = edges.to(dtype).to(torch.float32)
    up, down = e.nextafter(torch.tensor(math.inf)), e.nextafter(torch.tensor(-math.inf))
    u = torch.rand(1 << 20, generator=torch.Generator().manual_seed(bins), dtype=torch.float64)
    specials = torch.tensor([math.nan, math.inf, -math.inf, lo, hi, -0.0, 0.0]).repeat(100)
    x = torch.cat([e, up, down, (lo + (u * 1.2 - 0.1) * (hi - lo)), specials]).to(dtype)
    x = x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(4))].cuda()
    for label, v in (("aligned", x), ("unaligned", x[5:])):
        _assert_equal(
            lib.histogram(v, bins, lo, hi),
            _reference(lib, v, bins, lo, hi),
            f"{choice} {dtype} {label} bins={bins}",
        )


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("bins", "lo", "hi", "values"),
    [
        (256, -4.0, 4.0, "bf16"),  # bfloat16 values: most on an edge
        (4096, -4.0, 4.0, "bf16"),
        (1200, -600.0, 600.0, "int"),  # integers over an integer range: every one on an edge
        (3000, -600.0, 600.0, "int"),  # an edge every 0.4: integers on every other edge, or none
        (65536, -3.0, 5.0, "dyadic"),  # multiples of 1/1024 over a range of 8: every 8th edge
    ],
)
def test_values_on_edges_by_the_million(
    lib: Any, choice: str, dtype: torch.dtype, bins: int, lo: float, hi: float, values: str
) -> None:
    """Data whose values lie on bin edges (integers, bfloat16 values, multiples of 1/1024), a
    million of them, on every kernel choice: float32 x grouped (bounds, then bin_of near an edge)
    or element by element, bfloat16 x element by element (bin_bounds, then the division-free
    edge_bin where the bounds are neighbours)."""
    gen = torch.Generator().manual_seed(bins)
    u = torch.randn(1 << 20, generator=gen, dtype=torch.float64)
    if values == "int":
        v = (u * 300).round()
    elif values == "dyadic":
        v = (u * 1024).round() / 1024
    else:
        v = u.to(torch.bfloat16).to(torch.float64)
    x = v.to(dtype).cuda()
    _assert_equal(
        lib.histogram(x, bins, lo, hi),
        _reference(lib, x, bins, lo, hi),
        f"{choice} {dtype} {values} bins={bins}",
    )


@pytest.mark.cuda
@pytest.mark.parametrize("seed", range(6))
def test_random_ranges_near_every_edge(lib: Any, choice: str, seed: int) -> None:
    """Ranges drawn at random (lo over +-1000, widths 2^-8 to 2^12, 1 to 70000 bins): float32
    values on and up to 2 ulps either side of every edge, equal to the reference."""
    gen = torch.Generator().manual_seed(100 + seed)
    r = torch.rand(3, generator=gen, dtype=torch.float64)
    lo = float((r[0] * 2000 - 1000).item())
    hi = lo + float(2 ** (r[1] * 20 - 8).item())
    bins = 1 + int(r[2].item() * 70000)
    x = torch.cat(_near_edges(bins, lo, hi, 2))
    x = x[torch.randperm(x.numel(), generator=gen)].cuda()
    _assert_equal(
        lib.histogram(x, bins, lo, hi),
        _reference(lib, x, bins, lo, hi),
        f"{choice} bins={bins} lo={lo!r} hi={hi!r}",
    )


@pytest.mark.cuda
def test_empty_and_tiny(lib: Any, choice: str) -> None:
    for n in (0, 1, 3, 4, 5, 17):
        x = torch.linspace(-1, 1, n, device="cuda")
        for bins in (1, 65536):
            _assert_equal(
                lib.histogram(x, bins, -1.0, 1.0),
                _reference(lib, x, bins, -1.0, 1.0),
                f"{choice} n={n} bins={bins}",
            )


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int32])
def test_other_dtypes_on_the_cluster_path(lib: Any, choice: str, dtype: torch.dtype) -> None:
    x = (torch.randn(1 << 18, generator=torch.Generator().manual_seed(3)) * 3000).to(dtype).cuda()
    _assert_equal(
        lib.histogram(x, 65536, -9000.0, 9000.0),
        _reference(lib, x, 65536, -9000.0, 9000.0),
        f"{choice} {dtype}",
    )


@pytest.mark.cuda
@pytest.mark.parametrize("bins", [256, 65536])
def test_graph_capture_replays_on_new_data(lib: Any, choice: str, bins: int) -> None:
    x = torch.randn(1 << 20, device="cuda")
    lib.histogram(x, bins, -4.0, 4.0)  # warm up outside the capture (attributes, occupancy)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lib.histogram(x, bins, -4.0, 4.0)
    for seed in range(3):
        x.copy_(torch.randn(1 << 20, generator=torch.Generator().manual_seed(seed)).cuda() * 2)
        graph.replay()
        torch.cuda.synchronize()
        _assert_equal(out, _reference(lib, x, bins, -4.0, 4.0), f"{choice} replay {seed}")


@pytest.mark.cuda
@pytest.mark.parametrize("bins", [256, 65536, 200000])
def test_the_output_starts_from_dirty_memory(lib: Any, choice: str, bins: int) -> None:
    """The op allocates its output uncleared: the launcher (the kernel itself, or a memset) must
    clear every bin, here in memory that the caching allocator hands back full of ones."""
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(5)).cuda()
    want = _reference(lib, x, bins, -4.0, 4.0)
    for _ in range(3):
        dirty = torch.full((bins,), -1, dtype=torch.int64, device="cuda")
        del dirty  # its block goes back to the allocator, still full of -1
        _assert_equal(lib.histogram(x, bins, -4.0, 4.0), want, f"{choice} bins={bins}")


@pytest.mark.cuda
@pytest.mark.parametrize("bins", [256, 65536])
def test_one_hot_bin_holds_every_element(lib: Any, choice: str, bins: int) -> None:
    """16 Mi equal values: every block's counter of that bin takes the most a round allows (the
    half path's 16-bit counters), and the sum must still be exact."""
    n = 1 << 24
    for value in (0.5, 4.0, -4.0):
        x = torch.full((n,), value, device="cuda")
        want = _reference(lib, x[:1], bins, -4.0, 4.0) * n
        _assert_equal(lib.histogram(x, bins, -4.0, 4.0), want, f"{choice} {value} bins={bins}")


@pytest.mark.cuda
@pytest.mark.parametrize("bins", [256, 65536, 100000])
def test_neighbours_sharing_a_word_both_overflow(lib: Any, choice: str, bins: int) -> None:
    """16 Mi + 3 values in two neighbouring bins (the wide kernel's two 16-bit counters of one
    word, each taken back at 0x8000 many times a block), from an unaligned view; and the top edge
    (hi: the last bin) with its neighbour below."""
    n = (1 << 24) + 3
    width = 8.0 / bins
    for left in (bins // 2, bins - 2):
        a, b = -4.0 + (left + 0.5) * width, -4.0 + (left + 1.5) * width
        if left == bins - 2:
            b = 4.0
        pair = torch.tensor([a, b], dtype=torch.float32, device="cuda")
        x = pair.repeat(n // 2 + 2)[1 : n + 1]
        want = _reference(lib, x, bins, -4.0, 4.0)
        _assert_equal(lib.histogram(x, bins, -4.0, 4.0), want, f"{choice} {left} bins={bins}")


@pytest.mark.cuda
@pytest.mark.parametrize("name", [*ENV])
def test_a_bad_switch_value_is_an_error_naming_it(lib: Any, name: str) -> None:
    saved = os.environ.get(name)
    os.environ[name] = "nope"
    try:
        with pytest.raises(RuntimeError, match=f"{name}=nope is not a value it takes; expected"):
            lib.histogram(torch.randn(4096, device="cuda"), 256, -4.0, 4.0)
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


@pytest.mark.cuda
def test_concurrent_streams(lib: Any, choice: str) -> None:
    xs = [torch.randn(1 << 22, device="cuda") * (1 + i) for i in range(4)]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in xs]
    outs = []
    for i, (x, s) in enumerate(zip(xs, streams, strict=True)):
        with torch.cuda.stream(s):
            outs.append(lib.histogram(x, 256 if i % 2 else 65536, -4.0, 4.0))
    torch.cuda.synchronize()
    for i, (x, out) in enumerate(zip(xs, outs, strict=True)):
        _assert_equal(out, _reference(lib, x, 256 if i % 2 else 65536, -4.0, 4.0), f"stream {i}")


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("bins", "wide"),
    [(256, False), (24576, False), (24577, True), (65536, True), (100000, True), (200000, False)],
)
def test_the_default_takes_the_wide_kernel_above_24ki_bins(
    lib: Any, monkeypatch: pytest.MonkeyPatch, bins: int, wide: bool
) -> None:
    """Unset, float32 histograms of more than 24 Ki bins run histogram_wide_kernel on sm_90+
    (in clusters of 8, loads through the ring, or in registers where the ring does not fit beside
    100000 bins' counters), fewer bins the shared path, more than its counters fit (200000) the
    path before it; WB_HISTOGRAM_WIDE=0 turns it off and a named kernel runs as named. Exact
    counts each way."""
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    x = torch.randn(1 << 20, device="cuda")
    want = _reference(lib, x, bins, -4.0, 4.0)

    def kernels() -> str:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            _assert_equal(lib.histogram(x, bins, -4.0, 4.0), want, f"{bins} bins")
            torch.cuda.synchronize()
        return " ".join(e.name for e in prof.events())

    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert ("histogram_wide_kernel" in kernels()) == (wide and hopper)
    monkeypatch.setenv("WB_HISTOGRAM_WIDE", "0")
    assert "histogram_wide_kernel" not in kernels()
    monkeypatch.delenv("WB_HISTOGRAM_WIDE")
    monkeypatch.setenv("WB_HISTOGRAM_KERNEL", "plain")
    assert "histogram_wide_kernel" not in kernels()


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["read", "readsync", "readfull"])
def test_the_read_probes_clear_counts_and_count_nothing(lib: Any, kernel: str) -> None:
    """WB_HISTOGRAM_KERNEL=read / readsync / readfull time the load loop alone: float32 counts
    come out zero (from dirty memory), other dtypes still get their histogram."""
    saved = os.environ.get("WB_HISTOGRAM_KERNEL")
    os.environ["WB_HISTOGRAM_KERNEL"] = kernel
    try:
        x = torch.randn((1 << 20) + 3, generator=torch.Generator().manual_seed(9)).cuda()
        for bins in (256, 65536):
            dirty = torch.full((bins,), -1, dtype=torch.int64, device="cuda")
            del dirty
            got = lib.histogram(x[1:], bins, -4.0, 4.0)
            _assert_equal(got, torch.zeros_like(got), f"{kernel} bins={bins}")
        h = x.to(torch.float16)
        _assert_equal(
            lib.histogram(h, 256, -4.0, 4.0), _reference(lib, h, 256, -4.0, 4.0), f"{kernel} f16"
        )
    finally:
        if saved is None:
            os.environ.pop("WB_HISTOGRAM_KERNEL", None)
        else:
            os.environ["WB_HISTOGRAM_KERNEL"] = saved


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_fits_without_spills(tmp_path: Path, arch: str) -> None:
    """One 1024-thread block an SM (launch bound), no local memory, on every target."""
    kernels = compile_cubin(tmp_path, SOURCE, arch)
    names = [cubin.short_name(k.name) for k in kernels.values()]
    kinds = ("shared", "global", "cluster", "half", "read", "bulk", "wide")
    for kind in (f"histogram_{k}_kernel" for k in kinds):
        assert any(kind in n for n in names), f"{kind} missing on {arch}: {names}"
    for k in kernels.values():
        shown = f"{cubin.short_name(k.name)} [{arch}]: {k.registers} registers"
        assert k.spills == 0 and k.frame == 0, f"{shown}, {k.spills} bytes spilled"
        assert k.launch_bound == THREADS, shown
        assert k.registers <= 64, shown  # a whole 1024-thread block fits the register file
