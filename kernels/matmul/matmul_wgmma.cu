// matmul_wgmma.cu: the host launcher of the Hopper matmul (the kernel is matmul_wgmma.kernel.cu).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k] row-major (k-major), or column-major (m-major: a = x.t(), the weight gradient's
//   x^T @ dy) where the route is the whole-k kernel (wgmma_whole_k); b: [k, n] row-major
//   (n-major) or column-major (k-major); rows (columns) 16-byte aligned, any m, n, k below 2^31;
//   c: [m, n] contiguous. float16 / bfloat16.
//
// Makes the TMA tensor maps (a's boxes of 64 k x BM rows when k-major, else 64 m x 64 k; b's of
// 64 k x BN columns when k-major, else 64 n x 64 k; c's of 64 x 64) and launches one persistent
// block per SM (BLOCKS per SM when the tile is built for more). The tile's sizes come from the
// module (wgmma_shape, which the kernel's TU defines for the tile it was built with): this file
// does not change with the tile, so a variant of the family's tuning space or an edit of the kernel
// compiles the device-only TU alone.
//
// Split-k (plan_split): where c has fewer tiles than the device has SMs (a short a, as in
// 16 x 4096 x 4096), the plain build runs a 64 x 256 tile with k cut into S slices so that
// tiles * S fill the SMs once. By default one launch (wgmma_cluster_split_kernel): clusters of S
// blocks (S <= 8), the slices of one tile, sum their float32 partials through distributed shared
// memory and store c; no workspace; on a 128 x 256 tile where a has more than 64 rows. Where no
// such cluster fits the device as often as there are tiles (resident_clusters), or
// WB_WGMMA_SPLIT_SUM=launch: wgmma_split_kernel writes each slice's float32 sums into a workspace
// [S, m, n] the caller allocates (matmul_cuda_workspace), then sum_slices_kernel adds the slices in
// order and rounds once into c. Both add the slices in slice order: the same bits every call, and
// the same as each other for the same S; no state kept between calls, so a CUDA graph replays them.
//
// A/B switches, read from the environment at each call (for timing on a GPU; a bad value is an
// error naming it): WB_WGMMA_STORE=tensor | vector | bulk | direct, the epilogue (launch_smem);
// WB_WGMMA_CLUSTER=2 | 1, the whole-k kernel in clusters of two blocks sharing b or not
// (paired_choice; unset, not on the built tile, and so on the mid-size tile);
// WB_WGMMA_SPLITS=S, the split-k route's number of slices (plan_split); WB_WGMMA_SPLIT_SUM=cluster
// | launch, how the split-k route sums its slices (sum_choice); WB_WGMMA_SPLIT_TILE=64 | 128, the
// cluster sum's tile rows (wide_choice); WB_WGMMA_FEW=split | narrow | narrow1, the route of a
// few-rows shape (few_rows_route, wgmma_narrow.h: split-k, or k whole on narrow tiles in
// clusters of two sharing an operand's tile, or without clusters; matmul_wgmma_narrow.cu);
// WB_WGMMA_FEW=mid, a few shape on the whole-k kernel's 64 x 128 mid-size tile (wgmma_mid_kernel,
// by default in clusters of two sharing b; run_whole_k); WB_WGMMA_MID=on | pairs | tile | off, the
// mid-size rule for the square-ish shapes below a wave of built tiles (on, the default: a tiny
// shape to the narrow route; pairs: also the 128-row narrow tile of an a past the few-rows sizes
// paired along n; tile: those on the mid-size tile instead; off: the few-rows rule alone;
// plan_route, few_rows_route); WB_WGMMA_FEW=square | square192 | square256, a few shape on the
// 128, 192 or 256 x 128 tile (wgmma_square_kernel, unpaired unless WB_WGMMA_CLUSTER=2);
// WB_WGMMA_SQUARE=on | off, the square rule that runs them where their tiles make about one wave,
// and the wave rule that runs 192 or 256 x 128 past a wave of built tiles where its waves take
// less time (square_route), or a tile's name, that tile on every shape.
//   Check and time:  wb check matmul --device cuda;  wb bench matmul_path (path 3)
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <string_view>

#include "matmul/cluster_occupancy.h"
#include "matmul/matmul.h"
#include "matmul/sum_slices.cuh"
#include "matmul/wgmma_narrow.h"
#include "matmul/wgmma_shape.h"
#include "matmul/wgmma_shapes_host.h"
#include "matmul/wgmma_tma.h"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/dtypes.h"
#include "wb/module.h"

namespace wb::matmul {

WB_DEVICE_TEMPLATE(kWgmma, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_kernel");
WB_DEVICE_TEMPLATE(kSplit, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_split_kernel");
WB_DEVICE_TEMPLATE(kClusterSplit, "matmul_wgmma.kernel.cu",
                   "wb::matmul::wgmma_cluster_split_kernel");
WB_DEVICE_TEMPLATE(kMid, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_mid_kernel");
WB_DEVICE_TEMPLATE(kSquare, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_square_kernel");

namespace {

// The epilogue both kernels run, which the kernel reads off the launch's dynamic shared memory
// (launch_smem): =vector through shared memory and 16-byte coalesced stores (tile.smem + 16),
// =bulk through shared memory and asynchronous bulk copies (tile.smem), =tensor the same with
// one bulk tensor copy a chunk (tile.smem + 32; the whole-k kernels, with c's tensor map; others
// take it as vector), =direct from registers straight to c (the ring alone: no buffer).
// `fallback` is the launch's default, measured on an H100 against cuBLAS, bfloat16: for the
// whole-k kernels tensor (2026-11-27: 8192x8192x1024 0.945x where vector gave 0.897x, 4096^3
// 0.988x against 0.973x, the same bits), vector before it (2026-11-26: 0.93-1.00x at 4096^3 to
// 8192^3, bulk 0.76-0.98x, direct 0.70-0.94x); direct for the split-k slices (0.76-0.93x, bulk
// 0.58-0.77x). WB_WGMMA_STORE in the environment (read at each call) overrides it, for A/B. A tile
// without the buffer (stage_smem 0) stores from registers.
Status launch_smem(const WgmmaShape& tile, std::string_view fallback, unsigned* smem) {
  const std::string_view v = wb::detail::env("WB_WGMMA_STORE");
  const std::string_view store = !v.empty() ? v : fallback;
  *smem = static_cast<unsigned>(tile.smem);
  if (store == "bulk") return nullptr;
  if (store == "direct") {
    *smem = static_cast<unsigned>(tile.smem - tile.stage_smem);
  } else if (store == "vector" || store == "tensor") {
    if (tile.stage_smem != 0)
      *smem = static_cast<unsigned>(tile.smem + (store == "tensor" ? 32 : 16));
  } else {
    return "matmul: WB_WGMMA_STORE must be vector, tensor, bulk or direct; unset it for the "
           "default";
  }
  return nullptr;
}

// The whole-k kernel for each layout of b and of a (a m-major: wgmma_kernel's AMMajor).
template <typename T>
const DeviceKernel& wgmma_kernel(bool b_kmajor, bool a_mmajor) {
  if (a_mmajor) {
    return b_kmajor ? kernel<&kWgmma, T, Val<true>, Val<true>>
                    : kernel<&kWgmma, T, Val<false>, Val<true>>;
  }
  return b_kmajor ? kernel<&kWgmma, T, Val<true>, Val<false>>
                  : kernel<&kWgmma, T, Val<false>, Val<false>>;
}
// The whole-k kernel of a fixed tile for each layout of b (and of a, a square tile's): the
// mid-size tile's (64 x 128) or a square tile's (128, 192 or 256 x 128; C consumer warpgroups).
template <typename T, int C>
const DeviceKernel& square_kernel(bool b_kmajor, bool a_mmajor) {
  if (a_mmajor) {
    return b_kmajor ? kernel<&kSquare, T, Val<true>, Val<C>, Val<true>>
                    : kernel<&kSquare, T, Val<false>, Val<C>, Val<true>>;
  }
  return b_kmajor ? kernel<&kSquare, T, Val<true>, Val<C>, Val<false>>
                  : kernel<&kSquare, T, Val<false>, Val<C>, Val<false>>;
}
template <typename T>
const DeviceKernel& fixed_tile_kernel(bool b_kmajor, bool a_mmajor, FewRoute route) {
  if (route == FewRoute::square) return square_kernel<T, 2>(b_kmajor, a_mmajor);
  if (route == FewRoute::square192) return square_kernel<T, 3>(b_kmajor, a_mmajor);
  if (route == FewRoute::square256) return square_kernel<T, 4>(b_kmajor, a_mmajor);
  return b_kmajor ? kernel<&kMid, T, Val<true>> : kernel<&kMid, T, Val<false>>;
}

template <typename T>
const DeviceKernel& split_kernel(bool b_kmajor) {
  return b_kmajor ? kernel<&kSplit, T, Val<true>> : kernel<&kSplit, T, Val<false>>;
}
template <typename T>
const DeviceKernel& cluster_split_kernel(bool b_kmajor, bool wide) {
  if (wide) {
    return b_kmajor ? kernel<&kClusterSplit, T, Val<true>, Val<true>>
                    : kernel<&kClusterSplit, T, Val<false>, Val<true>>;
  }
  return b_kmajor ? kernel<&kClusterSplit, T, Val<true>, Val<false>>
                  : kernel<&kClusterSplit, T, Val<false>, Val<false>>;
}

int64_t tiles_of(int64_t m, int64_t n, const WgmmaShape& tile) {
  return ((m + tile.bm - 1) / tile.bm) * ((n + tile.bn - 1) / tile.bn);
}

// The default route's split of k for an m x n x k call: 0 runs the built tile with k whole;
// S >= 2 runs S slices of k, summed in clusters of S (cluster) or by sum_slices_kernel.
//
// The built tile (128 x 256) leaves most SMs idle when c has fewer tiles than there are SMs
// (16 x 4096 x 4096: 16 tiles for 132 SMs), and such a shape waits on reading b, which only many
// blocks reading at once makes fast. So there the split tile (64 x 256; for the cluster sum, the
// wide 128 x 256 one where a has more than 64 rows) runs with S = SMs / its tiles: one wave of at
// most one block an SM, each slice at least kMinSteps k steps (64 k each) so that the pipeline
// fills; the cluster sum takes at most 8 and only as many as let all tiles' clusters be resident
// at once (else the two-launch sum runs). A split of 1 would add the sum for nothing: the built
// tile runs instead. A tuned module runs its tile for every shape (the tune chose it, for its own
// sizes); so does a c with enough tiles for the SMs.
struct Split {
  int splits = 0;
  WgmmaShape tile{};     // the split tile (or the wide one, for the cluster sum), splits >= 2
  bool cluster = false;  // the slices summed in clusters of `splits` (one launch, no workspace)
  bool wide = false;     // the cluster sum on the 128-row tile (wgmma_wide_split_shape)
  bool few = false;      // a few-rows shape (fewer built tiles than SMs): few_rows_route decides
  int64_t tiles = 0;     // of c in the built tile
  bool tuned = false;    // the module is a tuned variant: its tile runs every shape
};
// Stands in for wgmma_cluster_split_kernel in the occupancy query below: the same threads and
// dynamic shared memory, which hold both to one block an SM (the kernel's registers do as well).
__global__ void __launch_bounds__(1024) cluster_probe_kernel() {}

// WB_WGMMA_SPLIT_SUM in the environment (read at each call; for A/B on a GPU): =cluster (the
// default) sums the slices in clusters, one launch; =launch writes them to the workspace and
// sums them in a second launch (sum_slices_kernel).
Status sum_choice(bool* cluster) {
  const std::string_view sum = wb::detail::env("WB_WGMMA_SPLIT_SUM");
  *cluster = sum.empty() || sum == "cluster";
  if (*cluster || sum == "launch") return nullptr;
  return "matmul: WB_WGMMA_SPLIT_SUM must be cluster (the default) or launch; unset it";
}

// The cluster sum's slices for `tiles` tiles: the most, from `splits` down to 2, whose clusters
// the device holds all at once (one wave); 0 for none. forced (WB_WGMMA_SPLITS): `splits` itself
// wherever such a cluster launches at all.
int cluster_slices(int64_t splits, int64_t tiles, const WgmmaShape& tile, bool forced) {
  const int smem = tile.smem - tile.stage_smem + 1024;  // + the kernel's static mbarriers, rounded
  if (forced) {
    return splits <= kMaxClusterSlices &&
                   resident_clusters(static_cast<int>(splits), tile.threads, smem) > 0
               ? static_cast<int>(splits)
               : 0;
  }
  for (int s = static_cast<int>(min_of<int64_t>(splits, kMaxClusterSlices)); s >= 2; --s) {
    if (resident_clusters(s, tile.threads, smem) >= tiles) return s;
  }
  return 0;
}

// WB_WGMMA_SPLIT_TILE in the environment (read at each call; for A/B on a GPU): the rows of the
// cluster sum's tile, =64 (the split tile) or =128 (the wide one); unset, 128 where a has more
// than 64 rows (its stages of b serve 128 rows: half the bytes from L2), else 64.
Status wide_choice(int64_t m, bool* wide) {
  const std::string_view rows = wb::detail::env("WB_WGMMA_SPLIT_TILE");
  *wide = rows.empty() ? m > 64 : rows == "128";
  if (rows.empty() || rows == "64" || rows == "128") return nullptr;
  return "matmul: WB_WGMMA_SPLIT_TILE must be 64 or 128 (the cluster sum's tile rows); unset it";
}

// WB_WGMMA_SPLITS=S in the environment (read at each call; for timing this choice on a GPU):
// S slices (at most one a k step) wherever the route splits; the cluster sum takes S up to 8.
// *forced: 0 where unset.
Status forced_splits(int64_t* forced) {
  *forced = 0;
  const char* v = wb::detail::env("WB_WGMMA_SPLITS").data();
  if (*v == '\0') return nullptr;
  char* end = nullptr;
  const long want = std::strtol(v, &end, 10);
  if (*end != '\0' || want < 2 || want > 4096) {
    return "matmul: WB_WGMMA_SPLITS must be a whole number from 2 to 4096; unset it";
  }
  *forced = want;
  return nullptr;
}

// The slices of k for tile: SMs / its tiles, each at least kMinSteps k steps, or the forced count
// (at most one a k step).
int64_t splits_of(int64_t m, int64_t n, int64_t k, const WgmmaShape& tile, int64_t forced) {
  const int64_t steps = (k + tile.bk - 1) / tile.bk;
  if (forced > 0) return min_of(forced, steps);
  return min_of(sm_count() / tiles_of(m, n, tile), steps / kMinSteps);
}

Status plan_split(int64_t m, int64_t n, int64_t k, Split* plan) {
  *plan = Split{};
  WgmmaShape built{};
  if (const Status e = global<&kShape>.read(&built)) return e;
  const int64_t tiles = tiles_of(m, n, built);
  plan->tuned = built.tuned != 0;
  plan->tiles = tiles;
  if (built.tuned || tiles >= sm_count()) return nullptr;
  plan->few = true;
  int64_t forced = 0;
  bool cluster = false, wide = false;
  if (const Status e = forced_splits(&forced)) return e;
  if (const Status e = sum_choice(&cluster)) return e;
  if (const Status e = wide_choice(m, &wide)) return e;
  WgmmaShape tile{};
  if (const Status e = global<&kSplitShape>.read(&tile)) return e;
  if (cluster) {
    WgmmaShape own = tile;
    if (wide) {
      if (const Status e = global<&kWideShape>.read(&own)) return e;
    }
    // Half the SMs' worth of blocks (S = SMs / 2 tiles, from 8 down to what fits): on an H100,
    // 2026-11-26, four slices of 16 tiles (64 blocks) beat six (96) at m = 1 to 128 x 4096 x
    // 4096 (0.79-0.98x cuBLAS against 0.68-0.92x), and eight of 4 tiles (32 blocks) four at
    // 16 x 1024 x 4096 (0.95x against 0.73x).
    const int64_t steps = (k + own.bk - 1) / own.bk;
    const int64_t splits = forced > 0
                               ? min_of(forced, steps)
                               : min_of(sm_count() / (2 * tiles_of(m, n, own)), steps / kMinSteps);
    const int slices =
        splits >= 2 ? cluster_slices(splits, tiles_of(m, n, own), own, forced > 0) : 0;
    if (slices >= 2) {
      *plan = Split{slices, own, true, wide, true, tiles};
      return nullptr;
    }
  }
  // The two-launch sum, on the split tile.
  const int64_t splits = splits_of(m, n, k, tile, forced);
  if (splits >= 2) *plan = Split{static_cast<int>(splits), tile, false, false, true, tiles};
  return nullptr;
}

// The route of an m x n x k call: plan_split's plan and, for a few-rows shape, few_rows_route's
// choice (FewRoute::split otherwise). The whole-k kernel runs where neither splits k nor takes
// the narrow route (whole_k).
//
// A few shape that the plan leaves on the built tile with k whole (k too short to split) and whose
// tiles fill at most 1 / kTinyShare of the SMs is `tiny` (128^3: one 128 x 256 tile for 132 SMs,
// 4.8 us of kernel where cuBLAS's 64 x 8 tiles take 2.3, H100): under the mid-size rule
// (WB_WGMMA_MID, few_rows_route) it takes the narrow route's 64-row tiles, a block a tile. Not for
// a column-major a (a_mmajor), which the whole-k kernel reads in place: the narrow route would
// need a copy of it first, a launch more than such a shape gains.
//
// Two slices of k on the wide 128 x 256 tile, summed in clusters of two (long_k_split), for k of
// at least kLongK, unless a switch of the route is set: where the mid-size rule's 64 x 128 tile
// passes one wave and the slices' blocks fill at most 4/5 of the SMs; and where a plan of more
// than kMidRows rows, a row-major, leaves k whole on its built tiles and the slices fit one wave.
// H100, 2026-11-27, us, before / two slices (cuBLAS), the slices' blocks: 2048 x 768 x 8192 71.2 /
// 51.9 (45.7), 96; 1152^2 x 4096 37.1 / 31.0 (21.4), 90; 1024 x 2048 x 8192 (whole k) 82.9 / 60.6
// (47.2), 128. Against the tile they lost where they filled the SMs (1408^2 x 4096 37.6 / 42.6,
// 132 blocks): the 4/5. The rest: bench/results/shapes.md. The square rules (square_route) run
// after it and take most of these shapes since, faster (1152^2 x 4096 26.0, 1024 x 2048 x 8192
// 53.0): the slices stay where the square tiles do not reach, or WB_WGMMA_SQUARE=off.
constexpr int64_t kTinyShare = 4, kLongK = 2048;
struct Route {
  Split plan;
  FewRoute few = FewRoute::split;
  bool whole_k() const { return few == FewRoute::split && plan.splits < 2; }
  // Whether the route's kernel reads a column-major a in place: the whole-k one or a square tile's.
  bool reads_mmajor() const { return whole_k() || square_tile(few); }
};
Status long_k_split(int64_t m, int64_t n, int64_t k, bool a_mmajor, Route* route) {
  using wb::detail::env;
  const bool past_mid = route->few == FewRoute::mid && mid_tiles(m, n) > sm_count();
  const bool starved = route->whole_k() && !a_mmajor && m > kMidRows;
  if (k < kLongK || (!past_mid && !starved)) return nullptr;
  for (const char* name :
       {"WB_WGMMA_FEW", "WB_WGMMA_SPLITS", "WB_WGMMA_SPLIT_SUM", "WB_WGMMA_SPLIT_TILE"}) {
    if (!env(name).empty()) return nullptr;  // an A/B run asked for its own route
  }
  WgmmaShape wide{};
  if (const Status e = global<&kWideShape>.read(&wide)) return e;
  const int64_t tiles = tiles_of(m, n, wide);
  const int64_t most = past_mid ? 4 * sm_count() / 5 : sm_count();  // the slices' blocks
  if ((k + wide.bk - 1) / wide.bk < 2 * kMinSteps || 2 * tiles > most ||
      cluster_slices(2, tiles, wide, false) != 2) {
    return nullptr;
  }
  route->plan = Split{2, wide, true, true, true, route->plan.tiles};
  route->few = FewRoute::split;
  return nullptr;
}
Status plan_route(int64_t m, int64_t n, int64_t k, bool a_mmajor, Route* route) {
  *route = Route{};
  if (const Status e = plan_split(m, n, k, &route->plan)) return e;
  if (route->plan.tuned) return nullptr;
  if (!route->plan.few) return square_route(m, n, route->plan.tiles, &route->few);
  const Split& plan = route->plan;
  const bool tiny = !a_mmajor && plan.splits < 2 && kTinyShare * plan.tiles <= sm_count();
  if (const Status e = few_rows_route(m, n, tiny, a_mmajor, &route->few)) return e;
  if (const Status e = long_k_split(m, n, k, a_mmajor, route)) return e;
  return square_route(m, n, plan.tiles, &route->few);
}

// Whether a is column-major (read m-major), as b_kmajor says of b.
template <typename T>
bool mmajor(View<T> a) {
  return a.row == 1 && a.col != 1;
}

// The maps of a and b in boxes of this tile (a's of 64 k x BM rows when k-major, else 64 m x 64 k;
// b's of 64 k x BN columns when k-major, BN / 2 for a cluster of two blocks that each copy half,
// else 64 n x 64 k).
template <typename T>
bool make_maps(CUtensorMap* map_a, CUtensorMap* map_b, View<T> a, View<T> b, int64_t m, int64_t n,
               int64_t k, bool b_kmajor, const WgmmaShape& tile, bool paired = false) {
  return (mmajor(a) ? make_map(map_a, a.data, m, k, a.col, 64, tile.bk)
                    : make_map(map_a, a.data, k, m, a.row, tile.bk, tile.bm)) &&
         (b_kmajor ? make_map(map_b, b.data, k, n, b.col, tile.bk, paired ? tile.bn / 2 : tile.bn)
                   : make_map(map_b, b.data, n, k, b.row, 64, tile.bk));
}

// WB_WGMMA_CLUSTER=2 in the environment (read at each call; for A/B on a GPU): the whole-k kernel
// runs in clusters of two blocks that compute two tiles one above the other and copy b's tile
// once for both (TMA multicast; see the kernel); =1 without. Unset: `fallback` (off for the built
// tile, on for the mid-size tile).
Status paired_choice(bool fallback, bool* paired) {
  const std::string_view cluster = wb::detail::env("WB_WGMMA_CLUSTER");
  *paired = cluster.empty() ? fallback : cluster == "2";
  if (cluster.empty() || cluster == "1" || cluster == "2") return nullptr;
  return "matmul: WB_WGMMA_CLUSTER must be 1 or 2; unset it for the default";
}

// The whole-k kernel's switches, read at every call whichever route runs, so that a bad value is
// refused by name on a shape that the mid-size rule moved off that kernel too.
Status check_switches() {
  WgmmaShape none{};
  unsigned smem = 0;
  bool paired = false;
  if (const Status e = launch_smem(none, "vector", &smem)) return e;
  return paired_choice(false, &paired);
}

// With fewer registers at entry than the split assumes, the pool would be short of what the
// consumers' setmaxnreg.inc asks for, and they would wait for ever: an error instead of a hang.
Status check_regs(const DeviceKernel& kernel, const WgmmaShape& tile) {
  int regs = 0;
  if (const Status e = kernel.attribute(KernelAttr::num_regs, &regs)) return e;
  if (regs < tile.entry_regs) {
    return "matmul: the wgmma kernel starts with fewer registers than it splits";
  }
  return nullptr;
}

// S slices of k on the split tile in clusters of S blocks, a cluster a tile, summed in the cluster
// into c (wgmma_cluster_split_kernel).
template <typename T>
Status run_cluster_split(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, bool b_kmajor,
                         const Split& plan, Stream stream) {
  const DeviceKernel& kernel = cluster_split_kernel<T>(b_kmajor, plan.wide);
  if (const Status e = check_regs(kernel, plan.tile)) return e;
  CUtensorMap map_a, map_b;
  if (!make_maps(&map_a, &map_b, a, b, m, n, k, b_kmajor, plan.tile)) {
    return "matmul: could not encode a TMA tensor map (cuTensorMapEncodeTiled)";
  }
  const int64_t units = tiles_of(m, n, plan.tile) * plan.splits;
  // The ring alone: the slices' sums go through its stages once they are consumed.
  LaunchConfig config{static_cast<unsigned>(units), static_cast<unsigned>(plan.tile.threads),
                      static_cast<unsigned>(plan.tile.smem - plan.tile.stage_smem)};
  config.cluster = Dim3{static_cast<unsigned>(plan.splits), 1, 1};
  return kernel.launch(config, stream, map_a, map_b, c, static_cast<int>(m), static_cast<int>(n),
                       static_cast<int>(k));
}

// S slices of k on the split tile into workspace [S, m, n], one block a unit (S * tiles <= SMs),
// then their sum into c.
template <typename T>
Status run_split(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                 bool b_kmajor, const Split& plan, Stream stream) {
  if (workspace == nullptr) return "matmul: the split-k route was given no workspace";
  const DeviceKernel& kernel = split_kernel<T>(b_kmajor);
  if (const Status e = check_regs(kernel, plan.tile)) return e;
  CUtensorMap map_a, map_b;
  if (!make_maps(&map_a, &map_b, a, b, m, n, k, b_kmajor, plan.tile)) {
    return "matmul: could not encode a TMA tensor map (cuTensorMapEncodeTiled)";
  }
  const int64_t units = tiles_of(m, n, plan.tile) * plan.splits;
  unsigned smem = 0;
  if (const Status e = launch_smem(plan.tile, "direct", &smem)) return e;
  const LaunchConfig config{static_cast<unsigned>(units), static_cast<unsigned>(plan.tile.threads),
                            smem};
  if (const Status e = kernel.launch(config, stream, map_a, map_b, workspace, static_cast<int>(m),
                                     static_cast<int>(n), static_cast<int>(k), plan.splits)) {
    return e;
  }
  const int64_t size = m * n, threads = 256;
  cudaLaunchConfig_t sum{};
  sum.gridDim = dim3(static_cast<unsigned>(((size + 3) / 4 + threads - 1) / threads));
  sum.blockDim = dim3(static_cast<unsigned>(threads));
  sum.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  sum.attrs = &early;
  sum.numAttrs = 1;
  cudaLaunchKernelEx(&sum, sum_slices_kernel<T>, static_cast<const float*>(workspace), c, size,
                     plan.splits);
  return launch_status();
}

// c = a @ b on `kernel`, the whole-k kernel of `tile` (or the mid-size tile's), k whole;
// WB_WGMMA_CLUSTER, else `pair`, says whether in clusters of two sharing b.
template <typename T>
Status run_whole_k(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, bool b_kmajor,
                   const DeviceKernel& kernel, const WgmmaShape& tile, bool pair, Stream stream) {
  if (const Status e = check_regs(kernel, tile)) return e;
  const int64_t tiles = tiles_of(m, n, tile);
  if (tiles > INT32_MAX) return "matmul: too many tiles for the wgmma grid";
  bool paired = false;
  if (const Status e = paired_choice(pair, &paired)) return e;
  paired = paired && tile.bn >= 128 && tiles >= 2;
  unsigned smem = 0;
  if (const Status e = launch_smem(tile, "tensor", &smem)) return e;
  CUtensorMap map_a, map_b, map_c{};  // c's map where its rows allow (the kernel checks the same)
  if (!make_maps(&map_a, &map_b, a, b, m, n, k, b_kmajor, tile, paired) ||
      (n % 8 == 0 && reinterpret_cast<uintptr_t>(c) % 16 == 0 &&
       !make_map(&map_c, c, n, m, n, 64, 64))) {
    return "matmul: could not encode a TMA tensor map (cuTensorMapEncodeTiled)";
  }
  // Persistent: BLOCKS blocks an SM (one by default), each walking tiles (paired: clusters of two
  // walking pairs of tiles). With more than one an SM, all of the SM's shared memory goes to
  // shared memory (carveout 100%), so that they fit.
  const int64_t slots = sm_count() * int64_t{tile.blocks};
  const int64_t pairs = (m + 2 * tile.bm - 1) / (2 * tile.bm) * ((n + tile.bn - 1) / tile.bn);
  const int64_t blocks = paired ? 2 * min_of<int64_t>(pairs, slots / 2) : min_of(tiles, slots);
  LaunchConfig config{static_cast<unsigned>(blocks), static_cast<unsigned>(tile.threads), smem};
  if (paired) config.cluster = Dim3{2, 1, 1};
  if (tile.blocks > 1) config.carveout = 100;
  return kernel.launch(config, stream, map_a, map_b, map_c, c, static_cast<int>(m),
                       static_cast<int>(n), static_cast<int>(k));
}

}  // namespace

// Remembered per device, size and smem, so that a call repeated under CUDA graph capture queries
// nothing.
int resident_clusters(int size, int threads, int smem) {
  struct Entry {
    int threads = 0, smem = -1, clusters = 0;
  };
  constexpr int kKept = 4;  // launch shapes remembered per size (the split-k routes' tiles)
  static Entry seen[64][kMaxClusterSlices + 1][kKept];
  static int next[64][kMaxClusterSlices + 1];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64 || size < 1 ||
      size > kMaxClusterSlices) {
    return 0;
  }
  for (const Entry& e : seen[device][size]) {
    if (e.threads == threads && e.smem == smem) return e.clusters;
  }
  const int clusters = query_resident_clusters(cluster_probe_kernel, size, threads, smem);
  int& slot = next[device][size];
  seen[device][size][slot] = Entry{threads, smem, clusters};
  slot = (slot + 1) % kKept;
  return clusters;
}

// Asked once per device (a route reads it several times a call): remembered as resident_clusters
// remembers its counts, so that a call under CUDA graph capture queries nothing.
int sm_count() {
  const int sms = wb::detail::device_attribute<cudaDevAttrMultiProcessorCount>();
  return sms > 0 ? sms : 1;
}

// Whether this device runs the real kernel: the module's image for it was built for sm_90a (on
// another arch the kernel is a stub of launch bounds 1), asked once per device.
bool wgmma_available() {
  static signed char known[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  if (known[device] == 0) {
    WgmmaShape shape{};
    int threads = 0;
    const bool real =
        global<&kShape>.read(&shape) == nullptr &&
        wgmma_kernel<bf16>(false, false).attribute(KernelAttr::max_threads, &threads) == nullptr &&
        threads >= shape.threads;
    known[device] = real ? 1 : -1;
  }
  return known[device] == 1;
}

// The workspace of a row-major a's route: a column-major one runs the same route or, read in
// place, the whole-k kernel, which takes none.
int64_t wgmma_workspace(int64_t m, int64_t n, int64_t k) {
  Route route;
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || plan_route(m, n, k, false, &route)) {
    return 0;
  }
  const Split& plan = route.plan;
  const bool launch_sum = route.few == FewRoute::split && plan.splits >= 2 && !plan.cluster;
  return launch_sum ? plan.splits * m * n : 0;
}

bool wgmma_whole_k(int64_t m, int64_t n, int64_t k) {
  Route route;
  // A bad switch (plan_route's error) reads as no: the call then meets the error in matmul_wgmma.
  // Asked for a column-major a (wgmma_takes_mmajor_a): the route it would take.
  return m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && wgmma_available() &&
         plan_route(m, n, k, true, &route) == nullptr && route.reads_mmajor();
}

template <typename T>
Status matmul_wgmma(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                    Stream stream) {
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return "matmul: wgmma takes sizes < 2^31";
  const bool b_kmajor = b.row == 1 && b.col != 1, a_mmajor = mmajor(a);
  Route route;
  if (const Status e = check_switches()) return e;
  if (const Status e = plan_route(m, n, k, a_mmajor, &route)) return e;
  if (a_mmajor && !route.reads_mmajor()) {  // matmul_cuda_unusable refuses such a call first
    return "matmul: the wgmma path reads a column-major a on its whole-k route only (this shape "
           "splits k or takes the narrow route): pass a row-major a";
  }
  const Split& plan = route.plan;
  WgmmaShape tile{};
  if (route.few == FewRoute::mid || square_tile(route.few)) {  // 64 x 128 in pairs, a square alone
    const Status e = route.few == FewRoute::square      ? global<&kSquareShape>.read(&tile)
                     : route.few == FewRoute::square192 ? global<&kSquare192Shape>.read(&tile)
                     : route.few == FewRoute::square256 ? global<&kSquare256Shape>.read(&tile)
                                                        : global<&kMidShape>.read(&tile);
    if (e != nullptr) return e;
    return run_whole_k(a, b, c, m, n, k, b_kmajor,
                       fixed_tile_kernel<T>(b_kmajor, a_mmajor, route.few), tile,
                       route.few == FewRoute::mid, stream);
  }
  if (route.few != FewRoute::split) {  // a few-rows shape on the narrow route
    return matmul_wgmma_narrow(a, b, c, m, n, k, b_kmajor, route.few == FewRoute::narrow, stream);
  }
  if (plan.splits >= 2 && plan.cluster) {
    return run_cluster_split(a, b, c, m, n, k, b_kmajor, plan, stream);
  }
  if (plan.splits >= 2) return run_split(a, b, c, workspace, m, n, k, b_kmajor, plan, stream);
  if (const Status e = global<&kShape>.read(&tile)) return e;
  return run_whole_k(a, b, c, m, n, k, b_kmajor, wgmma_kernel<T>(b_kmajor, a_mmajor), tile, false,
                     stream);
}
WB_INSTANTIATE(WB_REDUCED, matmul_wgmma)

}  // namespace wb::matmul
