"""A one-family registry whose op has a declared space of five variants, for ``wb tune`` tests.

``add_offset(x) = x + 1`` is built at ``MODE`` 0 to 4 (``-DWB_TUNE_MODE``):

- 0, the default: sleeps 100 us and reads x 8 more times (slow at every size);
- 1: sleeps 1 ms, no extra reads (the fastest on large inputs);
- 2: reads x 20 more times, no sleep (the fastest on small inputs);
- 3: adds 2 instead of 1: wrong, so the checker must disqualify it;
- 4: does not compile (#error).

The differences are 5x or more, so the winners are the same on any machine, however busy. When
the environment names a file in TINY_TRACE, each call appends its MODE to it: the tests see which
variant served a call.
"""

from __future__ import annotations

from pathlib import Path

from tests.registry_fixture import write_registry

KERNEL = """\
// tiny.cpp: out = x + OFFSET, at one of five tuning modes (see tests/tune_fixture.py)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "tiny/tiny.h"
#include "tiny_common.h"

#ifndef WB_TUNE_MODE
#define WB_TUNE_MODE 0
#endif
#if WB_TUNE_MODE == 4
#error mode 4 does not build
#endif

namespace tiny {
static volatile double sink;

template <typename T>
static void burn(const T* x, int64_t n, int passes) {
  double acc = 0;
  for (int p = 0; p < passes; ++p)
    for (int64_t i = 0; i < n; ++i) acc += x[i];
  sink = acc;
}

template <typename T>
void add_offset_cpu(const T* x, T* out, int64_t n) {
  if (const char* trace = std::getenv("TINY_TRACE")) {
    if (FILE* f = std::fopen(trace, "a")) {
      std::fprintf(f, "%d\\n", WB_TUNE_MODE);
      std::fclose(f);
    }
  }
  if (WB_TUNE_MODE == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    burn(x, n, 8);
  }
  if (WB_TUNE_MODE == 1) std::this_thread::sleep_for(std::chrono::microseconds(1000));
  if (WB_TUNE_MODE == 2) burn(x, n, 20);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + T(OFFSET + (WB_TUNE_MODE == 3 ? 1 : 0));
}
WB_INSTANTIATE(WB_FLOAT32_64, add_offset_cpu)
}  // namespace tiny
"""

SPEC = """\
import torch

from workbench import TuneSpace
from workbench.spec import OpSpec, Sample

TUNE = TuneSpace({"MODE": [0, 1, 2, 3, 4]})
SMALL, LARGE = 1024, 1 << 22


def _x(n, dtype, device, gen):
    return torch.randn(n, generator=gen).to(dtype=dtype, device=device)


def add_offset_samples(dtype, device, gen):
    return [Sample((_x(n, dtype, device, gen),), f"n{n}") for n in (0, 1, 7, 1000)]


def add_offset_bench_sizes(dtype, device, gen):
    return [Sample((_x(n, dtype, device, gen),), f"n{n}") for n in (SMALL, LARGE)]


OPS = [
    OpSpec(
        name="add_offset",
        reference=lambda x: x + 1,
        samples=add_offset_samples,
        bench_sizes=add_offset_bench_sizes,
        fake=lambda x: torch.empty_like(x),
        dtypes=(torch.float32, torch.float64),
        devices=("cpu",),
    )
]
"""

SMALL, LARGE = 1024, 1 << 22


def write_tuned_registry(root: Path) -> Path:
    kernels = write_registry(root)
    (kernels / "tiny" / "tiny.cpp").write_text(KERNEL)
    (kernels / "tiny" / "spec.py").write_text(SPEC)
    return kernels


def traced(path: Path) -> list[int]:
    """The modes that served the calls since the trace file was last removed."""
    if not path.exists():
        return []
    modes = [int(x) for x in path.read_text().split()]
    path.unlink()
    return modes
