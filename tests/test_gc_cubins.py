"""wb gc and wb clean --all with the cubins of device-only TUs: real NVRTC, a cache of its own."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from workbench import device, inventory, knobs, nvrtc, scaffold
from workbench.cli import main
from workbench.config import make_config
from workbench.project import discover

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")
NAMES = [("op00.kernel.cu", "wb::op00_family::op00_kernel<4,true,float>")]


def _age(paths: list[Path], seconds: float) -> None:
    """Make files look ``seconds`` old (older than the racy window, or the gc grace period)."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def _gc(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["gc", *args, "--json"]) == 0
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


def test_gc_removes_an_edited_kernels_older_cubins_then_over_the_limit_the_recorded_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], compiled: list[str]
) -> None:
    kernels = scaffold.write_registry(tmp_path / "registry", 1)
    sources = list((kernels / "op00").iterdir())
    config = make_config(archs=("sm_80",), link=False)
    with knobs.override(WB_CACHE_DIR=str(tmp_path / "cache")):
        project = discover(kernels)
        family = project.family("op00")
        _age(sources, 60)  # recorded by the warm record: older than the racy window
        (first,) = device.ensure(project, family, config, NAMES)
        math = kernels / "op00" / "op00_math.h"
        math.write_text(math.read_text().replace("kShift = 0.0", "kShift = 2.0"))
        _age(sources, 60)
        (edited,) = device.ensure(project, family, config, NAMES)
        old = [i.path for i in first.images]
        new = [i.path for i in edited.images]
        assert set(old).isdisjoint(new)
        assert inventory.referenced_cubins() == {os.path.abspath(p) for p in new}

        report = _gc(capsys, "--keep", "5")  # all written just now: the grace period keeps them
        assert report["cubins"] == 0 and all(p.exists() for p in old + new)

        _age(old + new, 3600)
        report = _gc(capsys, "--keep", "5")  # the older version's go, the recorded ones stay
        assert report["cubins"] == len(old)
        assert not any(p.exists() for p in old) and all(p.exists() for p in new)
        assert not any(p.with_suffix(".json").exists() for p in old)

        report = _gc(capsys, "--max-size", "0")  # over the limit: the recorded ones too
        assert report["cubins"] == len(new) and not any(p.exists() for p in new)
        compiled.clear()
        (again,) = device.ensure(project, family, config, NAMES)  # found missing: compiled
        assert compiled == ["op00/op00.kernel.cu"] and again.key == edited.key
        assert all(i.path.exists() for i in again.images)


def test_clean_all_removes_cubins_and_records_and_the_next_load_compiles_again(
    tmp_path: Path, compiled: list[str]
) -> None:
    kernels = scaffold.write_registry(tmp_path / "registry", 1)
    config = make_config(archs=("sm_80",), link=False)
    with knobs.override(WB_CACHE_DIR=str(tmp_path / "cache")):
        project = discover(kernels)
        family = project.family("op00")
        _age(list((kernels / "op00").iterdir()), 60)
        (module,) = device.ensure(project, family, config, NAMES)
        assert inventory.cubins() and inventory.referenced_cubins()
        assert main(["--kernels", str(kernels), "clean", "--all"]) == 0
        assert inventory.cubins() == [] and inventory.referenced_cubins() == set()
        compiled.clear()
        # This process still holds the record it read: the cubins it names are gone, so they
        # are compiled again rather than handed to a library that would fail at launch.
        (again,) = device.ensure(project, family, config, NAMES)
        assert compiled == ["op00/op00.kernel.cu"] and again.key == module.key
        assert all(i.path.exists() for i in again.images)
