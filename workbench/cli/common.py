"""What several subcommands share: choosing the project and the families named on the line."""

from __future__ import annotations

import argparse
import json
import re
import sys

from workbench.errors import WorkbenchError
from workbench.project import Family, Project, discover


def project_of(args: argparse.Namespace) -> Project:
    return discover(args.kernels, args.namespace)


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
            known = ", ".join(f.name for f in project.families) or "none"
            raise WorkbenchError(
                f"no op or op family {name!r} under {project.kernels_dir}; families: {known}"
            )
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen


def print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


def devices_arg(device: str) -> str | None:
    """--device cpu|cuda|auto as make_config's ``devices``."""
    return None if device == "auto" else ("cpu" if device == "cpu" else "cpu,cuda")
