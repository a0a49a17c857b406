"""check the toolchain, GPU and cache; each line OK, or WARN/FAIL with the fix; exit 1 on FAIL"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.cli.common import print_json
from workbench.cli.table import render

if TYPE_CHECKING:
    from workbench import launcher as launcher_mod


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str  # OK, WARN or FAIL
    detail: str


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the findings as JSON")


def run(args: argparse.Namespace) -> int:
    from workbench.project import BUNDLED_KERNELS

    folder = Path(args.kernels).resolve() if args.kernels else BUNDLED_KERNELS

    def check_launcher() -> list[Finding]:
        return launcher_findings(folder)

    findings = [f for check in [*CHECKS, check_launcher] for f in _safely(check)]
    if args.json:
        print_json([f.__dict__ for f in findings])
    else:
        print(
            render(
                ["check", "verdict", "detail"], [(f.check, f.verdict, f.detail) for f in findings]
            )
        )
    return 1 if any(f.verdict == "FAIL" for f in findings) else 0


def _safely(check: Callable[[], list[Finding]]) -> list[Finding]:
    try:
        return check()
    except Exception as e:  # one broken probe must not hide the other findings
        name = check.__name__.removeprefix("check_")
        return [Finding(name, "FAIL", f"{type(e).__name__}: {e}")]


def check_torch() -> list[Finding]:
    from workbench import toolchain

    t = toolchain.torch_info()
    cuda = (
        f"CUDA {t.cuda}"
        if t.cuda
        else "a CPU build (CUDA ops cannot be linked; wb smoke can compile them)"
    )
    return [Finding("torch", "OK", f"{t.version}, {cuda}")]


def _version_numbers(text: str) -> tuple[int, ...]:
    m = re.search(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else ()


def check_nvcc() -> list[Finding]:
    from workbench import toolchain

    home = toolchain.find_cuda_home()
    if home is None:
        return [
            Finding(
                "nvcc", "WARN", "not found: CPU only. Install the CUDA toolkit or set CUDA_HOME"
            )
        ]
    release = toolchain.nvcc_release(home / "bin" / "nvcc")
    line = f"nvcc {release}"
    nvcc = _version_numbers(release)
    torch_cuda = toolchain.torch_info().cuda
    if torch_cuda is None:
        return [Finding("nvcc", "OK", f"{home}: {line} (torch is a CPU build: compile only)")]
    want = _version_numbers(torch_cuda)
    if nvcc[:1] != want[:1]:
        return [
            Finding(
                "nvcc",
                "FAIL",
                f"{line} but torch is built with CUDA {torch_cuda}: set CUDA_HOME to a CUDA "
                f"{want[0]}.x toolkit, or install the torch build for CUDA {nvcc[0]}",
            )
        ]
    verdict = "OK" if nvcc == want else "WARN"
    note = "" if nvcc == want else " (same major version: works; an exact match is safest)"
    return [Finding("nvcc", verdict, f"{home}: {line}, torch CUDA {torch_cuda}{note}")]


def check_compiler() -> list[Finding]:
    from workbench import toolchain

    cxx = toolchain.find_cxx()
    line = toolchain.compiler_version(cxx)
    found = [Finding("host compiler", "OK", f"{cxx}: {line}")]
    if not toolchain.has_shared_libstdcxx(cxx):
        fallback = toolchain.shared_libstdcxx(cxx)
        found.append(
            Finding(
                "libstdc++",
                "WARN" if fallback else "FAIL",
                f"{cxx} has only a static libstdc++; "
                + (
                    f"libraries link torch's shared one by path ({fallback}), which works; "
                    if fallback
                    else "no shared one found to link, and a static copy beside torch's crashes; "
                )
                + "set CXX to a compiler with a shared libstdc++ to be safe",
            )
        )
    return found


def check_ninja() -> list[Finding]:
    from workbench import ninja

    exe = ninja.find_ninja()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    return [Finding("ninja", "OK", f"{exe} {version}")]


def check_gpu() -> list[Finding]:
    from workbench import knobs, toolchain

    gpus = toolchain.nvml_gpus()  # NVML: no CUDA context is created
    if not gpus:
        why = "NVML not found" if gpus is None else "NVML sees none"
        return [Finding("GPU", "OK", f"none ({why}): builds and checks run on the CPU")]
    found = [Finding("GPU", "OK", f"{g.name}, {g.arch}") for g in gpus]
    explicit = knobs.cuda_arch_list()
    if explicit:
        archs = toolchain.parse_arch_list(explicit)
        missing = sorted({g.arch for g in gpus} - {a.rstrip("af") for a in archs} - set(archs))
        if missing:
            found.append(
                Finding(
                    "GPU arch",
                    "WARN",
                    f"TORCH_CUDA_ARCH_LIST={explicit} builds no code for {', '.join(missing)} "
                    "present here; add it or unset the variable",
                )
            )
    return found


def check_arch_list() -> list[Finding]:
    from workbench import knobs, toolchain

    explicit = knobs.cuda_arch_list()
    if not explicit:
        return [Finding("TORCH_CUDA_ARCH_LIST", "OK", "unset: builds for the GPUs present")]
    try:
        archs = toolchain.parse_arch_list(explicit)
    except ValueError as e:
        return [Finding("TORCH_CUDA_ARCH_LIST", "FAIL", f"{e}; fix or unset it")]
    return [Finding("TORCH_CUDA_ARCH_LIST", "OK", f"{explicit} -> {', '.join(archs)}")]


def check_cache() -> list[Finding]:
    from workbench import cache, inventory
    from workbench.errors import CacheError

    try:
        root = cache.root()
        probe = root / "tmp" / ".doctor-probe"
        probe.write_bytes(b"x")
        probe.unlink()
    except (CacheError, OSError) as e:
        return [Finding("cache dir", "FAIL", f"{e}")]
    used = inventory.tree_size(root)
    return [
        Finding(
            "cache dir",
            "OK",
            f"{root} writable, {inventory.human(used)} used, {cache.free_space_text()}",
        )
    ]


def check_locks() -> list[Finding]:
    from workbench import cache, inventory

    found = []
    for path in sorted((cache.root() / "locks").glob("*.lock")):
        holder = cache.lock_holder(path.stem)
        if holder is not None:
            found.append(
                Finding("lock", "OK", f"{path.stem}: held by running pid {holder} (a build)")
            )
    dead = inventory.dead_tmp_dirs()
    if dead:
        found.append(
            Finding(
                "build folders",
                "WARN",
                f"{len(dead)} left by killed builds; `wb gc --keep 1000` removes them",
            )
        )
    found += _torch_extension_locks()
    if not found:
        found.append(Finding("locks", "OK", "none held; none can outlive its holder (flock)"))
    return found


def _torch_extension_locks() -> list[Finding]:
    """torch.utils.cpp_extension's lock files: its load() waits forever on a dead build's."""
    from workbench import knobs

    base = knobs.torch_extensions_dir()
    if not base.is_dir():
        return []
    return [
        Finding(
            "torch_extensions lock",
            "WARN",
            f"{lock}: torch.utils.cpp_extension waits forever on it if its build was killed; "
            "delete it when no such build runs",
        )
        for lock in sorted(base.glob("*/*/lock"))
    ]


def launcher_findings(folder: Path) -> list[Finding]:
    """The compiler launcher: found, its server up, its backend reached, and what it changes."""
    from workbench import launcher, toolchain

    words = launcher.configured(folder)
    if not words:
        return [
            Finding(
                "compiler launcher",
                "OK",
                "none: compiles are cached on this machine only (WB_COMPILER_LAUNCHER=sccache "
                "shares them through a team store; README, Team cache)",
            )
        ]
    found, problem = launcher.check(words)
    if problem is not None:
        return [Finding("compiler launcher", "WARN", f"{problem} (builds still work)")]
    version = subprocess.run(
        [found.command[0], "--version"], capture_output=True, text=True, stdin=subprocess.DEVNULL
    ).stdout.strip()
    findings = [Finding("compiler launcher", "OK", f"{shlex.join(found.command)} ({version})")]
    if found.is_sccache:
        findings.append(_backend_finding(found))
    if toolchain.find_cuda_home() is not None:
        findings.append(
            Finding(
                "nvcc pipeline",
                "OK",
                f"off while {found.name} is set: nvcc runs whole under it, which caches each of "
                "its phases; the side-by-side passes carry a per-run module id no cache matches",
            )
        )
    return findings


def _backend_finding(found: launcher_mod.Launcher) -> Finding:
    from workbench import knobs, launcher

    kind, _, value = knobs.sccache_backend()
    stats = launcher.server_stats(found) or {}
    raw = str(stats.get("cache_location", "unknown"))
    location = " ".join(launcher.shown(word) for word in raw.split(" "))
    if kind != "local disk" and value not in raw:
        return Finding(
            "sccache backend",
            "WARN",
            f"the running sccache server uses {location}, not {found.backend()} as this "
            "environment says: `sccache --stop-server`, and the next build starts one with it",
        )
    return Finding("sccache backend", "OK", f"{location}: reached, server running")


CHECKS: list[Callable[[], list[Finding]]] = [
    check_torch,
    check_nvcc,
    check_compiler,
    check_ninja,
    check_gpu,
    check_arch_list,
    check_cache,
    check_locks,
]
