"""NVRTC: compiling a device-only TU (``*.kernel.cu``) to a cubin in this process.

Why NVRTC and not ``nvcc -cubin``: a device-only TU of the scale family (12 instantiations)
compiles in 0.15-0.22 s through NVRTC on a 2-core CPU host, where ``nvcc -cubin`` of the same
kernels takes 0.6-0.7 s (nvcc starts a preprocessor, cicc and ptxas as processes, and parses
the CUDA runtime header every TU gets); ``bench/results/device-compile.md`` compares them for the
bundled kernels.

The library comes from the ``nvidia-cuda-nvrtc`` wheel that CUDA builds of torch depend on, else
from the CUDA toolkit (``CUDA_HOME``), else from the loader's search path; ``WB_NVRTC`` names a
``libnvrtc.so`` to use instead. The instantiations to compile are given as name expressions
(``"wb::scale::scale_kernel<4,true,float>"``); NVRTC instantiates each and reports its mangled
name, which is what the driver looks the kernel up by.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from workbench import knobs
from workbench.errors import BuildError, ToolchainError

_SONAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")


class Result:
    """One compile: the cubin, each name expression's mangled name, and NVRTC's log."""

    def __init__(self, cubin: bytes, lowered: dict[str, str], log: str) -> None:
        self.cubin = cubin
        self.lowered = lowered
        self.log = log


def _candidates() -> list[Path]:
    """Where libnvrtc may be, best first (see the module docstring)."""
    return list(_each_candidate())


def _each_candidate() -> Iterator[Path]:
    """The candidates of :func:`_candidates`, looked for one at a time (identity() needs one)."""
    explicit = knobs.nvrtc()
    if explicit:
        yield Path(explicit)
        return
    for entry in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"):
            folder = os.path.join(entry or ".", sub)
            for name in _SONAMES:
                if os.path.isfile(os.path.join(folder, name)):
                    yield Path(folder, name)
    from workbench import toolchain

    home = toolchain.find_cuda_home()
    if home is not None:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
            yield from (home / sub / name for name in _SONAMES if (home / sub / name).is_file())


class _Library:
    def __init__(self, path: str) -> None:
        folder = os.path.dirname(path)
        # libnvrtc opens libnvrtc-builtins by name at its first compile: load it first from the
        # same folder, so that a wheel's copy (not on the loader's path) is found.
        if folder:
            for name in sorted(os.listdir(folder)):
                if name.startswith("libnvrtc-builtins.so") and ".alt." not in name:
                    ctypes.CDLL(os.path.join(folder, name), mode=ctypes.RTLD_GLOBAL)
                    break
        self.path = path
        self.lib = ctypes.CDLL(path)
        lib = self.lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)
        count = ctypes.c_int()
        lib.nvrtcGetNumSupportedArchs(ctypes.byref(count))
        archs = (ctypes.c_int * max(count.value, 1))()
        lib.nvrtcGetSupportedArchs(archs)
        self.archs = tuple(archs[: count.value])

    def error(self, code: int) -> str:
        text = self.lib.nvrtcGetErrorString(code)
        return text.decode() if text else f"NVRTC error {code}"


@functools.cache
def library() -> _Library:
    """The NVRTC library (loaded once); ToolchainError naming the fix when there is none."""
    tried = _candidates()
    for path in tried:
        try:
            return _Library(str(path))
        except OSError:
            continue
    for name in _SONAMES:  # the loader's own search path
        try:
            return _Library(name)
        except OSError:
            continue
    where = ", ".join(map(str, tried)) or "no candidate found"
    raise ToolchainError(
        "NVRTC (libnvrtc) is not installed; device-only TUs (*.kernel.cu) need it. Install it "
        f"with `pip install nvidia-cuda-nvrtc`, or set WB_NVRTC to a libnvrtc.so (tried: {where})"
    )


@functools.cache
def identity() -> str:
    """Which NVRTC a compile would use, without loading it: the first candidate's path and
    stamp (a key input; loading libnvrtc takes tens of milliseconds, a warm start avoids it)."""
    for path in _each_candidate():
        try:
            st = os.stat(path)
        except OSError:
            continue
        return f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"
    return f"loader:{version()}"


def available() -> bool:
    try:
        library()
    except ToolchainError:
        return False
    return True


def version() -> str:
    major, minor = library().version
    return f"{major}.{minor}"


def arch_option(arch: str) -> str:
    """NVRTC's option for a build arch: sm_90a -> --gpu-architecture=sm_90a (a cubin)."""
    if not arch.startswith("sm_"):
        raise ToolchainError(
            f"device-only TUs are compiled to cubins: {arch} is not a GPU architecture (sm_XY)"
        )
    number = int(re.sub(r"\D", "", arch))
    if number not in library().archs:
        known = ", ".join(f"sm_{a}" for a in library().archs)
        raise ToolchainError(f"NVRTC {version()} cannot compile for {arch}; it knows {known}")
    return f"--gpu-architecture={arch}"


_LOG_LINE = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?P<rest>.*)$")


def readable_log(log: str) -> str:
    """NVRTC's ``file(12): error: ...`` lines as ``file:12: error: ...`` (as nvcc and gcc say)."""
    out = []
    for line in log.splitlines():
        m = _LOG_LINE.match(line)
        out.append(f"{m['file']}:{m['line']}: {m['rest']}" if m else line)
    return "\n".join(out).strip()


def compile(source: Path, arch: str, names: list[str], options: list[str]) -> Result:
    """Compile ``source`` for ``arch`` with the instantiations ``names``; BuildError on failure.

    ``options`` are NVRTC options besides the architecture (``-I``, ``-D``, ``-std``...).
    Threads may compile different programs at once: each call owns its program and its log
    (ctypes releases the GIL for the compile).
    """
    lib = library()
    c = lib.lib
    text = source.read_bytes()
    opts = [arch_option(arch), *options]
    prog = ctypes.c_void_p()
    _check(
        lib,
        c.nvrtcCreateProgram(ctypes.byref(prog), text, str(source).encode(), 0, None, None),
        "creating the program",
    )
    try:
        for name in names:
            _check(lib, c.nvrtcAddNameExpression(prog, name.encode()), f"naming {name}")
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = c.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        c.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        c.nvrtcGetProgramLog(prog, buf)
        log = readable_log(buf.value.decode(errors="replace"))
        if status != 0:
            from workbench.cubin import without_ptxas_info  # the -v report of other kernels

            shown = without_ptxas_info(log)
            raise BuildError(
                f"NVRTC {version()} failed to compile {source} for {arch}:\n{shown}", log
            )
        c.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, c.nvrtcGetCUBIN(prog, cubin), "reading the cubin")
        lowered = {}
        for name in names:
            out = ctypes.c_char_p()
            _check(
                lib,
                c.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out)),
                f"looking up {name}",
            )
            lowered[name] = (out.value or b"").decode()
        return Result(cubin.raw, lowered, log)
    finally:
        c.nvrtcDestroyProgram(ctypes.byref(prog))


def _check(lib: _Library, status: int, what: str) -> None:
    if status != 0:
        raise BuildError(f"NVRTC failed {what}: {lib.error(status)}")
