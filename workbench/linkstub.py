"""An empty stand-in for libtorch_cpu.so at link time, so that relinking after an edit is fast.

Linking a family's library against the real libtorch_cpu.so (hundreds of MB, a dynamic symbol
table of that size) takes the linker most of a second; the objects of a family need nothing
from it at link time but its name in the library's DT_NEEDED list. So the link names an empty
shared object with the same file name (and SONAME, if the real one has one), the real library
directory stays in the rpath, and the dynamic loader binds the symbols to the real libtorch_cpu
that the process has already loaded when the library is opened. A symbol that no library
defines is then reported when the library is opened (with RTLD_NOW), not by the linker.

The same folder holds ``exports.map``, the linker version script that keeps every symbol of a
library local except the workbench's C entry points (``wb_*``): two builds of a family never
bind to each other's symbols, and nothing else in the process binds to theirs.

The stub is built once per torch install and cached under ``<cache>/v1/stubs/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from workbench import cache, procs
from workbench.errors import BuildError
from workbench.hashing import digest

STUBBED = ("torch_cpu",)  # the libraries too large to read at every link
EXPORTS = "exports.map"
EXPORTS_TEXT = "{\n  global: wb_*;\n  local: *;\n};\n"


def stub_dir(torch_lib_dir: Path) -> Path:
    """Where the stubs of the torch in ``torch_lib_dir`` live (keyed by the real files)."""
    stamps = []
    for name in STUBBED:
        real = torch_lib_dir / f"lib{name}.so"
        st = real.stat() if real.exists() else None
        stamps.append((str(real), st.st_size if st else None, st.st_mtime_ns if st else None))
    return cache.root() / "stubs" / digest("stub", stamps)[:32]


def _soname(lib: Path) -> str | None:
    readelf = shutil.which("readelf")
    if readelf is None:
        return None
    out = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "(SONAME)" in line and "[" in line:
            return line.split("[", 1)[1].rstrip("]").strip()
    return None


def ensure(cxx: Path, torch_lib_dir: Path) -> Path:
    """The folder holding the stubs for this torch, built under a lock if missing."""
    folder = stub_dir(torch_lib_dir)
    names = [f"lib{n}.so" for n in STUBBED]
    if all((folder / n).exists() for n in [*names, EXPORTS]):
        return folder
    with cache.lock(f"stub-{folder.name}"):
        folder.mkdir(parents=True, exist_ok=True)
        cache.write_atomic(folder / EXPORTS, EXPORTS_TEXT)
        for name in names:
            if (folder / name).exists():
                continue
            soname = _soname(torch_lib_dir / name)
            tmp = folder / f".{name}.{os.getpid()}.tmp"
            cmd = [str(cxx), "-shared", "-x", "c++", "/dev/null", "-o", str(tmp)]
            if soname:
                cmd.insert(2, f"-Wl,-soname,{soname}")
            proc = procs.run(cmd)
            if proc.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise BuildError(f"building the link stub {name} failed:\n{proc.stderr.strip()}")
            os.replace(tmp, folder / name)
    return folder
