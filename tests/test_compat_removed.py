"""A drop-in reload whose new build no longer defines an op the old build did (an emptied file, a
deleted op, a renamed namespace): the reload says which ops are gone, and a later call of one of
them, through any handle, raises RemovedOpError naming it instead of crashing the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import workbench
from workbench import knobs
from workbench.compat.live import RemovedOpError, RemovedOpWarning
from workbench.errors import LoadError

TWO_OPS = """\
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

namespace {
at::Tensor shift_cpu(const at::Tensor& x) { return at::add(x, SHIFT); }
at::Tensor twice_cpu(const at::Tensor& x) { return at::mul(x, 2); }
}  // namespace

TORCH_LIBRARY(NAMESPACE, m) {
  m.def("shift(Tensor x) -> Tensor");
  m.def("twice(Tensor x) -> Tensor");  // TWICE
}

TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) {
  m.impl("shift", &shift_cpu);
  m.impl("twice", &twice_cpu);  // TWICE
}
"""


def _source(ns: str, shift: int, twice: bool = True) -> str:
    text = TWO_OPS.replace("NAMESPACE", ns).replace("SHIFT", str(shift))
    if not twice:
        text = "\n".join(line for line in text.splitlines() if "// TWICE" not in line) + "\n"
    return text


def _load(src: Path, name: str) -> str:
    return workbench.load(name, [str(src)], is_python_module=False)  # type: ignore[no-any-return]


def test_a_removed_op_raises_naming_it_and_comes_back_when_defined_again(tmp_path: Path) -> None:
    ns = f"wbremoved_{os.getpid()}"
    src = tmp_path / "two.cpp"
    src.write_text(_source(ns, 1))
    _load(src, ns)
    x = torch.arange(3.0)
    ops = getattr(torch.ops, ns)
    held = ops.twice.default  # a handle a script keeps across reloads
    torch.testing.assert_close(held(x), x * 2)

    src.write_text(_source(ns, 5, twice=False))
    with pytest.warns(RemovedOpWarning, match=rf"no longer defines {ns}::twice\b"):
        _load(src, ns)
    torch.testing.assert_close(ops.shift(x), x + 5)  # the op that stayed runs the new build
    for call in (lambda: held(x), lambda: ops.twice(x), lambda: getattr(torch.ops, ns).twice(x)):
        with pytest.raises(RemovedOpError, match=rf"{ns}::twice is no longer defined"):
            call()

    # A broken edit while an op is gone: the last good build stays, the op still raises.
    src.write_text(_source(ns, 7, twice=False).replace("shift(Tensor x)", "shift(Tensor x"))
    with pytest.raises(LoadError, match="shift"):
        _load(src, ns)
    torch.testing.assert_close(ops.shift(x), x + 5)
    with pytest.raises(RemovedOpError, match=f"{ns}::twice"):
        held(x)

    # Another extension of the same name (other sources) leaves the removed ops where they are.
    other = tmp_path / "other.cpp"
    other.write_text(
        "#include <pybind11/pybind11.h>\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("one", [] { return 1; }); }\n'
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RemovedOpWarning)
        assert workbench.load(ns, [str(other)]).one() == 1
    with pytest.raises(RemovedOpError, match=f"{ns}::twice"):
        held(x)

    src.write_text(_source(ns, 3))  # defined again: every handle calls the new kernel
    _load(src, ns)
    torch.testing.assert_close(held(x), x * 2)
    torch.testing.assert_close(ops.shift(x), x + 3)
    dump = torch._C._dispatch_dump(f"{ns}::twice")
    assert sum(line.startswith("CPU: ") for line in dump.splitlines()) == 1, dump


def test_a_renamed_namespace_retires_the_old_ops(tmp_path: Path) -> None:
    old_ns, new_ns = f"wbrename_a_{os.getpid()}", f"wbrename_b_{os.getpid()}"
    src = tmp_path / "two.cpp"
    src.write_text(_source(old_ns, 1))
    _load(src, "renamed_ext")
    x = torch.ones(2)
    held = getattr(torch.ops, old_ns).shift
    torch.testing.assert_close(held(x), x + 1)

    src.write_text(_source(new_ns, 2))
    with pytest.warns(RemovedOpWarning) as record:
        _load(src, "renamed_ext")
    message = " ".join(str(w.message) for w in record if w.category is RemovedOpWarning)
    assert f"{old_ns}::shift" in message and f"{old_ns}::twice" in message
    torch.testing.assert_close(getattr(torch.ops, new_ns).shift(x), x + 2)
    with pytest.raises(RemovedOpError, match=f"{old_ns}::shift"):
        held(x)

    src.write_text(_source(old_ns, 4))  # and back: the old namespace's ops return
    with pytest.warns(RemovedOpWarning, match=f"{new_ns}::shift"):
        _load(src, "renamed_ext")
    torch.testing.assert_close(held(x), x + 4)
    with pytest.raises(RemovedOpError, match=f"{new_ns}::twice"):
        getattr(torch.ops, new_ns).twice(x)


# The report's case, verbatim in shape: torch/extension.h, a schema with a float, then the file
# saved empty and loaded again in the same process. A crash would kill the child, not pytest.
EMPTIED = textwrap.dedent(
    """
    import sys, warnings
    from pathlib import Path
    import torch, workbench

    src = Path(sys.argv[1])
    good = src.read_text()
    workbench.load("my_extension", [str(src)], is_python_module=False)
    x = torch.ones(3)
    op = torch.ops.my_extension.my_op
    print("first", op(x, x, 2.0).tolist())
    src.write_text("")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        workbench.load("my_extension", [str(src)], is_python_module=False)
    print("warned", [str(w.message) for w in seen])
    for attempt in range(2):
        try:
            op(x, x, 2.0)
        except Exception as e:
            print("raised", type(e).__name__, e)
    src.write_text(good)
    workbench.load("my_extension", [str(src)], is_python_module=False)
    print("restored", op(x, x, 2.0).tolist())
    """
)

MY_OP = """\
#include <torch/extension.h>

at::Tensor my_op_cpu(const at::Tensor& input, const at::Tensor& other, double alpha) {
  return input + other * alpha;
}

TORCH_LIBRARY(my_extension, m) {
  m.def("my_op(Tensor input, Tensor other, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_extension, CPU, m) { m.impl("my_op", &my_op_cpu); }
"""


def test_an_emptied_source_loaded_again_never_crashes(tmp_path: Path) -> None:
    src = tmp_path / "my_op.cpp"
    src.write_text(MY_OP)
    env = {**os.environ, "WB_CACHE_DIR": str(knobs.cache_dir())}
    proc = subprocess.run(
        [sys.executable, "-c", EMPTIED, str(src)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "first [3.0, 3.0, 3.0]"
    assert "no longer defines my_extension::my_op" in lines[1]
    assert lines[2].startswith("raised RemovedOpError my_extension::my_op is no longer defined")
    assert lines[3] == lines[2]  # the second call is no different
    assert lines[4] == "restored [3.0, 3.0, 3.0]"


def test_a_changed_kernel_signature_is_refused_with_its_cause_and_the_old_build_runs(
    tmp_path: Path,
) -> None:
    """The dispatcher keeps an operator's first kernel signature while the operator lives, and a
    reload keeps it alive: an edit that changes the kernel's arguments gets an error that says so
    and how to load it, and the last good build (and every handle to it) keeps running."""
    ns = f"wbsignature_{os.getpid()}"
    src = tmp_path / "two.cpp"
    good = _source(ns, 1)
    src.write_text(good)
    _load(src, ns)
    x = torch.arange(3.0)
    held = getattr(torch.ops, ns).shift.default
    changed = good.replace("shift(Tensor x)", "shift(Tensor x, float s=0.5)").replace(
        "shift_cpu(const at::Tensor& x) { return at::add(x, 1); }",
        "shift_cpu(const at::Tensor& x, double s) { return at::add(x, s); }",
    )
    assert changed.count("double s") == 1
    src.write_text(changed)
    for _ in range(2):  # refused again: nothing of the failed swap is left behind
        with pytest.raises(LoadError) as info:
            _load(src, ns)
        text = str(info.value)
        assert f"the C++ signature of {ns}::shift's kernel changed" in text, text
        assert "(at::Tensor const&, double)" in text and "restart the Python process" in text
        torch.testing.assert_close(held(x), x + 1)
        torch.testing.assert_close(getattr(torch.ops, ns).twice(x), x * 2)
    src.write_text(good)  # back to the live signature: loads (from the cache) as before
    _load(src, ns)
    torch.testing.assert_close(held(x), x + 1)
