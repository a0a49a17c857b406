"""Every CUDA kernel TU compiles with nvcc for sm_80 and sm_90a; no GPU needed.

The bindings are compiled too (with their CUDA part where this torch is a CUDA build) and the
libraries linked where this torch allows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench import build
from workbench.config import make_config
from workbench.project import BUNDLED_KERNELS, discover

ARCHS = ("sm_80", "sm_90a")
FAMILIES = [f.name for f in discover().families]


@pytest.mark.nvcc
@pytest.mark.parametrize("family", FAMILIES)
def test_every_tu_compiles_for_every_arch(family: str) -> None:
    project = discover()
    fam = project.family(family)
    config = make_config(archs=ARCHS, link=torch.version.cuda is not None)
    built = build.ensure(project, fam, config)
    tus = {Path(t["source"]): t for t in built.manifest["tus"]}  # type: ignore[union-attr]
    cuda_sources = sorted((BUNDLED_KERNELS / family).glob("*.cu"))
    assert cuda_sources, f"{family} has no CUDA kernel"
    for source in cuda_sources:
        assert tus[source]["kind"] == "cuda"
        assert build._object_path(tus[source]["key"]).stat().st_size > 0
    assert built.manifest["toolchain"]["archs"] == list(ARCHS)  # type: ignore[index]
