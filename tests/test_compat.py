"""The drop-in load/load_inline with the real compiler and dispatcher: the tutorial's extension,
reload of an edited TORCH_LIBRARY source in process, pybind11 rebuilds, the dispatch rule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import workbench
from workbench import cache, knobs
from workbench.compat import dispatch, dropin
from workbench.errors import BuildError, LoadError

DATA = Path(__file__).parent / "data" / "extension"
_count = iter(range(1_000_000))


def _ns() -> str:
    return f"wbcompat{next(_count)}_{os.getpid()}"


def test_the_tutorial_extension_loads_as_a_torch_library() -> None:
    path = workbench.load("ext_muladd", [str(DATA / "muladd.cpp")], is_python_module=False)
    assert isinstance(path, str) and path in torch.ops.loaded_libraries
    a, b = torch.randn(37), torch.randn(37)
    ops = torch.ops.ext_muladd
    torch.testing.assert_close(ops.muladd(a, b, 0.5), a * b + 0.5)
    torch.testing.assert_close(ops.mul(a, b), a * b)
    out = torch.empty(37)
    ops.add_out(a, b, out)
    torch.testing.assert_close(out, a + b)
    with pytest.raises(RuntimeError, match="same shape"):
        ops.mul(a, torch.randn(3))
    # Loading again is a cache hit on the same file, with nothing registered twice.
    assert workbench.load("ext_muladd", [str(DATA / "muladd.cpp")], is_python_module=False) == path


def _shift(tmp_path: Path, ns: str, shift: int, **kw: object) -> str:
    src = tmp_path / "shift.cpp"
    text = (DATA / "shift.cpp").read_text().replace("NAMESPACE", ns)
    src.write_text(text.replace("#define SHIFT 1", f"#define SHIFT {shift}"))
    return workbench.load(f"shift_{ns}", [str(src)], is_python_module=False, **kw)  # type: ignore[no-any-return]


def test_an_edited_torch_library_source_reloads_in_process(tmp_path: Path) -> None:
    ns = _ns()
    first = _shift(tmp_path, ns, 1)
    x = torch.arange(3.0)
    packet = getattr(torch.ops, ns).shift
    overload = packet.default  # a handle held across the reload must stay valid
    torch.testing.assert_close(packet(x), x + 1)
    second = _shift(tmp_path, ns, 5)  # torch.utils.cpp_extension aborts the process here
    assert second != first
    torch.testing.assert_close(getattr(torch.ops, ns).shift(x), x + 5)
    torch.testing.assert_close(overload(x), x + 5)
    torch.testing.assert_close(packet(x), x + 5)
    for shift in (9, 1, 3):  # more swaps: each new kernel is checked against the first one's
        _shift(tmp_path, ns, shift)
        torch.testing.assert_close(overload(x), x + shift)
    # The dispatcher holds one CPU kernel: the last build's. No old build can be called.
    dump = torch._C._dispatch_dump(f"{ns}::shift")
    assert sum(line.startswith("CPU: ") for line in dump.splitlines()) == 1


def test_a_broken_edit_keeps_the_last_good_build(tmp_path: Path) -> None:
    ns = _ns()
    _shift(tmp_path, ns, 2)
    x = torch.zeros(2)
    src = tmp_path / "shift.cpp"
    good = src.read_text()
    src.write_text(good.replace("return at::add(x, SHIFT);", "return at::add(x, SHIFT) +* ;"))
    with pytest.raises(BuildError) as info:
        workbench.load(f"shift_{ns}", [str(src)], is_python_module=False)
    assert f"{src}:11:" in str(info.value)
    assert not [p for p in (cache.root() / "tmp").iterdir() if ns in p.name]
    torch.testing.assert_close(getattr(torch.ops, ns).shift(x), x + 2)
    # A schema that does not parse fails at registration: an error, not an abort.
    src.write_text(good.replace('"shift(Tensor x) -> Tensor"', '"shift(Tensor x -> Tensor"'))
    with pytest.raises(LoadError, match="shift"):
        workbench.load(f"shift_{ns}", [str(src)], is_python_module=False)
    torch.testing.assert_close(getattr(torch.ops, ns).shift(x), x + 2)
    src.write_text(good)  # leave a good source: later autoreloads in this process rebuild it
    workbench.load(f"shift_{ns}", [str(src)], is_python_module=False)


PYBIND_SOURCE = """\
#include <pybind11/pybind11.h>
int answer() { return ANSWER; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
"""


def test_a_pybind11_module_is_rebuilt_and_reimported_after_an_edit(tmp_path: Path) -> None:
    src = tmp_path / "answer.cpp"
    src.write_text(PYBIND_SOURCE.replace("ANSWER", "41"))
    first = workbench.load("answer_ext", [str(src)])
    assert first.answer() == 41
    src.write_text(PYBIND_SOURCE.replace("ANSWER", "42"))
    second = workbench.load("answer_ext", [str(src)])
    assert second.answer() == 42
    assert first.answer() == 42  # the module object the script holds follows the new build
    assert second is not first and second.__file__ != first.__spec__.origin


CLASS_SOURCE = """
struct Counter { int v; int get() const { return v + STEP; } };
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<Counter>(m, "Counter").def(pybind11::init<int>()).def("get", &Counter::get);
}
"""


def test_an_edited_module_that_binds_a_class_names_the_fix_and_keeps_the_old_build() -> None:
    first = workbench.load_inline(name="class_ext", cpp_sources=CLASS_SOURCE.replace("STEP", "1"))
    assert first.Counter(10).get() == 11
    with pytest.raises(LoadError, match=r"already registered.*py::module_local\(\)"):
        workbench.load_inline(name="class_ext", cpp_sources=CLASS_SOURCE.replace("STEP", "2"))
    assert first.Counter(10).get() == 11  # the last good build


MODEL_NEW_CPP = """\
torch::Tensor elementwise_add(torch::Tensor a, torch::Tensor b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "elementwise_add: a and b must have the same shape");
  auto out = torch::empty_like(a);
  auto ac = a.contiguous(), bc = b.contiguous();
  const float* pa = ac.data_ptr<float>();
  const float* pb = bc.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] + pb[i];
  return out;
}
"""


# The legacy registration API: the op is registered by a static object as the library opens.
STATIC_REGISTRATION = """\
#include <ATen/core/op_registration/op_registration.h>
#include <ATen/ops/add.h>

namespace {
at::Tensor lift(const at::Tensor& x) { return at::add(x, LIFT); }
static auto registry = c10::RegisterOperators().op("NAMESPACE::lift", &lift);
}  // namespace
"""

# A crash would end the child, not pytest: the child prints what it saw, step by step.
STATIC_RELOAD = """\
import sys
from pathlib import Path
import torch, workbench
src, ns = Path(sys.argv[1]), sys.argv[2]
good = src.read_text()
workbench.load(ns, [str(src)], is_python_module=False)
x = torch.zeros(2)
print("first", getattr(torch.ops, ns).lift(x).tolist())
src.write_text(good.replace("add(x, 10)", "add(x, 20)"))
try:
    workbench.load(ns, [str(src)], is_python_module=False)
except Exception as e:
    print("refused", e)
print("still", getattr(torch.ops, ns).lift(x).tolist())
src.write_text(good)
workbench.load(ns, [str(src)], is_python_module=False)
print("back", getattr(torch.ops, ns).lift(x).tolist())
"""


def test_a_library_that_registers_as_it_opens_is_refused_on_reload_not_aborted(
    tmp_path: Path,
) -> None:
    """torch::RegisterOperators registers at dlopen; opening an edited build would register the
    op again, which aborts the process: the reload is refused with the cause and the fix."""
    ns = _ns()
    src = tmp_path / "lift.cpp"
    src.write_text(STATIC_REGISTRATION.replace("NAMESPACE", ns).replace("LIFT", "10"))
    env = {**os.environ, "WB_CACHE_DIR": str(knobs.cache_dir())}
    proc = subprocess.run(
        [sys.executable, "-c", STATIC_RELOAD, str(src), ns],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "first [10.0, 10.0]", proc.stdout
    assert lines[1].startswith(f"refused the edited build of {ns!r} cannot be loaded"), lines
    assert f"registered {ns}::lift as it was opened" in lines[1] and "Restart" in lines[1]
    assert lines[2] == "still [10.0, 10.0]"
    assert lines[3] == "back [10.0, 10.0]"  # the loaded build's own source: nothing to swap


def test_load_inline_model_new_in_the_style_of_benchmark_suites() -> None:
    module = workbench.load_inline(
        name="elementwise_add_ext",
        cpp_sources=MODEL_NEW_CPP,
        functions=["elementwise_add"],
        extra_cflags=["-O2"],
    )

    class ModelNew(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.op = module

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.op.elementwise_add(a, b)  # type: ignore[no-any-return]

    a, b = torch.randn(4, 33), torch.randn(4, 33)
    torch.testing.assert_close(ModelNew()(a, b), a + b)
    with pytest.raises(RuntimeError, match="same shape"):  # TORCH_CHECK reaches Python
        ModelNew()(a, torch.randn(2))


def test_the_dispatch_rule() -> None:
    assert dispatch.is_dropin(("m", ["a.cpp"]), {})
    assert dispatch.is_dropin(("m",), {"sources": ["a.cpp"]})
    assert dispatch.is_dropin((), {"name": "m", "sources": ["a.cpp"], "verbose": True})
    assert not dispatch.is_dropin(("kernels",), {"namespace": "x", "jobs": 1})
    assert not dispatch.is_dropin((), {})
    with pytest.raises(TypeError, match="mixes the registry loader"):
        dispatch.is_dropin(("m", ["a.cpp"]), {"namespace": "x"})
    with pytest.raises(TypeError, match="unexpected keyword"):
        dispatch.is_dropin(("m",), {"source": ["a.cpp"]})


def test_bad_arguments_name_the_argument(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a Python identifier"):
        workbench.load("my-ext", [str(tmp_path / "a.cpp")])
    with pytest.raises(FileNotFoundError, match=r"missing\.cpp"):
        workbench.load("ext", [str(tmp_path / "missing.cpp")])
    with pytest.raises(ValueError, match="sources is empty"):
        workbench.load("ext", [])


@pytest.mark.nvcc
def test_nvcc_compiles_the_tutorial_cuda_file(tmp_path: Path) -> None:
    """The CUDA file, with the deferred-registration prelude, compiles (no GPU needed)."""
    if torch.version.cuda is None:
        pytest.skip("a CPU build of torch ships no c10/cuda build headers; needs a CUDA torch")
    with knobs.override(TORCH_CUDA_ARCH_LIST="9.0"):
        recipe = dropin.recipe(
            "ext_muladd_cuda",
            [DATA / "muladd.cu"],
            extra_cflags=[],
            extra_cuda_cflags=[],
            extra_ldflags=[],
            extra_include_paths=[],
            with_cuda=True,
            python_module=False,
            link=False,
        )
    unit = recipe.units[0]
    out = tmp_path / "muladd.o"
    cmd = [part.replace("@OUT@", str(out)) for part in unit.command]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0


@pytest.mark.cuda
def test_the_tutorial_extension_with_cuda() -> None:
    # The same extension as the CPU test, now with its CUDA file: two extensions cannot both
    # define TORCH_LIBRARY(ext_muladd), but one extension can be rebuilt with more sources.
    sources = [str(DATA / "muladd.cpp"), str(DATA / "muladd.cu")]
    workbench.load("ext_muladd", sources, is_python_module=False)
    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    torch.testing.assert_close(torch.ops.ext_muladd.muladd(a, b, 2.0), a * b + 2.0)
    torch.testing.assert_close(torch.ops.ext_muladd.mul(a, b), a * b)
    torch.testing.assert_close(torch.ops.ext_muladd.mul(a.cpu(), b.cpu()), a.cpu() * b.cpu())


MODEL_NEW_CUDA = """
#include <torch/extension.h>

__global__ void relu_kernel(const float* x, float* out, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "relu_cuda: float32 CUDA x");
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  int64_t n = xc.numel();
  relu_kernel<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}
"""


@pytest.mark.cuda
def test_load_inline_model_new_with_cuda_sources() -> None:
    """The shape of benchmark-suite submissions: cpp_sources declares, cuda_sources defines."""
    module = workbench.load_inline(
        name="relu_inline_ext",
        cpp_sources="torch::Tensor relu_cuda(torch::Tensor x);",
        cuda_sources=MODEL_NEW_CUDA,
        functions=["relu_cuda"],
    )

    class ModelNew(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return module.relu_cuda(x)  # type: ignore[no-any-return]

    x = torch.randn(3, 1000, device="cuda")
    torch.testing.assert_close(ModelNew()(x), torch.relu(x))
    with pytest.raises(RuntimeError, match="float32 CUDA x"):
        ModelNew()(x.cpu())
