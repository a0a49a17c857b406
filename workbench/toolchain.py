"""The compilers, torch and GPUs a build uses, and their identity for the build key.

Nothing here runs at import. Version probes (``c++ --version``, ``nvcc --version``) are cached
on disk keyed by the compiler binary's path, size and mtime, so a warm load runs no subprocess.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from workbench import cache, knobs
from workbench.cache import LAYOUT
from workbench.errors import ToolchainError


class Torch(NamedTuple):
    version: str
    git_version: str
    cuda: str | None  # torch.version.cuda: None for a CPU build
    cxx11_abi: bool
    include_dirs: tuple[Path, ...]
    lib_dir: Path

    @property
    def cxx_std(self) -> str:
        """The C++ standard torch's headers need: C++20 from torch 2.10 on, else C++17."""
        major, minor = (int(x) for x in re.findall(r"\d+", self.version)[:2])
        return "c++20" if (major, minor) >= (2, 10) else "c++17"


@functools.cache
def torch_info() -> Torch:
    import torch

    root = Path(torch.__file__).parent
    return Torch(
        version=torch.__version__,
        git_version=getattr(torch.version, "git_version", ""),
        cuda=torch.version.cuda,
        cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        include_dirs=(root / "include", root / "include" / "torch" / "csrc" / "api" / "include"),
        lib_dir=root / "lib",
    )


def find_cxx() -> Path:
    name = knobs.cxx() or "c++"
    found = shutil.which(name)
    if found is None:
        raise ToolchainError(
            f"no C++ compiler found: {name!r} is not on PATH; install g++ or set CXX to a compiler"
        )
    return Path(found)


def find_cuda_home() -> Path | None:
    """CUDA_HOME, else the toolkit of the nvcc on PATH, else /usr/local/cuda; None if absent."""
    explicit = knobs.cuda_home()
    if explicit:
        home = Path(explicit)
        if not (home / "bin" / "nvcc").exists():
            raise ToolchainError(f"CUDA_HOME={explicit} has no bin/nvcc; fix or unset CUDA_HOME")
        return home
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent)
    candidates.append(Path("/usr/local/cuda"))
    for home in candidates:
        if (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists():
            return home
    return None


def _kept(name: str) -> Path:
    """A file of probe answers kept across processes (not created here)."""
    return knobs.cache_dir() / LAYOUT / "toolchain" / name


def _keep(path: Path, value: object) -> None:
    """Write ``value`` as JSON to ``path``; an unwritable cache only costs a probe next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cache.write_atomic(path, json.dumps(value))
    except OSError:
        pass


def _probe_cache_file(exe: Path) -> Path:
    real = os.path.realpath(exe)
    st = os.stat(real)
    key = f"{real}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    return _kept(f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json")


# Probe cache files already read by this process. A file's name holds the binary's stamp, so a
# replaced compiler still gets a new probe.
_probes_read: dict[Path, dict[str, str]] = {}


def _probe(exe: Path, args: list[str], name: str) -> str:
    """The stdout of ``exe args``, cached on disk per binary under ``name``."""
    kept = _probe_cache_file(exe)
    known = _probes_read.get(kept)
    if known is None:
        loaded = cache.read_json(kept)
        known = loaded if isinstance(loaded, dict) else {}
        _probes_read[kept] = known
    if name in known:
        return str(known[name])
    try:
        out = subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainError(f"could not run {exe} {' '.join(args)}: {e}") from e
    known[name] = out
    _keep(kept, known)
    return out


def compiler_version(exe: Path) -> str:
    """The version line of ``exe --version`` (the first; nvcc's last); cached per binary."""
    lines = [ln for ln in _probe(exe, ["--version"], "version").splitlines() if ln.strip()]
    return lines[-1] if "nvcc" in exe.name else lines[0]


def nvcc_release(nvcc: Path) -> str:
    """'13.0.88' from ``nvcc --version`` ('release 13.0, V13.0.88'); cached per binary."""
    text = _probe(nvcc, ["--version"], "version")
    m = re.search(r"release [\d.]+, V([\d.]+)", text) or re.search(r"release ([\d.]+)", text)
    return m.group(1) if m else text.strip().splitlines()[-1]


def shared_libstdcxx(cxx: Path) -> Path | None:
    """The shared libstdc++ to link by path: the compiler's, else the one torch runs on.

    Linked by path it stays shared even where the compiler's own library folder holds only
    libstdc++.a (seen on a GPU host), which ``-lstdc++`` would pick.
    """
    out = _probe(cxx, ["-print-file-name=libstdc++.so"], "libstdcxx").strip()
    path = Path(out)
    if path.is_absolute() and path.exists():
        return path
    return _mapped_libstdcxx()


def has_shared_libstdcxx(cxx: Path) -> bool:
    """Whether ``cxx`` finds a shared libstdc++ of its own (some builds ship only the .a)."""
    out = _probe(cxx, ["-print-file-name=libstdc++.so"], "libstdcxx").strip()
    return Path(out).is_absolute() and Path(out).exists()


def _mapped_libstdcxx() -> Path | None:
    """The libstdc++ mapped into this process (torch's, once torch is imported)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                name = line.rsplit(maxsplit=1)[-1]
                if "/libstdc++.so" in name:
                    return Path(name)
    except OSError:
        pass
    return None


def python_tag() -> str:
    """The interpreter's ABI tag, e.g. 'cpython-311-x86_64-linux-gnu' (sysconfig's SOABI).

    Read from the extension-module suffix: asking sysconfig imports its data module, a
    millisecond of every warm start.
    """
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if suffix.startswith(".") and suffix.count(".") == 2 and suffix.endswith(".so"):
            return suffix[1:-3]
    import sysconfig  # only for a build: a warm start never asks

    return str(sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag)


def parse_arch_list(text: str) -> tuple[str, ...]:
    """'8.0;9.0a', '8.0 9.0+PTX', 'sm_80,sm_90a' or '90a' -> ('sm_80', 'sm_90a', ...).

    A '+PTX' entry becomes 'compute_XY' (PTX for that arch, JIT-compiled by the driver).
    """
    archs: list[str] = []
    for raw in re.split(r"[;,\s]+", text.strip()):
        if not raw:
            continue
        ptx = raw.endswith("+PTX")
        item = raw.removesuffix("+PTX").removeprefix("sm_").removeprefix("compute_")
        m = re.fullmatch(r"(\d+)\.?(\d)([af]?)", item)
        if m is None:
            raise ValueError(
                f"bad CUDA arch {raw!r}: expected forms like 8.0, 9.0a, 9.0+PTX or sm_90a"
            )
        num = f"{m.group(1)}{m.group(2)}{m.group(3)}"
        archs.append(f"sm_{num}")
        if ptx:
            archs.append(f"compute_{num}")
    if not archs:
        raise ValueError(f"empty CUDA arch list {text!r}")
    return tuple(dict.fromkeys(archs))


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    flags = []
    for arch in archs:
        num = arch.split("_", 1)[1]
        code = arch if arch.startswith("sm_") else f"compute_{num}"
        flags.append(f"-gencode=arch=compute_{num},code={code}")
    return flags


class Gpu(NamedTuple):
    name: str
    capability: tuple[int, int]

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


def nvml_gpus() -> list[Gpu] | None:
    """The GPUs through NVML, which creates no CUDA context; None where NVML is unusable."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        gpus = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            major, minor = ctypes.c_int(), ctypes.c_int()
            name = ctypes.create_string_buffer(96)
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                return None
            if nvml.nvmlDeviceGetCudaComputeCapability(
                handle, ctypes.byref(major), ctypes.byref(minor)
            ):
                return None
            nvml.nvmlDeviceGetName(handle, name, ctypes.c_uint(len(name)))
            gpus.append(Gpu(name.value.decode(errors="replace"), (major.value, minor.value)))
        return gpus
    finally:
        nvml.nvmlShutdown()


_NVIDIA_PROC = "/proc/driver/nvidia/gpus"


def _gpus_cache_file() -> Path | None:
    """Where NVML's answer is kept for this boot and this set of GPUs; None if unknowable.

    NVML takes about 25 ms to start and stop on an H100 host, more than the rest of a warm
    start of one family. The key is the boot and the driver's description of each GPU (model,
    bus location), read from /proc: a GPU added, removed or swapped changes it.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts = [f.read()]
        for gpu in sorted(os.listdir(_NVIDIA_PROC)):
            with open(os.path.join(_NVIDIA_PROC, gpu, "information")) as f:
                parts.append(f.read())
    except OSError:
        return None
    if len(parts) < 2:
        return None
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return _kept(f"gpus-{key}.json")


@functools.cache
def gpu_capabilities() -> tuple[tuple[int, int], ...]:
    """The compute capabilities of the GPUs torch can use; () when there are none."""
    import torch

    if torch.version.cuda is None:
        return ()
    kept = _gpus_cache_file()
    found = cache.read_json(kept) if kept is not None else None
    if isinstance(found, list):
        try:
            return tuple((int(a), int(b)) for a, b in found)
        except (ValueError, TypeError):  # malformed: ask NVML again
            pass
    gpus = nvml_gpus()
    caps = None if gpus is None else [g.capability for g in gpus]
    if caps is not None and kept is not None:
        _keep(kept, sorted(set(caps)))
    if caps is None:
        if not torch.cuda.is_available():
            return ()
        caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    return tuple(sorted(set(caps)))


def gpu_arch(capability: tuple[int, int]) -> str:
    """The arch to build for a GPU present: its own, with the arch-specific features of an
    sm_90 (wgmma, setmaxnreg: 'sm_90a', which runs on exactly that GPU, as a build for it must)."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def default_archs() -> tuple[str, ...]:
    """TORCH_CUDA_ARCH_LIST if set, else the archs of the GPUs present (see gpu_arch)."""
    explicit = knobs.cuda_arch_list()
    if explicit:
        return parse_arch_list(explicit)
    return tuple(gpu_arch(c) for c in gpu_capabilities())
