"""A throwaway one-family registry on disk, for tests that edit sources and rebuild."""

from __future__ import annotations

from pathlib import Path

KERNEL = """\
// tiny.cpp: out = x + OFFSET + {delta}
#include "tiny/tiny.h"
#include "tiny_common.h"

namespace tiny {{
template <typename T>
void add_offset_cpu(const T* x, T* out, int64_t n) {{
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + T(OFFSET + {delta});
}}
WB_INSTANTIATE(WB_FLOAT32_64, add_offset_cpu)
}}  // namespace tiny
"""

HEADER = """\
#pragma once
#include "wb/dtypes.h"
namespace tiny {
template <typename T>
void add_offset_cpu(const T* x, T* out, int64_t n);
}
"""

BINDING = """\
#include "tiny/tiny.h"
#include "wb/binding.h"

WB_DEF("add_offset(Tensor x) -> Tensor");

static at::Tensor add_offset(const at::Tensor& x_in) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  WB_DISPATCH(WB_FLOAT32_64, x.scalar_type(), "add_offset", "x", [&] {
    tiny::add_offset_cpu(wb::data<scalar_t>(x), wb::data<scalar_t>(out), x.numel());
  });
  return out;
}

WB_IMPL(CPU, m) { m.impl("add_offset", &add_offset); }
"""


def write_registry(root: Path, offset: int = 1, delta: int = 0) -> Path:
    """kernels/tiny (a CPU kernel and its header), kernels/include/tiny_common.h, bindings/."""
    kernels = root / "kernels"
    (kernels / "tiny").mkdir(parents=True, exist_ok=True)
    (kernels / "include").mkdir(exist_ok=True)
    (root / "bindings").mkdir(exist_ok=True)
    (kernels / "tiny" / "tiny.h").write_text(HEADER)
    (kernels / "tiny" / "tiny.cpp").write_text(KERNEL.format(delta=delta))
    (kernels / "include" / "tiny_common.h").write_text(f"#pragma once\n#define OFFSET {offset}\n")
    (root / "bindings" / "tiny.cpp").write_text(BINDING)
    return kernels
