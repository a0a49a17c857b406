"""The notebook extension: ``%load_ext workbench``.

Magics:

- ``%wb_registry [PATH] [--namespace NS]``: the notebook's kernel registry (default
  ``./wb_kernels``, namespace ``nb``); creates its folders and returns its Library.
- ``%%wb_kernel FAMILY [--cpu | --cuda | --header | --spec]``: the cell becomes a file of op
  family FAMILY and the family is rebuilt and swapped in, so ``torch.ops.<ns>.<op>`` runs the
  cell's code right away; running an edited cell again hot-reloads it under the same name.
  Without a flag the cell is the family's host side, ``bindings/FAMILY.cpp`` (``WB_DEF`` /
  ``WB_IMPL``, may hold a CPU kernel too); ``--cpu`` / ``--cuda`` / ``--header`` are the
  torch-free ``kernels/FAMILY/FAMILY.cpp`` / ``.cu`` / ``.h``; ``--spec`` is ``spec.py``.
  Compiler messages carry the cell's own line numbers (``#line``); a compile error fails the
  cell and the last good build stays loaded.

Before every cell, each loaded registry and drop-in extension whose files changed on disk is
rebuilt and swapped in, with one line saying what was rebuilt and how long it took. Builds
print ninja's progress and stop cleanly on the stop button (KeyboardInterrupt): the compiler
is killed, the temporary folder removed, the lock released, and nothing half-written is left in
the cache. A Library displays as a table of its ops, and a roofline picture
(``workbench.bench(...).roofline()``) as its SVG, inline.
"""

from __future__ import annotations

import html
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from workbench.errors import BuildError, WorkbenchError

DEFAULT_REGISTRY = "wb_kernels"
DEFAULT_NAMESPACE = "nb"
_KINDS = {
    None: ("bindings/{f}.cpp", True),
    "--cpu": ("kernels/{f}/{f}.cpp", True),
    "--cuda": ("kernels/{f}/{f}.cu", True),
    "--header": ("kernels/{f}/{f}.h", True),
    "--spec": ("kernels/{f}/spec.py", False),
}


class CellCompileError(BuildError):
    """A kernel cell that does not compile; the message has the cell's line numbers."""


class Session:
    """The extension's state in one IPython shell."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.library: Any = None
        self._failed: dict[str, str] = {}  # drop-in extension -> the error last reported

    # -- the registry ---------------------------------------------------------------------------

    def registry(self, line: str) -> Any:
        args = shlex.split(line)
        namespace = DEFAULT_NAMESPACE
        if "--namespace" in args:
            i = args.index("--namespace")
            if i + 1 >= len(args):
                raise ValueError("%wb_registry: --namespace needs a value, e.g. --namespace nb")
            namespace = args[i + 1]
            del args[i : i + 2]
        if len(args) > 1:
            raise ValueError("usage: %wb_registry [PATH] [--namespace NS]")
        root = Path(args[0] if args else DEFAULT_REGISTRY).expanduser().resolve()
        return self.open(root, namespace)

    def open(self, root: Path, namespace: str) -> Any:
        from workbench.compat import dispatch

        (root / "kernels").mkdir(parents=True, exist_ok=True)
        (root / "bindings").mkdir(exist_ok=True)
        # One broken family must not cost the notebook the others: they load, it is reported.
        self.library = dispatch.load(root / "kernels", namespace=namespace, on_error="warn")
        return self.library

    # -- kernel cells ---------------------------------------------------------------------------

    def kernel(self, line: str, cell: str) -> None:
        args = shlex.split(line)
        flags = [a for a in args if a.startswith("--")]
        names = [a for a in args if not a.startswith("--")]
        if len(names) != 1 or len(flags) > 1 or (flags and flags[0] not in _KINDS):
            raise ValueError(
                "usage: %%wb_kernel FAMILY [--cpu | --cuda | --header | --spec] (no flag: the "
                "family's host side with WB_DEF / WB_IMPL)"
            )
        family, kind = names[0], (flags[0] if flags else None)
        if self.library is None:
            self.registry("")
        root = self.library.project.kernels_dir.parent
        pattern, is_cpp = _KINDS[kind]
        path = root / pattern.format(f=family)
        path.parent.mkdir(parents=True, exist_ok=True)
        (root / "kernels" / family).mkdir(exist_ok=True)  # discovery finds families by folder
        text = f'#line 1 "<cell {family}>"\n{cell}' if is_cpp else cell
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        self.rebuild(family, kind)

    def rebuild(self, family: str, kind: str | None) -> None:
        try:
            report = self.library.reload(on_error="raise")
        except BuildError as e:
            raise CellCompileError(
                f"{family}: the cell does not compile; the last good build stays loaded.\n{e}",
                e.log,
            ) from None
        except WorkbenchError as e:
            if "no binding" in str(e):  # a kernel cell before its host-side cell
                print(f"wb: {family}: saved; it builds once its host-side cell has run")
                return
            raise
        if kind == "--cuda" and not self.library.config.with_cuda:
            print(
                f"wb: {family}: CUDA cell saved, not built here ({self.library.config.cpu_reason})"
            )
        ops = [f"torch.ops.{self.library.namespace}.{op}" for op in self._ops_of(family)]
        what = "rebuilt" if family in report.swapped else "unchanged"
        print(f"wb: {family}: {what} in {report.seconds:.2f} s; {', '.join(ops) or 'no ops yet'}")

    def _ops_of(self, family: str) -> list[str]:
        from workbench import loader

        handle = loader.live_handles(self.library.namespace).get(family)
        return sorted(handle.schemas) if handle is not None else []

    # -- autoreload -----------------------------------------------------------------------------

    def pre_run_cell(self, *_: Any) -> None:
        """Rebuild and swap in whatever changed on disk since the last build."""
        from workbench.compat import dispatch, dropin

        libraries = list(dispatch.libraries)
        if self.library is not None and self.library not in libraries:
            libraries.append(self.library)
        for lib in libraries:
            self._reload_library(lib)
        for name, compiled, seconds, error in dropin.reload_all():
            if error is not None:
                if self._failed.get(name) != error:  # say each failure once, not every cell
                    print(
                        f"wb autoreload: {name}: build failed, the last good build stays "
                        f"loaded:\n{error}",
                        file=sys.stderr,
                    )
                self._failed[name] = error
                continue
            self._failed.pop(name, None)
            if compiled:
                print(f"wb autoreload: {name}: rebuilt {', '.join(compiled)} in {seconds:.2f} s")

    def _reload_library(self, lib: Any) -> None:
        start = time.perf_counter()
        try:
            report = lib.reload(on_error="raise")  # reported below, once per cell
        except WorkbenchError as e:
            print(
                f"wb autoreload: torch.ops.{lib.namespace}: build failed, the last good build "
                f"stays loaded:\n{e}",
                file=sys.stderr,
            )
            return
        if report.swapped:
            files = sorted({p.name for p in report.compiled})
            print(
                f"wb autoreload: torch.ops.{lib.namespace}: rebuilt {', '.join(report.swapped)} "
                f"({', '.join(files) or 'relinked'}) in {time.perf_counter() - start:.2f} s"
            )


def library_html(lib: Any) -> str:
    """A Library as an HTML table: one row per op, with its family and schema."""
    from workbench import loader

    rows = []
    for family, handle in sorted(loader.live_handles(lib.namespace).items()):
        if family not in lib.families:
            continue
        for op, schema in sorted(handle.schemas.items()):
            cells = (f"torch.ops.{lib.namespace}.{op}", family, schema)
            rows.append("<tr>" + "".join(f"<td><code>{html.escape(c)}</code></td>" for c in cells))
    devices = "cpu+cuda" if lib.config.with_cuda else f"cpu ({lib.config.cpu_reason})"
    head = "<tr><th>op</th><th>family</th><th>schema</th></tr>"
    return (
        f"<p><b>workbench.Library</b> <code>torch.ops.{html.escape(lib.namespace)}</code>, "
        f"{html.escape(devices)}</p><table>{head}{''.join(rows)}</table>"
    )


def roofline_svg(picture: Any) -> str | None:
    """A roofline picture (``BenchResult.roofline()``) as inline SVG; None without matplotlib,
    and the notebook shows its text instead, which says so."""
    svg: str | None = picture.svg()
    return svg


_sessions: dict[int, Session] = {}


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext workbench``: register the magics, the autoreload hook and the display."""
    session = Session(ipython)
    _sessions[id(ipython)] = session
    ipython.register_magic_function(session.registry, "line", "wb_registry")
    ipython.register_magic_function(session.kernel, "cell", "wb_kernel")
    ipython.events.register("pre_run_cell", session.pre_run_cell)
    html_formatter = ipython.display_formatter.formatters["text/html"]
    html_formatter.for_type_by_name("workbench.api", "Library", library_html)
    svg_formatter = ipython.display_formatter.formatters["image/svg+xml"]
    svg_formatter.for_type_by_name("workbench.benchmark.roofline", "Roofline", roofline_svg)


def unload_ipython_extension(ipython: Any) -> None:
    session = _sessions.pop(id(ipython), None)
    if session is not None:
        ipython.events.unregister("pre_run_cell", session.pre_run_cell)
