"""Extensions on the LibTorch stable ABI (STABLE_TORCH_LIBRARY, the style of pytorch/extension-cpp):
an edit reloads in place as TORCH_LIBRARY sources do, and a second library that defines the same
namespace raises a LoadError where registering it at dlopen would run through a handle never
set. Run in a child process: a crash there must fail the test, not end the test run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from workbench import knobs

FILL = """\
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

using torch::stable::Tensor;

Tensor fill_val(const Tensor& a) {
  Tensor out = torch::stable::empty_like(a);
  torch::stable::fill_(out, VALUE);
  return out;
}

STABLE_TORCH_LIBRARY(NAMESPACE, m) { m.def("fill_val(Tensor a) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("fill_val", TORCH_BOX(&fill_val)); }
"""

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch, workbench

    src, ns = Path(sys.argv[1]), sys.argv[2]
    text = src.read_text()
    x = torch.zeros(2)
    for value in ("1.0", "2.0"):
        src.write_text(text.replace("VALUE", value))
        workbench.load("wb_stable", [src], is_python_module=False)
        print("value", getattr(torch.ops, ns).fill_val(x).tolist())
    other = src.with_name("other.cpp")
    other.write_text(text.replace("VALUE", "3.0"))
    try:
        workbench.load("wb_stable_other", [other], is_python_module=False)
    except workbench.errors.LoadError as e:
        print("refused", " ".join(str(e).split())[:300])
    print("still", getattr(torch.ops, ns).fill_val(x).tolist())
    """
)


def test_a_stable_abi_extension_reloads_and_a_second_definition_is_refused(
    tmp_path: Path,
) -> None:
    ns = f"wbstable_{os.getpid()}"
    src = tmp_path / "fill.cpp"
    src.write_text(FILL.replace("NAMESPACE", ns))
    env = {**os.environ, "WB_CACHE_DIR": str(knobs.cache_dir()), "WB_QUIET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(src), ns],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["value [1.0, 1.0]", "value [2.0, 2.0]"], proc.stdout + proc.stderr
    assert lines[2].startswith("refused registering the ops of wb_stable_other"), lines[2]
    assert f"namespace {ns}" in lines[2]
    assert lines[3] == "still [2.0, 2.0]"
