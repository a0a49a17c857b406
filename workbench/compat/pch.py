"""Precompiled torch headers for drop-in C++ sources (``load``, ``load_inline``'s ``cpp_sources``).

A source written for ``torch.utils.cpp_extension`` opens with ``#include <torch/extension.h>``
(or ``torch/all.h``, ``torch/torch.h``, ``torch/library.h``, an ``ATen/`` header): tens of
thousands of lines that every edit compiles again. Where the first thing a source does is include
one such header, its compile gets that header precompiled:

- the header is compiled once with the source's flags (``-x c++-header``) into a folder of the
  cache named by a key over the header, the compiler's identity and every flag, so that a compile
  with any other flag set (another ``-D``, ``-O``, standard) never reads it. The one flag left
  out is ``-DTORCH_EXTENSION_NAME``, which no torch header reads: every extension of a script
  shares one header (GCC checks that a macro defined since does not touch the header, and
  rejects the header where it does);
- the source is compiled with ``-include <header>`` first and that folder first on its include
  path: GCC reads the ``.gch`` where it is valid and the header's text otherwise, so a missing,
  failed or rejected header costs time, never a wrong object (``-Winvalid-pch`` says which);
- the source's own ``#include`` of the header then finds it included already: GCC looks for the
  header beside the ``.gch`` it used, so the folder also holds a link to the real header.

The header is made when a source that can use it is compiled again (an edit, in this cache): a
script's first run and a one-shot build (CI) never pay for it; the first edit makes it, and from
then on each edit compiles the source's own code only. ``WB_DROPIN_PCH=0`` turns it off.

**The lean form.** Most of what the umbrella headers (``torch/extension.h``, ``torch/all.h``,
``torch/torch.h``) cost a compile that reads them precompiled is not parsing but the templates
their inline code uses, which GCC instantiates at the end of every translation unit (a
precompiled header is written before that step): about 4 s of an empty source under
``torch/extension.h`` (pybind11's bindings and the C++ frontend's modules, optimizers and data
loaders), 1.1 s under the part a custom op uses (:data:`LEAN`: ATen, ``torch/library.h``, the
tensor factories; 1.5 s with ``torch/autograd.h``, added for a source that names C++
autograd). A source that opens with an umbrella header and names nothing beyond that part
(:data:`BEYOND_LEAN`: Python bindings, ``torch::nn``, ``torch::optim``, ...) gets the lean
form: the folder holds a stand-in for the umbrella header that includes the lean
headers, and the precompiled header is theirs. Its compile falls back to the whole header (as
above) in the same build step when the lean one does not compile it (a name the scan missed),
and that source is remembered as refused (``refused_file``) so that its next edits go straight to
the whole header. ``WB_DROPIN_PCH=full`` never uses the lean form.

A source that opens with anything else (a ``#define`` that could change the header, another
include, code) compiles as written, and the load says why once. clang is left alone: its
``-include`` takes ``.pch`` files, not ``.gch``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from workbench import cache, procs
from workbench.config import pch_root
from workbench.hashing import digest

# The extension's name: defined for every source, read by no torch header.
NAME_FLAG = "-DTORCH_EXTENSION_NAME="
# Headers worth precompiling: torch's umbrella headers and any of ATen's.
TORCH_PREFIXES = ("torch/", "ATen/")
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_FIRST = re.compile(r"^\s*#\s*(\w+)\s*(.*)$")
_INCLUDE = re.compile(r"^<([^>]+)>$")
# The umbrella headers that have a lean form, and what it includes.
UMBRELLAS = ("torch/extension.h", "torch/all.h", "torch/torch.h")
LEAN = ("ATen/ATen.h", "torch/library.h", "torch/types.h", "torch/utils.h", "torch/cuda.h")
# ... and, for a source that names C++ autograd (a quarter of the lean header's cost, which most
# op sources, registering their formulas from Python, never use), torch/autograd.h.
LEAN_AUTOGRAD = "torch/autograd.h"
_AUTOGRAD = re.compile(r"\bautograd\b|\bAutogradContext\b|\bvariable_list\b|\btensor_list\b")
# Names a source can only get from the whole umbrella header (its first match says why not lean).
BEYOND_LEAN = re.compile(
    r"\bPYBIND11_\w+|\bpybind11\b|\bpy::|\bPy[A-Z]\w*|\bTHP\w*|"
    r"\btorch::(?:python|nn|optim|data|jit|serialize|save|load|fft|linalg|special|nested|"
    r"sparse|mps|xpu|stable|enumtype|version)\b|\bTORCH_VERSION\w*|"
    r"#\s*include\s*[<\"](?:torch/python\.h|torch/csrc/|pybind11/|Python\.h)"
)


@dataclass(frozen=True)
class Header:
    """A precompiled header to make: the command, and the file it writes."""

    include: str  # as the source names it, e.g. "torch/extension.h"
    real: Path  # the header that name finds on the source's include path
    folder: Path  # first on the include path: holds <include>.gch and a link to ``real``
    command: tuple[str, ...]
    lean: tuple[str, ...] = ()  # the lean form: <include> in the folder includes these alone

    @property
    def output(self) -> Path:
        return self.folder / f"{self.include}.gch"

    @property
    def flags(self) -> tuple[str, ...]:
        """What the source's compile adds: the folder first, the header first."""
        return (f"-I{self.folder}", "-include", self.include, "-Winvalid-pch")


def leading_header(text: str) -> tuple[str | None, str]:
    """(the torch header a source includes before anything else, or None; why not)."""
    for line in _COMMENTS.sub(" ", text).splitlines():
        if not line.strip():
            continue
        match = _FIRST.match(line)
        if match is None:
            return None, "its first line is code, not an #include of a torch header"
        directive, rest = match.groups()
        if directive == "pragma" and rest.strip() == "once":
            continue
        if directive != "include":
            return None, f"it starts with #{directive}, which could change what the header means"
        name = _INCLUDE.match(rest.strip())
        if name is None or not name.group(1).startswith(TORCH_PREFIXES):
            return None, f"its first #include ({rest.strip()}) is not a torch header"
        return name.group(1), ""
    return None, "it includes no torch header"


def plan(text: str, head: list[str], identity: dict[str, object]) -> tuple[Header | None, str]:
    """The precompiled header for a source of ``text`` compiled with ``head`` (compiler and
    flags), or (None, why not). ``identity``: the toolchain's, part of the header's key."""
    include, why = leading_header(text)
    if include is None:
        return None, why
    real = _find(include, head)
    if real is None:
        return None, f"{include} is not on its include path"
    flags = [f for f in head if not f.startswith(NAME_FLAG)]
    key = digest("drop-in pch", 1, include, str(real), flags, identity)
    folder = pch_root() / "dropin" / key[:32]
    wrapper = folder / "wb_dropin_pch.h"
    command = (*flags, "-x", "c++-header", str(wrapper), "-o", f"{folder / include}.gch")
    return Header(include, real, folder, command), ""


def lean(full: Header, text: str, head: list[str], identity: dict[str, object]) -> Header | None:
    """The lean form of ``full`` for a source of ``text`` (see the module docstring), or None
    where ``full`` is not an umbrella header or the source names something beyond the lean
    part (:func:`beyond_lean` says what)."""
    if full.include not in UMBRELLAS:
        return None
    code = _COMMENTS.sub(" ", text)  # the comments stripped once, for both scans
    if BEYOND_LEAN.search(code) is not None:
        return None
    includes = (*LEAN, LEAN_AUTOGRAD) if _AUTOGRAD.search(code) else LEAN
    flags = [f for f in head if not f.startswith(NAME_FLAG)]
    key = digest("drop-in lean pch", 1, full.include, includes, str(full.real), flags, identity)
    folder = pch_root() / "dropin" / key[:32]
    wrapper = folder / "wb_dropin_pch.h"
    out = f"{folder / full.include}.gch"
    command = (*flags, "-x", "c++-header", str(wrapper), "-o", out)
    return Header(full.include, full.real, folder, command, lean=includes)


def beyond_lean(text: str) -> str | None:
    """The first thing ``text`` names that only the whole umbrella header declares, or None."""
    found = BEYOND_LEAN.search(_COMMENTS.sub(" ", text))
    return found.group(0) if found is not None else None


def refused_file(header: Header, source: Path) -> Path:
    """Where a lean header's failed compile of ``source`` is kept (its errors): the mark that
    the source's next compiles take the whole header."""
    return header.folder / "refused" / digest("refused", str(source))[:32]


def _find(include: str, head: list[str]) -> Path | None:
    """Where ``#include <include>`` lands: the first -I, then -isystem, folder that has it."""
    for prefix in ("-I", "-isystem"):
        for flag in head:
            if flag.startswith(prefix) and len(flag) > len(prefix):
                found = Path(flag[len(prefix) :]) / include
                if found.is_file():
                    return found
    return None


def ensure(header: Header) -> str | None:
    """Make ``header`` once (under a lock of the cache); None, or why it could not be made (the
    compile then reads the header's text)."""
    if header.output.exists():
        return None
    with cache.lock(f"dropin-pch-{header.folder.name}"):
        if header.output.exists():
            return None
        header.output.parent.mkdir(parents=True, exist_ok=True)
        wrapper = header.folder / "wb_dropin_pch.h"
        link = header.folder / header.include
        if header.lean:
            includes = "".join(f"#include <{h}>\n" for h in header.lean)
            cache.write_atomic(wrapper, includes)
            stand_in = f"#pragma once\n// The lean form of <{header.include}>\n"
            cache.write_atomic(link, stand_in + includes)
        else:
            cache.write_atomic(wrapper, f"#include <{header.include}>\n")
            part = link.with_name(f".{link.name}.{os.getpid()}.link")
            part.unlink(missing_ok=True)
            part.symlink_to(header.real)
            os.replace(part, link)
        tmp = header.output.with_name(f".{header.output.name}.{os.getpid()}.tmp")
        command = [*header.command[:-1], str(tmp)]
        proc = procs.run(command)  # an interrupt ends the compiler too
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            lines = proc.stderr.strip().splitlines()
            return f"precompiling {header.include} failed: {lines[-1] if lines else '?'}"
        os.replace(tmp, header.output)
    return None
