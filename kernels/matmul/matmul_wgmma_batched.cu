// matmul_wgmma_batched.cu: a batch of float16 / bfloat16 matrices in one launch on the tensor
// cores (matmul_tensor_core_batched): c[i] = a[i] @ b[i] for i < batch, each slice too small to
// fill the GPU alone (bindings/matmul.cpp's whole-batch route). On an sm_90a image, slices of at
// least 64 rows and columns (past 64 in both, or of a long k) whose 128 x 128 tiles fill half the
// SMs take the Hopper kernel (wgmma_batched_kernel in matmul_wgmma.kernel.cu: one persistent
// launch over the batch's tiles, a and b through 3-D TMA maps whose third coordinate is the
// slice); the rest, and other GPUs, the mma path's batch (matmul_mma_batched), whose 64 x 64
// tiles fill four times the SMs.
//
// The tile is 128 x 256, 192 x 128 or 128 x 128, and k whole or cut into S slices (2 to 8) run by
// the S blocks of a cluster and summed in it (each tile with the slices plan_batch's rule gives
// it), whichever costs the fewest waves of the SMs times a tile's work (a tile's k steps, or a
// slice's plus kSumSteps for the sum; a tie to the wider tile, whose MMAs read fewer bytes a
// flop): 4 slices of 1024^3 run 128 tiles of 128 x 256 (one wave) where 128 x 128 would take two;
// 8 of 512^3 run 128 of 128 x 128 where 128 x 256 would take a wave of double work; 16 of 384^3
// run 96 of 192 x 128, none past a slice, where 128 x 256 would compute a third past its slices'
// columns; 16 of 128 x 128 x 8192 run 16 tiles of 128 x 128 in 4 slices (64 blocks) where k
// whole would leave 116 SMs idle.
//
// The Hopper kernel reads a's and b's slices row-major or column-major in place: a = x.transpose
// (-1, -2) as in the weight-like gradient a^T @ g, b = x.transpose(-1, -2) as in attention's
// q @ k^T or the gradient g @ b^T. tensor_core_batch_in_place tells the binding where, so that it
// copies such slices to row-major only for the mma path's batch.
//
// A/B switches, read from the environment at each call (for timing on a GPU; a bad value is an
// error naming it): WB_MATMUL_BATCH=mma | wgmma, the mma path's batch or the Hopper kernel wherever
// it can run (unset: the rule above); WB_WGMMA_BATCH_TRANSPOSED=copy | read, column-major slices
// copied to row-major first or read in place (unset: read); WB_WGMMA_BATCH_TILE=128x256 | 192x128
// | 128x128, the tile; WB_WGMMA_BATCH_SPLITS=1 .. 8, the slices of k (1: k whole).
//   Check and time:  wb check matmul --device cuda;  python -m bench shapes --ops batched
#include <cuda.h>
#include <cudaTypedefs.h>

#include <string_view>

#include "matmul/matmul.h"
#include "matmul/wgmma_narrow.h"  // sm_count
#include "matmul/wgmma_shape.h"
#include "matmul/wgmma_shapes_host.h"
#include "matmul/wgmma_tma.h"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/dtypes.h"
#include "wb/module.h"

namespace wb::matmul {

WB_DEVICE_TEMPLATE(kBatch, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_batched_kernel");

namespace {

// TMA's limits on a map (cuTensorMapEncodeTiled): each extent below 2^32, each stride below 2^40
// bytes; and the kernel's units (slices times tiles) must fit an int.
constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;

// WB_MATMUL_BATCH: *forced = 0 unset (the rule), 1 the mma path's batch, 2 the Hopper kernel.
Status batch_choice(int* forced) {
  const std::string_view v = wb::detail::env("WB_MATMUL_BATCH");
  *forced = v.empty() ? 0 : v == "mma" ? 1 : v == "wgmma" ? 2 : -1;
  if (*forced >= 0) return nullptr;
  return "matmul: WB_MATMUL_BATCH must be mma or wgmma; unset it for the default";
}

// The batch's tiles, in the order the wave rule prefers on a tie (the wider first: its MMAs read
// fewer bytes a flop), and their names for WB_WGMMA_BATCH_TILE.
enum BatchTileId : int { kWide, kSquare192, kSquare, kTiles };
constexpr const char* kTileNames[kTiles] = {"128x256", "192x128", "128x128"};

// WB_WGMMA_BATCH_SPLITS: *splits = 0 unset (the wave rule), else the slices of k it names.
Status splits_choice(int* splits) {
  const std::string_view v = wb::detail::env("WB_WGMMA_BATCH_SPLITS");
  *splits = v.size() == 1 && v[0] >= '1' && v[0] <= '8' ? v[0] - '0' : v.empty() ? 0 : -1;
  if (*splits >= 0) return nullptr;
  return "matmul: WB_WGMMA_BATCH_SPLITS must be 1 to 8 (the slices of k; 1: k whole); unset it "
         "for the default";
}

// WB_WGMMA_BATCH_TILE: *tile = kTiles unset (the wave rule), else the tile it names.
Status tile_choice(int* tile) {
  const std::string_view v = wb::detail::env("WB_WGMMA_BATCH_TILE");
  *tile = kTiles;
  for (int t = 0; t < kTiles && !v.empty(); ++t) {
    if (v == kTileNames[t]) *tile = t;
  }
  if (v.empty() || *tile < kTiles) return nullptr;
  return "matmul: WB_WGMMA_BATCH_TILE must be 128x256, 192x128 or 128x128; unset it for the "
         "default";
}

int64_t units_of(int64_t batch, int64_t m, int64_t n, const WgmmaShape& tile) {
  return batch * ((m + tile.bm - 1) / tile.bm) * ((n + tile.bn - 1) / tile.bn);
}

// Whether the Hopper kernel reads an operand's slices in place: rows (or, transposed, columns)
// contiguous and 16-byte aligned, no two rows (columns) or slices overlapping (an operand shared
// through a zero batch stride is not: the mma path's batch takes it), within TMA's limits.
// `lines` x `along` is the slice as stored: a [m, k] (a column-major a: k lines of m), b [k, n].
template <typename T>
bool slices_readable(View<T> v, int64_t slice, int64_t lines, int64_t along, bool transposed) {
  const auto bytes = static_cast<int64_t>(sizeof(T));
  const int64_t extent = transposed ? along * v.col : lines * v.row;
  const bool lines_apart = transposed ? v.col >= lines : v.row >= along;  // no two overlap
  return (transposed ? !rows16(v) && cols16(v) : rows16(v)) && lines_apart && slice >= extent &&
         slice * bytes % 16 == 0 && slice * bytes < kMaxStrideBytes;
}
// a's slices column-major (m-major), b's column-major (k-major): read so by the Hopper kernel.
template <typename T>
bool transposed(View<T> v) {
  return !rows16(v) && cols16(v);
}
template <typename T>
bool a_readable(View<T> a, int64_t slice_a, int64_t m, int64_t k) {
  return slices_readable(a, slice_a, m, k, transposed(a));
}
template <typename T>
bool b_readable(View<T> b, int64_t slice_b, int64_t k, int64_t n) {
  return slices_readable(b, slice_b, k, n, transposed(b));
}

// WB_WGMMA_BATCH_TRANSPOSED: *copy = true for `copy` (column-major slices copied to row-major
// first, as before the Hopper kernel read them in place; for A/B on a GPU), false unset or `read`.
Status transposed_choice(bool* copy) {
  const std::string_view v = wb::detail::env("WB_WGMMA_BATCH_TRANSPOSED");
  *copy = v == "copy";
  if (v.empty() || v == "copy" || v == "read") return nullptr;
  return "matmul: WB_WGMMA_BATCH_TRANSPOSED must be read or copy; unset it for the default";
}

// The cluster sum's cost, in k steps of its tile, in the wave rule's cost (a guess: its partials
// through shared memory, the cluster's barrier, the slices' sums read from the other blocks).
constexpr int64_t kSumSteps = 2;
// Slices of k (the 128 x 128 and 128 x 256 tiles' kernels have them): S where the batch's tiles
// leave SMs idle, the most from 2 to 8 whose blocks fit a wave and whose clusters all fit the
// device at once, each of at least kSliceSteps k steps; for slices of fewer than kReadBoundRows
// "rows" (m n / (m + n): the MMAs' flops a byte of a and b read, halved), which read more than they
// compute, only to half the SMs: more blocks drew no more bandwidth there. H200, 2026-11-28, us,
// k whole / S (cuBLAS), bfloat16: 16 x 128^2 x 8192 52.2 / 25.5 at 4 (23.2; 33.8 at 2, 27.3 at 6);
// 8 x 256^2 x 8192 52.3 / 34.7 at 2 (25.8; 36.6 at 3); 4 x 512^2 x 4096 30.2 / 25.5 at 2 (17.7);
// 2 x 1024 x 512 x 8192 52.1 / 38.5 at 2 (28.2); 4 x 512^2 x 1024 13.1 / 14.6 at 2 (9.6: slices
// of 8 steps lost); the rest: bench/results/shapes.md.
constexpr int64_t kSliceSteps = 16, kReadBoundRows = 160;
constexpr bool sliceable(int id) { return id == kWide || id == kSquare; }

// Whether a batch of these sizes goes to the Hopper kernel, given operands it can read: an
// sm_90a image of the plain build, sizes within its grid and TMA's limits, and the rule below or
// WB_MATMUL_BATCH.
Status hopper_route(int64_t batch, int64_t m, int64_t n, int64_t k, bool* hopper) {
  *hopper = false;
  int forced = 0;
  if (const Status e = batch_choice(&forced)) return e;
  WgmmaShape built{};
  if (forced == 1 || !wgmma_available() || global<&kShape>.read(&built) != nullptr || built.tuned ||
      m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || batch > INT32_MAX) {
    return nullptr;
  }
  // The rule: slices of at least 64 rows and columns, past 64 in both or of k >= 512 (a 128-wide
  // tile of which half lies past a 64-wide slice still wins where k is long), whose 128 x 128 tiles
  // fill at least half the SMs (fewer leave most SMs idle, where the mma path's 64 x 64 tiles fill
  // four times as many), or, with k of 8 steps or more, whose tiles times the slices of k that k
  // allows (plan_batch) fill a quarter of them. H100, 2026-11-28, us, the rule's choice against the
  // other (cuBLAS): 96 x 512x64x512 26.3 / 30.6 (25.7), 256 x 64^3 8.5 / 9.8 (7.7), 64 x 128^3 8.7
  // / 9.3 (8.3), 32 x 16x1024x1024 29.1 / 30.5 (28.0), 8 x 512^3 10.5 / 16.4 (10.2); H200, the
  // same day, the Hopper kernel / the mma path's batch (cuBLAS): 4 x 512^2 x 1024 (k whole) 12.4 /
  // 15.6 (9.6), 8 x 256^2 x 2048 (float16, 2 slices) 16.3 / 22.0 (10.5); bench/results/shapes.md.
  const int64_t units = batch * square_tiles(m, n, 128);
  const int64_t steps = (k + built.bk - 1) / built.bk;
  const int64_t slices = min_of<int64_t>(steps / kSliceSteps, kMaxClusterSlices);
  const bool rule =
      min_of(m, n) >= 64 && (min_of(m, n) > 64 || k >= 512) &&
      (2 * units >= sm_count() ||
       (steps >= 2 * kMinSteps && 4 * units * (slices > 1 ? slices : 1) >= sm_count()));
  *hopper = units <= INT32_MAX && (forced == 2 || rule);
  return nullptr;
}

// The batch's kernel of tile `id`, a read column-major (m-major) or row-major, b column-major
// (k-major) or row-major.
template <typename T, bool AMMajor, bool BKMajor, bool Sliced>
const DeviceKernel& batch_kernel_of(int id) {
  using A = Val<AMMajor>;
  using B = Val<BKMajor>;
  using S = Val<Sliced>;
  if (id == kWide) return kernel<&kBatch, T, Val<128>, Val<256>, B, A, S>;
  if (id == kSquare192) return kernel<&kBatch, T, Val<192>, Val<128>, B, A, Val<false>>;
  return kernel<&kBatch, T, Val<128>, Val<128>, B, A, S>;
}
template <typename T, bool Sliced>
const DeviceKernel& batch_kernel_sliced(int id, bool a_mmajor, bool b_kmajor) {
  if (a_mmajor) {
    return b_kmajor ? batch_kernel_of<T, true, true, Sliced>(id)
                    : batch_kernel_of<T, true, false, Sliced>(id);
  }
  return b_kmajor ? batch_kernel_of<T, false, true, Sliced>(id)
                  : batch_kernel_of<T, false, false, Sliced>(id);
}
template <typename T>
const DeviceKernel& batch_kernel(int id, bool a_mmajor, bool b_kmajor, bool sliced) {
  return sliced ? batch_kernel_sliced<T, true>(id, a_mmajor, b_kmajor)
                : batch_kernel_sliced<T, false>(id, a_mmajor, b_kmajor);
}

// The launch's dynamic shared memory: the tile's with the staged epilogue and its 16-byte stores
// (the kernel reads that off the 16 bytes past the tile's), or in slices, the ring alone (the
// cluster sum stores c through it).
unsigned batch_smem(const WgmmaShape& tile, int splits) {
  if (splits > 1) return static_cast<unsigned>(tile.smem - tile.stage_smem);
  return static_cast<unsigned>(tile.smem + (tile.stage_smem != 0 ? 16 : 0));
}

// Whether `splits` slices of tile `id` run on this device: the kernel has them, k has that many
// steps, and at least `clusters` of them fit the device at once.
bool slices_run(const WgmmaShape& tile, int id, int splits, int64_t units, int64_t steps,
                int64_t clusters) {
  if (splits == 1) return true;
  const int smem = static_cast<int>(batch_smem(tile, splits)) + 1024;  // + static mbarriers
  return sliceable(id) && units * splits <= INT32_MAX && splits <= steps &&
         resident_clusters(splits, tile.threads, smem) >= clusters;
}

// The batch's tile (*id) and slices of k (*splits): the forced ones (WB_WGMMA_BATCH_TILE,
// WB_WGMMA_BATCH_SPLITS), else, of each tile with its slices (the rule above), the least cost of
// waves times a tile's work (the header's rule; a tie to the earlier tile).
Status plan_batch(const WgmmaShape (&tiles)[kTiles], int64_t batch, int64_t m, int64_t n, int64_t k,
                  int* id, int* splits) {
  int tile_forced = kTiles, splits_forced = 0;
  if (const Status e = tile_choice(&tile_forced)) return e;
  if (const Status e = splits_choice(&splits_forced)) return e;
  const int64_t sms = sm_count(), steps = (k + tiles[kWide].bk - 1) / tiles[kWide].bk;
  const int64_t cap = m * n < kReadBoundRows * (m + n) ? sms / 2 : sms;
  int64_t best = -1;
  for (int t = 0; t < kTiles; ++t) {
    const WgmmaShape& tile = tiles[t];
    const int64_t units = units_of(batch, m, n, tile);
    int s = splits_forced;
    if (s == 0) {  // the most slices the rule allows, else 1
      s = 1;
      for (int more = 2; more <= kMaxClusterSlices; ++more) {
        if (units * more <= cap && steps >= kSliceSteps * more &&
            slices_run(tile, t, more, units, steps, units)) {
          s = more;
        }
      }
    }
    if ((tile_forced != kTiles && t != tile_forced) || !slices_run(tile, t, s, units, steps, 1)) {
      continue;
    }
    const int64_t work = (steps + s - 1) / s + (s > 1 ? kSumSteps : 0);
    const int64_t cost = (units * s + sms - 1) / sms * work * tile.bm * tile.bn;
    if (best < 0 || cost < best) *id = t, *splits = s, best = cost;
  }
  if (best >= 0) return nullptr;
  return "matmul: WB_WGMMA_BATCH_SPLITS: the batch's tile has no kernel in that many slices of k "
         "(128x256 and 128x128 have), k has fewer 64-wide steps, or such clusters do not fit this "
         "device; unset it";
}

template <typename T>
Status run_hopper(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c, int64_t batch,
                  int64_t m, int64_t n, int64_t k, Stream stream) {
  WgmmaShape tiles[kTiles]{};
  if (const Status e = global<&kWideShape>.read(&tiles[kWide])) return e;
  if (const Status e = global<&kSquare192Shape>.read(&tiles[kSquare192])) return e;
  if (const Status e = global<&kSquareShape>.read(&tiles[kSquare])) return e;
  int id = kWide, splits = 1;
  if (const Status e = plan_batch(tiles, batch, m, n, k, &id, &splits)) return e;
  const WgmmaShape& tile = tiles[id];
  const bool a_mmajor = transposed(a), b_kmajor = transposed(b);
  const DeviceKernel& run = batch_kernel<T>(id, a_mmajor, b_kmajor, splits > 1);
  int regs = 0;
  if (const Status e = run.attribute(KernelAttr::num_regs, &regs)) return e;
  if (regs < tile.entry_regs) {
    return "matmul: the batched wgmma kernel starts with fewer registers than it splits";
  }
  CUtensorMap map_a, map_b;
  if (!(a_mmajor ? make_batch_map(&map_a, a.data, m, k, a.col, batch, slice_a, 64, tile.bk)
                 : make_batch_map(&map_a, a.data, k, m, a.row, batch, slice_a, tile.bk, tile.bm)) ||
      !(b_kmajor ? make_batch_map(&map_b, b.data, k, n, b.col, batch, slice_b, tile.bk, tile.bn)
                 : make_batch_map(&map_b, b.data, n, k, b.row, batch, slice_b, 64, tile.bk))) {
    return "matmul: could not encode a TMA tensor map (cuTensorMapEncodeTiled)";
  }
  // k whole: persistent, a block an SM. In slices: a cluster of `splits` blocks a tile.
  const int64_t units = units_of(batch, m, n, tile);
  LaunchConfig config{
      static_cast<unsigned>(splits > 1 ? units * splits : min_of<int64_t>(units, sm_count())),
      static_cast<unsigned>(tile.threads), batch_smem(tile, splits)};
  if (splits > 1) config.cluster = Dim3{static_cast<unsigned>(splits), 1, 1};
  return run.launch(config, stream, map_a, map_b, c, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), static_cast<int>(batch));
}

}  // namespace

bool tensor_core_batch_slices_k(int64_t batch, int64_t m, int64_t n, int64_t k) {
  bool hopper = false;
  const int64_t units = batch * square_tiles(m, n, 128);
  return hopper_route(batch, m, n, k, &hopper) == nullptr && hopper &&
         2 * units * kMaxClusterSlices >= sm_count();
}

template <typename T>
bool tensor_core_batch_in_place(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b,
                                int64_t batch, int64_t m, int64_t n, int64_t k) {
  bool copy = false, hopper = false;
  if (transposed_choice(&copy) != nullptr || hopper_route(batch, m, n, k, &hopper) != nullptr) {
    return false;  // matmul_tensor_core_batched names the bad switch
  }
  return hopper && a_readable(a, slice_a, m, k) && b_readable(b, slice_b, k, n) &&
         !(copy && (transposed(a) || transposed(b)));
}
WB_INSTANTIATE(WB_REDUCED, tensor_core_batch_in_place)

template <typename T>
Status matmul_tensor_core_batched(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c,
                                  int64_t batch, int64_t m, int64_t n, int64_t k, Stream stream) {
  bool copy = false, hopper = false;
  if (const Status e = transposed_choice(&copy)) return e;
  if (const Status e = hopper_route(batch, m, n, k, &hopper)) return e;
  if (hopper && a_readable(a, slice_a, m, k) && b_readable(b, slice_b, k, n)) {
    return run_hopper(a, slice_a, b, slice_b, c, batch, m, n, k, stream);
  }
  if (!rows16(a) || !rows16(b)) {
    return "matmul: the mma path's batch reads row-major slices (16-byte aligned rows); copy a "
           "and b so";
  }
  return matmul_mma_batched(a, slice_a, b, slice_b, c, batch, m, n, k, stream);
}
WB_INSTANTIATE(WB_REDUCED, matmul_tensor_core_batched)

}  // namespace wb::matmul
