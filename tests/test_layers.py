"""The shape of workbench/: no import cycle, no reach into another module's underscore names, the
device-only layer below the build and the loader, and docs/modules.md true to the code.

Imports are read with ``ast`` from every file, wherever they sit: at the top, inside a
function (a lazy import still runs), or under ``if TYPE_CHECKING`` (a type is still a
dependency). The front door's lazy names (``workbench._LAZY``) count as its imports."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "workbench"
MODULE_MAP = ROOT / "docs" / "modules.md"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _owner(name: str) -> str:
    """The module of the package that ``name`` (a module or a name inside one) lives in."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


class Imports:
    """What one module imports of the package: modules, and underscore names reached."""

    def __init__(self, module: str, path: Path) -> None:
        self.module = module
        self.targets: set[str] = set()
        self.private: list[str] = []
        tree = ast.parse(path.read_text(), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "workbench":
                        self.targets.add(_owner(alias.name))
                        if alias.asname:
                            aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = self._base(node, package)
                if base is None:
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in MODULES:  # a submodule
                        self.targets.add(full)
                        aliases[alias.asname or alias.name] = full
                        continue
                    self.targets.add(_owner(base))
                    if _is_private(alias.name):
                        self.private.append(f"from {base} import {alias.name}")
            elif isinstance(node, ast.Assign) and module == "workbench":
                self._lazy_names(node)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _is_private(node.attr)
            ):
                self.private.append(f"{aliases[node.value.id]}.{node.attr}")
        self.targets.discard(module)

    @staticmethod
    def _base(node: ast.ImportFrom, package: str) -> str | None:
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            head = parts[: len(parts) - node.level + 1]
            base = ".".join(head + ([node.module] if node.module else []))
        return base if base.split(".")[0] == "workbench" else None

    def _lazy_names(self, node: ast.Assign) -> None:
        """``_LAZY = {"name": "workbench.module", ...}``: the front door's imports on demand."""
        if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            assert isinstance(node.value, ast.Dict)
            for value in node.value.values:
                assert isinstance(value, ast.Constant) and isinstance(value.value, str)
                self.targets.add(_owner(value.value))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


GRAPH = {m: Imports(m, p) for m, p in MODULES.items()}


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in GRAPH[todo.pop()].targets:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_reader_sees_imports_of_every_kind() -> None:
    """The walker itself: lazy, type-only, relative and front-door imports all count."""
    assert "workbench.facade" in GRAPH["workbench"].targets  # _LAZY
    assert "workbench.device" in GRAPH["workbench.api"].targets  # inside a method
    assert "workbench.config" in GRAPH["workbench.device"].targets  # under TYPE_CHECKING
    assert "workbench.benchmark.run" in GRAPH["workbench.benchmark"].targets


def test_no_import_cycle() -> None:
    sorter = graphlib.TopologicalSorter({m: i.targets for m, i in GRAPH.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle in workbench/: {' -> '.join(e.args[1])}")


def test_no_module_reaches_into_another_modules_underscore_names() -> None:
    reaches = [f"{m}: {p}" for m, i in GRAPH.items() for p in i.private]
    assert not reaches, "\n".join(reaches)


def test_the_bench_runner_uses_only_public_names_of_the_package() -> None:
    """``python -m bench``'s measurements run outside the tests: a rename must break them loudly."""
    reaches = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        reaches += [f"bench/{path.name}: {p}" for p in Imports(f"bench.{path.stem}", path).private]
    assert not reaches, "\n".join(reaches)


def test_the_device_only_layer_never_calls_up() -> None:
    """NVRTC, cubins, driver modules and their warm records sit below the build and the loader."""
    above = {"workbench.build", "workbench.loader", "workbench.api", "workbench.tuning.route"}
    for module in ("workbench.device", "workbench.nvrtc", "workbench.nvrtc_worker"):
        assert not _reachable(module) & above, f"{module} imports {_reachable(module) & above}"


def test_files_stay_under_600_lines() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def _layers() -> list[tuple[str, list[str]]]:
    """The module map's layers, bottom first: rows ``| N | name | `a`, `b.c` |``."""
    rows = []
    for line in MODULE_MAP.read_text().splitlines():
        match = re.match(r"^\|\s*(\d+)\s*\|\s*([^|]+?)\s*\|([^|]+)\|", line)
        if match:
            names = re.findall(r"`([A-Za-z0-9_.*]+)`", match.group(3))
            rows.append((int(match.group(1)), match.group(2), names))
    assert [n for n, _, _ in rows] == list(range(len(rows))), "layers numbered 0, 1, 2, ..."
    return [(name, names) for _, name, names in rows]


def _layer_of() -> dict[str, int]:
    found: dict[str, int] = {}
    wildcards: list[tuple[str, int]] = []
    for number, (_, names) in enumerate(_layers()):
        for name in names:
            full = "workbench" if name == "workbench" else f"workbench.{name}"
            if full.endswith(".*"):
                wildcards.append((full[:-2], number))
                continue
            assert full in MODULES, f"docs/modules.md names {name}, which is no module"
            assert full not in found, f"docs/modules.md lists {name} twice"
            found[full] = number
    for module in MODULES:  # a wildcard takes the package's modules not listed by name
        for package, number in wildcards:
            if module not in found and (module == package or module.startswith(package + ".")):
                found[module] = number
    return found


def test_the_module_map_lists_every_module_once() -> None:
    missing = sorted(set(MODULES) - set(_layer_of()))
    assert not missing, f"docs/modules.md does not place: {', '.join(missing)}"


def test_every_import_goes_down_the_module_map() -> None:
    layer = _layer_of()
    names = [name for name, _ in _layers()]
    upward = [
        f"{m} ({names[layer[m]]}) imports {t} ({names[layer[t]]})"
        for m, imports in GRAPH.items()
        for t in imports.targets
        if layer[t] > layer[m]
    ]
    assert not upward, "\n".join(upward)
