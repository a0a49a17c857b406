"""Every environment knob the workbench reads, in one place, read at call time.

Tests change knobs for a block with :func:`override`, which never touches ``os.environ``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

_overrides: dict[str, str | None] = {}


def get(name: str) -> str | None:
    """A knob's raw value: a test's override, else the environment's."""
    if name in _overrides:
        return _overrides[name]
    return os.environ.get(name)


@contextlib.contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Scoped knob values for tests: ``with override(WB_CACHE_DIR=str(tmp)): ...``.

    A value of None means unset.
    """
    saved = dict(_overrides)
    _overrides.update(values)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def cache_dir() -> Path:
    """WB_CACHE_DIR, else $XDG_CACHE_HOME/workbench, else ~/.cache/workbench."""
    explicit = get("WB_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "workbench"


def namespace() -> str | None:
    """WB_NAMESPACE: the torch.ops namespace, over [tool.workbench] namespace in pyproject.toml."""
    return get("WB_NAMESPACE") or None


def devices() -> str | None:
    """WB_DEVICES: 'cpu' to build only the CPU part even where CUDA is available."""
    return get("WB_DEVICES") or None


def cuda_arch_list() -> str | None:
    """TORCH_CUDA_ARCH_LIST, as torch reads it: '8.0;9.0a' or '8.0 9.0+PTX'."""
    return get("TORCH_CUDA_ARCH_LIST") or None


def cxx() -> str | None:
    """CXX: the host C++ compiler (default: c++ on PATH)."""
    return get("CXX") or None


def cuda_home() -> str | None:
    """CUDA_HOME (or CUDA_PATH): the CUDA toolkit root."""
    return get("CUDA_HOME") or get("CUDA_PATH") or None


def jobs() -> int | None:
    """WB_JOBS (or MAX_JOBS): parallel compile jobs."""
    value = get("WB_JOBS") or get("MAX_JOBS")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"WB_JOBS must be a positive integer, got {value!r}")
    return int(value)


def nvcc_pipeline() -> bool:
    """WB_NVCC_PIPELINE=0 runs nvcc as one process instead of its passes side by side."""
    return (get("WB_NVCC_PIPELINE") or "1") != "0"


def dropin_pch() -> bool:
    """WB_DROPIN_PCH=0 compiles drop-in C++ sources without precompiled torch headers."""
    return (get("WB_DROPIN_PCH") or "1") != "0"


def dropin_lean() -> bool:
    """WB_DROPIN_PCH=full: a drop-in source under torch/extension.h (torch/all.h, torch/torch.h)
    reads the whole header precompiled, never its lean form (workbench.compat.pch)."""
    return (get("WB_DROPIN_PCH") or "1") not in ("0", "full")


def nvrtc() -> str | None:
    """WB_NVRTC: the libnvrtc.so that compiles device-only TUs (default: torch's, then CUDA's)."""
    return get("WB_NVRTC") or None


def ncu() -> str | None:
    """WB_NCU: the Nsight Compute ``ncu`` that ``wb profile`` runs (default: PATH, then the CUDA
    toolkit's and /opt/nvidia/nsight-compute's)."""
    return get("WB_NCU") or None


def tune_playoff() -> float:
    """WB_TUNE_PLAYOFF: the fraction within which the best variants of two GPUs' shares of a
    ``wb tune --devices`` run are timed again on the first GPU (default 0: off; on two H200s the
    playoff at 0.05 took 12 s of a 66 s tune of scale)."""
    value = get("WB_TUNE_PLAYOFF")
    try:
        fraction = float(value) if value else 0.0
    except ValueError:
        fraction = -1.0
    if not 0 <= fraction < 1:
        raise ValueError(f"WB_TUNE_PLAYOFF must be a fraction in [0, 1), 0.05 say; got {value!r}")
    return fraction


def tune_worker_timeout() -> float:
    """WB_TUNE_WORKER_TIMEOUT: seconds a ``wb tune --devices`` worker may take to answer (its
    start, its share's checks and timing) before it is stopped and its variants reported
    (default 1800)."""
    value = get("WB_TUNE_WORKER_TIMEOUT")
    if not value:
        return 1800.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(
            f"WB_TUNE_WORKER_TIMEOUT must be a positive number of seconds, got {value!r}"
        )
    return seconds


def profile_timeout() -> float:
    """WB_PROFILE_TIMEOUT: seconds one ``wb profile`` run under ncu may take before it is stopped
    (default 600: a cold build of the registry runs inside it)."""
    value = get("WB_PROFILE_TIMEOUT")
    if not value:
        return 600.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"WB_PROFILE_TIMEOUT must be a positive number of seconds, got {value!r}")
    return seconds


def compiler_launcher() -> str | None:
    """WB_COMPILER_LAUNCHER: a command put before every compile, e.g. ``sccache`` (over
    ``[tool.workbench] compiler_launcher`` in pyproject.toml; ``none`` turns that one off)."""
    return get("WB_COMPILER_LAUNCHER") or None


# sccache's own settings (sccache reads them; the workbench only names the backend in its
# messages and probes the endpoint before a build): the first one set says where the cache is.
SCCACHE_BACKENDS = (
    ("SCCACHE_REDIS_ENDPOINT", "redis"),
    ("SCCACHE_REDIS", "redis"),
    ("SCCACHE_REDIS_CLUSTER_ENDPOINTS", "redis cluster"),
    ("SCCACHE_MEMCACHED_ENDPOINT", "memcached"),
    ("SCCACHE_MEMCACHED", "memcached"),
    ("SCCACHE_BUCKET", "s3"),
    ("SCCACHE_GCS_BUCKET", "gcs"),
    ("SCCACHE_AZURE_CONNECTION_STRING", "azure"),
    ("SCCACHE_WEBDAV_ENDPOINT", "webdav"),
    ("SCCACHE_OSS_BUCKET", "oss"),
    ("SCCACHE_GHA_ENABLED", "github actions"),
)


def sccache_backend() -> tuple[str, str, str]:
    """(kind, variable, value) of the sccache backend this environment selects; the local
    disk cache (SCCACHE_DIR) when no remote one is set."""
    for name, kind in SCCACHE_BACKENDS:
        value = get(name)
        if value:
            return kind, name, value
    return "local disk", "SCCACHE_DIR", get("SCCACHE_DIR") or "~/.cache/sccache"


def sccache_env() -> dict[str, str]:
    """Every SCCACHE_* variable set (a change to any of them gets the launcher checked again)."""
    names = {n for n in (*os.environ, *_overrides) if n.startswith("SCCACHE_")}
    return {n: v for n in sorted(names) if (v := get(n))}


def torch_extensions_dir() -> Path:
    """TORCH_EXTENSIONS_DIR: where torch.utils.cpp_extension builds (``wb doctor`` looks there)."""
    explicit = get("TORCH_EXTENSIONS_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "torch_extensions"


def quiet() -> bool:
    """WB_QUIET=1 silences the one-line load log."""
    return (get("WB_QUIET") or "0") not in ("", "0")


def eager() -> bool:
    """WB_EAGER=1 registers every family at load, none at the first lookup of its ops."""
    return (get("WB_EAGER") or "0") not in ("", "0")


# Variables that reach the compilers without appearing on their command line; a change to any
# of them changes the build identity.
COMPILER_ENV = (
    "CXX",
    "CUDA_HOME",
    "CUDA_PATH",
    "TORCH_CUDA_ARCH_LIST",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
)


def compiler_env() -> dict[str, str]:
    return {name: v for name in COMPILER_ENV if (v := get(name))}
