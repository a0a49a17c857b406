"""Tuning spaces: the parameters a family's kernels may be built with, and their variants.

A family's ``spec.py`` declares its space at module level::

    from workbench import TuneSpace

    TUNE = TuneSpace(
        {"BLOCK": [128, 256, 512], "VEC": [1, 2, 4]},
        where=lambda p: p["BLOCK"] * p["VEC"] <= 1024,  # optional: prunes invalid points
    )

Each point is built as a variant of the family: its kernel TUs (``.cu`` and ``.cpp`` under
``kernels/<family>/``, not the binding) get one ``-DWB_TUNE_<NAME>=<value>`` per parameter, so
kernel code reads them as macros (or passes them on as template arguments). The plain build,
with no point, defines none of them: the kernel's own defaults (``#ifndef WB_TUNE_BLOCK``) are
the untuned variant. The options are part of every TU's command and so of its cache key: each
variant is its own cached object and library, and building one again compiles nothing.

Imports nothing beyond the standard library: a spec imports it on every warm start.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from workbench.project import Family

Value = int | str
Point = dict[str, Value]

MACRO_PREFIX = "WB_TUNE_"
_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
# A value the preprocessor takes as one token: an integer or a C identifier (an enumerator, a
# type name such as float4).
_TOKEN = re.compile(r"-?[0-9]+|[A-Za-z_][A-Za-z0-9_]*")


class TuneError(WorkbenchError):
    """A tuning space that cannot be used as declared."""


class TuneSpace:
    """Named parameters, each with its candidate values, and an optional ``where`` predicate.

    Points are enumerated in declaration order (the last parameter varies fastest); ``where``
    takes a point (a dict of parameter name to value) and returns whether it is valid. The
    ``default`` point, when given, must be one of the valid points; it is what ``wb tune``
    measures the others against (the first valid point otherwise), and it should be what the
    kernel's own ``#ifndef`` fallbacks give, so that an untuned load runs the default.

    ``buckets``: ascending numel bounds of the op's first tensor argument that split calls into
    buckets, each with its own winner (bucket i holds numel in [buckets[i-1], buckets[i])).
    Default: one bucket per size of the sweep that ``wb tune`` times, split at the geometric
    middle between neighbouring sizes.
    """

    def __init__(
        self,
        params: Mapping[str, Sequence[Value]],
        where: Callable[[Point], bool] | None = None,
        default: Mapping[str, Value] | None = None,
        buckets: Sequence[int] | None = None,
    ) -> None:
        if not isinstance(params, Mapping) or not params:
            raise TuneError("TuneSpace needs at least one parameter, e.g. {'BLOCK': [128, 256]}")
        self.params: dict[str, tuple[Value, ...]] = {}
        for name, values in params.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise TuneError(
                    f"tuning parameter {name!r}: name it in capitals, like a macro ('BLOCK_M'); "
                    f"kernels see it as {MACRO_PREFIX}<NAME>"
                )
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise TuneError(f"tuning parameter {name}: give a list of values, got {values!r}")
            if not values:
                raise TuneError(f"tuning parameter {name} has no values")
            for v in values:
                _check_value(name, v)
            if len(set(map(str, values))) != len(values):
                raise TuneError(f"tuning parameter {name} lists a value twice: {list(values)}")
            self.params[name] = tuple(values)
        self.where = where
        self._valid = self._prune()  # `where` runs once per combination, here
        valid = self._valid
        if not valid:
            raise TuneError(
                f"the tuning space {self.params} has no valid point: `where` rejects all "
                f"{self.size} combinations"
            )
        if default is None:
            self.default = dict(valid[0])
        else:
            point = dict(default)
            if point not in valid:
                raise TuneError(f"the default point {point} is not a valid point of the space")
            self.default = point
        self.buckets = _check_buckets(buckets)

    @property
    def size(self) -> int:
        """The number of combinations before pruning."""
        n = 1
        for values in self.params.values():
            n *= len(values)
        return n

    def _all(self) -> Iterator[Point]:
        names = list(self.params)
        for combo in itertools.product(*self.params.values()):
            yield dict(zip(names, combo, strict=True))

    def points(self) -> list[Point]:
        """The valid points, in declaration order (copies: a caller may change them)."""
        return [dict(p) for p in self._valid]

    def _prune(self) -> list[Point]:
        out = []
        for point in self._all():
            if self.where is None:
                out.append(point)
                continue
            try:
                keep = self.where(dict(point))
            except Exception as e:  # a predicate's bug, named with the point it failed on
                where = label(point)
                raise TuneError(f"the tuning space's `where` failed on {where}: {e!r}") from e
            if keep:
                out.append(point)
        return out

    def __repr__(self) -> str:
        return f"TuneSpace({self.params}, {len(self._valid)} of {self.size} points valid)"


def _check_buckets(buckets: Sequence[int] | None) -> tuple[int, ...] | None:
    if buckets is None:
        return None
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence):
        raise TuneError(f"buckets: give a list of numel bounds, got {buckets!r}")
    bounds = tuple(buckets)
    if not bounds or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bounds):
        raise TuneError(f"buckets: give positive whole numel bounds, got {list(bounds)}")
    if list(bounds) != sorted(set(bounds)):
        raise TuneError(f"buckets must ascend, each bound once: got {list(bounds)}")
    return bounds


def _check_value(name: str, v: object) -> None:
    if isinstance(v, bool):
        raise TuneError(f"tuning parameter {name}: write 0 and 1 rather than {v!r}")
    if isinstance(v, int) or (isinstance(v, str) and _TOKEN.fullmatch(v)):
        return
    raise TuneError(
        f"tuning parameter {name}: value {v!r} is neither an integer nor an identifier "
        "(kernels see it as a macro's value)"
    )


def label(point: Mapping[str, Value]) -> str:
    """``BLOCK=128,VEC=4``: a point as tables and records name it."""
    return ",".join(f"{k}={v}" for k, v in point.items())


def defines(point: Mapping[str, Value]) -> tuple[str, ...]:
    """The -D options a point's kernel TUs are compiled with, in a fixed order."""
    return tuple(f"-D{MACRO_PREFIX}{k}={point[k]}" for k in sorted(point))


def space_of(module: object) -> TuneSpace | None:
    """The ``TUNE`` a spec module declares, or None."""
    space = getattr(module, "TUNE", None)
    if space is None:
        return None
    if not isinstance(space, TuneSpace):
        raise TuneError(f"TUNE in a spec must be a workbench.TuneSpace, got {space!r}")
    return space


def variant(family: Family, point: Mapping[str, Value]) -> Family:
    """The family built at ``point``: the same sources, its kernel TUs with the point's -D."""
    return family._replace(defines=defines(point))
