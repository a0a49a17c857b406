"""write compile_commands.json (the real compiler commands of every TU) for clangd"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.cli.common import project_of
from workbench.config import Config
from workbench.project import Project


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", type=Path, help="where to write (default: beside kernels/)")
    p.add_argument(
        "--arch",
        help="include the CUDA TUs for these archs, e.g. sm_90a (default: this machine's)",
    )


def entries(project: Project, config: Config) -> list[dict[str, object]]:
    """One entry per TU (the shared registry TU once), with the command a build runs."""
    from workbench import build, cache

    out_dir = cache.root() / "tmp" / "clangd"
    rows: list[dict[str, object]] = []
    seen: set[Path] = set()
    for family in project.families:
        for i, src in enumerate(build.family_sources(family, config)):
            if src.path in seen:
                continue
            seen.add(src.path)
            out = out_dir / family.name / f"{i}_{src.path.stem}.o"
            rows.append(
                {
                    "directory": str(project.kernels_dir.parent),
                    "file": str(src.path),
                    "arguments": list(config.compile_command(project, src, out)),
                    "output": str(out),
                }
            )
    return rows


def run(args: argparse.Namespace) -> int:
    from workbench import toolchain
    from workbench.config import make_config

    project = project_of(args)
    try:
        archs = toolchain.parse_arch_list(args.arch) if args.arch else None
    except ValueError as e:
        raise SystemExit(f"wb compile-commands: --arch: {e}") from None
    config = make_config(archs=archs, link=False) if archs else make_config()
    rows = entries(project, config)
    path = args.output or project.kernels_dir.parent / "compile_commands.json"
    path.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {len(rows)} commands to {path}")
    return 0
