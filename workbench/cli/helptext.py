"""Subcommand help from the subcommand's module docstring, as plain text.

The docstring's first paragraph is the one-line summary in ``wb --help``; the whole docstring,
its paragraphs kept, is the description in ``wb COMMAND --help``. reStructuredText quoting
(double backquotes, ``:func:`` roles) is dropped: the terminal shows the plain words.
"""

from __future__ import annotations

import re
import textwrap

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str) -> str:
    """``text`` without reStructuredText quoting: ``x`` and :func:`x` read as x."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


def paragraphs(doc: str | None) -> list[str]:
    """The docstring's paragraphs, each as one line of plain text."""
    blocks = re.split(r"\n\s*\n", textwrap.dedent(doc or "").strip())
    return [" ".join(plain(b).split()) for b in blocks if b.strip()]


def summary(doc: str | None) -> str:
    """The first paragraph: the line ``wb --help`` shows for a subcommand."""
    first = paragraphs(doc)
    return first[0] if first else ""


def description(doc: str | None, width: int = 88) -> str:
    """Every paragraph, wrapped to ``width``, separated by a blank line (for
    argparse.RawDescriptionHelpFormatter, which keeps them)."""
    return "\n\n".join(textwrap.fill(p, width) for p in paragraphs(doc))
