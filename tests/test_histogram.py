"""histogram(x, bins, lo, hi): bit for bit against the reference (and the reference against plain
Python floats), the op contract, errors, and an impostor that drops the right edge of the last bin.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench
from tests.conftest import DEVICES
from tests.op_contract import assert_contract, assert_matches_reference, assert_opcheck
from workbench import knobs
from workbench.verify import specials

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def _spec(lib: Any) -> Any:
    return lib.specs["histogram"]


def _samples(lib: Any, dtype: torch.dtype, device: str, seed: int) -> list[Any]:
    """The spec's samples and, for a floating dtype, the check's special-values sample."""
    found = _spec(lib).samples(dtype, torch.device(device), torch.Generator().manual_seed(seed))
    special = specials.special_sample(_spec(lib), dtype, found, torch.Generator().manual_seed(seed))
    return [*found, special] if special is not None else found


def _first_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    i = int((got != want).nonzero()[0])
    return f"bin {i}: got {int(got[i])}, expected {int(want[i])}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_equals_the_reference_bit_for_bit(lib: Any, device: str, dtype: torch.dtype) -> None:
    """Every sample (edges, outside, bins=1, many bins, large, specials), two seeds."""
    for seed in (0, 1):
        for s in _samples(lib, dtype, device, seed):
            got = lib.histogram(*s.args)
            want = _spec(lib).reference(*s.args)
            assert got.dtype == torch.int64 and got.device == s.args[0].device, s.label
            assert torch.equal(got.cpu(), want.cpu()), f"{s.label}: {_first_diff(got, want)}"


def _python_histogram(values: list[float], bins: int, lo: float, hi: float) -> list[int]:
    """The documented rule on Python floats (IEEE doubles, rounded to nearest per operation)."""
    counts = [0] * bins
    width = hi - lo
    for v in values:
        if lo <= v <= hi:
            t = (v - lo) * bins / width
            b = bins - 1 if t >= bins else math.floor(t)
            counts[b] += 1
    return counts


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_reference_follows_the_documented_rule(lib: Any, dtype: torch.dtype) -> None:
    """The reference's tensor arithmetic bins as plain double arithmetic does, edges included."""
    for s in _samples(lib, dtype, "cpu", 0):
        x, bins, lo, hi = s.args
        if x.numel() > 5000:
            continue
        values = [float(v) for v in x.reshape(-1).to(torch.float64).tolist()]
        want = _python_histogram(values, bins, lo, hi)
        assert _spec(lib).reference(*s.args).tolist() == want, s.label


@pytest.mark.parametrize(
    ("bins", "lo", "hi"),
    [
        (7, -3.0, 3.0),
        (256, -4.0, 4.0),
        (1000, 0.1, 0.7),
        (3, -1e-300, 1e-300),
        (5, -8e307, 8e307),  # width > 2^1022: 1 / width is subnormal
        (10, 0.0, 1.5e-323),  # width subnormal: 1 / width overflows
        (100000, -50000.0, 50000.0),
    ],
)
def test_values_a_few_ulps_from_every_edge(lib: Any, bins: int, lo: float, hi: float) -> None:
    """The kernels skip the division where the bin is certain without it: float64 values up to
    64 ulps either side of every edge land where the plain double arithmetic puts them."""
    step = max(1, bins // 50)
    ks = range(0, bins + 1, step)
    edges = torch.tensor([lo + k * (hi - lo) / bins for k in ks], dtype=torch.float64)
    up, down, parts = edges, edges, [edges]
    for _ in range(64):
        up, down = _next(up, 1), _next(down, -1)
        parts += [up, down]
    x = torch.cat(parts)
    values = [float(v) for v in x.tolist()]
    assert lib.histogram(x, bins, lo, hi).tolist() == _python_histogram(values, bins, lo, hi)


# (bins, lo, hi, whether the float path is on): ranges for the float path's tests.
FLOAT_RANGES = [
    (7, -3.0, 3.0, True),
    (256, -4.0, 4.0, True),
    (1000, 0.1, 0.7, True),  # lo, hi and the scale no floats
    (256, 100.0, 108.0, True),  # an offset: its rounding counts in the margin
    (4096, -3.0, 3.0, True),  # the margin near its limit (2^-9 of a bin)
    (16384, -3.0, 3.0, False),  # past the limit: the double rule only
    (5, -1e30, 1e30, True),
    (3, -1e-28, 1e-28, True),
    (3, -1e-35, 1e-35, False),  # scale 1.5e35 past 2^100
    (65536, -4.0, 4.0, False),  # no float path, but bounds (the chunked path's slice test)
]


def _float_values(dtype: torch.dtype, bins: int, lo: float, hi: float) -> torch.Tensor:
    """Values of dtype up to 8 ulps either side of every edge (lo and hi rounded to the dtype
    included), NaN, +-Inf, and 2000 random values over the range and a little beyond."""
    step = max(1, bins // 200)
    edges = torch.tensor(
        [lo + k * (hi - lo) / bins for k in range(0, bins + 1, step)], dtype=torch.float64
    ).to(dtype)
    up, down, parts = edges, edges, [edges]
    for _ in range(8):
        up, down = _next(up, 1), _next(down, -1)
        parts += [up, down]
    u = torch.rand(2000, generator=torch.Generator().manual_seed(bins), dtype=torch.float64)
    parts += [(lo + (u * 1.2 - 0.1) * (hi - lo)).to(dtype)]
    parts += [torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)]
    return torch.cat(parts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("bins", "lo", "hi", "fast"), FLOAT_RANGES)
def test_floats_near_every_edge(
    lib: Any, device: str, dtype: torch.dtype, bins: int, lo: float, hi: float, fast: bool
) -> None:
    """float32, float16 and bfloat16 (on CUDA the float path: a multiply-add with a margin, the
    double rule near an edge) land where the plain double arithmetic puts them."""
    x = _float_values(dtype, bins, lo, hi)
    values = [float(v) for v in x.to(torch.float64).tolist()]
    got = lib.histogram(x.to(device), bins, lo, hi).cpu()
    assert got.tolist() == _python_histogram(values, bins, lo, hi)


_FLOAT_PATH_MAIN = r"""
#include <cstdio>
#include <cstring>

#include "histogram/histogram.h"

// stdin: bins lo hi count, then count float32 bit patterns in hex. stdout: whether the float
// path is on and whether bin_bounds holds (1 or 0 each), then per value bin_of_float's bin and
// bin_of's, and bin_bounds's first and last where it holds and the value is in [lo, hi].
int main() {
  long long bins = 0, count = 0;
  double lo = 0, hi = 0;
  if (std::scanf("%lld %la %la %lld", &bins, &lo, &hi, &count) != 4) return 2;
  const wb::histogram::Range r = wb::histogram::make_range(bins, lo, hi);
  std::printf("%d %d\n", r.fast ? 1 : 0, r.estimate ? 1 : 0);
  for (long long i = 0; i < count; ++i) {
    unsigned bits = 0;
    if (std::scanf("%x", &bits) != 1) return 2;
    float v = 0;
    std::memcpy(&v, &bits, sizeof v);
    std::printf("%lld %lld", static_cast<long long>(wb::histogram::bin_of_float(v, r)),
                static_cast<long long>(wb::histogram::bin_of(v, r)));
    if (r.estimate && v >= r.flo && v <= r.fhi) {
      const wb::histogram::BinBounds b = wb::histogram::bin_bounds(v, r);
      std::printf(" %d %d", b.first, b.last);
    }
    std::printf("\n");
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def float_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """histogram.h's bin_of_float and bin_of side by side in a host program (the CPU op bins with
    bin_of alone: the float path is the CUDA kernel's, and this is its logic on the host)."""
    folder = tmp_path_factory.mktemp("float_path")
    (folder / "main.cpp").write_text(_FLOAT_PATH_MAIN)
    cxx = knobs.cxx() or shutil.which("c++") or "g++"
    root = Path(__file__).resolve().parents[1] / "kernels"
    subprocess.run(
        [cxx, "-std=c++17", "-O2", f"-I{root / 'include'}", f"-I{root}", "main.cpp", "-o", "main"],
        cwd=folder, check=True, capture_output=True,
    )  # fmt: skip
    return folder / "main"


@pytest.mark.parametrize(("bins", "lo", "hi", "fast"), FLOAT_RANGES)
def test_the_float_path_bins_as_bin_of(
    float_path: Path, bins: int, lo: float, hi: float, fast: bool
) -> None:
    """Near every edge and across the range, the float path gives bin_of's bin (or -1), and
    bin_bounds's bounds hold it."""
    x = _float_values(torch.float32, bins, lo, hi)
    bits = [f"{b & 0xFFFFFFFF:x}" for b in x.view(torch.int32).tolist()]
    stdin = f"{bins} {lo.hex()} {hi.hex()} {len(bits)}\n" + "\n".join(bits) + "\n"
    run = subprocess.run([float_path], input=stdin, capture_output=True, text=True, check=True)
    first, *rows = run.stdout.splitlines()
    assert first.split()[0] == ("1" if fast else "0")
    estimate = first.split()[1] == "1"
    assert estimate or bins != 65536
    cols = [[int(c) for c in row.split()] for row in rows]
    assert len(cols) == x.numel()
    wrong = [(float(v), c) for v, c in zip(x.tolist(), cols, strict=True) if c[0] != c[1]]
    assert not wrong, wrong[:5]
    bounded = [c for c in cols if len(c) == 4]
    assert len(bounded) == (sum(c[1] >= 0 for c in cols) if estimate else 0)
    outside = [c for c in bounded if not c[2] <= c[1] <= c[3]]
    assert not outside, outside[:5]


_TIGHT_MAIN = r"""
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "histogram/histogram.h"

// The tight bounds as the device computes them (histogram.h, tight_bits): a float fma rounded
// down or up (long double holds the product exactly and rounds the sum the same way first), then
// the floor. stdin: bins lo hi count, then float32 bit patterns in hex. stdout: make_tight's ok,
// then per value in [flo, fhi]: bin_of's bin and the floors of lower and upper.
static float fma_dir(float v, float scale, float offset, int mode) {
  std::fesetround(mode);
  volatile long double p = static_cast<long double>(v) * scale + offset;
  volatile float f = static_cast<float>(p);
  std::fesetround(FE_TONEAREST);
  return f;
}

int main() {
  long long bins = 0, count = 0;
  double lo = 0, hi = 0;
  if (std::scanf("%lld %la %la %lld", &bins, &lo, &hi, &count) != 4) return 2;
  const wb::histogram::Range r = wb::histogram::make_range(bins, lo, hi);
  const wb::histogram::Tight t = wb::histogram::make_tight(r);
  std::printf("%d\n", t.ok ? 1 : 0);
  for (long long i = 0; i < count; ++i) {
    unsigned bits = 0;
    if (std::scanf("%x", &bits) != 1) return 2;
    float v = 0;
    std::memcpy(&v, &bits, sizeof v);
    if (!t.ok || !(v >= r.flo && v <= r.fhi)) continue;
    const float lower = fma_dir(v, r.scale, t.lo_offset, FE_DOWNWARD);
    const float upper = fma_dir(v, r.scale, t.hi_offset, FE_UPWARD);
    std::printf("%lld %.0f %.0f\n", static_cast<long long>(wb::histogram::bin_of(v, r)),
                std::floor(static_cast<double>(lower)), std::floor(static_cast<double>(upper)));
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def tight_bounds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """histogram.h's make_tight and the wide kernel's two directed-rounding fmas on the host."""
    folder = tmp_path_factory.mktemp("tight")
    (folder / "main.cpp").write_text(_TIGHT_MAIN)
    cxx = knobs.cxx() or shutil.which("c++") or "g++"
    root = Path(__file__).resolve().parents[1] / "kernels"
    subprocess.run(
        [cxx, "-std=c++17", "-O2", "-frounding-math", f"-I{root / 'include'}", f"-I{root}",
         "main.cpp", "-o", "main"],
        cwd=folder, check=True, capture_output=True,
    )  # fmt: skip
    return folder / "main"


# (bins, lo, hi, whether make_tight is ok)
TIGHT_RANGES = [
    (256, -4.0, 4.0, True),
    (1000, 0.1, 0.7, True),
    (256, 100.0, 108.0, True),
    (4096, -3.0, 3.0, True),
    (16384, -3.0, 3.0, True),
    (65536, -4.0, 4.0, True),  # the timed case: bin_bounds's margin is 2^-5 of a bin here
    (65536, -3.0, 5.0, True),
    (65536, -3.7, 4.1, True),  # scale and offset no floats
    (7, -3.0, 3.0, True),
    (100000, -50000.0, 50000.0, True),
    (5, -1e30, 1e30, True),
    (3, -1e-35, 1e-35, False),  # no float estimate (scale past 2^100)
    (1 << 22, 0.0, 1.0, True),
]


@pytest.mark.parametrize(("bins", "lo", "hi", "ok"), TIGHT_RANGES)
def test_the_tight_bounds_hold_the_bin(
    tight_bounds: Path, bins: int, lo: float, hi: float, ok: bool
) -> None:
    """Near every edge (8 ulps either side), lo, hi and across the range: floor(lower) <= bin <=
    floor(upper), so where the two floors agree they are the bin; and they agree for most values
    away from the edges (the bounds are tight)."""
    x = _float_values(torch.float32, bins, lo, hi)
    bits = [f"{b & 0xFFFFFFFF:x}" for b in x.view(torch.int32).tolist()]
    stdin = f"{bins} {lo.hex()} {hi.hex()} {len(bits)}\n" + "\n".join(bits) + "\n"
    run = subprocess.run([tight_bounds], input=stdin, capture_output=True, text=True, check=True)
    first, *rows = run.stdout.splitlines()
    assert first == ("1" if ok else "0")
    cols = [[int(float(c)) for c in row.split()] for row in rows]
    assert bool(cols) == ok
    wrong = [c for c in cols if not (c[1] <= c[0] <= c[2] and c[2] - c[1] <= 1)]
    assert not wrong, wrong[:5]
    assert all(0 <= c[0] < bins for c in cols)
    # The 2000 random values (the last ones in range) are rarely near an edge. (Not at 2^22 bins
    # over [0, 1]: floats near 1 are a quarter of a bin apart there.)
    spread = cols[-1500:]
    if bins < 1 << 22:
        assert sum(c[1] != c[2] for c in spread) <= len(spread) // 20, bins


@pytest.mark.parametrize(
    ("bins", "lo", "hi"), [(65536, -3.7, 4.1), (65536, -4.0, 4.0), (7, 0.1, 0.7)]
)
def test_the_tight_bounds_hold_at_every_edge(
    tight_bounds: Path, bins: int, lo: float, hi: float
) -> None:
    """Every edge of the range (not a sample of them), 4 floats either side."""
    edges = torch.tensor([lo + k * (hi - lo) / bins for k in range(bins + 1)], dtype=torch.float64)
    e = edges.to(torch.float32)
    up, down, parts = e, e, [e]
    for _ in range(4):
        up, down = _next(up, 1), _next(down, -1)
        parts += [up, down]
    x = torch.cat(parts)
    bits = "\n".join(f"{b & 0xFFFFFFFF:x}" for b in x.view(torch.int32).tolist())
    stdin = f"{bins} {lo.hex()} {hi.hex()} {x.numel()}\n{bits}\n"
    run = subprocess.run([tight_bounds], input=stdin, capture_output=True, text=True, check=True)
    first, *rows = run.stdout.splitlines()
    assert first == "1"
    cols = [[int(float(c)) for c in row.split()] for row in rows]
    wrong = [c for c in cols if not (c[1] <= c[0] <= c[2] and c[2] - c[1] <= 1)]
    assert not wrong, wrong[:5]
    assert len(cols) >= 8 * bins


def _next(x: torch.Tensor, direction: int) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, direction * math.inf))


def test_the_edges_fall_where_the_rule_says(lib: Any) -> None:
    """lo and every edge open their bin, hi closes the last; the values just outside are lost."""
    lo, hi, bins = -3.0, 3.0, 6  # edges -3, -2, ..., 3: exact
    x = torch.tensor([lo, -2.0, -1.0, 0.0, 1.0, 2.0, hi], dtype=torch.float32)
    assert lib.histogram(x, bins, lo, hi).tolist() == [1, 1, 1, 1, 1, 2]
    outside = torch.tensor([lo, hi], dtype=torch.float32)
    outside = torch.nextafter(outside, torch.tensor([-math.inf, math.inf]))
    nonfinite = torch.tensor([math.nan, math.inf, -math.inf])
    assert lib.histogram(torch.cat([outside, nonfinite]), bins, lo, hi).tolist() == [0] * bins
    big = torch.tensor([2**62 - 1, 2**62, 2**62 + 1, 2**62 + 2**10], dtype=torch.int64)
    # Converted to double first: 2^62 - 1 and 2^62 + 1 round to 2^62 == hi; 2^62 + 2^10 does not.
    assert lib.histogram(big, 2, 0.0, float(2**62)).tolist() == [0, 3]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_runs_inside_outside_and_mixed_count_as_the_reference(lib: Any, dtype: torch.dtype) -> None:
    """The CPU kernel tests a block of elements by the loop the previous block suggests (a branch
    where nearly all fell inside, one where nearly all fell outside, none where they mixed):
    x in runs of each kind, of lengths off the block's, ending on both sides of the range, NaN
    among them for the floating dtypes, bit for bit the reference, on one thread and on two."""
    gen = torch.Generator().manual_seed(7)
    lo, hi, bins = -3.0, 5.0, 160
    runs = []
    for length, kind in [
        (1500, "in"),
        (700, "mixed"),
        (2049, "out"),
        (300, "in"),
        (5000, "mixed"),
        (999, "rare"),
        (1024, "in"),
        (77, "out"),
        (3000, "mixed"),
    ]:
        u = torch.rand(length, generator=gen, dtype=torch.float64)
        if kind == "in":
            v = lo + u * (hi - lo)
        elif kind == "out":
            v = torch.where(u < 0.5, lo - 1 - u * 100, hi + 1 + u * 100)
        elif kind == "rare":  # one in a hundred inside, the rest just below hi's side or far
            v = torch.where(u < 0.01, hi - u, hi + 1 + u)
        else:
            v = lo - 4 + u * (hi - lo + 8)
        runs.append(v)
    x = torch.cat(runs)
    if dtype.is_floating_point:
        x[::97] = math.nan
        x = x.to(dtype)
    else:
        x = x.round().to(dtype)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got = lib.histogram(x, bins, lo, hi)
            want = _spec(lib).reference(x, bins, lo, hi)
            assert torch.equal(got, want), f"{n} threads: {_first_diff(got, want)}"
    finally:
        torch.set_num_threads(threads)


def test_many_threads_count_like_one(lib: Any) -> None:
    """The private histograms of the CPU threads add up to the single-thread counts."""
    x = torch.randn(3_000_001, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = lib.histogram(x, 100, -2.0, 2.0)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(lib.histogram(x, 100, -2.0, 2.0), one)
    assert int(one.sum()) == int(((x >= -2) & (x <= 2)).sum())


@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(lib: Any, device: str) -> None:
    assert_matches_reference(lib, "histogram", device)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(lib: Any, device: str) -> None:
    assert_opcheck(lib, "histogram", device)


@pytest.mark.parametrize("device", DEVICES)
def test_compile(lib: Any, device: str) -> None:
    assert_contract(lib, "histogram", device, "compile")


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_equals_eager(lib: Any, device: str) -> None:
    """torch.compile(fullgraph=True) traces the op (its fake) and gives the eager counts."""
    x = torch.randn(4099, generator=torch.Generator().manual_seed(0)).to(device)

    def f(x: torch.Tensor) -> torch.Tensor:
        return lib.histogram(x * 2, 33, -4.0, 4.0)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), f(x))


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((torch.randn(8), 0, 0.0, 1.0), RuntimeError, r"histogram: expected bins in \[1, "),
        ((torch.randn(8), -3, 0.0, 1.0), RuntimeError, r"got -3"),
        ((torch.randn(8), 4, math.nan, 1.0), RuntimeError, r"expected lo to be finite, got nan"),
        ((torch.randn(8), 4, 0.0, math.inf), RuntimeError, r"expected hi to be finite, got inf"),
        ((torch.randn(8), 4, 1.0, 1.0), RuntimeError, r"expected lo < hi, got lo = 1 and hi = 1"),
        ((torch.randn(8), 4, 2.0, 1.0), RuntimeError, r"expected lo < hi"),
        ((torch.randn(8), 4, -1e308, 1e308), RuntimeError, r"expected hi - lo to be finite"),
        (
            (torch.zeros(8, dtype=torch.uint8), 4, 0.0, 1.0),
            TypeError,
            r"histogram: x has dtype Byte, which is not supported; expected one of Float, "
            r"Double, Half, BFloat16, Int, Long",
        ),
    ],
)
def test_bad_input_is_named(lib: Any, args: tuple[Any, ...], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        lib.histogram(*args)


# An impostor: right but for v == hi, which it leaves out (a half-open last bin).
_IMPOSTOR: list[Any] = []


def _drops_hi(lib: Any) -> Any:
    if not _IMPOSTOR:

        @torch.library.custom_op("wbimp_histogram::drops_hi", mutates_args=())
        def drops_hi(x: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor:
            kept = x[x.to(torch.float64) != hi]
            return _spec(lib).reference(kept, bins, lo, hi)

        drops_hi.register_fake(lambda x, bins, lo, hi: x.new_empty((bins,), dtype=torch.int64))
        _IMPOSTOR.append(drops_hi)
    return _IMPOSTOR[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_impostor_that_drops_the_last_edge_differs_on_the_edge_samples(
    lib: Any, dtype: torch.dtype
) -> None:
    """Two edge samples hold values at hi (edges_frac's hi, 0.7, is no float of any dtype), so
    the impostor gives other counts than the op there."""
    impostor = _drops_hi(lib)
    edges = [s for s in _samples(lib, dtype, "cpu", 0) if s.label.startswith("edges")]
    at_hi = [s for s in edges if bool((s.args[0].to(torch.float64) == s.args[3]).any())]
    assert len(at_hi) >= 2, [s.label for s in at_hi]
    for s in at_hi:
        assert not torch.equal(impostor(*s.args), lib.histogram(*s.args)), s.label
        assert torch.equal(lib.histogram(*s.args), _spec(lib).reference(*s.args)), s.label


def test_the_check_fails_the_impostor_and_passes_the_op(lib: Any) -> None:
    spec = _spec(lib)
    report = workbench.check(_drops_hi(lib), spec, device="cpu", trials=1, contract=False)
    assert not report.passed, str(report)
    failing = {r.label for r in report.failures}
    assert {"edges7", "edges256", "edges20", "edges_big"} <= failing, str(report)
    assert "empty" not in failing, str(report)
    assert workbench.check("histogram", lib=lib, device="cpu", trials=1).passed


def test_the_bench_times_torch_histc_as_the_anchor(lib: Any) -> None:
    """The spec's anchor is timed as one more candidate, in a 'vs anchor' column after compiled."""
    result = workbench.bench(
        "histogram", lib=lib, device="cpu", sizes=["16Ki"], compile=False, min_time=0.01,
        roofline=False, save=False,
    )  # fmt: skip
    (size,) = result.ops[0].sizes
    assert "anchor" in size.times
    header = result.table().splitlines()[1].split()
    assert header.index("anchor") == header.index("compiled") + 2  # "vs anchor" follows
