"""Building one op family: content-keyed objects, one ninja edge per stale TU, a cached library.

Lifecycle (:func:`ensure`): compute each TU's key from its source, the headers its last
compile read, its command line and the toolchain; if the family's library for those keys is in
the cache and its checksum matches, use it (no lock taken). Otherwise take the family's lock,
look again, compile only the TUs whose objects are missing, link in a temporary directory,
write the manifest last and rename the directory into place.

Failure: the temporary directory is removed, so the cache never holds a partial entry; the
attempt is recorded in ``failed/`` (what ``wb status`` shows) and cleared by the next success.
A full disk (or a file-size limit) anywhere in the build reads as a CacheError that names the
cache directory and WB_CACHE_DIR.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from workbench import cache, events, procs, warm
from workbench.config import PCH_SOURCE, Config
from workbench.errors import BuildError
from workbench.events import compile_hooks
from workbench.hashing import digest, file_digest
from workbench.project import WB_REGISTRY_SOURCE, Family, Project, Source, mentions_tune

if TYPE_CHECKING:
    from workbench import launcher as team
    from workbench import ninja

# Called with (family name, source path) for every TU compiled: tests count rebuilds with it.
MANIFEST_FORMAT = 2
# Compiler messages that mean the disk (or a file-size limit) ran out, not a bad source.
_NO_SPACE_TEXT = (
    "No space left on device",
    "File too large",
    "File size limit exceeded",
    "Disk quota exceeded",
)


class Progress(Protocol):
    """What a build reports as it goes (``wb build`` draws it; tests may record it)."""

    def started(self, family: str, sources: list[Path], parallel: int) -> None: ...

    def finished(self, family: str, source: Path) -> None: ...

    def note(self, family: str, text: str) -> None: ...


class Built:
    """One family's build: its key, its library and manifest, and what making it took.

    The records on the load path are plain classes: a dataclass costs about 0.5 ms to create
    at import, and import is part of every warm start.
    """

    def __init__(
        self, family: str, key: str, library: Path | None, manifest: dict[str, Any] | None
    ) -> None:
        self.family = family
        self.key = key
        self.library = library  # None for a compile-only build
        self._manifest = manifest  # None: read from beside the library when first asked for
        self.compiled: list[Path] = []
        self.seconds = 0.0
        # Wall time of the build's phases ("compile", "link"); empty for a cache hit.
        self.phases: dict[str, float] = {}
        self.lock_wait = 0.0  # seconds spent waiting for another process's build lock
        self.locked_at: float | None = None  # time.monotonic() when the build lock was taken
        self.team: team.Span | None = None  # sccache's counters around its compiles, if used

    def __repr__(self) -> str:
        return (
            f"Built(family={self.family!r}, key={self.key[:12]!r}, library={self.library}, "
            f"compiled={len(self.compiled)})"
        )

    @property
    def hit(self) -> bool:
        return not self.compiled

    @property
    def manifest(self) -> dict[str, Any]:
        """What the build recorded (``manifest.json`` in its cache entry)."""
        if self._manifest is None:
            found = cache.read_json(self.library.parent / "manifest.json") if self.library else None
            self._manifest = found if isinstance(found, dict) else {}
        return self._manifest


def family_sources(family: Family, config: Config) -> list[Source]:
    """The TUs of the family's library: device-only TUs are not among them (workbench.device)."""
    cuda = config.with_cuda
    srcs = [s for s in family.sources if s.kind != "device" and (s.kind != "cuda" or cuda)]
    return [*srcs, Source(WB_REGISTRY_SOURCE, "registry")]


def _deps_file(source: Path, command: tuple[str, ...]) -> Path:
    """Where the header list of the last compile of (source, command) is kept."""
    return cache.root() / "deps" / f"{digest(str(source), command)[:32]}.json"


def headers_from_depfile(depfile: Path, source: Path, config: Config) -> list[str]:
    text = depfile.read_text().replace("\\\n", " ")
    _, _, deps = text.partition(": ")
    paths = [os.path.abspath(p) for p in deps.split()]
    # The precompiled header's text is named by its folder on the command line, and a compile
    # lists it only when it read the text instead of the .gch: left out, so the list is the same.
    skip = {str(source), str(PCH_SOURCE)}
    keep = [p for p in paths if p not in skip and not p.startswith(config.excluded_roots)]
    return sorted(set(keep))


class TU:
    def __init__(
        self,
        source: Source,
        command: tuple[str, ...],  # with placeholder output paths, identical across builds
        headers: list[str] | None,  # None: never compiled in this cache
        defines: tuple[str, ...] = (),  # a tuning variant's -D options, when the TU reads them
    ) -> None:
        self.source = source
        self.command = command
        self.headers = headers
        self.defines = defines
        self.key: str | None = None

    def compute_key(self, config: Config) -> str | None:
        if self.headers is None:
            return None
        inputs = [(p, file_digest(p)) for p in [str(self.source.path), *self.headers]]
        self.key = digest("tu", config.id, self.command, inputs)
        return self.key


def object_path(key: str) -> Path:
    return cache.root() / "obj" / key[:2] / f"{key}.o"


def _tu_defines(project: Project, family: Family, src: Source, config: Config) -> tuple[str, ...]:
    """The variant's -D options for ``src``: only for a TU that can read them.

    A kernel TU gets them when its text, or that of a header its plain build included (the
    compiler's own list, from its depfile), mentions ``WB_TUNE_``: the other TUs of a variant
    keep the plain build's command, key and object, so a variant compiles only the TUs its
    parameters reach. A TU whose plain build never ran here gets them (it cannot be told).
    """
    if not family.defines or src.kind not in ("cuda", "cpu"):
        return ()
    plain = config.compile_command(project, src, Path("@OUT@"))
    headers = cache.read_json(_deps_file(src.path, plain))
    if not isinstance(headers, list):
        return family.defines
    for path in [str(src.path), *headers]:
        if mentions_tune(path):
            return family.defines
    return ()


def shares_host_objects(project: Project, family: Family, config: Config) -> bool:
    """Whether every host TU of ``family`` (a tuning variant) keeps the plain build's object:
    its -D options reach no TU but its device-only ones (see :func:`_tu_defines`)."""
    return not any(
        _tu_defines(project, family, src, config) for src in family_sources(family, config)
    )


def plan_tus(project: Project, family: Family, config: Config) -> list[TU]:
    tus = []
    for src in family_sources(family, config):
        own = _tu_defines(project, family, src, config)
        cmd = config.compile_command(project, src, Path("@OUT@"), own)
        headers = cache.read_json(_deps_file(src.path, cmd))
        tu = TU(src, cmd, headers if isinstance(headers, list) else None, own)
        tu.compute_key(config)
        tus.append(tu)
    return tus


def _library_key(tus: list[TU], config: Config, device: tuple[str, ...] = ()) -> str | None:
    """The key of the library linked from ``tus``; ``device``: a variant's -D options that reach
    its device-only TUs (:func:`workbench.device.device_defines`), which make it another build."""
    if any(tu.key is None for tu in tus):
        return None
    link = config.link_command([], Path("@OUT@"), Path("@STUBS@")) if config.link else None
    parts: list[object] = ["lib", config.id, link, sorted((str(t.source.path), t.key) for t in tus)]
    if device:
        parts.append(("device-only TUs read", device))
    return digest(*parts)


def _key(project: Project, family: Family, config: Config, tus: list[TU]) -> str | None:
    from workbench.device import device_defines

    return _library_key(tus, config, device_defines(project, family, config))


def library_dir(family: Family, key: str) -> Path:
    return cache.root() / "lib" / family.name / key[:32]


def find_cached(family: Family, key: str | None) -> Built | None:
    """The complete, intact library for ``key``, or None. Never raises for a missing entry.

    A truncated or corrupted library (its sha256 differs from the manifest's) is reported as
    missing; the build that follows replaces it under the family lock.
    """
    if key is None:
        return None
    entry = cache.read_entry(library_dir(family, key), key, "library")
    if entry is None:
        return None
    manifest, lib = entry
    return Built(family.name, key, lib, manifest)


def current_key(project: Project, family: Family, config: Config) -> str | None:
    """The library key the current sources would build to; None if a TU was never compiled."""
    return _key(project, family, config, plan_tus(project, family, config))


def attempt_fingerprint(project: Project, family: Family, config: Config) -> str:
    """A digest of everything a build attempt starts from, known even before any compile."""
    return _fingerprint(plan_tus(project, family, config), config)


def _fingerprint(tus: list[TU], config: Config) -> str:
    parts = []
    for tu in tus:
        files = [str(tu.source.path), *(tu.headers or [])]
        parts.append((tu.command, [(p, file_digest(p)) for p in files]))
    return digest("attempt", config.id, parts)


def failure_path(project: Project, family: Family) -> Path:
    """Where the last failed build of this project's family is recorded."""
    where = digest(str(project.kernels_dir))[:8]
    return cache.root() / "failed" / f"{family.build_name}-{where}.json"


def ensure(
    project: Project,
    family: Family,
    config: Config,
    jobs: int | None = None,
    on_line: Callable[[str], None] | None = None,
    progress: Progress | None = None,
    index: warm.Index | None = None,
) -> Built:
    """The family's library for the current sources: from the cache, or built now.

    With a warm-start ``index``, a family whose inputs are untouched since the index recorded
    it is returned without planning or hashing (see :mod:`workbench.warm`).
    """
    hit = from_index(family, config, index) if index is not None else None
    if hit is not None:
        return hit
    built = _ensure(project, family, config, jobs, on_line, progress)
    if index is not None:
        sources = [str(s.path) for s in family_sources(family, config)]
        library = str(built.library) if built.library else None
        # A linked build's manifest is read from its cache entry when needed: most warm starts
        # never need it, and 30 copies of it made the index slow to read.
        manifest = None if library else built.manifest
        record = {"key": built.key, "library": library, "manifest": manifest}
        index.record(family.name, sources, list(built.manifest.get("inputs", {})), library, record)
    return built


def from_index(family: Family, config: Config, index: warm.Index) -> Built | None:
    """The family's build as the warm-start index recorded it, if its inputs are untouched."""
    entry = index.lookup(family.name, [str(s.path) for s in family_sources(family, config)])
    if entry is None:
        return None
    b = entry["build"]
    library = Path(b["library"]) if b["library"] else None
    if library is None and not isinstance(b.get("manifest"), dict):
        return None
    return Built(family.name, b["key"], library, b.get("manifest"))


def _ensure(
    project: Project,
    family: Family,
    config: Config,
    jobs: int | None,
    on_line: Callable[[str], None] | None,
    progress: Progress | None,
) -> Built:
    start = time.perf_counter()
    tus = plan_tus(project, family, config)
    hit = find_cached(family, _key(project, family, config, tus))
    if hit is not None:
        return hit

    def waiting() -> None:
        text = f"waiting for another process building {family.name}"
        if on_line:
            on_line(text)
        if progress:
            progress.note(family.name, text)

    before = time.monotonic()
    with cache.lock(family.build_name, on_wait=waiting):
        locked_at = time.monotonic()
        tus = plan_tus(project, family, config)  # look again: the other process may have built it
        built = find_cached(family, _key(project, family, config, tus))
        if built is None:
            built = _build_recorded(project, family, config, tus, jobs, on_line, progress)
    built.lock_wait, built.locked_at = locked_at - before, locked_at
    built.seconds = time.perf_counter() - start
    return built


def _build_recorded(
    project: Project,
    family: Family,
    config: Config,
    tus: list[TU],
    jobs: int | None,
    on_line: Callable[[str], None] | None,
    progress: Progress | None,
) -> Built:
    """Build under the family lock; record a failure for ``wb status``, clear it on success."""
    record = failure_path(project, family)
    fingerprint = _fingerprint(tus, config)
    try:
        with cache.lock("objects", shared=True):  # gc deletes no object while we build
            built = _build_locked(project, family, config, tus, jobs, on_line, progress)
    except OSError as e:
        if e.errno not in cache.NO_SPACE:
            raise
        error = cache.no_space_error(e, f"building {family.name}")
        _record_failure(record, fingerprint, str(error))
        raise error from e
    except BuildError as e:
        if any(text in str(e) for text in _NO_SPACE_TEXT):
            e.args = (f"{e}\n{cache.no_space_error(OSError(28, 'disk full'), family.name)}",)
        _record_failure(record, fingerprint, str(e))
        raise
    record.unlink(missing_ok=True)
    return built


def _record_failure(record: Path, fingerprint: str, message: str) -> None:
    data = {"fingerprint": fingerprint, "time": time.time(), "message": message[:4000]}
    with contextlib.suppress(OSError):  # a full disk must not hide the build's own error
        cache.write_atomic(record, _json_text(data))


def _build_locked(
    project: Project,
    family: Family,
    config: Config,
    tus: list[TU],
    jobs: int | None,
    on_line: Callable[[str], None] | None,
    progress: Progress | None,
) -> Built:
    from workbench import launcher as team  # here: a warm start never builds
    from workbench import ninja, pch

    tmp = cache.make_tmp_dir(family.name)
    try:
        stale = [tu for tu in tus if tu.key is None or not object_path(tu.key).exists()]
        outputs = {id(tu): tmp / f"{i}_{tu.source.path.stem}.o" for i, tu in enumerate(stale)}
        ninja_jobs = [
            ninja.Job(
                outputs[id(tu)], tu.source.path, _command(project, config, tu, outputs[id(tu)])
            )
            for tu in stale
        ]
        launcher = team.for_build(project.kernels_dir) if ninja_jobs else None
        note = _note_sink(family, on_line, progress)
        header_first, scout = pch.plan(
            config, [(tu.source.kind, tu.headers is not None) for tu in stale], launcher
        )
        if header_first:
            pch.ensure(config, note)
        started = time.perf_counter()
        result, span = ninja.Result(0.0), None
        if ninja_jobs:
            parallel = jobs or ninja.default_jobs()
            if progress:
                progress.started(family.name, [tu.source.path for tu in stale], parallel)
            sink = _status_sink(family, on_line, progress)
            header = lambda: pch.ensure(config, note)  # noqa: E731
            try:
                result, span = pch.compile_all(
                    tmp, ninja_jobs, parallel, sink, launcher, scout, header
                )
            except BuildError as e:  # the errors, without the -v report of the kernels that built
                from workbench.cubin import without_ptxas_info

                raise BuildError(without_ptxas_info(str(e)), e.log) from None
        _store_objects(family, config, stale, outputs, result)
        compiled = time.perf_counter()
        from workbench.device import device_defines

        device = device_defines(project, family, config)
        key = _library_key(tus, config, device)
        assert key is not None
        built = find_cached(family, key)  # e.g. an edit that was reverted: only objects missing
        if built is None:
            # A variant that differs only in its device-only TUs: the plain build's library, if
            # there is one, is the same link of the same objects.
            same = find_cached(family, _library_key(tus, config)) if device else None
            if progress and config.link and same is None:
                progress.note(family.name, "linking")
            built = _link(project, family, config, tus, key, tmp, same)
        built.compiled = [tu.source.path for tu in stale]
        built.team = span
        built.phases = {"compile": compiled - started, "link": time.perf_counter() - compiled}
        return built
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _command(project: Project, config: Config, tu: TU, out: Path) -> tuple[str, ...]:
    """A TU's command, a kernel TU's with ptxas's report of each kernel (registers, spills) that
    its compile log keeps for the resources a reload prints (:mod:`workbench.resources`). Not
    in the TU's key: it changes no code, only the note of ptxas's options inside the cubin."""
    command = config.compile_command(project, tu.source, out, tu.defines)
    report = tu.source.kind == "cuda" and not config.ptxas_info
    return (*command, "-Xptxas=-v") if report else command


def _note_sink(
    family: Family, on_line: Callable[[str], None] | None, progress: Progress | None
) -> Callable[[str], None]:
    def sink(text: str) -> None:
        if on_line:
            on_line(text)
        if progress:
            progress.note(family.name, text)

    return sink


def _status_sink(
    family: Family, on_line: Callable[[str], None] | None, progress: Progress | None
) -> Callable[[str], None]:
    from workbench import ninja

    def sink(line: str) -> None:
        if on_line:
            on_line(line)
        source = ninja.status_source(line)
        if progress and source:
            progress.finished(family.name, Path(source))

    return sink


def _store_objects(
    family: Family,
    config: Config,
    stale: list[TU],
    outputs: dict[int, Path],
    result: ninja.Result,
) -> None:
    for tu in stale:
        out, src = outputs[id(tu)], str(tu.source.path)
        tu.headers = headers_from_depfile(Path(f"{out}.d"), tu.source.path, config)
        key = tu.compute_key(config)
        assert key is not None
        dest = object_path(key)
        dest.parent.mkdir(exist_ok=True)
        log = {"seconds": result.tu_seconds.get(src), "output": result.tu_output.get(src, "")}
        cache.write_atomic(dest.with_suffix(".json"), _json_text(log))  # before the object
        os.replace(out, dest)
        cache.write_atomic(_deps_file(tu.source.path, tu.command), _json_text(tu.headers))
        for hook in compile_hooks:
            hook(family.name, tu.source.path)
        if tu.source.kind == "cuda":
            events.stored("object", key)


def compile_log(key: str) -> dict[str, Any]:
    """The seconds and compiler output of the compile that made object ``key`` ({} if none)."""
    data = cache.read_json(object_path(key).with_suffix(".json"))
    return data if isinstance(data, dict) else {}


def _json_text(data: object) -> str:
    return json.dumps(data, indent=1, sort_keys=True)


def _link(
    project: Project,
    family: Family,
    config: Config,
    tus: list[TU],
    key: str,
    tmp: Path,
    same: Built | None = None,
) -> Built:
    """Link the objects of ``tus`` into the library of ``key``; ``same``: a build linked from the
    same objects, whose library is copied instead."""
    from workbench import linkstub

    folder = tmp / "lib"
    folder.mkdir()
    objects = [object_path(tu.key) for tu in tus if tu.key is not None]
    lib_name = f"lib{family.name}.{key[:16]}.so" if config.link else None
    if lib_name is not None and same is not None and same.library is not None:
        shutil.copyfile(same.library, folder / lib_name)
    elif lib_name is not None:
        stubs = linkstub.ensure(config.cxx, config.torch.lib_dir)
        cmd = config.link_command(objects, folder / lib_name, stubs)
        proc = procs.run(cmd)
        if proc.returncode != 0:
            raise BuildError(f"linking {family.name} failed:\n{proc.stderr.strip()}", proc.stderr)
        _check_shared_libstdcxx(folder / lib_name, config)
    manifest = _manifest(project, family, config, tus, key, lib_name, folder)
    cache.write_atomic(folder / "manifest.json", _json_text(manifest))  # last: "complete"
    cache.install_entry(
        folder, library_dir(family, key), lambda: find_cached(family, key) is not None
    )
    built = find_cached(family, key)
    assert built is not None
    return built


def _check_shared_libstdcxx(lib: Path, config: Config) -> None:
    """Refuse a library with a private static libstdc++: it crashes beside torch's."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return
    dynamic = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True).stdout
    if "libstdc++.so" not in dynamic:
        raise BuildError(
            f"{lib.name} links libstdc++ statically (compiler {config.cxx}); torch uses the "
            "shared one and two copies in one process crash. Set CXX to a compiler that links "
            "libstdc++ dynamically"
        )


def _manifest(
    project: Project,
    family: Family,
    config: Config,
    tus: list[TU],
    key: str,
    lib_name: str | None,
    folder: Path,
) -> dict[str, object]:
    """What ``wb status`` and ``wb why`` read: the build's identity, part by part."""
    inputs: dict[str, str | None] = {}
    for tu in tus:
        for p in [str(tu.source.path), *(tu.headers or [])]:
            inputs[p] = file_digest(p)
    lib_path = folder / lib_name if lib_name else None
    return {
        "format": MANIFEST_FORMAT,
        "family": family.name,
        "project": str(project.kernels_dir),
        "key": key,
        "library": lib_name,
        "sha256": file_digest(str(lib_path)) if lib_path else None,
        "size": lib_path.stat().st_size if lib_path else 0,
        "created": time.time(),
        "devices": ["cpu", "cuda"] if config.with_cuda else ["cpu"],
        "toolchain": config.identity,
        "tus": [
            {
                "source": str(t.source.path),
                "kind": t.source.kind,
                "key": t.key,
                "command": t.command,
            }
            for t in tus
        ],
        "inputs": inputs,
    }
