"""``workbench.bench``, ``workbench.check`` and ``workbench.tune``: the layer functions
(:mod:`workbench.benchmark.run`, :mod:`workbench.verify.api`, :mod:`workbench.tuning.run`) with
the bundled registry, ``workbench.load()``, as the library where the call names none.

The layers below take the library they work on; loading the default one is this top layer's
job, so that no layer imports the package's front door (``workbench/__init__.py``) or the
loader's entry above it.
"""

from __future__ import annotations

import functools
from typing import Any

from workbench.benchmark import run as bench_run
from workbench.benchmark.result import BenchResult
from workbench.tuning import run as tune_run
from workbench.tuning.report import TuneResult
from workbench.verify import api as verify_api
from workbench.verify.report import Report


def _library(lib: Any) -> Any:
    if lib is not None:
        return lib
    from workbench.compat.dispatch import load

    return load()


@functools.wraps(bench_run.bench)
def bench(ops: Any = None, **kwargs: Any) -> BenchResult:
    kwargs["lib"] = _library(kwargs.get("lib"))
    return bench_run.bench(ops, **kwargs)


@functools.wraps(verify_api.check)
def check(op_or_name: Any, spec: Any = None, **kwargs: Any) -> Report:
    if isinstance(op_or_name, str):  # a name needs a library; an op handle brings its own
        kwargs["lib"] = _library(kwargs.get("lib"))
    return verify_api.check(op_or_name, spec, **kwargs)


@functools.wraps(tune_run.tune)
def tune(op: str, **kwargs: Any) -> TuneResult:
    kwargs["lib"] = _library(kwargs.get("lib"))
    return tune_run.tune(op, **kwargs)
