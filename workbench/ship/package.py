"""The Python side of an ahead-of-time package: its __init__.py and its specs.

Pure functions from what was built to file texts (``wb wheel`` zips them). The layout is the
one :func:`workbench.runtime.load_package` reads; the package carries copies of
``workbench/runtime.py`` (registration) and ``workbench/spec.py`` (OpSpec and the sample
helpers), and each family's spec.py with its ``workbench.spec`` imports pointed at that copy.
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


def _replacement(node: ast.Import | ast.ImportFrom, path: Path) -> str | None:
    """The import ``node`` as the shipped spec writes it, or None when it needs no change."""
    spec_module = "workbench.spec"
    if isinstance(node, ast.ImportFrom):
        if node.level or not (node.module or "").startswith("workbench"):
            return None
        if node.module == spec_module:
            return ast.unparse(ast.ImportFrom("_spec", node.names, 2))
        if node.module == "workbench" and [a.name for a in node.names] == ["spec"]:
            alias = node.names[0].asname or "spec"
            return ast.unparse(ast.ImportFrom(None, [ast.alias("_spec", alias)], 2))
        name = f"{node.module}.{node.names[0].name}"
    else:
        names = [a for a in node.names if a.name.split(".")[0] == "workbench"]
        if not names:
            return None
        if len(node.names) == 1 and names[0].name == spec_module and names[0].asname:
            return ast.unparse(ast.ImportFrom(None, [ast.alias("_spec", names[0].asname)], 2))
        name = names[0].name
    raise WorkbenchError(
        f"{path} imports {name}; a shipped spec carries only workbench.spec (import it as "
        "`from workbench.spec import ...`), so move what it needs into the spec"
    )


def shipped_spec(path: Path) -> str:
    """The text of spec.py ``path`` with its ``workbench.spec`` imports made relative.

    The package's ``_specs/<family>.py`` imports ``.._spec`` (the package's copy of
    workbench/spec.py) instead; any other import of the workbench is refused.
    """
    text = path.read_text()
    tree = ast.parse(text, str(path))
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            new = _replacement(node, path)
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
