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
