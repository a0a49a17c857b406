"""The suite's own order: the files conftest.py runs first exist, and come first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SLOW_FIRST


def test_every_file_named_to_run_first_exists() -> None:
    here = Path(__file__).parent
    missing = [name for name in SLOW_FIRST if not (here / name).is_file()]
    assert not missing, f"conftest.SLOW_FIRST names files that are gone: {missing}"


def test_the_slow_files_are_collected_first(pytestconfig: pytest.Config) -> None:
    from tests.conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, name: str) -> None:
            self.path = Path(name)
            self.keywords: dict[str, object] = {}

    items = [Item(n) for n in ("test_a.py", SLOW_FIRST[1], "test_b.py", SLOW_FIRST[0])]
    pytest_collection_modifyitems(pytestconfig, items)  # type: ignore[arg-type]
    assert [i.path.name for i in items] == [SLOW_FIRST[0], SLOW_FIRST[1], "test_a.py", "test_b.py"]
