"""``workbench.load()`` and the library object it returns."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import build, knobs, loader
from workbench.config import Config, make_config
from workbench.project import Project, discover
from workbench.spec import OpSpec


def _say(line: str) -> None:
    if not knobs.quiet():
        print(f"wb: {line}", file=sys.stderr, flush=True)


@dataclass
class LoadReport:
    """What one load() or reload() did."""

    built: list[build.Built]
    swapped: list[str]  # families whose live build changed
    seconds: float

    @property
    def compiled(self) -> list[Path]:
        return [p for b in self.built for p in b.compiled]


class Library:
    """The ops of a kernel registry, as ``lib.<op>`` and ``torch.ops.<ns>.<op>``.

    ``reload()`` rebuilds what changed on disk and swaps it in under the same names.
    """

    def __init__(
        self, project: Project, config: Config, families: Sequence[str] | None, jobs: int | None
    ) -> None:
        self.project = project
        self.config = config
        self.namespace = project.namespace
        self._selected = tuple(families) if families else None
        self._jobs = jobs
        self.specs: dict[str, OpSpec] = {}
        self.families: dict[str, build.Built] = {}
        self.last = self.reload(_first=True)

    @property
    def ops(self) -> list[str]:
        handles = loader.live_handles(self.namespace)
        return sorted(op for fam in self.families for op in handles[fam].schemas)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.ops:
            raise AttributeError(f"no op {name!r} in this library; ops: {', '.join(self.ops)}")
        import torch

        return getattr(getattr(torch.ops, self.namespace), name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.ops))

    def __repr__(self) -> str:
        devices = "+".join(["cpu", "cuda"] if self.config.with_cuda else ["cpu"])
        return f"<workbench.Library torch.ops.{self.namespace}: {', '.join(self.ops)} ({devices})>"

    def reload(self, _first: bool = False) -> LoadReport:
        """Rebuild the families whose inputs changed and swap the new builds in.

        A failed build raises BuildError and leaves the last good build loaded.
        """
        start = time.perf_counter()
        project = discover(self.project.kernels_dir, self.namespace)
        self.project = project
        names = self._selected or [f.name for f in project.families]
        built, swapped = [], []
        for name in names:
            family = project.family(name)
            result = build.ensure(project, family, self.config, self._jobs, on_line=_say)
            module = loader.load_spec_module(family.name, self.namespace, family.spec_path)
            specs = loader.specs_of(module)
            if loader.activate(self.namespace, result, specs):
                swapped.append(name)
            self.specs.update(specs)
            self.families[name] = result
            built.append(result)
        report = LoadReport(built, swapped, time.perf_counter() - start)
        if _first or swapped:
            _say(self._summary(report))
        return report

    def _summary(self, report: LoadReport) -> str:
        fresh = [b.family for b in report.built if not b.hit]
        objs = len(report.compiled)
        what = (
            f"built {len(fresh)} ({objs} object{'s' * (objs != 1)} compiled)"
            if fresh
            else "all cached (0 objects compiled)"
        )
        cuda = (
            f"cpu+cuda {','.join(self.config.archs)}"
            if self.config.with_cuda
            else self.config.cpu_reason
        )
        return (
            f"{len(report.built)} op families into torch.ops.{self.namespace}: {what}, "
            f"{report.seconds:.3f} s; {cuda}"
        )


def load(
    path: str | Path | None = None,
    *,
    namespace: str | None = None,
    families: Sequence[str] | None = None,
    devices: str | None = None,
    jobs: int | None = None,
) -> Library:
    """Build (or find in the cache) the kernel registry under ``path`` and load its ops.

    ``path`` is a ``kernels/`` folder with a ``bindings/`` folder beside it (default: the
    bundled kernels). ``namespace`` overrides WB_NAMESPACE and ``[tool.workbench] namespace``
    (default ``wb``). ``devices='cpu'`` skips CUDA even where a GPU is present. ``jobs`` is the
    number of parallel compiles (default: from cores and free memory).
    """
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    project = discover(path, namespace)
    return Library(project, make_config(devices), families, jobs)


__all__ = ["Library", "LoadReport", "load"]
