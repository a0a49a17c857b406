"""Spec of the matmul family: matmul(a, b) = a @ b, and matmul_path (the same on one CUDA path).

    c[i, j] = sum_p a[i, p] * b[p, j]      a: [m, k], b: [k, n] (any strides), c: [m, n]

Batched as torch.matmul is for these shapes: a [batch, m, k] with b [k, n] or [batch, k, n]
gives c [batch, m, n] (bindings/matmul.cpp, ``batched``).

Accumulated in float32 (float64 for float64 inputs), never through TF32, rounded once.
``matmul_path(a, b, path)`` forces a CUDA path (1 simt, 2 mma, 3 wgmma; 0 automatic) so that
each one is checked and timed on its own; it is not differentiable.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench import TuneSpace
from workbench.spec import DEFAULT_TOLERANCES, OpSpec, Sample, randn, within_torch_error

# A right kernel accumulates in float32 and rounds once, so its error is within one ulp of the
# dtype (bfloat16: 2^-8 relative) plus the float32 sum's, which is far smaller. bfloat16's
# default floor (1.6e-2 of |ref| + 1e-2 of the largest output) is meant for chains of rounded
# steps and lets a bfloat16 running sum pass up to k ~ 1000; here rtol is two ulps and atol
# 1e-3 of the largest output covers cancellation. Measured on the CPU kernel: a right kernel
# stays at 0.3-0.4 of this bound for every k from 16 to 8192, a bfloat16 accumulator fails from
# k = 256 (tests/test_check_matmul.py).
# float32: twice PyTorch's own error on the sample, over a floor of eight epsilons of the largest
# output (where PyTorch's error is a lucky few ulps: at k = 72 on an H100 cuBLAS's largest error
# was half of a right SIMT kernel's, which two epsilons failed; at k = 8192 eight epsilons are
# about twice cuBLAS's error, so the floor does not loosen the long-k bound). The default floor
# (1e-4 of each element and 1e-5 of the largest) let one running sum over k pass at k = 8192,
# where its error is 6-10x a blocked sum's (PyTorch's, and this family's kernels', which sum
# 128-long slices of k from zero); now it fails there, 3.3x over the bound
# (tests/test_matmul_float32.py).
_TOLERANCES = {
    **DEFAULT_TOLERANCES,
    torch.float32: within_torch_error(torch.float32, ulps=8.0),
    torch.bfloat16: (8e-3, 1e-3),
}
# The special-values sample keeps NaN, Inf, -0.0 and subnormals but not the largest finite values.
_WHY_NO_MAX = (
    "products of the largest finite values overflow the accumulator partway through a sum that "
    "also holds an Inf, and whether +Inf meets -Inf (NaN) then depends on the order of the sum"
)

# (label, (m, k, n)): the awkward cases first. Sizes that are not multiples of any tile (the
# tensor-core tiles are 128 x 256 x 64 and 128 x 128 x 32), k deep enough for the error to grow.
_SHAPES: list[tuple[str, tuple[int, int, int]]] = [
    ("empty", (0, 8, 5)),
    ("k0", (3, 0, 4)),  # no products: zeros
    ("one", (1, 1, 1)),
    ("odd", (17, 33, 9)),  # k odd: rows not 16-byte aligned, the simt path
    ("row", (1, 64, 40)),  # one row of a
    ("k_tail", (40, 72, 48)),  # k not a multiple of a k step
    ("tails", (300, 264, 520)),  # several tiles, partial in m and n
    ("primes", (127, 131, 257)),
    ("k1024", (8, 1024, 16)),
    ("k8192", (8, 8192, 24)),
    ("tall_narrow", (2048, 136, 24)),  # few columns, many rows: on sm_90 the tall rule's narrow1
    ("tall_wide", (6000, 136, 96)),  # 96 columns past a wave of narrow tiles: the 64 x 128 tile
    ("one_column", (2048, 136, 1)),  # on sm_90 computed as c^T = b^T a^T (a GEMV)
]
# float32 only, whose bound is PyTorch's own error at the sample's k: long k that is not a multiple
# of a step (16) or of a summed slice (128), over more than one tile of c (the SIMT path's
# 128 x 128) and less than one.
_FLOAT32_SHAPES = [("k2053", (130, 2053, 136)), ("k8191", (40, 8191, 72))]


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c = a @ b; a: [m, k], b: [k, n], or batched (a [batch, m, k], b [k, n] or [batch, k, n])."""
    return torch.matmul(a, b)


def _pair(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, gen: Any) -> tuple:
    return randn((m, k), dtype, device, gen), randn((k, n), dtype, device, gen)


def matmul_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    shapes = _SHAPES + (_FLOAT32_SHAPES if dtype == torch.float32 else [])
    samples = [Sample(_pair(*shape, dtype, device, gen), label) for label, shape in shapes]
    # a transposed (a column-major view) and b a view of every other column: read in place by
    # the simt paths, copied once for the tensor-core paths.
    at = randn((24, 16), dtype, device, gen).t()
    b = randn((24, 24), dtype, device, gen, strided=True)
    samples.insert(4, Sample((at, b), "strided"))
    # b column-major (b = w.t() for a weight w [n, k], as in x @ w.t()): the wgmma path reads it
    # as it is (k-major), the others copy it.
    w = randn((40, 96), dtype, device, gen)
    samples.insert(5, Sample((randn((70, 96), dtype, device, gen), w.t()), "b_colmajor"))
    # ... with an odd n: rows of c that are not 4-byte multiples (the wgmma epilogue's 2-byte path).
    w = randn((37, 96), dtype, device, gen)
    samples.insert(6, Sample((randn((150, 96), dtype, device, gen), w.t()), "b_colmajor_odd_n"))
    # a column-major (a = x.t(), as in the weight gradient x^T @ dy) on a c of more 128 x 256
    # tiles than a Hopper GPU has SMs (13 x 12 = 156), 8 past a tile in m and n and a 64-k step in
    # k: the wgmma path's whole-k kernel reads it in place (m-major), where the few-rows shapes
    # above copy it. On CUDA only, where its 0.9 GFLOP are quick.
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        x = randn((200, 1544), dtype, device, gen)
        samples.append(Sample((x.t(), randn((200, 2824), dtype, device, gen)), "a_colmajor"))
    # A batch whose slices' 128 x 128 tiles fill half of a Hopper GPU's SMs (40 x 4 of them), past
    # a tile in m, n and a k step: on sm_90a the batched wgmma kernel (3-D tensor maps), else the
    # mma path's batch, float32 and float64 the SIMT path's; and with b's slices column-major (b
    # = x.transpose(1, 2), as k^T in q @ k^T), then a's too, which the wgmma kernel reads in
    # place. On CUDA only.
    if device.type == "cuda":
        a = randn((40, 136, 72), dtype, device, gen)
        samples.append(Sample((a, randn((40, 72, 136), dtype, device, gen)), "batched_hopper"))
        b_t = randn((40, 136, 72), dtype, device, gen).transpose(1, 2)
        samples.append(Sample((a, b_t), "batched_hopper_b_t"))
        a_t = randn((40, 72, 136), dtype, device, gen).transpose(1, 2)
        samples.append(Sample((a_t, b_t), "batched_hopper_a_t_b_t"))
    # Batched: a slice at a time (k and n multiples of 8: every path's layout), one product of a's
    # rows for a b shared by the batch (a of rows that fold into one matrix, and a transposed view
    # whose rows do not), and a batch of none.
    samples += [
        Sample((randn((3, 17, 40), dtype, device, gen), randn((3, 40, 24), dtype, device, gen)),
               "batched"),
        Sample((randn((4, 30, 72), dtype, device, gen), randn((72, 48), dtype, device, gen)),
               "batched_shared_b"),
        Sample((randn((3, 24, 40), dtype, device, gen).transpose(1, 2),
                randn((24, 16), dtype, device, gen)), "batched_transposed_a"),
        Sample((randn((0, 5, 8), dtype, device, gen), randn((0, 8, 3), dtype, device, gen)),
               "batched_empty"),
    ]  # fmt: skip
    return samples


def _paths(dtype: torch.dtype, device: torch.device) -> list[int]:
    """The paths matmul_path can take for this dtype on this device (0 only on a CPU)."""
    if device.type != "cuda":
        return [0]
    paths = [1]
    if dtype in (torch.float16, torch.bfloat16):
        major, minor = torch.cuda.get_device_capability(device)
        paths += [2] if major >= 8 else []
        paths += [3] if (major, minor) == (9, 0) else []
    return paths


_PATH_NAMES = {0: "auto", 1: "simt", 2: "mma", 3: "wgmma"}


def matmul_path_samples(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """Row-major operands with k and n multiples of 8 (every path reads them), on every path."""
    shapes = [("one", (1, 8, 8)), ("odd", (17, 40, 24)), ("k_tail", (40, 72, 48)),
              ("tails", (300, 264, 520)), ("k8192", (8, 8192, 24))]  # fmt: skip
    out = []
    for path in _paths(dtype, device):
        for label, shape in shapes:
            a, b = _pair(*shape, dtype, device, gen)
            out.append(Sample((a, b, path), f"{label} {_PATH_NAMES[path]}"))
    return out


def matmul_path_reference(a: torch.Tensor, b: torch.Tensor, path: int) -> torch.Tensor:
    return torch.matmul(a, b)


def matmul_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """Labelled m x n x k: square, large, and skinny (a short k; a single block of rows)."""
    if device.type == "cuda":
        shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (16, 4096, 4096)]
    else:
        shapes = [(256, 256, 256), (512, 512, 512), (16, 1024, 1024)]
    return [Sample(_pair(m, k, n, dtype, device, gen), f"{m}x{n}x{k}") for m, n, k in shapes]


def matmul_path_bench_sizes(
    dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> list[Sample]:
    """4096^3 on each path (CPU: 256^3 on its one path): the gap per step."""
    size = 4096 if device.type == "cuda" else 256
    a, b = _pair(size, size, size, dtype, device, gen)
    return [Sample((a, b, p), f"{size}^3 {_PATH_NAMES[p]}") for p in _paths(dtype, device)]


def matmul_flops(args: tuple[Any, ...], out: torch.Tensor) -> int:
    """A multiply and an add per (i, j, p), of every slice of a batch."""
    a, b = args[0], args[1]
    return 2 * a.numel() * b.shape[-1]


def matmul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch._check(
        a.dim() in (2, 3),
        lambda: f"matmul: expected a to be 2-d [m, k] or 3-d [batch, m, k], got {a.dim()}-d",
    )
    torch._check(
        b.dim() in (2, 3),
        lambda: f"matmul: expected b to be 2-d [k, n] or 3-d [batch, k, n], got {b.dim()}-d",
    )
    torch._check(a.dim() == 3 or b.dim() == 2, lambda: "matmul: a 2-d a takes a 2-d b")
    torch._check(
        b.dim() == 2 or b.shape[0] == a.shape[0],
        lambda: f"matmul: b.size(0) ({b.shape[0]}) != a.size(0) ({a.shape[0]})",
    )
    torch._check(
        a.shape[-1] == b.shape[-2],
        lambda: f"matmul: a's k ({a.shape[-1]}) != b's ({b.shape[-2]})",
    )
    torch._check(a.dtype == b.dtype, lambda: "matmul: b must have a's dtype")
    torch._check(a.device == b.device, lambda: "matmul: b must be on a's device")
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


def matmul_path_fake(a: torch.Tensor, b: torch.Tensor, path: int) -> torch.Tensor:
    return matmul_fake(a, b)


def matmul_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b = inputs
    ctx.save_for_backward(a, b)


def matmul_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    """grad_a = grad @ b^T,  grad_b = a^T @ grad, by the op itself: a slice at a time for a
    batched b, and summed over the batch (one product of a's rows) for a b the batch shares."""
    a, b = ctx.saved_tensors
    grad_a = ctx.ops.matmul(grad, b.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
    grad_b = None
    if ctx.needs_input_grad[1]:
        if a.dim() == 3 and b.dim() == 2:
            k, n = b.shape
            grad_b = ctx.ops.matmul(a.reshape(-1, k).t(), grad.reshape(-1, n))
        else:
            grad_b = ctx.ops.matmul(a.transpose(-1, -2), grad)
    return grad_a, grad_b


# What both ops share: the FLOP count, matmul's bfloat16 floor, the special values they get.
_COMMON: dict[str, Any] = dict(
    flops=matmul_flops, tolerances=_TOLERANCES, specials_exclude=("max",), why=_WHY_NO_MAX
)

OPS = [
    OpSpec(
        name="matmul",
        reference=matmul_reference,
        samples=matmul_samples,
        fake=matmul_fake,
        backward=matmul_backward,
        setup_context=matmul_setup_context,
        bench_sizes=matmul_bench_sizes,
        **_COMMON,
    ),
    OpSpec(
        name="matmul_path",
        reference=matmul_path_reference,
        samples=matmul_path_samples,
        fake=matmul_path_fake,
        bench_sizes=matmul_path_bench_sizes,
        **_COMMON,
    ),
]


# --- the tuning space (`wb tune matmul`) ---------------------------------------------------------
# The Hopper path's tile: matmul_wgmma.kernel.cu (a device-only TU) reads each parameter as
# WB_TUNE_<NAME>, and its #ifndef defaults are the default point (tests/test_tune_matmul.py keeps
# the two equal). Nothing else reads them: a variant compiles that file alone (NVRTC; its host
# launcher reads the tile from the module), and float32 and float64 are the same in every variant.
#   BN         columns of c a tile (the N of wgmma.m64nNk16). 256 spreads each read of a over the
#              most columns; 128 and 64 make more tiles where there are few (16 x 4096 x 4096 is
#              16 tiles of 128 x 256 for 132 SMs).
#   CONSUMERS  consumer warpgroups, 64 rows of the tile each (BM = 64 * CONSUMERS): 2 share each
#              stage of b; 1 wastes less of a tile on an a of few rows.
#   STAGES     shared-memory stages in the ring: copies in flight to hide the latency of memory.
#   BLOCKS     resident blocks an SM: with 2, one block stores its tile from registers while the
#              other's MMAs run (the epilogue is not overlapped within a block; a short k makes it
#              a large share of the time).
# `_fits` prunes what the kernel's static_asserts would reject (the same arithmetic):
#   - shared memory: STAGES * (BM + BN) * 128 bytes + 1 KiB of alignment + 16 bytes a stage of
#     mbarriers within a block's 227 KiB, and BLOCKS such blocks plus 1 KiB reserved each within an
#     SM's 228 KiB (BN 256 with 2 consumers: 4 stages at most);
#   - registers: a thread starts at 65536 / (threads * BLOCKS), in 8s, at most 255, and ptxas
#     compiles the consumers' code within that (setmaxnreg raises no compile-time limit), so it
#     must hold the BN / 2 accumulators and 32 more (ptxas fails below BN / 2 + 26). This leaves
#     BLOCKS = 2 only to one consumer with BN <= 128, or two with BN = 64;
# and two rules that keep the space to points worth a compile (each variant compiles the kernel):
#   - at least 4 stages in flight an SM (STAGES * BLOCKS >= 4, the plain build's depth): fewer
#     only leave the tensor cores waiting on memory;
#   - BN = 64 only with one consumer and one block, for an a of few rows; a wider a fills 128-row
#     or 128-column tiles, where each wgmma does more work per read of shared memory.
# Every valid point compiles for sm_90a without spills (ptxas -v: 168, 255 or 128 registers at
# entry for 2 consumers, 1, and 1 with 2 blocks; 0 bytes spilled).
_SMEM_PER_BLOCK, _SMEM_PER_SM, _SMEM_RESERVED = 227 * 1024, 228 * 1024, 1024


def wgmma_smem_bytes(p: dict[str, Any]) -> int:
    """WgmmaTile::kSmemBytes: the ring of stages of a (BM x 64) and b (64 x BN), 128-byte rows,
    and 1 KiB to align the first stage to a swizzle atom."""
    return p["STAGES"] * (64 * p["CONSUMERS"] + p["BN"]) * 128 + 1024


def wgmma_entry_regs(p: dict[str, Any]) -> int:
    """WgmmaTile::kEntryRegs: the registers a thread starts with under its launch bounds."""
    threads = 128 * (1 + p["CONSUMERS"])
    return min(65536 // (threads * p["BLOCKS"]) // 8 * 8, 255)


def _fits(p: dict[str, Any]) -> bool:
    barriers = 16 * p["STAGES"]
    block = wgmma_smem_bytes(p) + barriers
    fits = (
        block <= _SMEM_PER_BLOCK
        and p["BLOCKS"] * (block + _SMEM_RESERVED) <= _SMEM_PER_SM
        and wgmma_entry_regs(p) >= p["BN"] // 2 + 32
    )
    deep = p["STAGES"] * p["BLOCKS"] >= 4
    narrow_ok = p["BN"] > 64 or (p["CONSUMERS"] == 1 and p["BLOCKS"] == 1)
    return fits and deep and narrow_ok


TUNE = TuneSpace(
    {"BN": [64, 128, 256], "CONSUMERS": [1, 2], "STAGES": [2, 3, 4, 5, 6], "BLOCKS": [1, 2]},
    where=_fits,
    default={"BN": 256, "CONSUMERS": 2, "STAGES": 4, "BLOCKS": 1},
)
