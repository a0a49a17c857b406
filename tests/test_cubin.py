"""workbench.cubin: kernels' resources read from real cubins, against what ptxas -v printed.

nvcc compiles kernels that differ in each resource (launch bounds, static shared memory, a
local array, a spill forced by -maxrregcount) for several SMs; the reader must agree with
ptxas's own report of the same compile on every number. The occupancy bound is a pure function
checked on values worked out by hand from the SM's limits.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from workbench import cubin, device, nvrtc

SOURCE = r"""
__global__ void __launch_bounds__(256) axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
__global__ void __launch_bounds__(128, 4) bounded(float* y) { y[threadIdx.x] = 1.0f; }
__global__ void staged(const float* x, float* y, int n) {
  __shared__ float tile[1000];
  __shared__ double extra[3];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.f;
  extra[threadIdx.x % 3] = tile[0];
  __syncthreads();
  if (i < n) y[i] = tile[(threadIdx.x + 1) % blockDim.x] + extra[1];
}
__global__ void heavy(const float* x, float* y, int n, int k) {
  float acc[64];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = x[(i + j * 7) % n];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = acc[j] * acc[(j + k) & 63] + acc[(j * 3 + 1) & 63];
  float s = 0;
#pragma unroll
  for (int j = 0; j < 64; ++j) s += acc[j] * (j + 1);
  if (i < n) y[i] = s;
}
template <int N> __global__ void fill(float* y) { y[threadIdx.x] = N; }
template __global__ void fill<3>(float*);
"""
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120"]


def nvcc() -> str:
    return shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


def compile_cubin(tmp: Path, arch: str, *flags: str) -> tuple[bytes, str]:
    """(cubin, ptxas -v output) of SOURCE for ``arch``."""
    src = tmp / "k.cu"
    src.write_text(SOURCE)
    out = tmp / f"k_{arch}{'_'.join(flags)}.cubin"
    cmd = [nvcc(), "-cubin", f"-arch={arch}", "-Xptxas", "-v", *flags, "-o", str(out), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return out.read_bytes(), proc.stdout + proc.stderr


def ptxas_says(text: str) -> dict[str, dict[str, int]]:
    """What ptxas -v printed per entry function: registers, smem, stack frame, spills."""
    out: dict[str, dict[str, int]] = {}
    current: dict[str, int] = {}
    for line in text.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            current = out.setdefault(m.group(1), {"smem": 0})
        elif m := re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes", line
        ):
            current.update(frame=int(m[1]), stores=int(m[2]), loads=int(m[3]))
        elif m := re.search(r"Used (\d+) registers", line):
            current["registers"] = int(m[1])
            if s := re.search(r"(\d+) bytes smem", line):
                current["smem"] = int(s[1])
    return out


def known_to_nvcc(arch: str) -> bool:
    listed = subprocess.run([nvcc(), "--list-gpu-code"], capture_output=True, text=True).stdout
    return f"sm_{cubin.sm_of(arch)}" in listed.split()


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_the_reader_agrees_with_ptxas_on_every_kernel(tmp_path: Path, arch: str) -> None:
    if not known_to_nvcc(arch):
        pytest.skip(f"this nvcc does not compile for {arch}")
    data, log = compile_cubin(tmp_path, arch)
    said = ptxas_says(log)
    kernels = cubin.with_spills(cubin.read(data, arch), log)
    assert set(kernels) == set(said) and len(said) == 5
    for name, k in kernels.items():
        p = said[name]
        assert (k.registers, k.shared, k.frame) == (p["registers"], p["smem"], p["frame"]), name
        assert (k.spill_stores, k.spill_loads) == (p["stores"], p["loads"]), name
        assert k.arch == arch
    assert kernels["_Z4axpyfPKfPfi"].launch_bound == 256
    assert kernels["_Z7boundedPf"].launch_bound == 128
    assert kernels["_Z6stagedPKfPfi"].shared == 4000 + 24 and kernels["_Z6stagedPKfPfi"].shared
    assert kernels["_Z4fillILi3EEvPf"].launch_bound == 0  # no bound: 1024 threads
    assert kernels["_Z5heavyPKfPfii"].frame >= 256  # its local array


@pytest.mark.nvcc
def test_a_forced_spill_reads_as_ptxas_reported_it(tmp_path: Path) -> None:
    data, log = compile_cubin(tmp_path, "sm_90a", "-maxrregcount=24")
    heavy = cubin.with_spills(cubin.read(data, "sm_90a"), log)["_Z5heavyPKfPfii"]
    p = ptxas_says(log)["_Z5heavyPKfPfii"]
    assert heavy.registers == p["registers"] <= 24
    assert heavy.spill_stores == p["stores"] > 0 and heavy.spill_loads == p["loads"] > 0
    assert heavy.spills == p["stores"] + p["loads"] and heavy.frame == p["frame"]
    assert cubin.read(data, "sm_90a")["_Z5heavyPKfPfii"].spills is None  # no report: unknown


@pytest.mark.nvcc
def test_an_objects_fat_binary_holds_each_arch_cubin(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text(SOURCE)
    obj = tmp_path / "k.o"
    gencode = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]
    cmd = [nvcc(), "-c", *gencode, "-o", str(obj), str(tmp_path / "k.cu")]
    subprocess.run(cmd, check=True, capture_output=True)
    found = cubin.fatbin_cubins(obj.read_bytes())
    assert cubin.fatbin_section(obj.read_bytes())[:4] == (0xBA55ED50).to_bytes(4, "little")
    assert sorted(found) == ["sm_80", "sm_90"]  # the fat binary names the SM, not the 'a'
    for arch in ("sm_80", "sm_90a"):
        alone, _ = compile_cubin(tmp_path, arch)
        inside = cubin.read(found[f"sm_{cubin.sm_of(arch)}"], arch)
        assert inside == cubin.read(alone, arch)  # the same code and resources


def zstd_at_hand() -> bool:
    import importlib

    for name in ("compression.zstd", "zstandard"):
        try:
            importlib.import_module(name)
            return True
        except ImportError:
            pass
    return False


@pytest.mark.nvcc
def test_a_compressed_cubin_reads_as_the_plain_one(tmp_path: Path) -> None:
    """nvcc 12.8+ compresses large cubins by default (``--compress-mode=size``: every one); the
    reader unpacks them where Python has zstd, so a reload still prints their registers."""
    usage = subprocess.run([nvcc(), "--help"], capture_output=True, text=True).stdout
    if "--compress-mode" not in usage:
        pytest.skip("this nvcc does not compress cubins")
    if not zstd_at_hand():
        pytest.skip("no zstd module (Python 3.14's compression.zstd or zstandard)")
    (tmp_path / "k.cu").write_text(SOURCE)
    gencode = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]
    objects = {}
    for mode in ("size", "none"):
        obj = tmp_path / f"k_{mode}.o"
        cmd = [nvcc(), "-c", *gencode, f"--compress-mode={mode}", "-o", str(obj)]
        cmd.append(str(tmp_path / "k.cu"))
        subprocess.run(cmd, check=True, capture_output=True)
        objects[mode] = obj.read_bytes()
    packed = [p[:4] == cubin.ZSTD_MAGIC for _, _, p in cubin.fatbin_entries(objects["size"])]
    plain = [p[:4] == cubin.ZSTD_MAGIC for _, _, p in cubin.fatbin_entries(objects["none"])]
    assert packed == [True, True] and plain == [False, False]
    found = cubin.fatbin_cubins(objects["size"])
    assert sorted(found) == ["sm_80", "sm_90"] and found == cubin.fatbin_cubins(objects["none"])
    assert len(cubin.read(found["sm_90"], "sm_90a")) == 5


def test_a_compressed_entry_that_does_not_decode_is_left_out() -> None:
    assert cubin._unzstd(cubin.ZSTD_MAGIC + b"not a frame") == b""


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")
def test_an_nvrtc_cubin_and_its_log_give_the_same_numbers(tmp_path: Path) -> None:
    src = tmp_path / "k.kernel.cu"
    src.write_text(SOURCE.replace("template __global__ void fill<3>(float*);", ""))
    names = ["axpy", "staged", "heavy", "fill<3>"]
    result = nvrtc.compile(src, "sm_90a", names, [*device.NVRTC_FLAGS, "-maxrregcount=32"])
    kernels = cubin.with_spills(cubin.read(result.cubin, "sm_90a"), result.log)
    heavy = kernels[result.lowered["heavy"]]
    assert heavy.registers <= 32 and heavy.spills and heavy.spills > 0  # -v is always asked for
    said = ptxas_says(result.log)
    for k in kernels.values():
        assert k.registers == said[k.name]["registers"] and k.shared == said[k.name]["smem"]


def test_the_occupancy_bound_on_known_values() -> None:
    # sm_90: 32 regs x 256 threads = 8 warps of 1024 registers: 64 warps by registers, 8 blocks,
    # and 2048 threads / 256 = 8 blocks too (a tie names the threads).
    assert cubin.occupancy("sm_90a", 32, 0, 256) == cubin.Occupancy(8, 64, "threads")
    # 64 regs: 2048 registers a warp, 32 warps, 4 blocks of 8 warps.
    assert cubin.occupancy("sm_90a", 64, 0, 256) == cubin.Occupancy(4, 32, "registers")
    # 40 regs round up to 1280 a warp: 51 warps fit, 6 blocks of 8 warps.
    assert cubin.occupancy("sm_80", 40, 0, 256) == cubin.Occupancy(6, 48, "registers")
    # 48 KiB of shared memory (+1 KiB reserved) a block: 4 blocks in 228 KiB, 3 in 164 KiB,
    # 2 in 100 KiB.
    for arch, blocks in (("sm_90", 4), ("sm_80", 3), ("sm_86", 2)):
        assert cubin.occupancy(arch, 16, 48 * 1024, 128) == cubin.Occupancy(
            blocks, blocks * 4, "shared memory"
        )
    # Small blocks hit the block limit: 32 a SM on sm_90, 16 on sm_86.
    assert cubin.occupancy("sm_90", 16, 0, 32) == cubin.Occupancy(32, 32, "blocks")
    assert cubin.occupancy("sm_86", 16, 0, 32) == cubin.Occupancy(16, 16, "blocks")
    # 1536 threads a SM on sm_86: one block of 1024.
    assert cubin.occupancy("sm_86", 16, 0, 1024) == cubin.Occupancy(1, 32, "threads")
    # An unknown newer SM takes the nearest older one's limits.
    assert (
        cubin.limits("sm_103a") == cubin.LIMITS[100] and cubin.limits("sm_121") == cubin.LIMITS[120]
    )


def test_registers_cap_the_threads_a_block_can_have() -> None:
    # 168 registers: 5376 a warp, 12 warps fit the 64K register file: 384 threads, 1 block.
    k = cubin.Kernel("f", "sm_90a", 168, 0, 0, 0, 0)
    assert k.max_threads == 384 and cubin.bound(k) == cubin.Occupancy(1, 12, "registers")
    assert cubin.Kernel("f", "sm_90a", 32, 0, 256, 0, 0).max_threads == 256  # its bound
    assert cubin.Kernel("f", "sm_90a", 0, 0, 0, 0, 0).max_threads == 1024


@pytest.mark.nvcc
def test_fewer_registers_warn_of_spills_and_more_of_a_lower_bound(tmp_path: Path) -> None:
    free, free_log = compile_cubin(tmp_path, "sm_90a")
    capped, capped_log = compile_cubin(tmp_path, "sm_90a", "-maxrregcount=24")
    loose = cubin.with_spills(cubin.read(free, "sm_90a"), free_log)
    tight = cubin.with_spills(cubin.read(capped, "sm_90a"), capped_log)
    name = "_Z5heavyPKfPfii"
    # Capped to 24 registers: the kernel now spills, and its bound rises (no warning for that).
    (warning,) = cubin.warnings_for(tight[name], loose[name])
    assert "heavy sm_90a spills" in warning and f"{tight[name].spills} bytes" in warning
    # The cap lifted: no spills, but the bound falls from 64 to the warps 168-odd registers allow.
    (warning,) = cubin.warnings_for(loose[name], tight[name])
    was, now = cubin.bound(tight[name]), cubin.bound(loose[name])
    assert now.warps < was.warps
    assert f"occupancy bound fell from {was.warps} to {now.warps} warps/SM" in warning
    changed = cubin.changed(loose, tight)
    assert name in [k.name for k, _ in changed]  # what -maxrregcount reached
    assert cubin.changed(loose, loose) == []
    line = cubin.describe(tight[name])
    assert line.startswith(f"heavy sm_90a: {tight[name].registers} regs, {tight[name].spills} B")
    # A new kernel that spills warns too; one that does not, and an unknown report, do not.
    assert cubin.warnings_for(tight[name], None) and not cubin.warnings_for(loose[name], None)
    assert cubin.warnings_for(cubin.read(capped, "sm_90a")[name], None) == []


NAMED = r"""
namespace outer {
struct Pair { float a, b; };
namespace inner {
template <int N, bool B, typename T> __global__ void k(T* p) { p[0] = T(); }
template <typename T, typename U> __global__ void two(T* p, const U* q) { p[0] = T(q[0]); }
}  // namespace inner
namespace {
template <unsigned N, typename T> __global__ void hidden(T* p) { p[0] = T(N); }
}  // namespace
template <int N> __global__ void launch(float* p) { inner::k<N, true, float><<<1, 1>>>(p); }
}  // namespace outer
template <long N, typename T> __global__ void top(T* p) { p[0] = T(N); }
"""
EXPRESSIONS = [
    "outer::inner::k<4, true, float>",
    "outer::inner::k<-3, false, outer::Pair>",
    "outer::inner::k<8, false, double>",
    "outer::inner::two<outer::Pair, outer::Pair>",
    "outer::inner::two<const int*, unsigned char>",
    "top<7, long long>",
    "top<0, outer::Pair*>",
    "outer::hidden<3, float>",
]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")
def test_short_names_read_back_the_instantiations_nvrtc_mangled(tmp_path: Path) -> None:
    src = tmp_path / "named.kernel.cu"
    src.write_text(NAMED.replace("template <int N> __global__ void launch", "// no launch"))
    result = nvrtc.compile(src, "sm_90a", EXPRESSIONS, ["-std=c++17"])
    for expression, mangled in result.lowered.items():  # an anonymous namespace is left out
        assert cubin.short_name(mangled).replace(" ", "") == expression.replace(" ", ""), mangled
    assert cubin.read(result.cubin, "sm_90a").keys() == set(result.lowered.values())


def test_short_names_and_the_report_filter() -> None:
    assert cubin.short_name("_Z4axpyfPKfPfi") == "axpy"
    assert cubin.short_name("_Z4fillILi3EEvPf") == "fill<3>"
    layer_norm = "_ZN2wb10layer_norm12_GLOBAL__N_122layer_norm_regs_kernelILi4ELi2EfEEvPKT1_"
    assert cubin.short_name(layer_norm) == "wb::layer_norm::layer_norm_regs_kernel<4, 2, float>"
    expression = "_ZN2wb1k6kernelILi1EXadL_Z1fvEEEEvv"  # an argument this reader does not know
    assert cubin.short_name(expression) == "wb::k::kernel<...>"
    assert cubin.short_name("plain_c_name") == "plain_c_name"
    text = (
        "k.cu(3): error: x is undefined\n"
        "ptxas info    : Used 10 registers, used 0 barriers\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas error   : Entry function 'k' uses too much shared data\n"
    )
    assert cubin.without_ptxas_info(text).splitlines() == [
        "k.cu(3): error: x is undefined",
        "ptxas error   : Entry function 'k' uses too much shared data",
    ]


def test_bytes_that_are_not_a_cubin_are_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a 64-bit"):
        cubin.read(b"not an elf at all")
    with pytest.raises(ValueError, match="not a cubin"):
        cubin.read(b"\x7fELF\x02\x01" + b"\0" * 10)
    with pytest.raises(ValueError):
        cubin.fatbin_cubins(b"\x7fELF\x02\x01" + b"\0" * 10)
    with pytest.raises(ValueError):
        cubin.fatbin_section(b"\x7fELF\x02\x01" + b"\0" * 10)
