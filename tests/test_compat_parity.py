"""The drop-in against torch.utils.cpp_extension on what third-party extensions pass it: torch's
signatures and argument order, names torch accepts, torch's exception types for build and load
failures, loads of one name with other sources, executables, and the overloads a reload holds."""

from __future__ import annotations

import inspect
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension as torch_ext

import workbench
from workbench.compat import dropin, live
from workbench.errors import BuildError, LoadError

OPS = """\
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <torch/library.h>

namespace {
at::Tensor shift_cpu(const at::Tensor& x, int64_t k) { return at::add(x, k + SHIFT); }
at::Tensor& shift_out(const at::Tensor& x, int64_t k, at::Tensor& out) {
  return out.copy_(at::add(x, k + SHIFT));
}
}  // namespace

TORCH_LIBRARY(NAMESPACE, m) {
  m.def("shift(Tensor x, int k=0) -> Tensor");
  m.def("shift.out(Tensor x, int k=0, *, Tensor(a!) out) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) {
  m.impl("shift", &shift_cpu);
  m.impl("shift.out", &shift_out);
}
"""


def _ops(tmp_path: Path, ns: str, shift: int, file: str = "ops.cpp") -> Path:
    src = tmp_path / file
    src.write_text(OPS.replace("NAMESPACE", ns).replace("SHIFT", str(shift)))
    return src


@pytest.mark.parametrize(
    "ours, theirs", [(dropin.load, torch_ext.load), (dropin.load_inline, torch_ext.load_inline)]
)
def test_the_signatures_are_torchs_in_torchs_order(ours: object, theirs: object) -> None:
    mine = [(p.name, p.default) for p in inspect.signature(ours).parameters.values()]  # type: ignore[arg-type]
    torch_params = inspect.signature(theirs).parameters.values()  # type: ignore[arg-type]
    expected = [(p.name, p.default) for p in torch_params]
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 13):
        assert mine == expected  # positional calls land on the same arguments
    else:  # an older torch: a subset of the arguments, in the same order
        assert [m for m in mine if m in expected] == expected


def test_a_library_named_with_a_dash_or_a_dot_loads_as_with_torch(tmp_path: Path) -> None:
    ns = f"wbparity_{os.getpid()}"
    src = _ops(tmp_path, ns, 1)
    # Positionally, in torch's order: extra_ldflags is the sixth, with_sycl the eleventh.
    path = workbench.load(
        "my-ext.v2", [src], ["-O2"], None, None, ["-lm"], None, None, False, False, False, False
    )
    assert isinstance(path, str) and Path(path).name.startswith("my_ext_v2.")
    assert path in torch.ops.loaded_libraries
    torch.testing.assert_close(
        getattr(torch.ops, ns).shift(torch.zeros(2), 2), torch.full((2,), 3.0)
    )
    with pytest.raises(ValueError, match=r"not a Python identifier.*name it 'my_ext'"):
        workbench.load("my-ext", [src])  # a module named my-ext cannot be imported


def test_a_reload_holds_every_overload_of_an_op(tmp_path: Path) -> None:
    ns = f"wboverloads_{os.getpid()}"
    src = _ops(tmp_path, ns, 1)
    workbench.load("wb_overloads", [src], is_python_module=False)
    out_handle = getattr(torch.ops, ns).shift.out
    # The placeholders that keep the ops alive mid-swap hold each overload, op.out included:
    # one held by nothing is freed, and a handle to it then points into freed memory.
    holders = live._hold_ops([ns])
    try:
        for op in ("shift", "shift.out"):
            assert "PrivateUse3" in torch._C._dispatch_dump(f"{ns}::{op}")
    finally:
        for lib in holders:
            lib._destroy()  # type: ignore[attr-defined]
    _ops(tmp_path, ns, 5)
    workbench.load("wb_overloads", [src], is_python_module=False)
    x, out = torch.zeros(2), torch.empty(2)
    out_handle(x, 1, out=out)
    torch.testing.assert_close(out, x + 6)


def test_bad_arguments_raise_torchs_exception_types_naming_the_argument(tmp_path: Path) -> None:
    src = _ops(tmp_path, "unused", 0)
    with pytest.raises(TypeError, match="sources must be a list of paths"):
        workbench.load("ext", None)
    with pytest.raises(TypeError, match="sources must be a list of paths"):
        workbench.load("ext", [src, 3])
    with pytest.raises(ValueError, match="mutually exclusive"):
        workbench.load("ext", [src], is_standalone=True)  # is_python_module defaults to True
    with pytest.raises(ValueError, match="SYCL"):
        workbench.load("ext", [src], with_sycl=True, is_python_module=False)
    with pytest.raises(ValueError, match="SYCL"):
        workbench.load_inline("ext", "", sycl_sources="int x;")
    with pytest.raises(ValueError, match="Expected 'functions' to be a list or dict"):
        workbench.load_inline("ext", "", functions=3)  # type: ignore[arg-type]


def test_build_and_load_failures_are_torchs_types_and_an_undefined_symbol_is_named(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken.cpp"
    broken.write_text("int f() { return 1 +* ; }\n")
    with pytest.raises(RuntimeError) as info:  # torch: RuntimeError("Error building ...")
        workbench.load("wb_broken", [broken], is_python_module=False)
    assert isinstance(info.value, BuildError) and f"{broken}:1:" in str(info.value)
    unresolved = tmp_path / "unresolved.cpp"
    unresolved.write_text("int missing_fn(int);\nint use(int a) { return missing_fn(a); }\n")
    with pytest.raises(OSError) as opened:  # torch.ops.load_library: OSError
        workbench.load("wb_unresolved", [unresolved], is_python_module=False)
    assert isinstance(opened.value, LoadError)
    message = str(opened.value)
    assert "missing_fn(int)" in message and "extra_ldflags" in message
    module = tmp_path / "unresolved_module.cpp"
    module.write_text(
        "#include <Python.h>\nint missing_fn(int);\n"
        'extern "C" PyObject* PyInit_wb_unresolved_module() {\n'
        "  return PyLong_FromLong(missing_fn(1));\n}\n"
    )
    with pytest.raises(ImportError, match=r"missing_fn\(int\).*extra_ldflags"):
        workbench.load("wb_unresolved_module", [module])


PYBIND = """\
#include <pybind11/pybind11.h>
int which() { return WHICH; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("which", &which); }
"""


def test_one_name_loaded_with_other_sources_is_another_extension(tmp_path: Path) -> None:
    a, b = tmp_path / "a.cpp", tmp_path / "b.cpp"
    a.write_text(PYBIND.replace("WHICH", "1"))
    b.write_text(PYBIND.replace("WHICH", "2"))
    first = workbench.load("wb_same_name", [a])
    second = workbench.load("wb_same_name", [b])  # torch: a second module, same_name_v1
    assert (first.which(), second.which()) == (1, 2)  # the first module was not overwritten
    a.write_text(PYBIND.replace("WHICH", "3"))  # an edit of the first still reloads it
    again = workbench.load("wb_same_name", [a])
    assert (first.which(), again.which(), second.which()) == (3, 3, 2)


def test_an_executable_registers_its_torch_library_blocks_as_it_starts(tmp_path: Path) -> None:
    ns = f"wbstandalone_{os.getpid()}"
    src = _ops(tmp_path, ns, 0)
    main = tmp_path / "main.cpp"
    main.write_text(
        "#include <ATen/core/dispatch/Dispatcher.h>\n#include <cstdio>\n"
        f'int main() {{ auto op = c10::Dispatcher::singleton().findSchema({{"{ns}::shift", ""}});\n'
        '  std::puts(op ? "registered" : "missing"); return op ? 0 : 1; }\n'
    )
    exe = workbench.load("wb_exe", [src, main], is_standalone=True, is_python_module=False)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "registered", run.stdout + run.stderr


def test_load_inline_reads_functions_and_implicit_headers_as_torch_does() -> None:
    # No implicit <torch/extension.h>: a global named torch would clash with its namespace.
    source = "#include <pybind11/pybind11.h>\nint torch = 7;\nint seven() { return torch; }\n"
    module = workbench.load_inline(
        "wb_no_implicit",
        source,
        functions={"seven": 'returns "seven"'},
        with_pytorch_error_handling=False,
        no_implicit_headers=True,
    )
    assert module.seven() == 7 and 'returns "seven"' in module.seven.__doc__
    empty = workbench.load_inline(
        "wb_no_functions",
        "#include <pybind11/pybind11.h>\n",
        functions=[],
        no_implicit_headers=True,
    )
    assert [n for n in dir(empty) if not n.startswith("__")] == []  # torch: an empty module


BOTH = """\
#include <ATen/ops/add.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

at::Tensor add1(const at::Tensor& x) { return at::add(x, 1); }
TORCH_LIBRARY(NAMESPACE, m) { m.def("add1(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("add1", &add1); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add1", &add1, "adds one"); }
"""


def test_a_file_with_both_pybind11_and_torch_library_loads_either_way(tmp_path: Path) -> None:
    ns = f"wbboth_{os.getpid()}"
    src = tmp_path / "both.cpp"
    src.write_text(BOTH.replace("NAMESPACE", ns))
    x = torch.zeros(2)
    # As torch's load, a library of ops links torch_python: its pybind11 casters resolve.
    path = workbench.load("wb_both", [src], is_python_module=False)
    assert isinstance(path, str)
    torch.testing.assert_close(getattr(torch.ops, ns).add1(x), x + 1)
    # The same name as a module (one more link): it registers the same namespace, so it takes
    # the library's place instead of registering the namespace twice.
    module = workbench.load("wb_both", [src])
    torch.testing.assert_close(module.add1(x), x + 1)
    torch.testing.assert_close(getattr(torch.ops, ns).add1(x), x + 1)
    assert "adds one" in module.add1.__doc__
    # The notebook's autoreload now reloads only the module load, not the two in turn.
    assert [call[0] for call in dropin._calls.values()].count("wb_both") == 1


def test_ops_loaded_as_a_module_register_and_raise_importerror_naming_the_fix(
    tmp_path: Path,
) -> None:
    ns = f"wbnomodule_{os.getpid()}"
    src = _ops(tmp_path, ns, 0)
    for _ in range(2):  # each call raises, as torch's load does; the ops stay registered
        with pytest.raises(ImportError, match="is_python_module=False"):
            workbench.load("wb_no_module", [src])  # is_python_module defaults to True
        torch.testing.assert_close(
            getattr(torch.ops, ns).shift(torch.zeros(1), 2), torch.full((1,), 2.0)
        )


def test_registration_blocks_in_a_projects_header_reload_in_place(tmp_path: Path) -> None:
    ns = f"wbheader_{os.getpid()}"
    text = OPS.replace("NAMESPACE", ns)
    kernels, blocks = text.split("TORCH_LIBRARY(", 1)
    (tmp_path / "inc" / "ops").mkdir(parents=True)
    (tmp_path / "inc" / "ops" / "blocks.h").write_text('#include "more.h"\n')
    (tmp_path / "inc" / "ops" / "more.h").write_text("TORCH_LIBRARY(" + blocks)
    src = tmp_path / "kernels.cpp"
    x = torch.zeros(1)
    for shift in (1, 4):  # the .cpp never names TORCH_LIBRARY; its header's header does
        src.write_text(kernels.replace("SHIFT", str(shift)) + "#include <ops/blocks.h>\n")
        workbench.load(
            "wb_header", [src], extra_include_paths=[str(tmp_path / "inc")], is_python_module=False
        )
        torch.testing.assert_close(getattr(torch.ops, ns).shift(x), x + shift)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine with no GPU to build for")
def test_cuda_sources_with_nothing_to_build_for_raise_oserror_as_torchs_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = tmp_path / "kernel.cu"
    kernel.write_text("__global__ void k(float* x) { x[0] = 1.0f; }\n")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    with pytest.raises(OSError, match="TORCH_CUDA_ARCH_LIST"):  # torch: OSError (CUDA_HOME)
        workbench.load("wb_no_gpu", [kernel], is_python_module=False)
