"""What a kernel costs the SM, read from its cubin: registers, static shared memory, launch bound,
stack frame; with ptxas's ``-v`` report, the bytes it spills; and the occupancy bound they allow.

Read in Python from the ELF bytes, without a GPU or a process: a cubin of a device-only TU as
NVRTC wrote it, or the cubins inside the fat binary (``.nv_fatbin``) of an nvcc object. In a
cubin, kernel ``F`` has:

- its code in section ``.text.F``;
- its static shared memory as the size of section ``.nv.shared.F`` (absent when it has none),
  which from sm_90 on also holds the 1 KiB that every block reserves for the system at its start
  (ptxas reports the size less that; earlier SMs reserve it outside the section);
- attribute records (``EIATTR_*``), each ``format, attribute, value``: in ``.nv.info.F`` its
  launch bound (``__launch_bounds__`` or ``reqntid``), in ``.nv.info`` its registers and stack
  frame, named by the index of its symbol. (The top byte of ``.text.F``'s ``sh_info`` held the
  registers in older cubins; CUDA 13's sm_90 cubins leave it 0.)

Spilled bytes are in no record of the ELF: ptxas prints them (``N bytes spill stores, M bytes
spill loads``) when asked for ``-v``, and the build keeps that report beside each object and
cubin; :func:`ptxas_report` reads it. Standard library only: a reload reads a few cubins in well
under a millisecond each.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

# Attribute records (EIATTR_*) read here, by their code.
EIATTR_MAX_THREADS = 0x05  # __launch_bounds__(N): x, y, z as three u32
EIATTR_REQNTID = 0x10  # .reqntid: the exact block shape, x, y, z
EIATTR_FRAME_SIZE = 0x11  # in .nv.info: (symbol index, bytes of stack frame per thread)
EIATTR_REGCOUNT = 0x2F  # in .nv.info: (symbol index, registers per thread)
_EIFMT_SVAL = 0x04  # a record with a u16 size and that many bytes of value
_SHT_NOBITS = 8
_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_ELF = 2  # an entry holding a cubin (1: PTX text)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a compressed entry's payload: one zstd frame


@dataclass(frozen=True)
class Kernel:
    """One kernel of a cubin. ``spill_stores``/``spill_loads``: None where ptxas's report of its
    compile is not at hand. ``code``: a digest of its machine code, to tell a changed kernel."""

    name: str
    arch: str
    registers: int
    shared: int  # bytes of static shared memory
    launch_bound: int  # threads per block of __launch_bounds__ or reqntid; 0: none
    frame: int  # bytes of stack frame (local memory) per thread
    code: int
    spill_stores: int | None = None
    spill_loads: int | None = None

    @property
    def spills(self) -> int | None:
        """Bytes stored and loaded by spills; None: not known."""
        if self.spill_stores is None or self.spill_loads is None:
            return None
        return self.spill_stores + self.spill_loads

    @property
    def max_threads(self) -> int:
        """The most threads per block it can launch: its launch bound (1024 without one), fewer
        where its registers do not fit the register file for that many."""
        return limits(self.arch).max_threads(self.registers, self.launch_bound or 1024)


def _sections(data: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, type, offset, size, info) of each section of an ELF64 little-endian image."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF image")
    shoff, = struct.unpack_from("<Q", data, 0x28)  # fmt: skip
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = data[strtab[4] : strtab[4] + strtab[5]]
    out = []
    for h in headers:
        end = names.find(b"\0", h[0])
        out.append((names[h[0] : end].decode(errors="replace"), h[1], h[4], h[5], h[7]))
    return out


def _records(blob: memoryview) -> Iterable[tuple[int, memoryview | int]]:
    """(attribute, value) of each record of an .nv.info section: the bytes of a sized value, an
    int for the others."""
    at = 0
    while at + 4 <= len(blob):
        fmt, attr, value = struct.unpack_from("<BBH", blob, at)
        at += 4
        if fmt == _EIFMT_SVAL:
            yield attr, blob[at : at + value]
            at += value
        else:
            yield attr, value


def _arch_of(data: bytes) -> str:
    """The SM of a cubin, from its ELF flags (the low byte; bit 0x800 of older ones' flags...)."""
    flags, = struct.unpack_from("<I", data, 0x30)  # fmt: skip
    sm = (flags >> 8) & 0xFF if data[7] == 0x41 else flags & 0xFF  # ABI v7 keeps it in byte 1
    return f"sm_{sm}"


def read(data: bytes, arch: str | None = None) -> dict[str, Kernel]:
    """The kernels of a cubin, by mangled name. ``arch``: its architecture as the build names
    it (``sm_90a``), default: read from the ELF header. ValueError for bytes that are not one."""
    try:
        return _read(data, arch)
    except (struct.error, IndexError) as e:
        raise ValueError(f"not a cubin: {e}") from None


def _read(data: bytes, arch: str | None) -> dict[str, Kernel]:
    sections = _sections(data)
    arch = arch or _arch_of(data)
    shared = {n[11:]: s for n, _, _, s, _ in sections if n.startswith(".nv.shared.")}
    frames: dict[int, int] = {}
    registers: dict[int, int] = {}
    bounds: dict[str, int] = {}
    view = memoryview(data)
    for name, _, offset, size, _ in sections:
        if name == ".nv.info":
            for attr, value in _records(view[offset : offset + size]):
                if attr in (EIATTR_FRAME_SIZE, EIATTR_REGCOUNT) and not isinstance(value, int):
                    index, count = struct.unpack_from("<II", value)
                    (frames if attr == EIATTR_FRAME_SIZE else registers)[index] = count
        elif name.startswith(".nv.info."):
            for attr, value in _records(view[offset : offset + size]):
                if attr in (EIATTR_MAX_THREADS, EIATTR_REQNTID) and not isinstance(value, int):
                    x, y, z = struct.unpack_from("<III", value)
                    bounds[name[len(".nv.info.") :]] = x * y * z
    symbols = _symbols(data, sections, set(frames) | set(registers))
    out = {}
    for name, _, offset, size, info in sections:
        if not name.startswith(".text."):
            continue
        fn = name[len(".text.") :]
        index = symbols.get(fn, -1)
        smem = shared.get(fn, 0)
        out[fn] = Kernel(
            name=fn,
            arch=arch,
            registers=registers.get(index, info >> 24),
            shared=max(0, smem - RESERVED_SHARED) if sm_of(arch) >= 90 and smem else smem,
            launch_bound=bounds.get(fn, 0),
            frame=frames.get(index, 0),
            code=zlib.crc32(view[offset : offset + size]),
        )
    return out


def _symbols(
    data: bytes, sections: list[tuple[str, int, int, int, int]], indices: set[int]
) -> dict[str, int]:
    """The symbols of ``.symtab`` at ``indices`` (those the records name), index by name."""
    tables = {n: (o, s) for n, _, o, s, _ in sections if n in (".symtab", ".strtab")}
    if len(tables) < 2:
        return {}
    (sym_at, sym_size), (str_at, _) = tables[".symtab"], tables[".strtab"]
    out = {}
    for i in indices:
        if i >= sym_size // 24:
            continue
        name_at, = struct.unpack_from("<I", data, sym_at + 24 * i)  # fmt: skip
        end = data.find(b"\0", str_at + name_at)
        out[data[str_at + name_at : end].decode(errors="replace")] = i
    return out


def fatbin_cubins(data: bytes) -> dict[str, bytes]:
    """The cubins in the fat binary of an object (``.nv_fatbin``), by ``sm_XY``. nvcc 12.8+
    compresses (zstd) the cubins it deems large unless ``--compress-mode=none`` (the build's
    flag): such a cubin is unpacked where Python has zstd (``compression.zstd``, 3.14+, or the
    ``zstandard`` package), else left out. ValueError for bytes that are not an ELF object."""
    try:
        return _fatbin_cubins(data)
    except (struct.error, IndexError) as e:
        raise ValueError(f"not an object with a fat binary: {e}") from None


def _fatbin_cubins(data: bytes) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for kind, sm, payload in fatbin_entries(data):
        if kind != _FATBIN_ELF:
            continue
        cubin = _unzstd(payload) if payload[:4] == ZSTD_MAGIC else payload
        if cubin[:4] == b"\x7fELF":
            out.setdefault(f"sm_{sm}", cubin)
    return out


def fatbin_section(data: bytes) -> bytes:
    """The ``.nv_fatbin`` section of an ELF object (b"" where it has none): a fat binary as the
    driver's ``cuModuleLoadData`` takes it. ValueError for bytes that are not an ELF object."""
    try:
        found = [(o, s) for n, _, o, s, _ in _sections(data) if n == ".nv_fatbin"]
    except (struct.error, IndexError) as e:
        raise ValueError(f"not an ELF object: {e}") from None
    return b"".join(data[o : o + s] for o, s in found)


def fatbin_entries(data: bytes) -> Iterable[tuple[int, int, bytes]]:
    """(kind, SM number, payload as stored) of each entry of an ELF object's fat binaries: kind 2
    a cubin, 1 PTX; a payload starting with ZSTD_MAGIC is compressed. struct.error or IndexError
    for bytes that are not an ELF object."""
    found = [(o, s) for n, _, o, s, _ in _sections(data) if n == ".nv_fatbin"]
    for offset, size in found:
        at, end = offset, offset + size
        while at + 16 <= end:
            magic, _, header, body = struct.unpack_from("<IHHQ", data, at)
            if magic != _FATBIN_MAGIC:
                break
            entry, stop = at + header, at + header + body
            while entry + 32 <= stop:
                kind, _, head, payload = struct.unpack_from("<HHIQ", data, entry)
                sm, = struct.unpack_from("<I", data, entry + 28)  # fmt: skip
                yield kind, sm, data[entry + head : entry + head + payload]
                entry += head + payload
            at = (stop + 7) // 8 * 8


def _unzstd(frame: bytes) -> bytes:
    """The bytes of a zstd frame (a fat binary's entry may end in padding after it); b"" where
    no zstd module is at hand or the frame does not decode."""
    try:
        from compression import zstd  # Python 3.14+

        unpack = zstd.decompress
    except ImportError:
        try:
            import zstandard  # the optional package
        except ImportError:
            return b""
        unpack = zstandard.ZstdDecompressor().decompressobj().decompress
    try:
        return bytes(unpack(frame))
    except Exception:  # a frame this reader cannot decode: no cubin, as for an unknown entry
        return b""


# --- what ptxas -v reported ---------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_INFO = re.compile(r"^(ptxas info\s*:.*|ptxas\s+\.\s+.*|\s+\d+ bytes stack frame, .*)$")


def ptxas_report(text: str) -> dict[tuple[int, str], tuple[int, int]]:
    """(spill stores, spill loads) per (SM number, function) in the output of ``ptxas -v`` (as
    nvcc ``-Xptxas=-v`` or NVRTC ``--ptxas-options=-v`` print it)."""
    out: dict[tuple[int, str], tuple[int, int]] = {}
    sm, function = 0, ""
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            sm = sm_of(m.group(2))
        elif m := _PROPERTIES.search(line):
            function = m.group(1)
        elif (m := _SPILLS.search(line)) and function:
            out[(sm, function)] = (int(m.group(1)), int(m.group(2)))
    return out


def without_ptxas_info(text: str) -> str:
    """``text`` less the lines of ptxas's ``-v`` report (what a failed compile shows)."""
    return "\n".join(line for line in text.splitlines() if not _PTXAS_INFO.match(line))


def with_spills(kernels: dict[str, Kernel], report: str) -> dict[str, Kernel]:
    """``kernels`` with the spills that ``report`` (ptxas -v output) gives for their SM."""
    if not report:
        return kernels
    spills = ptxas_report(report)
    out = dict(kernels)
    for name, k in kernels.items():
        found = spills.get((sm_of(k.arch), name))
        if found is not None:
            out[name] = replace(k, spill_stores=found[0], spill_loads=found[1])
    return out


# --- the occupancy bound ------------------------------------------------------------------------

REGISTERS_PER_SM = 65536  # also the most one block may hold, on every SM since sm_50
REGISTER_UNIT = 256  # registers are allocated to a warp in units of this many
SHARED_UNIT = 128  # shared memory is allocated to a block in units of this many bytes
RESERVED_SHARED = 1024  # bytes every block reserves for the system, from sm_80 on


@dataclass(frozen=True)
class Limits:
    """What one SM of an architecture holds (the CUDA programming guide's table)."""

    threads: int  # resident threads per SM
    blocks: int  # resident blocks per SM
    shared: int  # bytes of shared memory per SM

    def max_threads(self, registers: int, bound: int) -> int:
        """Threads per block a kernel can launch: ``bound``, less where its registers would not
        fit the register file."""
        if registers <= 0:
            return bound
        warps = REGISTERS_PER_SM // _per_warp(registers)
        return min(bound, warps * 32)


# By SM number; an SM missing here takes the nearest lower one's.
LIMITS = {
    70: Limits(2048, 32, 96 * 1024),
    75: Limits(1024, 16, 64 * 1024),
    80: Limits(2048, 32, 164 * 1024),
    86: Limits(1536, 16, 100 * 1024),
    87: Limits(1536, 16, 164 * 1024),
    89: Limits(1536, 24, 100 * 1024),
    90: Limits(2048, 32, 228 * 1024),
    100: Limits(2048, 32, 228 * 1024),
    120: Limits(1536, 32, 100 * 1024),
}


def sm_of(arch: str) -> int:
    """90 for sm_90a, sm_90 or compute_90 (0 for a name without a number)."""
    digits = re.search(r"(\d+)", arch)
    return int(digits.group(1)) if digits else 0


def limits(arch: str) -> Limits:
    sm = sm_of(arch)
    known = [k for k in LIMITS if k <= sm]
    return LIMITS[max(known)] if known else LIMITS[min(LIMITS)]


def _per_warp(registers: int) -> int:
    return -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks and warps per SM that a kernel's resources allow, and what limits them
    (``registers``, ``shared memory``, ``threads`` or ``blocks``)."""

    blocks: int
    warps: int
    limiter: str


def occupancy(arch: str, registers: int, shared: int, threads: int) -> Occupancy:
    """The bound for blocks of ``threads`` threads, each thread holding ``registers`` and each
    block ``shared`` bytes of static shared memory, on one SM of ``arch``."""
    lim = limits(arch)
    warps = max(1, -(-threads // 32))
    bounds = {"blocks": lim.blocks, "threads": lim.threads // (warps * 32)}
    if registers > 0:
        bounds["registers"] = REGISTERS_PER_SM // _per_warp(registers) // warps
    reserved = RESERVED_SHARED if sm_of(arch) >= 80 else 0
    if shared + reserved > 0:
        per_block = -(-(shared + reserved) // SHARED_UNIT) * SHARED_UNIT
        bounds["shared memory"] = lim.shared // per_block
    limiter = min(bounds, key=lambda k: bounds[k])
    return Occupancy(bounds[limiter], bounds[limiter] * warps, limiter)


def bound(k: Kernel) -> Occupancy:
    """The occupancy bound of a kernel at its most threads per block."""
    return occupancy(k.arch, k.registers, k.shared, k.max_threads)


# --- what changed -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)  # a reload's old and new kernels share most names
def short_name(mangled: str) -> str:
    """``wb::scale::scale_kernel<4, true, float>`` for ``_ZN2wb5scale12scale_kernelILi4ELb1EfEE
    vi...``: the name of an Itanium-mangled function with its template arguments, without its
    parameters or anonymous namespaces. Template arguments this reader does not know (an
    expression, a substitution of std::) read as ``<...>``; a name it cannot read is returned
    as it is."""
    if not mangled.startswith("_Z"):
        return mangled
    try:
        name = _Names(mangled).function()
    except (ValueError, IndexError):
        name = _names_only(mangled)
    return re.sub(r"_GLOBAL__N_\w*?::", "", name) or mangled


_BUILTIN = {
    "v": "void", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char",
    "s": "short", "t": "unsigned short", "i": "int", "j": "unsigned int", "l": "long",
    "m": "unsigned long", "x": "long long", "y": "unsigned long long", "f": "float",
    "d": "double", "e": "long double",
}  # fmt: skip


class _Names:
    """The names and template arguments of a mangled function's name (the Itanium C++ ABI's
    <name>), with the substitutions (``S_``, ``S0_``...) that refer to earlier components."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 2  # after _Z
        self.subs: list[str] = []

    def function(self) -> str:
        if self.s[self.i] == "N":
            return self.nested()
        name = self.source()
        if self.s[self.i] == "I":
            self.add(name)
            name += self.args()
        return name

    def add(self, entity: str) -> None:
        if entity not in self.subs:
            self.subs.append(entity)

    def nested(self) -> str:
        self.i += 1  # N
        if self.s[self.i] in "KVr":  # cv-qualifiers of a member function
            raise ValueError("a member function")
        parts: list[str] = []
        while self.s[self.i] != "E":
            if self.s[self.i] == "I":
                parts[-1] += self.args()
            elif self.s[self.i] == "S":
                parts.append(self.substitution())
            else:
                parts.append(self.source())
            self.add("::".join(parts))
        self.i += 1
        return "::".join(parts)

    def source(self) -> str:
        digits = re.match(r"\d+", self.s[self.i :])
        if digits is None:
            raise ValueError(f"no name at {self.i}")
        self.i += len(digits.group(0))
        n = int(digits.group(0))
        self.i += n
        return self.s[self.i - n : self.i]

    def substitution(self) -> str:
        m = re.match(r"S([0-9A-Z]*)_", self.s[self.i :])
        if m is None:
            raise ValueError("a substitution of std::")
        self.i += len(m.group(0))
        return str(self.subs[int(m.group(1), 36) + 1 if m.group(1) else 0])

    def args(self) -> str:
        self.i += 1  # I
        out = []
        while self.s[self.i] != "E":
            out.append(self.arg())
        self.i += 1
        return "<" + ", ".join(a for a in out if a) + ">"

    def arg(self) -> str:
        if self.s[self.i] == "J":  # a pack: its arguments in place ("" for an empty one)
            self.i += 1
            items = []
            while self.s[self.i] != "E":
                items.append(self.arg())
            self.i += 1
            return ", ".join(i for i in items if i)
        if self.s[self.i] != "L":
            return self.type()
        m = re.match(r"L([a-z])(n?)(\d+)E", self.s[self.i :])
        if m is None:
            raise ValueError("a literal this reader does not know")
        self.i += len(m.group(0))
        if m.group(1) == "b":
            return "true" if m.group(3) == "1" else "false"
        return ("-" if m.group(2) else "") + m.group(3)

    def type(self) -> str:
        c = self.s[self.i]
        if c in _BUILTIN:
            self.i += 1
            return _BUILTIN[c]
        if c in "PK":
            self.i += 1
            inner = self.type()
            out = f"{inner}*" if c == "P" else f"const {inner}"
        elif c == "N":
            out = self.nested()
        elif c == "S":
            out = self.substitution()
        else:
            out = self.source()
        if self.s[self.i] == "I":
            self.add(out)
            out += self.args()
        self.add(out)
        return out


def _names_only(mangled: str) -> str:
    """The names of a mangled function, its template arguments as ``<...>``."""
    m = re.match(r"_Z(N?)", mangled)
    assert m is not None
    at, parts = m.end(), []
    while at < len(mangled) and mangled[at].isdigit():
        digits = re.match(r"\d+", mangled[at:])
        assert digits is not None
        n = int(digits.group(0))
        at += len(digits.group(0))
        parts.append(mangled[at : at + n])
        at += n
        if at < len(mangled) and mangled[at] == "I":
            parts[-1] += "<...>"
            break
        if not m.group(1):
            break
    return "::".join(parts)


def changed(
    before: dict[str, Kernel], after: dict[str, Kernel]
) -> list[tuple[Kernel, Kernel | None]]:
    """(new, old or None) of each kernel of ``after`` that is new or whose code or resources
    differ from ``before``'s."""
    out = []
    for name, k in after.items():
        old = before.get(name)
        if old is None or old != k:
            out.append((k, old))
    return out


def describe(k: Kernel, name: str | None = None) -> str:
    """One line: registers, spilled bytes, static shared memory, most threads per block, and
    the occupancy bound they allow."""
    spills = "spills ?" if k.spills is None else f"{k.spills} B spilled"
    occ = bound(k)
    return (
        f"{name or short_name(k.name)} {k.arch}: {k.registers} regs, {spills}, {k.shared} B smem, "
        f"{k.max_threads} threads max -> {occ.blocks} blocks/SM ({occ.warps} warps, "
        f"{occ.limiter})"
    )


def warnings_for(k: Kernel, old: Kernel | None, name: str | None = None) -> list[str]:
    """What got worse than the kernel it replaces: spills where it had none (or a new kernel
    that spills), an occupancy bound that fell."""
    name = name or short_name(k.name)
    out = []
    if k.spills and (old is None or not old.spills):
        out.append(
            f"{name} {k.arch} spills {k.spills} bytes per thread ({k.spill_stores} stored, "
            f"{k.spill_loads} loaded; {k.registers} registers, {k.frame} B stack frame)"
        )
    if old is not None:
        was, now = bound(old), bound(k)
        if now.warps < was.warps:
            out.append(
                f"{name} {k.arch}: occupancy bound fell from {was.warps} to {now.warps} warps/SM "
                f"({now.limiter}: {old.registers} -> {k.registers} regs, {old.shared} -> "
                f"{k.shared} B smem, {old.max_threads} -> {k.max_threads} threads)"
            )
    return out
