"""A wheel file from a set of package files: its tag, its metadata and its RECORD.

The wheel format (PEP 427, PEP 491) is a zip of the package's files and a ``.dist-info``
folder; writing it here keeps ``wb wheel`` free of build backends, and the bytes reproducible
(fixed timestamps, sorted entries).

The tag. A wheel's Python tag says which interpreters can load its compiled code. The
libraries of a kernel registry are torch-dispatcher libraries: C++ that registers kernels
through ``torch::Library`` and exposes C entry points read with ctypes; none includes
``Python.h``. When no library names libpython or any ``Py*`` / ``_Py*`` symbol (read from its
dynamic section and symbol table), the compiled code is independent of the interpreter and the
wheel is ``py3-none-<platform>``: one wheel for every Python 3 that runs the specs' Python
(``Requires-Python``), which is more than ``abi3`` promises. A library that does use the Python
API gets this interpreter's tag (``cp311-cp311-...``): the limited API that ``abi3`` needs
cannot be proved from a binary. The platform is this machine's (``linux_x86_64``), not a
``manylinux`` tag: those promise glibc and libstdc++ symbol versions that only an auditor such
as auditwheel checks, and the libraries follow torch's own requirements anyway. The torch the
libraries need is recorded in the package and checked at import (see ``runtime.check_torch``).
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from workbench.errors import WorkbenchError

REQUIRES_PYTHON = ">=3.10"  # the specs' Python: what the workbench itself needs
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the same bytes for the same files
_VERSION = re.compile(
    r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?"
)


def check_version(version: str) -> str:
    if not _VERSION.fullmatch(version):
        raise WorkbenchError(f"version {version!r} is not a PEP 440 version such as 0.1.0")
    return version


def python_api_use(library: Path) -> list[str]:
    """What of the Python C API ``library`` needs: libpython entries and Py* symbols."""
    readelf = shutil.which("readelf")
    if readelf is None:
        raise WorkbenchError(
            "readelf (binutils) is needed to tell whether the libraries use the Python API, "
            "which decides the wheel's tag; install binutils"
        )
    cmd = [readelf, "-W", "--dynamic", "--dyn-syms", str(library)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise WorkbenchError(f"readelf cannot read {library}: {proc.stderr.strip()}")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(libpython[^\]]*)\]", proc.stdout)
    # A symbol line ends with its name, its version and the version's index: "PyList_New@V (2)".
    symbol = r"\s(_?Py[A-Za-z0-9_]+)(?:@\S+)?(?:\s+\(\d+\))?\s*$"
    symbols = re.findall(symbol, proc.stdout, re.MULTILINE)
    return sorted(set(needed) | set(symbols))


def platform_tag() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", sysconfig.get_platform())


def tag_for(libraries: list[Path]) -> tuple[str, list[str]]:
    """(wheel tag, the Python API the libraries use); see the module docstring."""
    used = sorted({name for lib in libraries for name in python_api_use(lib)})
    if not used:
        return f"py3-none-{platform_tag()}", used
    cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"{cp}-{cp}-{platform_tag()}", used


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def metadata(name: str, version: str, summary: str, requires: list[str]) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {summary}",
        f"Requires-Python: {REQUIRES_PYTHON}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    return "\n".join(lines) + "\n"


def write_wheel(
    out_dir: Path, name: str, version: str, tag: str, files: dict[str, bytes], meta: str
) -> Path:
    """Write ``<name>-<version>-<tag>.whl`` into ``out_dir`` from ``files`` (path -> bytes)."""
    from workbench.version import VERSION

    dist_info = f"{name}-{version}.dist-info"
    wheel_text = (
        "Wheel-Version: 1.0\n"
        f"Generator: workbench {VERSION} (wb wheel)\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    )
    entries = dict(sorted(files.items()))
    entries[f"{dist_info}/METADATA"] = meta.encode()
    entries[f"{dist_info}/WHEEL"] = wheel_text.encode()
    entries[f"{dist_info}/top_level.txt"] = f"{name}\n".encode()
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in entries.items()]
    entries[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{version}-{tag}.whl"
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in entries.items():
            info = zipfile.ZipInfo(arcname, _EPOCH)
            mode = 0o755 if arcname.endswith(".so") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    tmp.replace(path)
    return path
