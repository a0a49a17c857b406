"""A family's ``spec.py``: imported from cached code, and imported only when first needed.

A warm start of 30 families spent about a fifth of its time running their spec.py files (each
builds its OpSpec and Sample objects) and importing :mod:`workbench.spec` for them, though a
load needs only what each spec *declares* to register its ops: which ops it covers, where each
op's fake function is, whether it has a Python backward and setup_context, and whether a C++
autograd kernel differentiates it. Those are the spec's *facts*. They are recorded in the cache
(``warm/specs.json``) by the spec's text the first time that text runs. A later load of the same
text registers stand-ins (:class:`DeferredSpec`) whose fake function, backward and setup_context
import the spec.py at their first call and then call its own; ``Library.specs``, the check and
the bench import it too. A spec.py whose text has no record (new, or edited) runs at load as
before, so its errors still show at the load that first sees them.

Lifecycle of one family's specs in a process (:func:`family_specs`): read the text (every load:
an edit that keeps size and mtime shows); the same text as last time gives the same
:class:`FamilySpecs`, so the loader sees the same stand-ins and registers nothing again; other
text gives a new one, whose stand-ins replace the old registrations.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import marshal
import os
import sys
import threading
import types
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import cache, runtime
from workbench.errors import CacheError, LoadError

if TYPE_CHECKING:
    from workbench.spec import OpSpec

# The meaning of a record in warm/specs.json; a record of another version is not used.
FACTS_VERSION = 1
# At most this many spec texts are remembered (the oldest go first).
MAX_RECORDS = 512


def facts_of(specs: dict[str, OpSpec]) -> list[dict[str, Any]]:
    """What the loader registers from each spec: the facts a warm load works from."""
    return [
        {
            "name": name,
            "fake": runtime.source_of(spec.fake) if spec.fake is not None else None,
            "backward": spec.backward is not None,
            "setup_context": spec.setup_context is not None,
            "cpp_autograd": bool(spec.cpp_autograd),
        }
        for name, spec in specs.items()
    ]


class DeferredSpec:
    """Stands in for one OpSpec of a spec.py that is not imported yet.

    Has what the loader reads (``name``, ``fake``, ``backward``, ``setup_context``,
    ``cpp_autograd``; ``reference`` imports); the functions import the spec.py when first
    called and then call the spec's own.
    """

    def __init__(self, owner: FamilySpecs, facts: dict[str, Any]) -> None:
        self.owner = owner
        self.name: str = facts["name"]
        self.cpp_autograd = bool(facts["cpp_autograd"])
        self.fake = self._stand_in("fake", facts["fake"]) if facts["fake"] else None
        self.backward = self._stand_in("backward", None) if facts["backward"] else None
        self.setup_context = (
            self._stand_in("setup_context", None) if facts["setup_context"] else None
        )

    def _stand_in(self, attr: str, source: str | None) -> Any:
        owner, name = self.owner, self.name

        def call(*args: Any, **kwargs: Any) -> Any:
            function = getattr(owner.spec(name), attr)
            if function is None:
                raise LoadError(
                    f"op {name}: its spec ({owner.path}) has no {attr} now, but had one when the "
                    "op was registered; call lib.reload() after editing spec.py"
                )
            return function(*args, **kwargs)

        call.__name__ = call.__qualname__ = f"{name}_{attr}"
        call.wb_source = source  # type: ignore[attr-defined]  # read by runtime._register_fake
        return call

    def resolve(self) -> OpSpec:
        """The OpSpec this stands for (imports the spec.py)."""
        return self.owner.spec(self.name)

    @property
    def reference(self) -> Any:  # named in the loader's autograd errors
        return self.resolve().reference


class FamilySpecs:
    """The op specs of one version (one text) of a family's spec.py."""

    def __init__(self, family: str, ns: str, path: Path, text: bytes) -> None:
        self.family, self.ns, self.path, self.text = family, ns, path, text
        self.key = _key(path, text)
        self._module: types.ModuleType | None = None
        self._specs: dict[str, OpSpec] | None = None
        self._lock = threading.Lock()
        self.stale = False  # its spec.py, run, declared other facts than its record
        # The record the stand-ins were made from (None: made from the spec just run).
        self._facts = _store().get(self.key)
        facts = self._facts
        if facts is None:  # new or edited: run it now, so its errors show at this load
            facts = facts_of(self.ops())
            _store().put(self.key, facts)
        self.deferred = {f["name"]: DeferredSpec(self, f) for f in facts}

    @property
    def module(self) -> types.ModuleType:
        self.ops()
        assert self._module is not None
        return self._module

    def ops(self) -> dict[str, OpSpec]:
        """The spec's OpSpecs by op name (imports the spec.py the first time)."""
        if self._specs is not None:  # every call of a stand-in comes here: no lock once imported
            return self._specs
        with self._lock:
            if self._specs is None:
                self._module = import_text(self.family, self.ns, self.path, self.text)
                self._specs = {s.name: s for s in getattr(self._module, "OPS", [])}
                if self._facts is not None and facts_of(self._specs) != self._facts:
                    _store().forget(self.key)  # the next load runs it and registers anew
                    self.stale = True
                    warnings.warn(
                        f"{self.path} declares other ops, fake functions or backwards than when "
                        "its text was first loaded (does it depend on the environment?); the "
                        "ops were registered from the earlier ones: call lib.reload()",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            return self._specs

    def spec(self, name: str) -> OpSpec:
        found = self.ops().get(name)
        if found is None:
            raise LoadError(f"op {name}: its spec ({self.path}) no longer declares it in OPS")
        return found


# family -> its current FamilySpecs, per namespace (the loader's registrations follow it).
_families: dict[tuple[str, str], FamilySpecs] = {}


def family_specs(family: str, ns: str, path: Path | None) -> FamilySpecs | None:
    """The specs of ``family``'s spec.py as it is on disk now (None: it has none)."""
    if path is None:
        _families.pop((ns, family), None)
        return None
    try:
        text = path.read_bytes()  # the text itself: an edit that keeps size and mtime shows
    except OSError as e:
        raise LoadError(f"cannot read the op spec {path}: {e}") from e
    current = _families.get((ns, family))
    if current is not None and current.text == text and current.path == path and not current.stale:
        return current
    made = FamilySpecs(family, ns, path, text)
    _families[(ns, family)] = made
    return made


def load_module(family: str, ns: str, path: Path | None) -> types.ModuleType | None:
    """Import (or re-import after an edit) a family's spec.py: its module, or None."""
    specs = family_specs(family, ns, path)
    return specs.module if specs is not None else None


def import_text(family: str, ns: str, path: Path, text: bytes) -> types.ModuleType:
    """Run ``text`` (the spec.py at ``path``) as module ``workbench._specs.<ns>.<family>``."""
    name = f"workbench._specs.{ns}.{family}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot import the op spec {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(spec_code(path, text), module.__dict__)
    return module


def _key(path: Path, text: bytes) -> str:
    return hashlib.sha256(
        importlib.util.MAGIC_NUMBER + str(path).encode() + b"\0" + text
    ).hexdigest()[:32]


def spec_code(path: Path, text: bytes) -> types.CodeType:
    """The compiled code of a spec.py's ``text``, kept in the cache by its content.

    Python keeps bytecode beside a source only where it may write there and
    PYTHONDONTWRITEBYTECODE is unset; without it every new process compiled every family's spec
    again (about 1 ms each: 30 ms of a 30-family warm start on an H100 host). The code is keyed
    by the text, the path (it names the source in tracebacks) and the interpreter's bytecode
    version, and runs from the very bytes the loader compared to notice an edit. A text that
    does not compile raises LoadError ``path:line: SyntaxError: message``.
    """
    try:
        stored: str | None = os.path.join(cache.root(), "specs", f"{_key(path, text)}.code")
    except CacheError:  # no usable cache: compile, as Python would
        stored = None
    if stored is not None:
        with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
            with open(stored, "rb") as f:
                code = marshal.loads(f.read())
            if isinstance(code, types.CodeType):
                return code
    try:
        code = compile(text, str(path), "exec", dont_inherit=True)
    except SyntaxError as e:  # one line, as a compile error is: file:line: what
        raise LoadError(f"{path}:{e.lineno}: {type(e).__name__}: {e.msg}") from e
    if stored is not None:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(stored), exist_ok=True)
            cache.write_atomic(Path(stored), marshal.dumps(code))
    return code


class _Store:
    """The recorded facts of spec texts (``warm/specs.json``), read once per process and cache."""

    def __init__(self) -> None:
        try:
            self.path: Path | None = cache.root() / "warm" / "specs.json"
        except CacheError:
            self.path = None
        loaded = cache.read_json(self.path) if self.path is not None else None
        ok = isinstance(loaded, dict) and loaded.get("version") == FACTS_VERSION
        records = loaded.get("specs") if ok else None  # type: ignore[union-attr]
        self.records: dict[str, list[dict[str, Any]]] = records if isinstance(records, dict) else {}
        self.dirty = False

    def get(self, key: str) -> list[dict[str, Any]] | None:
        found = self.records.get(key)
        return found if isinstance(found, list) else None

    def put(self, key: str, facts: list[dict[str, Any]]) -> None:
        self.records.pop(key, None)  # the newest last: the oldest are dropped first
        self.records[key] = facts
        while len(self.records) > MAX_RECORDS:
            del self.records[next(iter(self.records))]
        self.dirty = True

    def forget(self, key: str) -> None:
        if self.records.pop(key, None) is not None:
            self.dirty = True

    def save(self) -> None:
        if not self.dirty or self.path is None:
            return
        text = json.dumps({"version": FACTS_VERSION, "specs": self.records})
        with contextlib.suppress(OSError):  # it only saves time
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cache.write_atomic(self.path, text)
        self.dirty = False


_stores: dict[tuple[str | None, ...], _Store] = {}


def _store() -> _Store:
    """The record of the current cache (one per cache folder and process)."""
    return cache.per_cache(_stores, _Store)


def save() -> None:
    """Write the facts recorded by this process's loads (the loader calls it after each)."""
    _store().save()
