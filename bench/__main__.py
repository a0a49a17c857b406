"""``python -m bench NAME [ARGS]``: run one measurement; with no name (or ``--list``), list them."""

from __future__ import annotations

import importlib
import sys

from bench.common import measurements

USAGE = "usage: python -m bench NAME [ARGS]   (python -m bench NAME --help: its options)"


def listing(known: dict[str, str]) -> str:
    width = max(map(len, known))
    return "\n".join([USAGE, "", *(f"  {n:<{width}}  {s}" for n, s in known.items())])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    known = measurements()
    if not args or args[0] in ("--list", "-h", "--help"):
        print(listing(known))
        return 0
    name, rest = args[0], args[1:]
    if name not in known:
        print(
            f"python -m bench: no measurement named {name!r}; known: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"bench.{name}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
