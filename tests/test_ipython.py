"""The notebook extension in a real IPython shell: kernel cells, compile errors mapped to cell
lines, hot reload of an edited cell, autoreload of a file edited on disk, the Library display."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("IPython")

from IPython.core.interactiveshell import InteractiveShell

from workbench.ipython import CellCompileError

HOST = """\
#include <ATen/ops/add.h>
#include "wb/binding.h"

WB_DEF("bump(Tensor x) -> Tensor");

static at::Tensor bump(const at::Tensor& x) { return at::add(x, BUMP); }

WB_IMPL(CPU, m) { m.impl("bump", &bump); }
"""


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Any]:
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "workbench")
    ns = f"nbtest_{os.getpid()}_{len(os.listdir(tmp_path.parent))}"
    ip.run_line_magic("wb_registry", f"{tmp_path / 'reg'} --namespace {ns}")
    ip.user_ns["wb_ns"] = ns
    yield ip
    ip.run_line_magic("unload_ext", "workbench")


def _ops(ip: Any) -> Any:
    return getattr(torch.ops, ip.user_ns["wb_ns"])


def test_a_kernel_cell_is_callable_and_an_edited_cell_hot_reloads(shell: Any) -> None:
    shell.run_cell_magic("wb_kernel", "bump", HOST.replace("BUMP", "1"))
    x = torch.arange(3.0)
    torch.testing.assert_close(_ops(shell).bump(x), x + 1)
    shell.run_cell_magic("wb_kernel", "bump", HOST.replace("BUMP", "7"))
    torch.testing.assert_close(_ops(shell).bump(x), x + 7)


def test_a_compile_error_fails_the_cell_with_cell_line_numbers(shell: Any) -> None:
    shell.run_cell_magic("wb_kernel", "bump", HOST.replace("BUMP", "1"))
    broken = HOST.replace("return at::add(x, BUMP);", "return at::add(x, 2) +* ;")
    with pytest.raises(CellCompileError) as info:
        shell.run_cell_magic("wb_kernel", "bump", broken)
    assert "<cell bump>:6:" in str(info.value)  # line 6 of the cell
    assert "last good build stays loaded" in str(info.value)
    torch.testing.assert_close(_ops(shell).bump(torch.zeros(1)), torch.ones(1))


def test_autoreload_rebuilds_a_file_edited_on_disk(
    shell: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("wb_kernel", "bump", HOST.replace("BUMP", "1"))
    binding = tmp_path / "reg" / "bindings" / "bump.cpp"
    binding.write_text(binding.read_text().replace("at::add(x, 1)", "at::add(x, 3)"))
    capsys.readouterr()
    shell.run_cell("y = 1")  # the pre_run_cell hook runs before this cell
    out = capsys.readouterr().out
    assert "wb autoreload" in out and "bump" in out and "bump.cpp" in out
    torch.testing.assert_close(_ops(shell).bump(torch.zeros(1)), torch.full((1,), 3.0))
    shell.run_cell("y = 2")
    assert "wb autoreload" not in capsys.readouterr().out  # nothing changed: nothing said


def test_the_library_displays_as_a_table_of_ops(shell: Any) -> None:
    shell.run_cell_magic("wb_kernel", "bump", HOST.replace("BUMP", "1"))
    formatter = shell.display_formatter.formatters["text/html"]
    from workbench.ipython import _sessions

    html = formatter(_sessions[id(shell)].library)
    assert "bump(Tensor x) -&gt; Tensor" in html and "<table>" in html


def test_a_bad_magic_line_says_the_usage(shell: Any) -> None:
    with pytest.raises(ValueError, match="usage: %%wb_kernel FAMILY"):
        shell.run_cell_magic("wb_kernel", "bump --gpu", HOST)
