"""Precompiled torch headers for drop-in C++ sources: which sources get one, that a header is
keyed by the flags (and shared across extension names), made at the first edit and read by the
compiles after it, and that a header GCC rejects costs time, never a wrong build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import workbench
from workbench import knobs
from workbench.cli import main as wb
from workbench.compat import dropin, pch
from workbench.errors import BuildError

SOURCE = """\
// A TORCH_LIBRARY source whose first include is a torch header.
#include <torch/library.h>
#include <ATen/ops/add.h>

at::Tensor bump_cpu(const at::Tensor& x) { return at::add(x, STEP); }
TORCH_LIBRARY(NAMESPACE, m) { m.def("bump(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("bump", &bump_cpu); }
"""


@pytest.mark.parametrize(
    ("text", "header", "why"),
    [
        ("#include <torch/extension.h>\nint x;", "torch/extension.h", ""),
        ("// c\n/* a\n block */\n#pragma once\n#include <ATen/ATen.h>\n", "ATen/ATen.h", ""),
        ("  #  include <torch/all.h>\n", "torch/all.h", ""),
        ("#define NDEBUG\n#include <torch/extension.h>\n", None, "starts with #define"),
        ("#include <vector>\n#include <torch/extension.h>\n", None, "(<vector>) is not a torch"),
        ('#include "torch/extension.h"\n', None, "is not a torch header"),
        ("int f();\n#include <torch/extension.h>\n", None, "first line is code"),
        ("", None, "includes no torch header"),
    ],
)
def test_which_sources_get_a_header(text: str, header: str | None, why: str) -> None:
    found, reason = pch.leading_header(text)
    assert found == header and why in reason


def _head(name: str, *extra: str) -> list[str]:
    include = Path(torch.__file__).parent / "include"
    return ["g++", f"-DTORCH_EXTENSION_NAME={name}", f"-isystem{include}", "-std=c++17", *extra]


def test_the_key_is_every_flag_but_the_extension_name(tmp_path: Path) -> None:
    src = tmp_path / "a.cpp"
    src.write_text("#include <torch/library.h>\n")
    ident = {"cxx": "g++ (test)"}
    text = src.read_text()
    first, _ = pch.plan(text, _head("one"), ident)
    other_name, _ = pch.plan(text, _head("two"), ident)
    other_flags, _ = pch.plan(text, _head("one", "-O1"), ident)
    other_tool, _ = pch.plan(text, _head("one"), {"cxx": "g++ (another)"})
    assert first is not None and other_name is not None and other_flags is not None
    assert other_tool is not None
    assert first.folder == other_name.folder  # one header for every extension of a script
    assert first.folder != other_flags.folder and first.folder != other_tool.folder
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME") for f in first.command)
    assert first.real.is_file() and first.real.name == "library.h"
    assert pch.plan("#include <torch/nosuch.h>\n", _head("one"), ident) == (
        None,
        "torch/nosuch.h is not on its include path",
    )


def _uses_header(unit: dropin.Unit, tmp: Path) -> bool:
    """Compile ``unit`` with -H: GCC marks a precompiled header it reads with '!'."""
    cmd = [part.replace(dropin.OUT, str(tmp / "probe.o")) for part in unit.command]
    proc = subprocess.run([*cmd, "-H"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert unit.pch is not None
    return f"! {unit.pch.output}" in proc.stderr


def test_an_edit_makes_the_header_and_the_next_compiles_read_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    ns = f"wbpch{os.getpid()}"
    src = tmp_path / "bump.cpp"

    def load(step: int) -> None:
        src.write_text(SOURCE.replace("NAMESPACE", ns).replace("STEP", str(step)))
        workbench.load(ns, [str(src)], is_python_module=False, verbose=True)
        x = torch.zeros(2)
        torch.testing.assert_close(getattr(torch.ops, ns).bump(x), x + step)

    load(1)  # a first compile makes no header
    capfd.readouterr()
    assert wb(["why", str(src)]) == 0
    said = capfd.readouterr().out
    assert said.startswith("bump.cpp: last compiled ") and f"(drop-in {ns})" in said
    assert "it includes torch/library.h, ATen/ops/add.h" in said
    assert "not made yet: it is made at the source's first edit" in said
    options = dict(extra_cflags=[], extra_cuda_cflags=[], extra_ldflags=[], extra_include_paths=[])
    (unit, _) = dropin.recipe(ns, [src], with_cuda=False, python_module=False, **options).units
    assert unit.pch is not None and unit.pch.include == "torch/library.h"
    assert not unit.pch.output.exists()
    load(2)  # an edit: the header, then the compile that reads it
    assert unit.pch.output.exists()
    assert "precompiling torch/library.h for the next edits" in capfd.readouterr().out
    made = unit.pch.output.stat().st_mtime_ns
    load(3)
    assert unit.pch.output.stat().st_mtime_ns == made  # made once
    assert _uses_header(unit, tmp_path)
    capfd.readouterr()
    assert wb(["why", str(src)]) == 0
    assert "with the precompiled torch/library.h" in capfd.readouterr().out

    # A header GCC cannot use (damaged here; a changed flag or macro alike): it says so and
    # compiles the header's text, with the same result.
    unit.pch.output.write_bytes(b"not a precompiled header")
    assert not _uses_header(unit, tmp_path)
    load(4)
    load(5)


def test_a_source_that_cannot_use_a_header_says_why_once(tmp_path: Path) -> None:
    src = tmp_path / "lead.cpp"
    text = "#define STEP 1\n" + SOURCE.replace("NAMESPACE", f"wbnopch{os.getpid()}")
    src.write_text(text.replace("at::add(x, STEP)", "at::add(x, STEP + 0)"))
    script = (
        "import sys, workbench\n"
        "from pathlib import Path\n"
        "src = Path(sys.argv[1])\n"
        "for k in (1, 2):\n"
        "    src.write_text(src.read_text().replace(f'STEP + {k - 1}', f'STEP + {k}'))\n"
        "    workbench.load('lead_ext', [str(src)], is_python_module=False)\n"
    )
    env = {**os.environ, "WB_CACHE_DIR": str(knobs.cache_dir()), "WB_QUIET": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(src)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "no precompiled torch header" in ln]
    assert said == [
        "wb: lead_ext: lead.cpp: no precompiled torch header: it starts with #define, which "
        "could change what the header means"
    ]
    why = subprocess.run(
        [sys.executable, "-m", "workbench", "why", str(src)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert why.returncode == 0, why.stderr
    assert "no precompiled header: it starts with #define" in why.stdout
    assert "make the torch header the source's first include" in why.stdout


UMBRELLA = """\
#include <torch/extension.h>

at::Tensor twice_cpu(const at::Tensor& x) { return x * 2 + STEP + EXTRA; }
TORCH_LIBRARY(NAMESPACE, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("twice", &twice_cpu); }
"""


@pytest.mark.parametrize(
    ("text", "lean", "beyond"),
    [
        (UMBRELLA, True, None),
        ("#include <torch/torch.h>\nat::Tensor f(at::Tensor x) { return torch::relu(x); }\n",
         True, None),
        ("#include <torch/library.h>\n", False, None),  # not an umbrella: read whole already
        (UMBRELLA + "PYBIND11_MODULE(m, mod) {}\n", False, "PYBIND11_MODULE"),
        (UMBRELLA + "void g(py::object o) {}\n", False, "py::"),
        (UMBRELLA + "auto l = torch::nn::Linear(2, 2);\n", False, "torch::nn"),
        (UMBRELLA + "// torch::nn in a comment is no use\n", True, None),
        (UMBRELLA + "struct F : torch::autograd::Function<F> {};\n", True, None),
    ],
)  # fmt: skip
def test_which_sources_get_the_lean_form(text: str, lean: bool, beyond: str | None) -> None:
    ident = {"cxx": "g++ (test)"}
    api = Path(torch.__file__).parent / "include/torch/csrc/api/include"  # torch/torch.h's
    head = _head("one", f"-isystem{api}")
    full, _ = pch.plan(text, head, ident)
    assert full is not None
    slim = pch.lean(full, text, head, ident)
    assert (slim is not None) == lean
    assert pch.beyond_lean(text) == beyond
    if slim is not None:
        assert slim.lean[: len(pch.LEAN)] == pch.LEAN
        assert (pch.LEAN_AUTOGRAD in slim.lean) == ("autograd" in text)
        assert slim.include == full.include and slim.folder != full.folder
        assert slim.output.name == f"{full.include.rsplit('/', 1)[1]}.gch"


def test_an_umbrella_source_reads_the_lean_header_and_falls_back_to_the_whole(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    ns = f"wblean{os.getpid()}"
    src = tmp_path / "twice.cpp"
    options = dict(extra_cflags=[], extra_cuda_cflags=[], extra_ldflags=[], extra_include_paths=[])

    def load(step: int, extra: str = "0") -> dropin.Unit:
        text = UMBRELLA.replace("NAMESPACE", ns).replace("STEP", str(step))
        src.write_text(text.replace("EXTRA", extra))
        workbench.load(ns, [str(src)], is_python_module=False)
        x = torch.ones(2)
        torch.testing.assert_close(getattr(torch.ops, ns).twice(x), x * 2 + step)
        units = dropin.recipe(ns, [src], with_cuda=False, python_module=False, **options).units
        return next(u for u in units if u.source == src)  # the rest are the workbench's own

    load(1)
    unit = load(2)  # the first edit makes the lean header
    assert unit.pch is not None and unit.pch.lean and unit.pch.output.exists()
    stand_in = (unit.pch.folder / "torch/extension.h").read_text()
    assert all(f"#include <{h}>" in stand_in for h in pch.LEAN)
    assert pch.LEAN_AUTOGRAD not in stand_in  # the source names no C++ autograd
    assert unit.fallback is not None and unit.refused is not None and not unit.refused.exists()
    unit = load(3)
    assert _uses_header(unit, tmp_path)
    capfd.readouterr()
    assert wb(["why", str(src)]) == 0
    assert "with the precompiled torch/extension.h (its lean form: ATen/ATen.h" in (
        capfd.readouterr().out
    )

    # torch::kSum is declared by torch/enum.h, which only the whole header includes, and no
    # scan names it: the lean compile fails, the same step compiles with the whole header.
    unit = load(4, "(int(sizeof(torch::kSum)) - 1)")
    assert unit.refused is not None and unit.refused.exists()
    assert "kSum" in unit.refused.read_text()  # the lean compile's error, kept
    assert unit.fallback is None and unit.pch is not None and not unit.pch.lean
    capfd.readouterr()
    assert wb(["why", str(src)]) == 0
    assert "its lean form did not compile this source" in capfd.readouterr().out
    load(5, "(int(sizeof(torch::kSum)) - 1)")  # the whole header from now on

    # A real error: both compiles fail, the error is the whole header's, and nothing is kept.
    src.write_text(src.read_text().replace("return x * 2", "return x * * 2"))
    with pytest.raises(BuildError, match=r"twice\.cpp:3"):
        workbench.load(ns, [str(src)], is_python_module=False)


def test_a_fallback_step_shows_the_first_commands_warnings_or_the_seconds_errors(
    tmp_path: Path,
) -> None:
    from workbench import ninja

    def job(name: str, first: str, second: str) -> ninja.Job:
        out = tmp_path / f"{name}.o"
        (tmp_path / f"{name}.cpp").touch()
        refused = str(tmp_path / "refused" / name)
        return ninja.Job(out, tmp_path / f"{name}.cpp", ("sh", "-c", first), None,
                         ("sh", "-c", second), refused)  # fmt: skip

    ok = job("ok", "echo first-warning >&2; touch ok.o", "echo second >&2; exit 1")
    ran = ninja.run(tmp_path, [ok], 1)
    assert "first-warning" in "".join(ran.tu_output.values())
    assert not Path(str(ok.refused)).exists()
    back = job("back", "echo lean-error >&2; exit 1", "touch back.o")
    ninja.run(tmp_path, [back], 1)
    assert Path(str(back.refused)).read_text().strip() == "lean-error"
    both = job("both", "echo lean-error >&2; exit 1", "echo whole-error >&2; exit 1")
    with pytest.raises(BuildError) as failed:
        ninja.run(tmp_path, [both], 1)
    said = str(failed.value)  # the summary of the compiler's output (the log has the command)
    assert "whole-error" in said and "lean-error" not in said
    assert not Path(str(both.refused)).exists()
