"""The notebooks under notebooks/ run top to bottom (CPU here; CUDA cells where a GPU is, and
there they must not take their "skipped" branch) and are committed without outputs.

Where Jupyter is not installed, `scripts/vendor_notebook_deps.sh` vendors what these tests need
for PYTHONPATH; `bash scripts/gpu_evidence.sh notebooks` runs them with it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import knobs

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
ROOT = Path(__file__).parent.parent


def test_the_four_notebooks_are_there() -> None:
    names = [p.stem for p in NOTEBOOKS]
    assert names == [
        "01_quickstart",
        "02_edit_and_reload",
        "03_autograd_and_compile",
        "04_matmul",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_committed_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a cell has outputs; clear them"
            assert cell.execution_count is None, f"{path.name}: clear the execution counts"


def this_interpreter_kernel(tmp_path: Path) -> Any:
    """An AsyncKernelManager whose `python3` is this interpreter (`-m ipykernel_launcher`), not
    a `python3` kernelspec the machine may have registered (a vendored ipykernel registers none)."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    write_kernel_spec(tmp_path / "kernels" / "python3")
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=specs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_runs_top_to_bottom(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel is a new process: it sees the environment (PYTHONPATH with any vendored
    # Jupyter packages, the cache), not knobs.override.
    monkeypatch.setenv("WB_CACHE_DIR", str(knobs.cache_dir()))
    # Absolute entries: the kernel runs in notebooks/.
    inherited = [
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *inherited]))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        km=this_interpreter_kernel(tmp_path),
        timeout=900,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on failure
    text = "\n".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert "Traceback" not in text
    if torch.cuda.is_available():  # the CUDA cells ran, not their "skipped ..." branch
        skips = [line for line in text.splitlines() if line.startswith("skipped")]
        assert skips == [], f"{path.name}: a CUDA cell skipped on a GPU host"
