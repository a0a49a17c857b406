"""Loading tuned winners: every op of a tuned family gets a router kernel, written in C++.

A family with a stored record (:mod:`workbench.tuning.store`) is loaded like any other, and then:

1. its plain build's kernels move from ``<ns>`` to a private namespace of that build
   (``<ns>__<family>__home_<key>``), where its schemas are defined too;
2. each winning variant's library is opened and registered under a private namespace of its
   own build key (once per process: a variant serves every later load that wins with it);
3. for every op and every dispatch key the plain build serves (CPU, CUDA), ``wb_route``
   registers a boxed router as ``<ns>::<op>``'s kernel. A call reads its first tensor argument's
   dtype, device name and numel, finds the table of that (device, dtype) and the bucket of that
   numel, and redispatches to the winning variant's kernel for the same dispatch key; a call
   no table covers (another dtype, another GPU, an op that was not tuned) goes to the plain build.

``<ns>::<op>`` keeps its schema, fake function and autograd formula: ``torch.compile``, CUDA
graphs and ``opcheck`` see one op as before, and no Python runs in the call path. A family with
C++ autograd kernels (``WB_AUTOGRAD``) has them registered under ``<ns>`` as well
(``wb_register_autograd``); they call ``<ns>::<op>`` below autograd, which reaches the routers.

Private namespaces stay defined for the life of the process, and so their libraries stay mapped
(the dispatcher keeps a pointer into the library that first registered a kernel of an op; see
``loader._retired``): tuning keeps at most one library per variant that won, per process.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench import runtime
from workbench.build import Built
from workbench.errors import BuildError, LoadError

if TYPE_CHECKING:
    from workbench.config import Config
    from workbench.device_live import Handle
    from workbench.project import Family, Project

# Private namespace -> its op definitions (kept for the process; see the module docstring).
_defined: dict[str, list[torch.library.Library]] = {}
# Private namespace -> the handle of the variant library registered there.
_variants: dict[str, Any] = {}

_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def private_namespace(ns: str, family: str, key: str) -> str:
    """Where a variant's kernels are registered: one namespace per build key."""
    return f"{ns}__{family}__{key[:12]}"


def home_namespace(ns: str, family: str, key: str) -> str:
    """Where a routed family's plain build is registered. Not its variant namespace: a variant
    whose parameters reach none of its TUs has the plain build's key and library, and one
    library may be registered under two namespaces, not twice under one."""
    return f"{ns}__{family}__home_{key[:12]}"


def _define_all(pns: str, schemas: dict[str, str]) -> None:
    if pns not in _defined:
        _defined[pns] = [runtime.define(pns, schema) for schema in schemas.values()]


def open_variant(ns: str, built: Built, prepare: Callable[[Any], object] | None = None) -> str:
    """Register ``built``'s kernels under a private namespace of its own (once per process) and
    return that namespace: ``getattr(torch.ops, pns).<op>`` calls the variant's kernels.

    ``prepare`` is called with the opened library before it registers (to load the modules of
    its device-only TUs, built with the variant's options: workbench.device). A variant already
    open gets ``prepare`` again: ``wb tune`` checks a variant whose modules hold only the kernels
    its checks launch, and routing to it as a winner completes them."""
    from workbench import loader

    pns = private_namespace(ns, built.family, built.key)
    if pns in _variants:
        if prepare is not None:
            prepare(_variants[pns])
        return pns
    handle = loader.open_library(built)
    if prepare is not None:
        try:
            prepare(handle)
        except BaseException:
            handle.close()
            raise
    _define_all(pns, handle.schemas)
    handle.register(pns)
    handle.pinned = True  # its namespace stays defined: see the module docstring
    _variants[pns] = handle
    return pns


def tables_text(tables: list[dict[str, Any]], namespaces: dict[str, str], device: str) -> str:
    """The router's tables for one dispatch key (``device``: 'cpu' or 'cuda'), one per line."""
    lines = []
    for table in tables:
        if table["device_type"] != device:
            continue
        name = table["device"] if device == "cuda" else ""
        bounds = ",".join(str(int(b)) for b in table["bounds"])
        targets = ",".join(namespaces[label] for label in table["winners"])  # PLAIN: the home
        lines.append(f"{name}\t{_c10_name(table['dtype'])}\t{bounds}\t{targets}")
    return "\n".join(lines)


def _c10_name(name: str) -> str:
    """The c10 name of a dtype (``bfloat16`` -> ``BFloat16``), which the router parses: the
    name of the legacy tensor type, which torch derives from c10::toString for every dtype."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise LoadError(f"a tuned table names dtype {name!r}, which this torch does not have")
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def first_tensor_arg(schema: str) -> int:
    """The index of the first Tensor argument of ``schema`` (-1 if it has none)."""
    for i, arg in enumerate(torch._C.parse_schema(schema).arguments):
        if isinstance(arg.type, torch.TensorType):
            return i
    return -1


# Given a variant's point, what prepares its library before it registers (see open_variant).
PreparePoint = Callable[[dict[str, Any]], Callable[[Any], object] | None]


def apply(
    ns: str, handle: Any, record: dict[str, Any] | None, prepare: PreparePoint | None = None
) -> bool:
    """Route the ops of ``handle`` (a family's live build) as ``record`` says, or unroute them
    (``record`` None). Returns whether the routing changed. On a failure the family is left
    unrouted (its plain build under ``ns``) and a LoadError says why."""
    want = json.dumps(record, sort_keys=True) if record else None
    if getattr(handle, "routes", None) == want:
        return False
    handle.unregister()  # from ns, or from its private namespace and its routers
    if want is None:
        handle.register(ns)
        return True
    assert record is not None
    try:
        _route(ns, handle, record, prepare)
        handle.routes = want
    except (LoadError, BuildError, OSError, RuntimeError) as e:
        handle.unregister()
        handle.register(ns)
        raise LoadError(
            f"{handle.built.family}: its tuned variants could not be loaded: {e}"
        ) from e
    return True


def _route(ns: str, handle: Any, record: dict[str, Any], prepare: PreparePoint | None) -> None:
    family = handle.built.family
    home = home_namespace(ns, family, handle.built.key)
    _define_all(home, handle.schemas)
    handle.register(home)
    handle.pinned = True
    handle.routed = ns
    from workbench.tuning.store import PLAIN  # not .report: it imports the bench (300 ms)

    namespaces: dict[str, str] = {PLAIN: home}
    for label, v in record["variants"].items():
        if any(label in t["winners"] for tables in record["ops"].values() for t in tables):
            library = Path(v["library"])
            if not library.is_file():
                raise LoadError(
                    f"the library of variant {label} ({library}) is gone from the cache (wb gc or "
                    f"wb clean removed it); run `wb tune` again"
                )
            ready = prepare(v.get("point", {})) if prepare is not None else None
            namespaces[label] = open_variant(ns, Built(family, v["key"], library, None), ready)
    devices = handle.built.manifest.get("devices", ["cpu"])
    for op, schema in handle.schemas.items():
        tables = record["ops"].get(op, [])
        for device in devices:
            key = _KEYS[device]
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{home}::{op}", key):
                continue
            text = tables_text(tables, namespaces, device)
            arg = first_tensor_arg(schema)
            error = runtime.route(handle.cdll, ns, op, key, arg, home, text)
            if error is not None:
                raise LoadError(f"routing {ns}::{op} for {key} failed: {error}")
    if handle.autograd:  # C++ autograd kernels: under ns too, above its routers
        error = runtime.register_autograd(handle.cdll, ns)
        if error is not None:
            raise LoadError(f"registering the autograd kernels of {family} under {ns}: {error}")


def apply_quietly(
    ns: str, handle: Any, record: dict[str, Any] | None, prepare: PreparePoint | None = None
) -> None:
    """:func:`apply`, with a failure turned into a warning: the family works untuned."""
    try:
        apply(ns, handle, record, prepare)
    except LoadError as e:
        warnings.warn(str(e), RuntimeWarning, stacklevel=3)


def variant_preparer(
    project: Project, family: Family, config: Config, only: set[tuple[str, str]] | None = None
) -> Callable[[dict[str, Any]], Callable[[Handle], object]] | None:
    """Given a tuning variant's point, what loads the variant's modules (compiled with its
    options) into its library before it registers; None for a family without modules.
    ``only``: the modules hold just these of the kernels the launchers name (see
    :func:`workbench.device.sync`)."""
    from workbench import device
    from workbench.tuning.space import variant

    if not device.has_modules(family, config):
        return None

    def for_point(point: dict[str, Any]) -> Callable[[Handle], object]:
        return lambda handle: device.sync(
            project, variant(family, point), config, handle, only=only
        )

    return for_point
