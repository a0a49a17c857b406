"""A reload's modules in two steps, without a GPU: the kernels a live process launched compile
first, the rest behind them, and the whole module is found again by its content.

The real NVRTC compiles here; the launch side (the library's completion hook) is tested on a GPU
(tests/test_device_cuda.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workbench import device, nvrtc, scaffold
from workbench.config import make_config
from workbench.errors import BuildError
from workbench.project import discover

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")

FILE = "op00.kernel.cu"


def names_of() -> list[tuple[str, str]]:
    """Four instantiations of the template family's kernel: float and double, two each."""
    return [
        (FILE, f"wb::op00_family::op00_kernel<{n},{b},{t}>")
        for t, n in (("float", 4), ("double", 2))
        for b in ("true", "false")
    ]


TU = tuple[Path, Callable[..., list[device.Module]]]


@pytest.fixture
def tu(tmp_path: Path) -> TU:
    """A template family's registry, and device.ensure of its kernel TU for sm_90a (the family
    found again at each call: a test edits its sources)."""
    kernels = scaffold.write_registry(tmp_path, 1)
    config = make_config(archs=("sm_90a",), link=False)

    def ensure(names: list[tuple[str, str]], **kw: Any) -> list[device.Module]:
        project = discover(kernels)
        return device.ensure(project, project.family("op00"), config, names, **kw)

    return kernels, ensure


def lowered(images: list[device.Image]) -> list[str]:
    return sorted(n for i in images for n in i.lowered)


def test_the_launched_kernels_compile_first_and_the_rest_completes_the_module(
    tu: TU, compiled: list[str]
) -> None:
    _, ensure = tu
    names = names_of()
    launched = {names[1]}
    (part,) = ensure(names, first=lambda: launched)
    assert lowered(part.images) == [names[1][1]]  # only what the process launched
    assert part.rest is not None and compiled == ["op00/op00.kernel.cu"]
    # A second ensure of the same sources waits for the rest under way; it compiles nothing.
    (whole,) = ensure(names)
    assert part.rest.done.is_set() and part.rest.error == ""
    assert compiled == ["op00/op00.kernel.cu"]
    assert lowered(whole.images) == sorted(e for _, e in names) and whole.rest is None
    assert whole.key == tuple(i.key for i in part.rest.images or [])
    assert whole.images[0].key == part.images[0].key  # the first step's cubin is part of it


def test_the_whole_module_is_found_by_its_content_after_the_rest_is_done(
    tu: TU, compiled: list[str]
) -> None:
    _, ensure = tu
    names = names_of()
    (part,) = ensure(names, first=lambda: {names[0]})
    assert part.rest is not None
    assert part.rest.done.wait(300) and part.rest.images is not None
    compiled.clear()
    (whole,) = ensure(names, first=lambda: {names[0]})
    assert compiled == [] and whole.rest is None  # listed: nothing compiles, nothing splits
    assert all(i.seconds == 0 for i in whole.images)
    assert lowered(whole.images) == sorted(e for _, e in names)


def test_no_split_where_nothing_or_everything_was_launched(tu: TU, compiled: list[str]) -> None:
    kernels, ensure = tu
    names = names_of()
    (none,) = ensure(names, first=set)
    assert none.rest is None and lowered(none.images) == sorted(e for _, e in names)
    math = kernels / "op00" / "op00_math.h"  # a new content: compiles again
    math.write_text(math.read_text().replace("kShift = 0.0", "kShift = 1.0"))
    (every,) = ensure(names, first=lambda: set(names))
    assert every.rest is None and lowered(every.images) == sorted(e for _, e in names)

    def never() -> set[tuple[str, str]]:
        raise AssertionError("read although nothing compiles")

    compiled.clear()
    (again,) = ensure(names, first=never)
    assert compiled == [] and again.key == every.key


def test_an_error_in_a_kernel_not_launched_shows_in_the_rest_and_at_the_next_ensure(
    tu: TU,
) -> None:
    kernels, ensure = tu
    source = kernels / "op00" / FILE
    body = "  wb::detail::elementwise_body<N, NoL1>"
    text = source.read_text()
    assert body in text
    source.write_text(
        text.replace(body, '  static_assert(sizeof(T) != 8, "no doubles here");\n' + body)
    )
    names = names_of()
    (part,) = ensure(names, first=lambda: {names[0]})
    assert lowered(part.images) == [names[0][1]]  # float compiles
    assert part.rest is not None and part.rest.done.wait(300)
    assert part.rest.images is None and "no doubles here" in part.rest.error
    with pytest.raises(BuildError, match="no doubles here"):  # whole, even with its first
        ensure(names, first=lambda: {names[0]})
