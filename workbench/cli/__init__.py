"""The ``wb`` command: one module per subcommand, each with ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import sys

from workbench import __version__
from workbench.cli import (
    adopt,
    bench,
    build,
    check,
    clean,
    compile_commands,
    doctor,
    gc,
    helptext,
    new,
    profile,
    smoke,
    status,
    tune,
    watch,
    wheel,
    why,
)
from workbench.errors import WorkbenchError

COMMANDS = {
    "build": build,
    "check": check,
    "bench": bench,
    "tune": tune,
    "profile": profile,
    "new": new,
    "adopt": adopt,
    "status": status,
    "why": why,
    "clean": clean,
    "gc": gc,
    "doctor": doctor,
    "watch": watch,
    "compile-commands": compile_commands,
    "smoke": smoke,
    "wheel": wheel,
}


def _global_options(p: argparse.ArgumentParser, default: object) -> None:
    p.add_argument(
        "--kernels", metavar="DIR", default=default, help="kernels/ folder (default: bundled)"
    )
    p.add_argument(
        "--namespace",
        default=default,
        help="torch.ops namespace (default: from pyproject or 'wb')",
    )


def parser() -> argparse.ArgumentParser:
    """``wb [--kernels DIR] [--namespace NS] COMMAND [--kernels DIR] [--namespace NS] ...``.

    The global options are accepted before and after the subcommand; given after it, they win.
    """
    p = argparse.ArgumentParser(prog="wb", description="Build, check and time C++/CUDA ops.")
    p.add_argument("--version", action="version", version=f"wb {__version__}")
    _global_options(p, None)
    globals_after = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand that is not given them leaves the values from before it alone.
    _global_options(globals_after, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_parser(
            sub.add_parser(
                name,
                help=helptext.summary(module.__doc__),
                description=helptext.description(module.__doc__),
                formatter_class=argparse.RawDescriptionHelpFormatter,
                parents=[globals_after],
            )
        )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(COMMANDS[args.command].run(args))
    except WorkbenchError as e:
        print(f"wb {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"wb {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
