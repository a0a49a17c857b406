"""The build configuration: toolchain, devices, flags, and the identity they give a build."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from workbench import knobs, toolchain
from workbench.cache import LAYOUT
from workbench.errors import ToolchainError
from workbench.hashing import digest, file_digest
from workbench.project import WB_BINDING_INCLUDE, WB_KERNEL_INCLUDE, Project, Source
from workbench.version import VERSION

KERNEL_CXX_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden")
CUDA_FLAGS = ("-std=c++17", "-O3", "-lineinfo", "-Xcompiler=-fPIC,-fvisibility=hidden")
# nvcc 12.1+ optimises a TU's kernels on several threads: a TU of several heavy kernels (the wgmma
# matmul's four instantiations) compiled in 2.9 s instead of 4.7 s on an H100 host, a TU of one
# light kernel in the same time (scale.cu 1.8 s either way).
SPLIT_COMPILE = ("--split-compile=0",)
# nvcc 12.8+ compresses (zstd) the cubins of a fat binary it deems large (softmax.cu's sm_90a
# cubin, 10 MB, went in as 1.5 MB), where the reload reads each kernel's registers and spills from
# the object: kept plain, every object reads the same way, and the driver loads it without
# unpacking it first.
NO_COMPRESS = ("--compress-mode=none",)


def cuda_flags(nvcc_version: str | None) -> tuple[str, ...]:
    """CUDA_FLAGS, with SPLIT_COMPILE (12.1 and later) and NO_COMPRESS (12.8 and later) where nvcc
    knows them.

    ``nvcc_version`` is nvcc's version line, e.g. 'Build cuda_13.0.r13.0/compiler.36424714_0'.
    """
    found = re.search(r"(\d+)\.(\d+)", nvcc_version or "")
    release = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    flags = CUDA_FLAGS + SPLIT_COMPILE if release >= (12, 1) else CUDA_FLAGS
    return flags + NO_COMPRESS if release >= (12, 8) else flags


BINDING_FLAGS = ("-O2", "-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden")
# The torch headers every binding TU includes, precompiled once per toolchain (see the header).
PCH_INCLUDE = "wb/torch_pch.h"
PCH_SOURCE = WB_BINDING_INCLUDE / PCH_INCLUDE


def pch_root() -> Path:
    return knobs.cache_dir() / LAYOUT / "pch"


class Config:
    """Everything outside the sources that changes a binary. Built by :func:`make_config`.

    Read-only once made (its ``id`` is cached). A plain class, not a dataclass: creating a
    dataclass costs about 1 ms at import, and import is part of every warm start.
    """

    cxx: Path
    cxx_version: str
    torch: toolchain.Torch
    python_tag: str
    env: dict[str, str]
    archs: tuple[str, ...]  # empty: no CUDA
    cuda_home: Path | None
    nvcc_version: str | None
    libstdcxx: Path | None  # the shared libstdc++ to link by path
    link: bool  # False: compile only (smoke builds for archs this torch cannot link)
    cpu_reason: str  # why CUDA is off, for the load log
    ptxas_info: bool  # -Xptxas=-v: registers, spills, shared memory (wb smoke)

    def __init__(
        self,
        *,
        cxx: Path,
        cxx_version: str,
        torch: toolchain.Torch,
        python_tag: str,
        env: dict[str, str],
        archs: tuple[str, ...] = (),
        cuda_home: Path | None = None,
        nvcc_version: str | None = None,
        libstdcxx: Path | None = None,
        link: bool = True,
        cpu_reason: str = "",
        ptxas_info: bool = False,
    ) -> None:
        fields = dict(locals())
        del fields["self"]
        self.__dict__.update(fields)  # past __setattr__, which refuses changes

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Config is read-only (tried to set {name!r}); call make_config()")

    def __repr__(self) -> str:
        return f"Config(id={self.id[:12]}, cxx={self.cxx}, archs={self.archs}, link={self.link})"

    @property
    def with_cuda(self) -> bool:
        return bool(self.archs)

    @property
    def nvcc(self) -> Path:
        assert self.cuda_home is not None
        return self.cuda_home / "bin" / "nvcc"

    @functools.cached_property
    def identity(self) -> dict[str, object]:
        """The toolchain part of every build key, in words (shown by ``wb why``)."""
        return {
            "workbench": VERSION,
            "layout": LAYOUT,
            "python": self.python_tag,
            "torch": self.torch.version,
            "torch_git": self.torch.git_version,
            "torch_cuda": self.torch.cuda,
            "cxx11_abi": self.torch.cxx11_abi,
            "cxx": f"{self.cxx} ({self.cxx_version})",
            "nvcc": f"{self.nvcc} ({self.nvcc_version})" if self.with_cuda else None,
            "archs": list(self.archs),
            "env": self.env,
        }

    @functools.cached_property
    def id(self) -> str:
        return digest(self.identity)

    @functools.cached_property
    def excluded_roots(self) -> tuple[str, ...]:
        """Header prefixes covered by the toolchain identity instead of by content."""
        roots = [self.torch.lib_dir.parent, Path("/usr/include"), Path("/usr/lib"), pch_root()]
        if self.cuda_home is not None:
            roots += [self.cuda_home, self.cuda_home.resolve()]
        return tuple(os.path.join(r, "") for r in roots)  # a trailing "/": /t must not match /tmp

    def compile_command(
        self, project: Project, src: Source, out: Path, defines: tuple[str, ...] = ()
    ) -> tuple[str, ...]:
        """The compiler command for one TU, writing ``out`` and its depfile ``out.d``.

        ``defines`` (a tuning variant's -D options) go to kernel TUs only: the binding and the
        registry stay the same across variants.
        """
        inc = [f"-I{d}" for d in project.include_dirs]
        head: list[str]
        if src.kind == "cuda":
            ccbin = ["-ccbin", str(self.cxx)] if knobs.cxx() else []
            head = [
                str(self.nvcc),
                *cuda_flags(self.nvcc_version),
                *ccbin,
                *toolchain.gencode_flags(self.archs),
            ]
            head += ["-Xptxas=-v"] if self.ptxas_info else []
        elif src.kind == "cpu":
            head = [str(self.cxx), *KERNEL_CXX_FLAGS]
        else:
            pch = ["-include", PCH_INCLUDE, "-Winvalid-pch"] if self.use_pch else []
            head = [str(self.cxx), *self.torch_flags, *pch]
            if src.kind == "registry":  # the same object serves every project
                inc = [f"-I{WB_BINDING_INCLUDE}", f"-I{WB_KERNEL_INCLUDE}"]
            else:
                inc += [f"-I{d}" for d in project.binding_include_dirs]
            # First: the folder of the precompiled header (empty until it is built, lazily).
            inc = [f"-I{self.pch_dir}", *inc] if self.use_pch else inc
        tail = ["-MMD", "-MF", f"{out}.d", "-c", str(src.path), "-o", str(out)]
        own = defines if src.kind in ("cuda", "cpu") else ()
        return (*head, *own, *inc, *tail)

    @functools.cached_property
    def torch_flags(self) -> tuple[str, ...]:
        """Flags of every TU that includes torch headers (bindings and their PCH)."""
        t = self.torch
        flags = [
            f"-std={t.cxx_std}",
            *BINDING_FLAGS,
            f"-D_GLIBCXX_USE_CXX11_ABI={int(t.cxx11_abi)}",
        ]
        flags += [f"-isystem{d}" for d in t.include_dirs]
        if self.cuda_bindings:
            assert self.cuda_home is not None
            flags += [f"-isystem{self.cuda_home / 'include'}", "-DWB_WITH_CUDA"]
        return tuple(flags)

    @property
    def cuda_bindings(self) -> bool:
        """Whether bindings register CUDA kernels: needs a CUDA build of torch.

        A smoke build on a CPU torch compiles the CUDA kernel TUs but CPU-only bindings.
        """
        return self.with_cuda and self.torch.cuda is not None

    @property
    def use_pch(self) -> bool:
        """A precompiled torch header for binding TUs (GCC only; clang's PCH works otherwise)."""
        return "clang" not in self.cxx_version.lower()

    @functools.cached_property
    def pch_dir(self) -> Path:
        """The include folder that holds this configuration's ``wb/torch_pch.h.gch``: one per
        host toolchain and torch flags, shared by configurations that differ only in their CUDA
        archs or nvcc (``wb smoke`` and a build for the GPU present), which a host TU never sees."""
        host = {k: v for k, v in self.identity.items() if k not in ("archs", "nvcc")}
        return pch_root() / digest(host, self.torch_flags, file_digest(str(PCH_SOURCE)))[:32]

    @property
    def pch_file(self) -> Path:
        return self.pch_dir / f"{PCH_INCLUDE}.gch"

    def link_command(
        self, objects: list[Path], out: Path, stubs: Path | None = None
    ) -> tuple[str, ...]:
        """The link of a family's library; ``stubs`` is a folder of link stubs (linkstub.py).

        Without stubs the linker reads the real torch libraries and refuses undefined symbols;
        with them, undefined symbols are reported when the library is opened.
        """
        lib = str(self.torch.lib_dir)
        cmd = [str(self.cxx), "-shared", "-o", str(out), *map(str, objects)]
        # The shared libstdc++ that torch uses, named before anything the compiler driver adds:
        # a driver that links libstdc++ statically would give the library a private copy, and
        # two copies in one process crash (seen: locale code in a TORCH_CHECK message).
        cmd += [str(self.libstdcxx)] if self.libstdcxx else ["-lstdc++"]
        search = [f"-L{stubs}", "-Wl,--no-as-needed"] if stubs else []  # keep stub DT_NEEDEDs
        cmd += [*search, f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu"]
        if self.with_cuda:
            assert self.cuda_home is not None
            cuda_lib = str(self.cuda_home / "lib64")
            cmd += ["-lc10_cuda", f"-L{cuda_lib}", f"-Wl,-rpath,{cuda_lib}", "-lcudart"]
        if stubs is None:
            cmd += ["-Wl,--no-undefined"]
        else:
            cmd += [f"-Wl,--version-script={stubs / 'exports.map'}"]
        return tuple(cmd)


def _cuda_plan(devices: str | None, archs: tuple[str, ...] | None) -> tuple[tuple[str, ...], str]:
    """(archs to build, reason CUDA is off)."""
    if devices == "cpu":
        return (), "CPU only (WB_DEVICES=cpu)"
    if archs is not None:
        return archs, ""
    torch = toolchain.torch_info()
    if torch.cuda is None:
        return (), "CPU only: this torch is a CPU build"
    if toolchain.find_cuda_home() is None:
        return (), "CPU only: nvcc not found (set CUDA_HOME)"
    found = toolchain.default_archs()
    if not found:
        return (), "CPU only: no GPU found"
    return found, ""


def make_config(
    devices: str | None = None,
    archs: tuple[str, ...] | None = None,
    link: bool = True,
    ptxas_info: bool = False,
) -> Config:
    """The configuration for this machine (or for explicit ``archs``, e.g. a smoke build).

    ``ptxas_info`` adds ``-Xptxas=-v`` to CUDA compiles, whose output the build keeps.
    """
    devices = devices or knobs.devices()
    if devices not in (None, "cpu", "cuda", "cpu,cuda"):
        raise ValueError(f"devices must be 'cpu' or 'cpu,cuda', got {devices!r}")
    cxx = toolchain.find_cxx()
    cuda_archs, reason = _cuda_plan(devices, archs)
    if cuda_archs and link and toolchain.torch_info().cuda is None:
        raise ToolchainError(
            "cannot link CUDA kernels against a CPU build of torch; install a CUDA build of "
            "torch, or compile without linking (a smoke build)"
        )
    cuda_home = nvcc_version = None
    if cuda_archs:
        cuda_home = toolchain.find_cuda_home()
        if cuda_home is None:
            raise ToolchainError("CUDA archs requested but nvcc not found; set CUDA_HOME")
        nvcc_version = toolchain.compiler_version(cuda_home / "bin" / "nvcc")
    return Config(
        cxx=cxx,
        cxx_version=toolchain.compiler_version(cxx),
        libstdcxx=toolchain.shared_libstdcxx(cxx),
        torch=toolchain.torch_info(),
        python_tag=toolchain.python_tag(),
        env=knobs.compiler_env(),
        archs=cuda_archs,
        cuda_home=cuda_home,
        nvcc_version=nvcc_version,
        link=link,
        cpu_reason=reason,
        ptxas_info=ptxas_info,
    )
