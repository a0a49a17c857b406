"""``wb adopt`` refuses what it cannot split safely: it names file:line and the construct, says
what to move by hand, and writes nothing (tests/data/adopt/pybind and refused/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main

DATA = Path(__file__).parent / "data" / "adopt"

CASES = [
    # (source, line, what the message names)
    ("pybind/square.cpp", 6, "pybind11 module PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)"),
    ("refused/macro_global.cu", 4, "macro 'DEFINE_FILL' hides a __global__ function"),
    ("refused/shared_template.cu", 4, "template 'clamp_to' shared across host and device"),
    ("refused/no_registration.cpp", 1, "no TORCH_LIBRARY or PYBIND11_MODULE in any source"),
    ("refused/accessor_kernel.cu", 4, "device code 'negate_kernel' uses torch::PackedTensor"),
]


@pytest.mark.parametrize(("source", "line", "construct"), CASES)
def test_a_refused_construct_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, line: int, construct: str
) -> None:
    kernels = tmp_path / "kernels"
    path = DATA / source
    assert main(["adopt", str(path), "--name", "adopted", "--kernels", str(kernels)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: {construct}" in err, err
    assert "wb adopt wrote nothing" in err and "by hand" in err
    assert not kernels.exists() and not (tmp_path / "bindings").exists()


def _adopt_text(tmp_path: Path, name: str, text: str) -> str:
    source = tmp_path / name
    source.write_text(text)
    code = main(["adopt", str(source), "--name", "x", "--kernels", str(tmp_path / "k")])
    assert code == 2 and not (tmp_path / "k").exists()
    return str(source)


REGISTER = 'TORCH_LIBRARY(e, m) { m.def("f(Tensor x) -> Tensor"); }\n'


@pytest.mark.parametrize(
    ("text", "line", "construct"),
    [
        # a kernel under #if: adopt does not split preprocessor conditionals
        ("#if 1\n__global__ void k(float* x) {}\n#endif\n" + REGISTER, 2, "inside an #if block"),
        # a host function called from a kernel
        (
            "float h(float v) { return v; }\n__global__ void k(float* x) { x[0] = h(x[0]); }\n"
            + REGISTER,
            1,
            "host function or variable 'h', used by device code 'k'",
        ),
        # a kernel handed to a CUDA API instead of launched
        (
            "__global__ void k(float* x) {}\nvoid g() { cudaFuncSetAttribute(k, 0, 0); }\n"
            + REGISTER,
            2,
            "kernel 'k' named by host code other than in a <<<...>>> launch",
        ),
        # a user header adopt would have to move
        ('#include "mine.h"\n' + REGISTER, 1, '#include "mine.h"'),
        # a registration body adopt does not read
        ('TORCH_LIBRARY(e, m) { m.class_<int>("C"); }\n', 1, "in TORCH_LIBRARY"),
        # a half-precision dispatch into a template kernel
        (
            "template <typename T> __global__ void k(T* x) {}\n"
            'void g(at::Tensor t) { AT_DISPATCH_FLOATING_TYPES_AND_HALF(t.scalar_type(), "g", [&] {'
            " k<scalar_t><<<1, 1>>>(t.data_ptr<scalar_t>()); }); }\n" + REGISTER,
            2,
            "launched under a dtype dispatch that includes c10::Half",
        ),
        # a statement begun in one branch of a group and ended after it
        (
            "#if A\nint x =\n#else\nint x =\n#endif\n 1;\n" + REGISTER,
            3,
            "inside a declaration: #else",
        ),
        # an unterminated comment: the reader cannot go on
        ("/* never closed\n" + REGISTER, 1, "unterminated comment"),
    ],
)
def test_constructs_of_one_source_are_refused_with_their_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, construct: str
) -> None:
    source = _adopt_text(tmp_path, "ext.cu", text)
    err = capsys.readouterr().err
    assert f"{source}:{line}: " in err and construct in err, err


def test_a_source_that_is_not_cpp_or_cuda_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = tmp_path / "ops.h"
    header.write_text(REGISTER)
    assert main(["adopt", str(header), "--name", "x", "--kernels", str(tmp_path / "k")]) == 2
    assert "adopt reads C++ and CUDA sources" in capsys.readouterr().err
