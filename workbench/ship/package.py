"""The Python side of an ahead-of-time package: its __init__.py and its specs.

Pure functions from what was built to file texts (``wb wheel`` zips them). The layout is the
one :func:`workbench.runtime.load_package` reads; the package carries copies of
``workbench/runtime.py`` (registration), ``workbench/spec.py`` (OpSpec and the sample helpers)
and ``workbench/tuning/space.py`` (TuneSpace, which a spec's ``TUNE`` is built with), and each
family's spec.py with its workbench imports pointed at those copies.
"""

from __future__ import annotations

import ast
from pathlib import Path

from workbench.errors import WorkbenchError

INIT_TEMPLATE = '''\
"""{name}: an ahead-of-time build of the op registry torch.ops.{namespace} ({families}).

Made by `wb wheel` (workbench {workbench}) for torch {torch}, CUDA {cuda}, archs {archs}.
Importing it checks the torch in this process against that one, opens its libraries and
registers their ops under torch.ops.{namespace} with their fake functions and autograd
formulas. It needs no compiler and imports nothing of the workbench.

``build_info``: what it was built for; ``specs``: the ops' specs (reference, samples, ...), which
``wb check --package {name}`` checks the installed ops against; ``{name}.<op>`` is
``torch.ops.{namespace}.<op>``.
"""

from pathlib import Path as _Path
from typing import Any as _Any

from ._runtime import load_package as _load_package

_package = _load_package(__name__, _Path(__file__).parent)
namespace = _package.namespace
build_info = _package.info
specs = _package.specs
ops = _package.ops


def __getattr__(name: str) -> _Any:
    return _package.op(name)


def __dir__() -> list[str]:
    return sorted([*globals(), *ops])
'''


def init_text(name: str, info: dict[str, object]) -> str:
    torch = info["torch"]
    assert isinstance(torch, dict)
    families = info["families"]
    assert isinstance(families, list)
    archs = info["archs"]
    assert isinstance(archs, list)
    return INIT_TEMPLATE.format(
        name=name,
        namespace=info["namespace"],
        families=", ".join(f["name"] for f in families),
        workbench=info["workbench"],
        torch=torch["version"],
        cuda=torch["cuda"] if archs else "none",
        archs=", ".join(archs) or "none (CPU only)",
    )


# What a shipped package carries of the workbench: module -> its copy at the package's root.
# A spec may import these (and the names below from the top-level package); nothing else.
SHIPPED_MODULES = {
    "workbench.spec": "_spec",
    "workbench.tuning.space": "_tune",
    "workbench.errors": "_errors",
}
# ``from workbench import NAME``: the shipped module NAME comes from (None: NAME is a module).
_TOP_LEVEL = {"spec": None, "TuneSpace": "workbench.tuning.space"}


def _refused(name: str, path: Path) -> WorkbenchError:
    return WorkbenchError(
        f"{path} imports {name}; a shipped spec carries only workbench.spec and "
        "workbench.TuneSpace (import them as `from workbench.spec import ...` and "
        "`from workbench import TuneSpace`), so move what it needs into the spec"
    )


def _replacement(node: ast.Import | ast.ImportFrom, path: Path, level: int) -> str | None:
    """The import ``node`` as the shipped module writes it, or None when it needs no change.

    ``level``: how deep the shipped module sits in the package (1: its root, 2: ``_specs/``).
    """
    if isinstance(node, ast.ImportFrom):
        if node.level or (node.module or "").split(".")[0] != "workbench":
            return None
        if node.module in SHIPPED_MODULES:
            return ast.unparse(ast.ImportFrom(SHIPPED_MODULES[node.module], node.names, level))
        if node.module != "workbench":
            raise _refused(f"{node.module}.{node.names[0].name}", path)
        parts = []
        for alias in node.names:
            if alias.name not in _TOP_LEVEL:
                raise _refused(f"workbench.{alias.name}", path)
            home = _TOP_LEVEL[alias.name]
            if home is None:  # a module: `from workbench import spec [as s]`
                copy = ast.alias(
                    SHIPPED_MODULES[f"workbench.{alias.name}"], alias.asname or alias.name
                )
                parts.append(ast.ImportFrom(None, [copy], level))
            else:
                parts.append(ast.ImportFrom(SHIPPED_MODULES[home], [alias], level))
        return "; ".join(ast.unparse(part) for part in parts)
    names = [a for a in node.names if a.name.split(".")[0] == "workbench"]
    if not names:
        return None
    only = names[0]
    if len(node.names) == 1 and only.name in SHIPPED_MODULES and only.asname:
        copy = ast.alias(SHIPPED_MODULES[only.name], only.asname)
        return ast.unparse(ast.ImportFrom(None, [copy], level))
    raise _refused(only.name, path)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never run, so left as written)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
            if name == "TYPE_CHECKING":
                skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def shipped_module(path: Path, level: int) -> str:
    """The text of ``path`` with its workbench imports pointed at the package's copies.

    ``workbench.spec`` becomes ``_spec``, ``workbench.TuneSpace`` comes from ``_tune`` (the
    package's copies of workbench/spec.py and workbench/tuning/space.py); any other import of
    the workbench is refused, but for those under ``if TYPE_CHECKING:``, which never run.
    """
    text = path.read_text()
    tree = ast.parse(text, str(path))
    lines = text.splitlines(keepends=True)
    skipped = _type_checking_only(tree)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skipped:
            new = _replacement(node, path, level)
            if new is not None:
                edits.append((node, new))
    # Positions are in UTF-8 bytes; edit from the end so earlier positions stay valid.
    for node, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        assert node.end_lineno is not None and node.end_col_offset is not None
        first = lines[node.lineno - 1].encode()
        last = lines[node.end_lineno - 1].encode()
        joined = first[: node.col_offset] + new.encode() + last[node.end_col_offset :]
        lines[node.lineno - 1 : node.end_lineno] = [joined.decode()]
    return "".join(lines)


def shipped_spec(path: Path) -> str:
    """The text of spec.py ``path`` as the package's ``_specs/<family>.py`` (see shipped_module)."""
    return shipped_module(path, 2)
