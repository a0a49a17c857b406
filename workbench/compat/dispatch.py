"""``workbench.load``: the kernel registry's loader, or the drop-in for torch's ``load``.

The rule: a call is the drop-in (``torch.utils.cpp_extension.load``) when it passes
``sources`` or any other argument only torch's signature has, or a second positional argument
(``load(name, sources)``); it is the registry loader (``workbench.api.load``) when it passes at
most one positional argument (the kernels path) and only ``namespace``, ``families``,
``devices``, ``jobs`` or ``on_error``. A call that mixes the two raises TypeError saying which
to use.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

REGISTRY_KWARGS = frozenset(
    {"path", "namespace", "families", "devices", "jobs", "on_error", "eager"}
)
DROPIN_KWARGS = frozenset(
    {
        "name",
        "sources",
        "extra_cflags",
        "extra_cuda_cflags",
        "extra_sycl_cflags",
        "extra_ldflags",
        "extra_include_paths",
        "build_directory",
        "verbose",
        "with_cuda",
        "with_sycl",
        "is_python_module",
        "is_standalone",
        "keep_intermediates",
    }
)

# Every registry Library made through workbench.load(), for the notebook's autoreload.
libraries: weakref.WeakSet[Any] = weakref.WeakSet()


def is_dropin(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    unknown = set(kwargs) - REGISTRY_KWARGS - DROPIN_KWARGS
    if unknown:
        raise TypeError(f"workbench.load() got unexpected keyword arguments {sorted(unknown)}")
    registry = set(kwargs) & (REGISTRY_KWARGS - {"path"})
    dropin = set(kwargs) & DROPIN_KWARGS or (len(args) >= 2 and {"positional sources"})
    if registry and dropin:
        raise TypeError(
            f"workbench.load() mixes the registry loader's {sorted(registry)} with "
            f"torch.utils.cpp_extension's {sorted(dropin)}: call load(path, namespace=..., "
            "families=..., devices=..., jobs=...) for a kernel registry, or load(name, sources, "
            "...) for a torch extension"
        )
    if "path" in kwargs and dropin:
        raise TypeError(
            "workbench.load(): path= belongs to the registry loader, not load(name, sources)"
        )
    return bool(dropin)


def load(*args: Any, **kwargs: Any) -> Any:
    """Load a kernel registry, or build a torch extension; see this module's docstring."""
    started = time.perf_counter()  # the load line times the whole call, imports included
    if is_dropin(args, kwargs):
        from workbench.compat.dropin import load as dropin_load

        return dropin_load(*args, **kwargs)
    if len(args) > 1:
        raise TypeError("workbench.load() takes at most one positional argument, the kernels path")
    from workbench import api

    library = api.load(*args, started=started, **kwargs)
    libraries.add(library)
    return library
