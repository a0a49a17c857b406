"""``wb adopt``: an extension's sources become a registry family (tests/data/adopt/).

Three layouts: TORCH_LIBRARY with CPU and CUDA code (tutorial/, in the shape of
pytorch/extension-cpp), a CUDA-only extension in one .cu (cuda_only/), and a CPU-only one with
an inline m.def kernel (cpu_inline/). The CPU families are built by the real compiler and
checked against their references here; the device-only TUs compile with NVRTC and the launchers
with nvcc where those are installed (tests/test_adopt_cuda.py runs them on a GPU).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

import workbench
from workbench import build, device, lister, nvrtc
from workbench.adopt import adopt, plan_sources
from workbench.adopt.lexer import tokenize
from workbench.adopt.parse import parse
from workbench.cli import main
from workbench.config import make_config
from workbench.project import discover

DATA = Path(__file__).parent / "data" / "adopt"
TUTORIAL = [DATA / "tutorial" / "muladd.cpp", DATA / "tutorial" / "muladd.cu"]
CUDA_ONLY = [DATA / "cuda_only" / "scale_rows.cu"]
CPU_INLINE = [DATA / "cpu_inline" / "relu.cpp"]
CUDA_SPLIT = [DATA / "cuda_split" / "ops.cpp", DATA / "cuda_split" / "ops.cu"]
REFS = "adopt_refs"
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")


@pytest.fixture
def refs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DATA / "references"))


def files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_tutorial_layout_splits_into_kernel_launcher_binding_and_spec(tmp_path: Path) -> None:
    before = {p: p.read_bytes() for p in TUTORIAL}
    done = adopt(TUTORIAL, "tut", tmp_path / "kernels")
    got = files(tmp_path)
    assert set(got) == {
        "kernels/tut/tut.kernel.cu",
        "kernels/tut/tut.h",
        "kernels/tut/tut.cu",
        "kernels/tut/tut.cpp",
        "kernels/tut/spec.py",
        "bindings/tut.cpp",
    }
    assert done.ops == ["mymuladd", "mymul", "myadd_out"] and done.namespace == "tutorial_ext"
    assert all(p.read_bytes() == data for p, data in before.items())  # the sources stay
    kernel = got["kernels/tut/tut.kernel.cu"]
    for name in ("muladd_kernel", "mul_kernel", "add_kernel"):
        assert f"__global__ void {name}(" in kernel
    code = "\n".join(line for line in kernel.splitlines() if not line.startswith("//"))
    assert "torch" not in code and "at::" not in code and "#include <" not in code
    launcher = got["kernels/tut/tut.cu"]
    assert (
        'WB_DEVICE_TEMPLATE(k_muladd_kernel, "tut.kernel.cu", "tutorial_ext::muladd_kernel")'
        in (launcher)
    )
    binding = got["bindings/tut.cpp"]
    assert ">>>(" not in binding and "__global__" not in binding
    assert 'WB_DEF("myadd_out(Tensor a, Tensor b, Tensor(a!) out) -> ()");' in binding
    assert "WB_IMPL(CPU, m)" in binding and "WB_IMPL(CUDA, m)" in binding
    code = "\n".join(line for line in binding.splitlines() if not line.startswith("//"))
    assert "TORCH_LIBRARY" not in code
    assert "launch_muladd_kernel(::wb_adopt_config((numel + 255) / 256, 256)" in binding
    assert "PyInit__C" not in binding and "Python.h" not in binding
    assert done.dropped == [f"{TUTORIAL[0]}:12: PyInit__C (the Python module stub)"]
    # The torch-free CPU loop moves to tut.cpp, declared in tut.h; the ops on at::Tensor stay.
    assert "void muladd_loop(const float* a" in got["kernels/tut/tut.cpp"]
    assert (
        "void muladd_loop(const float* a, const float* b, float c, float* out, int64_t n);"
        in (got["kernels/tut/tut.h"])
    )
    assert "void muladd_loop" not in binding and "muladd_loop(a_ptr, b_ptr" in binding
    # The CUDA host code builds only with CUDA; the CPU code always.
    cuda_part = binding.split("#ifdef WB_WITH_CUDA")[-1]
    assert "mymuladd_cuda" in cuda_part and "mymuladd_cpu" not in cuda_part


def test_a_cuda_only_extension_shares_its_constants_and_keeps_device_helpers(
    tmp_path: Path,
) -> None:
    adopt(CUDA_ONLY, "rows", tmp_path / "kernels")
    got = files(tmp_path)
    shared = got["kernels/rows/rows_shared.h"]
    assert "constexpr int kThreads = 128;" in shared  # the launch and the kernel's bounds
    kernel = got["kernels/rows/rows.kernel.cu"]
    assert '#include "rows/rows_shared.h"' in kernel
    assert "#define ROW_FACTOR(r)" in kernel  # a macro only device code uses
    assert "__device__ __forceinline__ T scaled(" in kernel
    assert "kThreads = 128" not in kernel + got["bindings/rows.cpp"]
    header = got["kernels/rows/rows.h"]
    assert "template <typename scalar_t>\nStatus launch_scale_rows_kernel(" in header
    assert "wb::kernel<&k_scale_rows_kernel, scalar_t>" in header
    binding = got["bindings/rows.cpp"]
    assert "launch_scale_rows_kernel<scalar_t>(::wb_adopt_config(grid, kThreads, 0), " in binding
    assert "::wb_adopt_stream(c10::cuda::getCurrentCUDAStream())" in binding
    assert (
        'WB_DEF("scale_rows(Tensor x, float s) -> Tensor");'
        in binding.split("#ifdef")[0] + (binding.split("#endif")[1])
    )
    assert 'WB_IMPL(CUDA, m) { m.impl("scale_rows", TORCH_FN(scale_rows_cuda)); }' in binding
    spec = got["kernels/rows/spec.py"]
    assert "devices=('cuda',)" in spec and "(torch.float32, torch.float64)" in spec


def test_a_conditional_inside_a_declaration_stays_in_it(tmp_path: Path) -> None:
    """An #if group inside a statement (an arch- or option-dependent constant, an optional
    parameter) belongs to the statement: its first branch is read, the statement ends after the
    #endif, and adopt carries the group over verbatim."""
    text = (
        "template <typename T>\nconstexpr bool kPacked =\n#if defined(__CUDA_ARCH__) && "
        "__CUDA_ARCH__ < 800\n    false;\n#else\n    sizeof(T) == 2;\n#endif\n"
        "__global__ void k(float* x\n#ifdef WIDE\n    , float* y\n#endif\n) { x[0] = 1; }\n"
        "static const int kB =\n#if A\n#if B\n  1;\n#else\n  2;\n#endif\n#elif C\n  3;\n"
        "#else\n  4;\n#endif\nint z = 2;\n"
    )
    unit = parse(tmp_path / "c.cu", text)
    got = [(it.kind, it.names[0], text[it.start : it.end]) for it in unit.items]
    assert [(kind, name) for kind, name, _ in got] == [
        ("declaration", "kPacked"), ("function", "k"), ("declaration", "kB"),
        ("declaration", "z"),
    ]  # fmt: skip
    assert got[0][2].endswith("sizeof(T) == 2;\n#endif") and got[2][2].endswith("4;\n#endif")
    assert got[1][2].endswith(") { x[0] = 1; }")
    source = tmp_path / "scale_rows.cu"
    original = CUDA_ONLY[0].read_text()
    line = "constexpr int kThreads = 128;"
    assert line in original
    group = "constexpr int kThreads =\n#ifdef WIDE_ROWS\n    256;\n#else\n    128;\n#endif"
    source.write_text(original.replace(line, group))
    adopt([source], "rows", tmp_path / "kernels")
    assert group in (tmp_path / "kernels/rows/rows_shared.h").read_text()


def test_an_inline_def_becomes_a_composite_kernel(tmp_path: Path) -> None:
    adopt(CPU_INLINE, "cpuin", tmp_path / "kernels")
    got = files(tmp_path)
    binding = got["bindings/cpuin.cpp"]
    assert 'WB_IMPL(CompositeExplicitAutograd, m) { m.impl("myrelu", &myrelu); }' in binding
    assert "kernels/cpuin/cpuin.kernel.cu" not in got  # no kernels: no device-only TU
    assert "devices=('cpu', 'cuda')" in got["kernels/cpuin/spec.py"]


def test_a_forward_declared_kernel_gets_one_launcher_and_a_meta_kernel_no_device(
    tmp_path: Path,
) -> None:
    source = tmp_path / "fwd.cu"
    source.write_text(
        "#include <torch/extension.h>\n"
        "__global__ void twice_kernel(float* x, int n);\n"
        "at::Tensor twice_cuda(const at::Tensor& x_in) {\n"
        "  at::Tensor x = x_in.clone();\n"
        "  twice_kernel<<<1, 128>>>(x.data_ptr<float>(), static_cast<int>(x.numel()));\n"
        "  return x;\n"
        "}\n"
        "at::Tensor twice_meta(const at::Tensor& x) { return at::empty_like(x); }\n"
        "__global__ void twice_kernel(float* x, int n) {\n"
        "  int i = threadIdx.x;\n"
        "  if (i < n) x[i] *= 2;\n"
        "}\n"
        'TORCH_LIBRARY(fwd, m) { m.def("twice(Tensor x) -> Tensor"); }\n'
        'TORCH_LIBRARY_IMPL(fwd, CUDA, m) { m.impl("twice", &twice_cuda); }\n'
        'TORCH_LIBRARY_IMPL(fwd, Meta, m) { m.impl("twice", &twice_meta); }\n'
    )
    adopt([source], "fwd", tmp_path / "kernels")
    got = files(tmp_path)
    assert got["kernels/fwd/fwd.cu"].count("WB_DEVICE_TEMPLATE(") == 1
    kernel = got["kernels/fwd/fwd.kernel.cu"]
    assert kernel.index("void twice_kernel(float* x, int n);") < kernel.index("x[i] *= 2")
    assert "devices=('cuda',)" in got["kernels/fwd/spec.py"]
    assert "WB_IMPL(Meta, m)" in got["bindings/fwd.cpp"]


def test_the_lexer_reads_braces_in_comments_strings_and_raw_strings() -> None:
    text = '// {\n/* } */ const char* s = "}{";\nauto r = R"x(})x";\nk<<<1, 2>>>(a);\n'
    toks = tokenize(text)
    assert [t.text for t in toks if t.kind == "punct" and t.text in "{}"] == []
    assert ("<<<", 4) in [(t.text, t.line) for t in toks] and ">>>" in [t.text for t in toks]
    assert [t.kind for t in toks if t.text.startswith(("R", '"'))] == ["string", "string"]


def test_the_reader_reads_every_cpp_and_cuda_source_of_the_registry() -> None:
    root = Path(__file__).parent.parent
    sources = [
        p
        for folder in ("kernels", "bindings", "tests/data")
        for p in sorted((root / folder).rglob("*"))
        if p.suffix in (".cu", ".cuh", ".cpp", ".h")
    ]
    assert len(sources) > 50
    for path in sources:
        unit = parse(path, path.read_text())
        assert unit.items or not path.read_text().strip(), path


def test_a_lambda_kernel_in_a_registration_is_kept_whole(tmp_path: Path) -> None:
    source = tmp_path / "lam.cpp"
    source.write_text(
        "#include <torch/extension.h>\n"
        'TORCH_LIBRARY(lam, m) { m.def("neg(Tensor x) -> Tensor"); }\n'
        "TORCH_LIBRARY_IMPL(lam, CPU, m) {\n"
        '  m.impl("neg", [](const at::Tensor& x) { auto y = -x; return y; });\n'
        "}\n"
    )
    adopt([source], "lam", tmp_path / "kernels")
    binding = (tmp_path / "bindings" / "lam.cpp").read_text()
    assert "WB_IMPL(CPU, m) {" in binding and "auto y = -x; return y; });" in binding


def test_stubs_of_a_python_module_are_left_out_and_named(tmp_path: Path) -> None:
    source = tmp_path / "stubs.cpp"
    source.write_text(
        "#include <torch/extension.h>\n"
        "std::tuple<at::Tensor, at::Tensor> pair(const at::Tensor& x) { return {x, x}; }\n"
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}\n"
        "TORCH_LIBRARY(stubs, m) {\n"
        '  m.impl_abstract_pystub("stubs.ops");\n'
        '  m.def("pair(Tensor x) -> (Tensor, Tensor)");\n'
        "}\n"
        'TORCH_LIBRARY_IMPL(stubs, CPU, m) { m.impl("pair", &pair); }\n'
    )
    done = adopt([source], "stubs", tmp_path / "kernels")
    assert done.dropped == [
        f"{source}:3: PYBIND11_MODULE (an empty pybind11 module, which only names the library)",
        f"{source}:5: m.impl_abstract_pystub (fakes and autograd come from spec.py)",
    ]
    binding = (tmp_path / "bindings" / "stubs.cpp").read_text()
    assert "PYBIND11" not in binding and "pystub" not in binding
    spec = (tmp_path / "kernels" / "stubs" / "spec.py").read_text()
    namespace: dict[str, object] = {}
    exec(compile(spec, "spec.py", "exec"), namespace)
    (op,) = namespace["OPS"]  # type: ignore[misc]
    assert [t.shape for t in op.fake(torch.ones(3))] == [(3,), (3,)]


def test_cpu_layouts_build_and_pass_wb_check(
    tmp_path: Path, refs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = tmp_path / "kernels"
    tut = [f"{op}={REFS}:{op}" for op in ("mymuladd", "mymul", "myadd_out")]
    assert main(["adopt", *map(str, TUTORIAL), "--name", "tut", "--kernels", str(kernels),
                 *(f"--reference={r}" for r in tut)]) == 0  # fmt: skip
    assert main(["adopt", *map(str, CPU_INLINE), "--name", "cpuin", "--kernels", str(kernels),
                 "--reference", f"myrelu={REFS}:myrelu",
                 "--reference", f"myaxpy={REFS}:myaxpy"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"next: `wb --kernels {kernels} check myrelu myaxpy`" in out and "left out:" in out
    ns = f"adopt{os.getpid()}"
    lib = workbench.load(kernels, namespace=ns, devices="cpu")
    for op in ("mymuladd", "mymul", "myrelu", "myaxpy"):
        report = workbench.check(op, lib=lib, device="cpu")
        assert report.passed, (op, [str(r) for r in report.failures])
    # The command adopt prints, from the terminal (myadd_out's out must be contiguous: its
    # samples' strided out fails the op's own check, so the terminal run checks cpuin's ops).
    assert main(["check", "myrelu", "myaxpy", "--kernels", str(kernels), "--namespace", ns,
                 "--device", "cpu"]) == 0  # fmt: skip


def test_a_stub_reference_says_what_to_fill_in(tmp_path: Path) -> None:
    adopt(CPU_INLINE, "cpuin", tmp_path / "kernels")
    spec = (tmp_path / "kernels" / "cpuin" / "spec.py").read_text()
    namespace: dict[str, object] = {}
    exec(compile(spec, "spec.py", "exec"), namespace)  # the generated spec is valid Python
    ops = namespace["OPS"]
    assert [o.name for o in ops] == ["myrelu", "myaxpy"]  # type: ignore[attr-defined]
    with pytest.raises(NotImplementedError, match="write the reference of myrelu"):
        ops[0].reference(None)  # type: ignore[index]


def test_adopt_never_overwrites_a_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = tmp_path / "kernels"
    (tmp_path / "bindings").mkdir()
    existing = tmp_path / "bindings" / "tut.cpp"
    existing.write_text("// mine\n")
    argv = ["adopt", *map(str, TUTORIAL), "--name", "tut", "--kernels", str(kernels)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "would overwrite" in err and str(existing) in err and "nothing was written" in err
    assert existing.read_text() == "// mine\n" and not (kernels / "tut").exists()
    existing.unlink()
    assert main(argv) == 0
    before = files(tmp_path)
    assert main(argv) == 2  # a second adopt of the same name
    assert files(tmp_path) == before


def test_bad_arguments_name_the_argument_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = tmp_path / "kernels"
    cases = [
        (["--name", "class"], "op family name 'class'"),
        (["--name", "tut", "--reference", "mymul=no_such_module_xyz:f"], "cannot import"),
        (["--name", "tut", "--reference", "mymul"], "module:function"),
        (["--name", "tut", "--reference", "os:getcwd"], "names no op"),
    ]
    for extra, message in cases:
        assert main(["adopt", *map(str, TUTORIAL), "--kernels", str(kernels), *extra]) == 2
        assert message in capsys.readouterr().err, extra
    assert main(["adopt", str(tmp_path / "missing.cu"), "--name", "x", "--kernels",
                 str(kernels)]) == 2  # fmt: skip
    assert "missing.cu" in capsys.readouterr().err
    assert not kernels.exists() and not (tmp_path / "bindings").exists()


@needs_nvrtc
@pytest.mark.nvcc
def test_the_launchers_compile_with_nvcc_and_the_kernels_with_nvrtc(tmp_path: Path) -> None:
    kernels = tmp_path / "kernels"
    adopt(TUTORIAL, "tut", kernels)
    adopt(CUDA_ONLY, "rows", kernels)
    adopt(CUDA_SPLIT, "split", kernels)
    project = discover(kernels)
    config = make_config(archs=("sm_90a",), link=False)
    # The older split: the .cpp registers a CUDA kernel its .cu defines; the binding's CPU-only
    # build leaves that registration out, and the kernel (static, in an anonymous namespace)
    # keeps a name the launcher can look up.
    split = project.family("split")
    built = build.ensure(project, split, config)
    assert lister.listed_kernels(project, split, config, built) == [
        ("split.kernel.cu", "split_ext::split_local::square_kernel")
    ]
    device.ensure(project, split, config, lister.listed_kernels(project, split, config, built))
    tut = project.family("tut")
    built = build.ensure(project, tut, config)  # tut.cu by nvcc, the binding CPU-only
    listed = lister.listed_kernels(project, tut, config, built)
    assert sorted(listed) == sorted(
        ("tut.kernel.cu", f"tutorial_ext::{k}")
        for k in ("muladd_kernel", "mul_kernel", "add_kernel")
    )
    (module,) = device.ensure(project, tut, config, listed)
    assert module.file == "tut.kernel.cu" and module.images
    # A template kernel: the binding instantiates the launcher for float and double
    # (AT_DISPATCH_FLOATING_TYPES); those are the names NVRTC compiles.
    rows = project.family("rows")
    names = [("rows.kernel.cu", f"rows_ext::scale_rows_kernel<{t}>") for t in ("float", "double")]
    (module,) = device.ensure(project, rows, config, names)
    assert len(module.images) >= 1
    # The template launcher in rows.h, instantiated as bindings/rows.cpp does (by the host
    # compiler, which compiles the binding).
    use = tmp_path / "use.cpp"
    use.write_text(
        '#include "rows/rows.h"\n'
        "auto* f = &wb::rows_family::launch_scale_rows_kernel<float>;\n"
        "auto* d = &wb::rows_family::launch_scale_rows_kernel<double>;\n"
    )
    includes = [f"-I{d}" for d in project.include_dirs]
    subprocess.run(
        [str(config.cxx), "-std=c++17", "-fsyntax-only", *includes, str(use)], check=True
    )


def test_the_plan_of_a_launch_keeps_its_arguments_and_configuration() -> None:
    plan = plan_sources(CUDA_ONLY)
    (launch,) = plan.launches
    assert launch.kernel.name == "scale_rows_kernel" and launch.targs == "scalar_t"
    assert launch.config == ["grid", "kThreads", "0", "c10::cuda::getCurrentCUDAStream()"]
    assert launch.args.startswith("x.data_ptr<scalar_t>()")


@pytest.mark.nvcc
def test_the_bindings_cuda_half_compiles_against_the_cuda_headers(tmp_path: Path) -> None:
    """The host code of the .cu sources, launches rewritten, as a CUDA build compiles it
    (-DWB_WITH_CUDA, the CUDA toolkit's headers). A CPU build of torch ships the c10/cuda headers
    but not the one CMake writes for CUDA builds, which only sets export macros: an empty one
    stands in for it here; on a CUDA host tests/test_adopt_cuda.py builds the whole library."""
    kernels = tmp_path / "kernels"
    adopt(TUTORIAL, "tut", kernels)
    adopt(CUDA_ONLY, "rows", kernels)
    project = discover(kernels)
    config = make_config(archs=("sm_90a",), link=False)
    torch_include = [Path(f[len("-isystem") :]) for f in config.torch_flags if "-isystem" in f]
    if not any((d / "c10" / "cuda" / "CUDAStream.h").is_file() for d in torch_include):
        pytest.skip("this torch ships no c10/cuda headers")
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    stub.parent.mkdir(parents=True)
    stub.write_text("#pragma once\n")
    assert config.cuda_home is not None
    procs = []
    for family in ("tut", "rows"):
        cmd = [
            str(config.cxx),
            *config.torch_flags,
            f"-isystem{config.cuda_home / 'include'}",
            f"-isystem{tmp_path / 'stub'}",
            "-DWB_WITH_CUDA",
            *(f"-I{d}" for d in (*project.include_dirs, *project.binding_include_dirs)),
            "-fsyntax-only",
            str(project.bindings_dir / f"{family}.cpp"),
        ]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate()
        assert p.returncode == 0, out.decode()[-4000:]
