"""``workbench.load()`` and the library object it returns."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from workbench import build, knobs, loader, warm
from workbench import launcher as team
from workbench.config import Config, make_config
from workbench.errors import BuildError, WorkbenchError
from workbench.project import Family, Project, discover
from workbench.spec import OpSpec


def _say(line: str) -> None:
    if not knobs.quiet():
        print(f"wb: {line}", file=sys.stderr, flush=True)


class LoadReport:
    """What one load() or reload() did."""

    def __init__(self, built: list[build.Built]) -> None:
        self.built = built
        self.swapped: list[str] = []  # families whose live build changed (added ones included)
        self.seconds = 0.0
        self.removed: list[str] = []  # families that no longer exist
        self.redefined: list[str] = []  # ops with a new or changed schema
        self.swap_seconds = 0.0  # opening, registering and closing libraries

    def __repr__(self) -> str:
        return (
            f"LoadReport(swapped={self.swapped}, removed={self.removed}, "
            f"redefined={self.redefined}, compiled={[p.name for p in self.compiled]}, "
            f"seconds={self.seconds:.3f})"
        )

    @property
    def compiled(self) -> list[Path]:
        return [p for b in self.built for p in b.compiled]

    @property
    def team_cache(self) -> tuple[team.Launcher, team.Counts] | None:
        """sccache's counters over this load's compiles: hits, compiles run here, seconds."""
        return team.total([b.team for b in self.built])

    @property
    def phases(self) -> dict[str, float]:
        """Seconds spent compiling, linking and swapping; the rest is hashing and planning."""
        total = {"compile": 0.0, "link": 0.0}
        for b in self.built:
            for phase, seconds in b.phases.items():
                total[phase] = total.get(phase, 0.0) + seconds
        return {**total, "swap": self.swap_seconds}


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
        self._specs: dict[str, dict[str, OpSpec]] = {}  # family -> op -> spec
        self.families: dict[str, build.Built] = {}
        self.last = self.reload(_first=True)

    @property
    def specs(self) -> dict[str, OpSpec]:
        """The op specs of the live builds, by op name."""
        return {name: spec for specs in self._specs.values() for name, spec in specs.items()}

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

        Families added on disk are loaded and families removed from disk are unloaded (their
        ops disappear). Every family is built before any is swapped; a family whose build
        fails keeps its last good build, the others are swapped, and BuildError is raised.
        """
        start = time.perf_counter()
        if not _first:  # families may have been added or removed on disk
            self.project = discover(self.project.kernels_dir, self.namespace)
        project = self.project
        names = list(self._selected or [f.name for f in project.families])
        built, errors = self._build_all(project, names)
        report = LoadReport(built)
        for result in built:
            self._activate(project.family(result.family), result, report)
        for name in [n for n in self.families if n not in names]:
            self._deactivate(name, report)
        report.seconds = time.perf_counter() - start
        shared = report.team_cache
        if shared is not None:
            team.record(*shared)
        if _first or report.swapped or report.removed:
            _say(self._summary(report, _first) + _team_text(shared))
        if errors:
            raise errors[0] if len(errors) == 1 else BuildError("\n\n".join(map(str, errors)))
        self.last = report
        return report

    def _build_all(
        self, project: Project, names: list[str]
    ) -> tuple[list[build.Built], list[WorkbenchError]]:
        """Build (or find) every family; families build concurrently, each with its own ninja.

        A family has a few TUs, so one ninja per family would leave most cores idle on a cold
        build of many families: up to one family per three jobs builds at once.
        """
        index = warm.Index(warm.identity(project.kernels_dir, project.include_dirs, self.config.id))
        results: dict[str, build.Built | WorkbenchError | None] = {
            name: build.from_index(project.family(name), self.config, index) for name in names
        }
        stale = [name for name, hit in results.items() if hit is None]
        if stale:  # a warm start, with nothing touched, needs no threads
            from workbench import ninja

            jobs = self._jobs or ninja.default_jobs()

            def one(name: str) -> build.Built:
                family = project.family(name)
                return build.ensure(project, family, self.config, jobs, _say, index=index)

            with ThreadPoolExecutor(max_workers=max(1, min(len(stale), jobs // 3))) as pool:
                futures = {name: pool.submit(one, name) for name in stale}
                for name, future in futures.items():
                    try:
                        results[name] = future.result()
                    except WorkbenchError as e:
                        results[name] = e
        with contextlib.suppress(OSError):  # the index only saves time
            index.save()
        built = [r for r in results.values() if isinstance(r, build.Built)]
        errors = [r for r in results.values() if isinstance(r, WorkbenchError)]
        return built, errors

    def _activate(self, family: Family, result: build.Built, report: LoadReport) -> None:
        module = loader.load_spec_module(family.name, self.namespace, family.spec_path)
        specs = loader.specs_of(module)
        swap = loader.activate(self.namespace, result, specs)
        report.swap_seconds += swap.seconds
        report.redefined += swap.redefined
        if swap.swapped:
            report.swapped.append(family.name)
        self._specs[family.name] = specs
        self.families[family.name] = result

    def _deactivate(self, name: str, report: LoadReport) -> None:
        swap = loader.deactivate(self.namespace, name)
        report.swap_seconds += swap.seconds
        report.removed.append(name)
        del self.families[name]
        self._specs.pop(name, None)

    def _summary(self, report: LoadReport, first: bool) -> str:
        if not first:
            return self._reload_summary(report)
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

    def _reload_summary(self, report: LoadReport) -> str:
        parts = []
        if report.swapped:
            names = ", ".join(p.name for p in report.compiled) or "none"
            parts.append(f"reloaded {', '.join(report.swapped)} (compiled: {names})")
        if report.removed:
            parts.append(f"removed {', '.join(report.removed)}")
        if report.redefined:
            parts.append(f"new schema for {', '.join(report.redefined)}")
        phases = ", ".join(f"{k} {v:.2f}" for k, v in report.phases.items() if v)
        return f"{'; '.join(parts)} in {report.seconds:.2f} s ({phases})"


def _team_text(shared: tuple[team.Launcher, team.Counts] | None) -> str:
    """The load line's account of the shared compile cache, e.g. ``; sccache: 9 hits, ...``."""
    return "" if shared is None else f"; {shared[0].name}: {shared[1].text()}"


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
