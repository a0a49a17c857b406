"""The compilers, torch and GPUs a build uses, and their identity for the build key.

Nothing here runs at import. Version probes (``c++ --version``, ``nvcc --version``) are cached
on disk keyed by the compiler binary's path, size and mtime, so a warm load runs no subprocess.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from workbench import knobs
from workbench.cache import LAYOUT
from workbench.errors import ToolchainError


@dataclass(frozen=True)
class Torch:
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


def _probe_cache_file(exe: Path) -> Path:
    st = exe.resolve().stat()
    key = f"{exe.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return knobs.cache_dir() / LAYOUT / "toolchain" / f"{digest}.json"


def _probe(exe: Path, args: list[str], name: str) -> str:
    """The stdout of ``exe args``, cached on disk per binary under ``name``."""
    cache = _probe_cache_file(exe)
    known = {}
    try:
        known = json.loads(cache.read_text())
        return str(known[name])
    except (OSError, ValueError, KeyError):
        pass
    try:
        out = subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainError(f"could not run {exe} {' '.join(args)}: {e}") from e
    known[name] = out
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, cache)
    except OSError:
        pass  # an unwritable cache only costs a probe next time
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


@dataclass(frozen=True)
class Gpu:
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


@functools.cache
def gpu_capabilities() -> tuple[tuple[int, int], ...]:
    """The compute capabilities of the GPUs torch can use; () when there are none."""
    import torch

    if torch.version.cuda is None:
        return ()
    gpus = nvml_gpus()
    caps = None if gpus is None else [g.capability for g in gpus]
    if caps is None:
        if not torch.cuda.is_available():
            return ()
        caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    return tuple(sorted(set(caps)))


def default_archs() -> tuple[str, ...]:
    """TORCH_CUDA_ARCH_LIST if set, else the archs of the GPUs present."""
    explicit = knobs.cuda_arch_list()
    if explicit:
        return parse_arch_list(explicit)
    return tuple(f"sm_{major}{minor}" for major, minor in gpu_capabilities())
