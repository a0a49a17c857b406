"""What several subcommands share: choosing the project and the families named on the line."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.project import Family, Project, discover


def project_of(args: argparse.Namespace) -> Project:
    """The registry ``--kernels`` names (default: the bundled one); an error where it holds no
    op family, saying how to make one."""
    project = discover(args.kernels, args.namespace)
    if not project.families:
        where = args.kernels or project.kernels_dir
        raise WorkbenchError(
            f"no op family found in {project.kernels_dir}: a family is a folder DIR/NAME/ of "
            f"kernels with its binding in bindings/NAME.cpp beside DIR; make one with "
            f"`wb new NAME --kernels {where}`"
        )
    return project


def unknown(what: str, name: str, known: list[str], where: object) -> WorkbenchError:
    """The error for a name on the command line that names nothing: the name, where it was
    looked for, and the names there are."""
    listing = ", ".join(sorted(known)) or "none"
    return WorkbenchError(f"no {what} {name!r} in {where}; known: {listing}")


def require_specs(
    names: list[str], specs: dict[str, Any], where: object, project: Project | None = None
) -> list[str]:
    """``names`` as ops with a spec (the ops that can be checked and timed): a family's name
    stands for its ops that have one. Raise for the first name that is neither."""
    ops: list[str] = []
    for name in names:
        found = [name] if name in specs else []
        if not found and project is not None:
            family = next((f for f in project.families if f.name == name), None)
            found = [op for op in op_names(family, project) if op in specs] if family else []
        if not found:
            families = [f.name for f in project.families] if project else []
            raise unknown("op", name, list(dict.fromkeys([*specs, *families])), where)
        ops += [op for op in found if op not in ops]
    return ops


def op_names(family: Family, project: Project) -> list[str]:
    """The ops a family defines, read from the ``WB_DEF("name(...)")`` lines of its binding."""
    binding = project.bindings_dir / f"{family.name}.cpp"
    try:
        text = binding.read_text()
    except OSError:
        return []
    return re.findall(r'WB_DEF\(\s*"\s*([A-Za-z_][A-Za-z0-9_]*)', text)


def families_of(project: Project, names: list[str]) -> list[Family]:
    """The families named (by family or by op name), in order; all of them for no names."""
    if not names:
        return list(project.families)
    chosen: list[Family] = []
    for name in names:
        match = [f for f in project.families if f.name == name]
        match = match or [f for f in project.families if name in op_names(f, project)]
        if not match:
            known = {f.name for f in project.families}
            known |= {op for f in project.families for op in op_names(f, project)}
            raise unknown("op or op family", name, list(known), project.kernels_dir)
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen


def print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


def devices_arg(device: str) -> str | None:
    """--device cpu|cuda|auto as make_config's ``devices``."""
    return None if device == "auto" else ("cpu" if device == "cpu" else "cpu,cuda")


def kernels_to_write(args: argparse.Namespace, usage: str) -> Path:
    """The kernels folder a command that writes a family writes into: ``--kernels``, or the
    bundled one in a checkout (never the installed package's; ``usage`` shows the fix)."""
    from workbench.project import BUNDLED_KERNELS, INSTALLED

    if INSTALLED and not args.kernels:
        raise WorkbenchError(
            "the bundled kernels belong to the installed workbench package; write the family "
            f"into your own registry: {usage}"
        )
    return Path(args.kernels) if args.kernels else BUNDLED_KERNELS


@contextlib.contextmanager
def writing_family(name: str, kernels: Path) -> Iterator[None]:
    """A family's files written all or none (scaffold.write_all): its errors in words."""
    from workbench import scaffold

    try:
        yield
    except scaffold.FamilyExists as e:
        raise WorkbenchError(
            f"op family {name!r} would overwrite {e}; nothing was written: pick another "
            "name, or remove those files first"
        ) from e
    except OSError as e:
        raise WorkbenchError(
            f"cannot write op family {name!r} into {kernels}: {e}; "
            "the files written before the error were removed"
        ) from e
