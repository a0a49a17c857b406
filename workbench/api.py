"""``workbench.load()`` and the library object it returns."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import build, cache, deferred, knobs, loader, specfile, warm
from workbench.config import Config, make_config
from workbench.errors import BuildError, LoadError, WorkbenchError
from workbench.project import Family, Project, discover
from workbench.tuning import store as tune_store

if TYPE_CHECKING:  # the team cache's module is imported only where a build used it
    from workbench import launcher as team
    from workbench import resources
    from workbench.device_live import Module
    from workbench.spec import OpSpec

# Called with the builds a load is about to open, under its use locks: tests use it to hold a
# load between finding its libraries and opening them while another process runs gc or clean.
before_open_hooks: list[Callable[[list[build.Built]], None]] = []


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
        self.failed: dict[str, WorkbenchError] = {}  # families whose build or load failed
        self.tuned: list[str] = []  # families whose ops route to tuned variants (wb tune)
        # Families left for the first lookup of one of their ops (workbench.deferred).
        self.deferred: list[str] = []
        # Device-only TUs (workbench.device): families whose module alone was swapped, the TUs
        # NVRTC compiled, and the seconds spent compiling and loading modules.
        self.device_only: list[str] = []
        self.device_compiled: list[Path] = []
        self.device_seconds = 0.0
        # (TU, kernels) of each module whose rest compiles behind the reload (device_live.Rest)
        self.device_behind: list[tuple[Path, int]] = []
        # The kernels a reload changed (workbench.resources): a line each, what got worse, the
        # seconds after the swap, by step ("in thread": read beside the build, not counted).
        self.resources: list[str] = []
        self.resource_warnings: list[str] = []
        self.resource_seconds = 0.0
        self.resource_parts: dict[str, float] = {}

    def __repr__(self) -> str:
        return (
            f"LoadReport(swapped={self.swapped}, removed={self.removed}, "
            f"redefined={self.redefined}, compiled={[p.name for p in self.compiled]}, "
            f"seconds={self.seconds:.3f})"
        )

    @property
    def compiled(self) -> list[Path]:
        return [p for b in self.built for p in b.compiled] + self.device_compiled

    @property
    def team_cache(self) -> tuple[team.Launcher, team.Counts] | None:
        """sccache's counters over this load's compiles: hits, compiles run here, seconds."""
        spans = [b.team for b in self.built if b.team is not None]
        if not spans:  # a warm start: nothing compiled, nothing to import
            return None
        from workbench import launcher as team

        return team.total(spans)

    @property
    def phases(self) -> dict[str, float]:
        """Seconds spent compiling, linking, swapping libraries and compiling and loading device
        modules (NVRTC); the rest is hashing and planning."""
        total = {"compile": 0.0, "link": 0.0}
        for b in self.built:
            for phase, seconds in b.phases.items():
                total[phase] = total.get(phase, 0.0) + seconds
        return {**total, "swap": self.swap_seconds, "device": self.device_seconds}


class Library:
    """The ops of a kernel registry, as ``lib.<op>`` and ``torch.ops.<ns>.<op>``.

    ``reload()`` rebuilds what changed on disk and swaps it in under the same names.
    ``failed`` maps each family whose last build (or load) failed to its error; such a family
    keeps its last good build, if it had one.

    A family this cache has loaded before, untouched since, is registered with torch at the first
    lookup of one of its ops (:mod:`workbench.deferred`), unless ``eager`` (or WB_EAGER=1).
    """

    def __init__(
        self,
        project: Project,
        config: Config,
        families: Sequence[str] | None,
        jobs: int | None,
        on_error: str = "raise",
        eager: bool | None = None,
        started: float | None = None,
    ) -> None:
        self.project, self.config, self.namespace = project, config, project.namespace
        self.on_error = _on_error(on_error)
        self._selected = tuple(families) if families else None
        self._jobs = jobs
        # family -> its spec.py (imported when first needed: see workbench.specfile)
        self._specs: dict[str, specfile.FamilySpecs | None] = {}
        self.families: dict[str, build.Built] = {}
        self.failed: dict[str, WorkbenchError] = {}
        self._tune_records: frozenset[str] | None = None  # the stored tune records, per reload
        self._stamps: dict[str, list[int] | None] = {}  # of device-only TUs' inputs, per reload
        self._reader: resources.Reader | None = None  # a reload's kernels, read meanwhile
        self.eager = knobs.eager() if eager is None else eager
        self._index: warm.Index | None = None  # the warm-start index of the last reload
        self._ops_key: tuple[int, int, tuple[str, ...]] | None = None  # of _ops_now
        self._ops_now: frozenset[str] = frozenset()
        self.last = self.reload(_first=True, _started=started)

    @property
    def specs(self) -> dict[str, OpSpec]:
        """The op specs of the live builds, by op name (imports the spec.py files not imported
        yet)."""
        return {
            name: spec
            for specs in self._specs.values()
            if specs is not None
            for name, spec in specs.ops().items()
        }

    @property
    def ops(self) -> list[str]:
        return sorted(self._op_names())

    def _op_names(self) -> frozenset[str]:
        # Remembered until a family is swapped in, removed or deferred anywhere, or this library's
        # families change: lib.<op> is on every eager call's path (working it out each time cost
        # 2.7 us a call, where the call of a small op costs 5-20).
        key = (loader.generation(), deferred.generation(), tuple(self.families))
        if self._ops_key != key:
            handles = loader.handles(self.namespace)
            waiting = deferred.pending(self.namespace)
            self._ops_now = frozenset(
                op
                for fam in self.families
                for op in (handles[fam].schemas if fam in handles else waiting[fam].schemas)
            )
            self._ops_key = key
        return self._ops_now

    def register_all(self) -> None:
        """Register the families still waiting for the first lookup of one of their ops (for a
        caller that finds ops in torch's dispatcher by name, without Python)."""
        deferred.activate_all(self.namespace)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._op_names():
            raise AttributeError(f"no op {name!r} in this library; ops: {', '.join(self.ops)}")
        import torch

        return getattr(getattr(torch.ops, self.namespace), name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.ops))

    def __repr__(self) -> str:
        devices = "+".join(["cpu", "cuda"] if self.config.with_cuda else ["cpu"])
        return f"<workbench.Library torch.ops.{self.namespace}: {', '.join(self.ops)} ({devices})>"

    def reload(
        self, _first: bool = False, on_error: str | None = None, _started: float | None = None
    ) -> LoadReport:
        """Rebuild the families whose inputs changed and swap the new builds in.

        Families added on disk are loaded and families removed from disk are unloaded (their
        ops disappear). Every family is built before any is swapped; a family whose build
        fails keeps its last good build and the others are swapped. Then, with ``on_error``
        "raise" (default: the library's, from :func:`load`), a BuildError whose first line names
        each failed family and its first compiler error is raised (a lone LoadError as it is);
        with "warn", a warning says the same and ``failed`` holds the errors.
        """
        mode = _on_error(on_error or self.on_error)
        start = time.perf_counter() if _started is None else _started
        if not _first:  # families may have been added or removed on disk
            self.project = discover(self.project.kernels_dir, self.namespace)
        project = self.project
        names = list(self._selected or [f.name for f in project.families])
        # Each input's stat, read once per load (the index and the device-only TUs share headers).
        self._stamps = {}
        with cache.use_locks(names):  # gc and clean remove no library between find and open
            # The kernels a reload may replace, noted (and read in a thread) while it builds.
            before = self._resource_snapshot(loader.handles(self.namespace), _first)
            built, failed = self._build_all(project, names)
            for hook in before_open_hooks:
                hook(built)
            report = LoadReport(built)
            self._tune_records = tune_store.listing()  # one directory read for every family
            live = loader.handles(self.namespace)
            later = {b.family: d for b in built if (d := self._deferrable(b, live)) is not None}
            fresh = [
                os.fspath(b.library)
                for b in built
                if b.library is not None
                and b.family not in later
                and (b.family not in live or live[b.family].built.library != b.library)
            ]
            with loader.prefetch(fresh):  # opened in a thread meanwhile
                for result in built:
                    family = project.family(result.family)
                    try:
                        described = later.get(result.family)
                        if described is None:
                            self._activate(family, result, report)
                        else:
                            self._defer(family, result, described, report)
                    except (LoadError, BuildError) as e:  # the last good build stays
                        failed[result.family] = e
        if before is not None and report.swapped:
            self._resources(before, report)
        for name in [n for n in self.families if n not in names]:
            self._deactivate(name, report)
        specfile.save()  # the facts of spec texts run for the first time
        self._save_index()
        report.failed = self.failed = failed
        report.seconds = time.perf_counter() - start
        shared = report.team_cache
        if shared is not None:
            from workbench import launcher as team

            team.record(*shared)
        if _first or report.swapped or report.removed:
            _say(self._summary(report, _first) + _team_text(shared))
            for line in report.resources:
                _say(line)
            for line in report.resource_warnings:
                _say(f"warning: {line}")
        if failed:
            from workbench.ninja import failure

            error = failure(failed, len(names))
            if mode == "raise":
                raise error
            warnings.warn(str(error), BuildWarning, stacklevel=2)
        self.last = report
        return report

    def _resource_snapshot(
        self, live: dict[str, loader.Handle], first: bool
    ) -> dict[str, resources.Snapshot] | None:
        """What a reload of a CUDA build compares its kernels' resources with (not a load)."""
        if first or not self.config.with_cuda:
            return None
        from workbench import resources

        snap = resources.snapshot(live)
        if self._reader is not None:  # left by a reload that raised
            self._reader.close()
        self._reader = resources.Reader.start(snap, self.config.archs)
        return snap

    def _resources(self, before: dict[str, resources.Snapshot], report: LoadReport) -> None:
        """A line per kernel the reload changed, and what got worse (workbench.resources)."""
        from workbench import resources

        start = time.perf_counter()
        reader, self._reader = self._reader, None
        if reader is not None:  # what it has not read yet is read below
            report.resource_parts["in thread"] = reader.close()
        report.resource_parts["wait"] = time.perf_counter() - start
        arch = resources.newest_arch(list(self.config.archs))
        live = loader.handles(self.namespace)
        after = resources.snapshot({n: live[n] for n in report.swapped if n in live})
        if arch is not None:
            found = resources.report(before, after, arch, report.resource_parts)
            report.resources, report.resource_warnings = found
        report.resource_seconds = time.perf_counter() - start

    def _build_all(
        self, project: Project, names: list[str]
    ) -> tuple[list[build.Built], dict[str, WorkbenchError]]:
        """Build (or find) every family; families build concurrently, each with its own ninja.

        A family has a few TUs, so one ninja per family would leave most cores idle on a cold
        build of many families: up to one family per three jobs builds at once.
        """
        identity = warm.identity(project.kernels_dir, project.include_dirs, self.config.id)
        index = warm.Index(identity, self._stamps)
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
        self._index = index
        self._save_index()
        built = [r for r in results.values() if isinstance(r, build.Built)]
        errors = {n: r for n, r in results.items() if isinstance(r, WorkbenchError)}
        return built, errors

    def _activate(
        self,
        family: Family,
        result: build.Built,
        report: LoadReport,
        read: tuple[specfile.FamilySpecs | None, list[Module] | None] | None = None,
    ) -> None:
        """Register ``result`` as the family's live build. ``read``: the specs and the device
        modules that the load which deferred it found (default: found now)."""
        if read is None:
            specs = specfile.family_specs(family.name, self.namespace, family.spec_path)
            ready = None
        else:
            specs, ready = read
        from workbench import device

        has_device = device.has_modules(family, self.config)

        def prepare(handle: loader.Handle) -> None:  # a new library: its modules before its ops
            if has_device:
                self._sync_device(family, handle, report, ready)

        deferred = specs.deferred if specs is not None else {}
        swap = loader.activate(self.namespace, result, deferred, prepare)
        report.swap_seconds += swap.seconds
        report.redefined += swap.redefined
        if not swap.swapped and has_device:  # the same library: a device-only TU may have changed
            handle = loader.handles(self.namespace)[family.name]
            if self._sync_device(family, handle, report):
                report.device_only.append(family.name)
                swap.swapped = True
                loader.after_module_swap()
        if swap.swapped:
            report.swapped.append(family.name)
        self._specs[family.name] = specs
        self.families[family.name] = result
        if self._index is not None and swap.swapped and result.library is not None:
            handle = loader.handles(self.namespace)[family.name]
            self._index.describe(
                family.name, os.fspath(result.library), handle.schemas, handle.autograd
            )
        self.route(family.name, report)

    def _save_index(self) -> None:
        if self._index is not None:
            with contextlib.suppress(OSError):  # the index only saves time
                self._index.save()

    def _deferrable(
        self, result: build.Built, live: dict[str, loader.Handle]
    ) -> dict[str, Any] | None:
        """What the library of ``result`` declared when this cache last opened it, if the family
        can wait for the first lookup of one of its ops (workbench.deferred); else None."""
        if self.eager or result.library is None or result.family in live or self._index is None:
            return None
        described = self._index.described(result.family, os.fspath(result.library))
        if described is None:  # never opened here (or since it was built): opened now
            return None
        if tune_store.lookup(result.family, result.key, self._tune_records) is not None:
            return None  # routed to tuned variants: registered now (workbench.tuning.route)
        return described

    def _defer(
        self, family: Family, result: build.Built, described: dict[str, Any], report: LoadReport
    ) -> None:
        """Leave the family for the first lookup of one of its ops, or register it now where it
        cannot wait. What a load reports at once still does: a new spec.py runs now, a spec that
        disagrees with the library on autograd is registered now (and refused), and the
        device-only TUs are compiled now if they changed."""
        from workbench import device

        specs = specfile.family_specs(family.name, self.namespace, family.spec_path)
        given = specs.deferred if specs is not None else {}
        schemas = dict(described["schemas"])
        try:
            loader.check_autograd(schemas, set(described["autograd"]), given)
        except LoadError:  # registered now, which raises the error
            self._activate(family, result, report, (specs, None))
            return
        assert result.library is not None
        modules = None
        if device.has_modules(family, self.config):
            start = time.perf_counter()
            modules = device.prepare(
                self.project, family, self.config, result.library, self._stamps
            )
            report.device_seconds += time.perf_counter() - start
            if modules is None:  # the kernels its launchers name are not recorded
                self._activate(family, result, report, (specs, None))
                return
            report.device_compiled += [m.source for m in modules if m.compiled]
        name = family.name

        def activate() -> None:
            self._activate_deferred(name, result, specs, modules)

        deferred.defer(self.namespace, deferred.Pending(name, schemas, activate))
        self._specs[name] = specs
        self.families[name] = result
        report.deferred.append(name)

    def _activate_deferred(
        self,
        name: str,
        result: build.Built,
        specs: specfile.FamilySpecs | None,
        modules: list[Module] | None,
    ) -> None:
        """Register a deferred family, at the first lookup of one of its ops."""
        report = LoadReport([result])
        family = self.project.family(name)
        with cache.use_locks([name]):
            read: tuple[specfile.FamilySpecs | None, list[Module] | None] | None
            read = (specs, modules)
            if result.library is not None and not result.library.exists():
                # Removed from the cache since the load (wb gc, wb clean): built again.
                from workbench import ninja

                jobs = self._jobs or ninja.default_jobs()
                result, read = build.ensure(self.project, family, self.config, jobs, _say), None
            try:
                self._activate(family, result, report, read)
            except (LoadError, BuildError) as e:
                self.failed[name] = e
                raise
        self.failed.pop(name, None)
        self._save_index()

    def _sync_device(
        self,
        family: Family,
        handle: loader.Handle,
        report: LoadReport,
        ready: list[Module] | None = None,
    ) -> bool:
        """Compile and load the family's changed device-only TUs (workbench.device); ``ready``:
        the modules a deferring load found, loaded as they are."""
        from workbench import device

        start = time.perf_counter()
        swapped = device.sync(self.project, family, self.config, handle, self._stamps, ready=ready)
        report.device_seconds += time.perf_counter() - start
        report.device_compiled += [m.source for m in swapped if m.compiled]
        report.device_behind += [(m.source, m.rest.count) for m in swapped if m.rest is not None]
        return bool(swapped)

    def route(self, family: str, report: LoadReport | None = None) -> None:
        """Send the family's ops to their tuned winners, as stored for its live build (or back
        to the plain build when nothing is stored): see :mod:`workbench.tuning.route`."""
        handle = loader.handles(self.namespace)[family]
        record = tune_store.lookup(family, handle.built.key, self._tune_records)
        if record is None and handle.routes is None:
            return  # the common case, without importing the router
        from workbench.tuning import route

        prepare = route.variant_preparer(self.project, self.project.family(family), self.config)
        route.apply_quietly(self.namespace, handle, record, prepare)
        if report is not None and handle.routes is not None:
            report.tuned.append(family)

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
        failed = f"; {len(report.failed)} failed: {', '.join(report.failed)}" * bool(report.failed)
        later = len(report.deferred)
        waiting = f" ({later} registered at the first lookup of an op)" * bool(later)
        return (
            f"{len(report.built)} op families into torch.ops.{self.namespace}{waiting}: {what}, "
            f"{report.seconds:.3f} s; {cuda}{failed}"
        )

    def _reload_summary(self, report: LoadReport) -> str:
        names = ", ".join(p.name for p in report.compiled) or "none"
        lists = (
            ("reloaded", report.swapped, f" (compiled: {names})"),
            ("module swap only for", report.device_only, ""),
            ("removed", report.removed, ""),
            ("new schema for", report.redefined, ""),
        )
        parts = [f"{label} {', '.join(items)}{tail}" for label, items, tail in lists if items]
        phases = ", ".join(f"{k} {v:.2f}" for k, v in report.phases.items() if v)
        behind = "".join(
            f"; {n} more kernel{'s' * (n != 1)} of {source.name} compiling behind it"
            for source, n in report.device_behind
        )
        return f"{'; '.join(parts)} in {report.seconds:.2f} s ({phases}){behind}"


class BuildWarning(UserWarning):
    """Some op families failed to build or load (``load(..., on_error="warn")``)."""


ON_ERROR = ("raise", "warn")


def _on_error(value: str) -> str:
    if value not in ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'warn', got {value!r}")
    return value


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
    on_error: str = "raise",
    eager: bool | None = None,
    started: float | None = None,
) -> Library:
    """Build (or find in the cache) the kernel registry under ``path`` and load its ops.

    ``path`` is a ``kernels/`` folder with a ``bindings/`` folder beside it (default: the
    bundled kernels). ``namespace`` overrides WB_NAMESPACE and ``[tool.workbench] namespace``
    (default ``wb``). ``devices='cpu'`` skips CUDA even where a GPU is present. ``jobs`` is the
    number of parallel compiles (default: from cores and free memory).

    A family that fails to build or load never stops the others from loading. With
    ``on_error="raise"`` (the default) the error is then raised: a BuildError whose first line
    names each failed family and its first compiler error. With ``on_error="warn"`` a
    :class:`BuildWarning` says the same, and the Library is returned with the good families and
    ``lib.failed`` (family -> error); ``lib.reload()`` then warns too.

    A family this cache has loaded before, untouched since, is registered with torch at the
    first lookup of one of its ops (``torch.ops.<ns>.<op>``, ``lib.<op>``): see
    :mod:`workbench.deferred`. ``eager=True`` (or WB_EAGER=1) registers every family at load.

    ``started``: the ``time.perf_counter()`` at which the caller's call began (``workbench.load``
    passes its entry, before it imports this module), so that the load line times the whole
    call; default: now.
    """
    if started is None:
        started = time.perf_counter()
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    project = discover(path, namespace)
    config = make_config(devices)
    return Library(project, config, families, jobs, _on_error(on_error), eager, started)


__all__ = ["BuildWarning", "Library", "LoadReport", "load"]
