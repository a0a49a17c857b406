"""The kernels a family's compiled CUDA launchers name, read without torch or a GPU (``wb smoke``
on a CPU build of torch, where the launchers cannot be linked against torch)."""

from __future__ import annotations

import json
from pathlib import Path

from workbench import build, cache, procs
from workbench.config import Config
from workbench.errors import BuildError
from workbench.hashing import digest, file_digest
from workbench.project import Family, Project

# Run in a child process by listed_kernels: a launcher's static initialiser that crashes takes
# down the child, not the caller.
_LIST = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.wb_kernel_name.restype = ctypes.c_char_p
for i in range(lib.wb_kernel_count()):
    print(lib.wb_kernel_name(i).decode())
"""


def listed_kernels(
    project: Project, family: Family, config: Config, built: build.Built
) -> list[tuple[str, str]]:
    """The kernels the family's compiled CUDA launchers name, read without torch or a GPU.

    For builds that cannot be linked against torch here (``wb smoke`` on a CPU build of torch):
    the launchers' objects are linked with ``bindings/kernel_lister.cpp`` and the CUDA runtime
    into a small library, which a child process loads to read the names (kept in the cache by
    the objects' keys).
    """
    import subprocess
    import sys
    import tempfile

    from workbench.project import WB_BINDING_INCLUDE, WB_KERNEL_INCLUDE, WB_ROOT

    lister = WB_ROOT / "bindings" / "kernel_lister.cpp"
    tus = [t for t in built.manifest.get("tus", []) if t["kind"] == "cuda"]
    objects = [build.object_path(str(t["key"])) for t in tus]
    if not objects:
        return []
    key = digest("lister", config.id, [o.name for o in objects], file_digest(str(lister)))
    kept = cache.root() / "lister" / f"{key[:32]}.json"
    found = cache.read_json(kept)
    if isinstance(found, list):
        return [(str(f), str(e)) for f, e in found]
    if config.cuda_home is None:
        raise BuildError("listing device kernels needs the CUDA runtime: set CUDA_HOME")
    libdirs = [config.cuda_home / d for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
    libdir = next((d for d in libdirs if (d / "libcudart.so").exists()), libdirs[0])
    with tempfile.TemporaryDirectory(prefix="wb-lister-") as tmp:
        obj, lib = Path(tmp) / "lister.o", Path(tmp) / "lister.so"
        compile_cmd = [
            str(config.cxx),
            "-std=c++17",
            "-fPIC",
            "-fvisibility=hidden",
            f"-I{WB_BINDING_INCLUDE}",
            f"-I{WB_KERNEL_INCLUDE}",
            "-c",
            str(lister),
            "-o",
            str(obj),
        ]
        link_cmd = [str(config.cxx), "-shared", "-o", str(lib), *map(str, objects), str(obj)]
        link_cmd += [f"-L{libdir}", "-lcudart", f"-Wl,-rpath,{libdir}"]
        for cmd in (compile_cmd, link_cmd):
            proc = procs.run(cmd)
            if proc.returncode != 0:
                raise BuildError(
                    f"listing the device kernels of {family.name} failed:\n{proc.stderr.strip()}",
                    proc.stderr,
                )
        proc = subprocess.run(
            [sys.executable, "-c", _LIST, str(lib)], capture_output=True, text=True, timeout=120
        )
    if proc.returncode != 0:
        raise BuildError(
            f"loading the launchers of {family.name} to list their kernels failed:\n"
            f"{proc.stderr.strip()[-2000:]}",
            proc.stderr,
        )
    names = [tuple(line.split("\t", 1)) for line in proc.stdout.splitlines() if "\t" in line]
    kept.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(kept, json.dumps(names))
    return [(f, e) for f, e in names]
