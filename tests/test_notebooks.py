"""The notebooks under notebooks/ run top to bottom (CPU here; CUDA cells where a GPU is) and
are committed without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workbench import knobs

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
ROOT = Path(__file__).parent.parent


def test_the_three_notebooks_are_there() -> None:
    names = [p.stem for p in NOTEBOOKS]
    assert names == ["01_quickstart", "02_edit_and_reload", "03_autograd_and_compile"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_committed_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a cell has outputs; clear them"
            assert cell.execution_count is None, f"{path.name}: clear the execution counts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_runs_top_to_bottom(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel is a new process: it sees the environment, not knobs.override.
    monkeypatch.setenv("WB_CACHE_DIR", str(knobs.cache_dir()))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on failure
    text = "\n".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert "Traceback" not in text
