"""One broken family does not cost the others: ``workbench.load`` on a registry where one of
three ``wb new`` families does not compile (real compiles)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import workbench
from workbench import scaffold
from workbench.api import BuildWarning
from workbench.errors import BuildError
from workbench.ipython import Session

GOOD = ("good_a", "good_b")


def _break(kernels: Path, family: str) -> int:
    """A syntax error in the family's CPU kernel; the line it is on."""
    source = kernels / family / f"{family}.cpp"
    text = source.read_text().replace("apply(v, a);", "apply(v, a) +* ;")
    source.write_text(text)
    return next(i for i, line in enumerate(text.splitlines(), 1) if "+* ;" in line)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("broken")
    kernels = root / "kernels"
    for name in (*GOOD, "bad"):
        scaffold.write_family(kernels, name, shift=2.0)
    return kernels, _break(kernels, "bad")


def _callable(ns: str, names: tuple[str, ...]) -> None:
    ops = getattr(torch.ops, ns)
    for name in names:
        assert torch.equal(getattr(ops, name)(torch.zeros(2), 1.0), torch.full((2,), 2.0))


def test_the_first_line_names_the_failed_family_and_its_first_compiler_error(
    registry: tuple[Path, int],
) -> None:
    kernels, line = registry
    with pytest.raises(BuildError) as info:
        workbench.load(kernels, namespace="wberr_raise", devices="cpu")
    first = str(info.value).splitlines()[0]
    source = kernels / "bad" / "bad.cpp"
    assert re.fullmatch(
        rf"1 of 3 op families failed to build: bad \({re.escape(str(source))}:{line}: .+\)", first
    ), first
    assert "expected" in first  # the compiler's own words
    assert set(info.value.failed) == {"bad"}
    _callable("wberr_raise", GOOD)  # the good families were registered all the same


def test_on_error_warn_returns_the_good_families_and_the_failures(
    registry: tuple[Path, int], tmp_path: Path
) -> None:
    kernels, _ = registry
    with pytest.warns(BuildWarning, match=r"^1 of 3 op families failed to build: bad \("):
        lib = workbench.load(kernels, namespace="wberr_warn", devices="cpu", on_error="warn")
    assert sorted(lib.families) == list(GOOD) and set(lib.failed) == {"bad"}
    assert isinstance(lib.failed["bad"], BuildError)
    assert sorted(lib.ops) == list(GOOD)
    _callable("wberr_warn", GOOD)


def test_two_broken_families_are_both_named_and_a_fix_clears_them(tmp_path: Path) -> None:
    kernels = tmp_path / "kernels"
    for name in ("good_a", "bad_x", "bad_y"):
        scaffold.write_family(kernels, name, shift=2.0)
    lines = {name: _break(kernels, name) for name in ("bad_x", "bad_y")}
    with pytest.warns(BuildWarning) as caught:
        lib = workbench.load(kernels, namespace="wberr_two", devices="cpu", on_error="warn")
    (warning,) = [w for w in caught if w.category is BuildWarning]
    first = str(warning.message).splitlines()[0]
    assert first.startswith("2 of 3 op families failed to build: ")
    for name, line in lines.items():
        assert f"{name} ({kernels / name / f'{name}.cpp'}:{line}: " in first
    scaffold.write_family(kernels, "bad_x", shift=2.0)  # the template again: fixed
    with pytest.warns(BuildWarning, match=r"^1 of 3 op families failed to build: bad_y \("):
        report = lib.reload()
    assert report.swapped == ["bad_x"] and set(lib.failed) == {"bad_y"}
    _callable("wberr_two", ("good_a", "bad_x"))


def test_the_notebook_registry_loads_the_good_families_beside_a_broken_one(
    registry: tuple[Path, int],
) -> None:
    kernels, _ = registry
    with workbench.knobs.override(WB_DEVICES="cpu"), pytest.warns(BuildWarning):
        lib = Session(shell=None).open(kernels.parent, "wberr_nb")
    assert set(lib.failed) == {"bad"}
    _callable("wberr_nb", GOOD)
