// matmul_gemv.cu: the host launcher of the matmul's GEMV route for an a of few rows (the kernels
// are gemv_kernel and gemv_sum_kernel, in the device-only TU matmul_gemv.kernel.cu).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j], 1 <= m <= 8
//   a: [m, k] row-major, rows 16-byte aligned; b: [k, n] row-major (n-major) or column-major
//   (k-major), rows (columns) 16-byte aligned as the wgmma path takes them, or n-major with rows
//   off 16 bytes (any row stride and base: gemv_unaligned_kernel reads it in place, where the
//   binding would copy it); c: [m, n] contiguous. float16 / bfloat16, float32 sums, rounded
//   once; any n, k below 2^31.
//
// A grid of column tiles x slices of k (plan_gemv): the slices are doubled, up to 8, while the
// blocks still fit the SMs at once (gemv_blocks_per_sm each: one wave) and each slice keeps
// kMinSliceRows (b n-major) or kMinSliceSteps (k-major) of k. On an H100 (132 SMs), m <= 4:
// 4096 x 4096 is 32 tiles x 8 slices of 512 rows (n-major), 128 tiles x 2 slices of 2048 k
// (k-major); 8192 x 8192 64 x 4 (n-major), 256 x 1 (k-major). The slices of a tile are summed in
// slice order, by a cluster of the tile's blocks through distributed shared memory (sm_90: one
// launch, no workspace; the slices halved, down to 2, until every tile's cluster is resident at
// once), else by gemv_sum_kernel over a float32 workspace [slices, m, n] the caller allocates
// (matmul_cuda_workspace); the same bits either way, every call; no state kept between calls, so
// a CUDA graph replays it.
//
// Switches, read from the environment at each call (for A/B on a GPU; a bad value is an error
// naming it):
//   WB_MATMUL_GEMV=0 | 1         the route off (the automatic route picks as before), or on for
//                                m <= WB_MATMUL_GEMV_ROWS on either layout of b (unset: m = 1, b
//                                n-major, gemv_chosen's rule)
//   WB_MATMUL_GEMV_ROWS=1..8     the most rows of a it takes (unset: 1; 8 with WB_MATMUL_GEMV=1)
//   WB_MATMUL_GEMV_SPLITS=1..64  the slices of k (unset: plan_gemv's)
//   WB_MATMUL_GEMV_SUM=cluster | launch   how the slices are summed (unset: cluster on sm_90
//                                where resident; cluster forces it, resident or not)
//   WB_MATMUL_GEMV_KIND=0 | 1    for an a of one row on b n-major: 1 (unset) the one-row kernel
//                                (gemv_row_kernel, matmul_gemv.h), 0 gemv_kernel as for m rows
//   WB_MATMUL_GEMV_UNALIGNED=0 | 1   an n-major b whose rows are off 16 bytes: 1 (unset) the
//                                route reads it in place (gemv_unaligned_kernel, whatever the
//                                kind), 0 the route takes it only as the binding's padded copy
//   Check and time:  wb check matmul --device cuda;  python -m pytest -m cuda
//   tests/test_matmul_gemv.py
#include <string_view>

#include "matmul/cluster_occupancy.h"
#include "matmul/matmul.h"
#include "matmul/matmul_gemv.h"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/dtypes.h"
#include "wb/module.h"

namespace wb::matmul {

WB_DEVICE_TEMPLATE(kGemv, "matmul_gemv.kernel.cu", "wb::matmul::gemv_kernel");
WB_DEVICE_TEMPLATE(kGemvSum, "matmul_gemv.kernel.cu", "wb::matmul::gemv_sum_kernel");
WB_DEVICE_TEMPLATE(kGemvRow, "matmul_gemv.kernel.cu", "wb::matmul::gemv_row_kernel");
WB_DEVICE_TEMPLATE(kGemvUnaligned, "matmul_gemv.kernel.cu", "wb::matmul::gemv_unaligned_kernel");

namespace {

// The least k a slice keeps: 16 half-warps x 16 rows (b n-major); two turns of a warp's loop,
// 2 x 256 k each (k-major). Fewer would leave a block too little to read to hide its start and its
// sum.
constexpr int64_t kMinSliceRows = 256;
constexpr int64_t kMinSliceSteps = 1024;

using detail::env;  // an environment switch's value ("" where unset)

// A switch of a whole number in [lo, hi], at most two digits (`fallback` where unset).
Status number_switch(const char* name, int lo, int hi, int fallback, const char* error,
                     int* value) {
  const std::string_view v = env(name);
  *value = fallback;
  if (v.empty()) return nullptr;
  int number = 0;
  for (const char ch : v) {
    if (ch < '0' || ch > '9' || v.size() > 2) return error;
    number = 10 * number + (ch - '0');
  }
  if (number < lo || number > hi) return error;
  *value = number;
  return nullptr;
}

// The current device's SMs, and whether it launches clusters (sm_90+), asked once per device.
struct DeviceFacts {
  int sms = 0;
  bool clusters = false;
};
DeviceFacts device_facts() {
  using wb::detail::device_attribute;
  const int sms = device_attribute<cudaDevAttrMultiProcessorCount>();
  return {sms > 0 ? sms : 1, device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9 &&
                                 device_attribute<cudaDevAttrClusterLaunch>() != 0};
}

// Stands in for gemv_kernel in the occupancy query below: the same threads, and dynamic shared
// memory that holds an SM to the kernel's blocks an SM (its launch bounds hold the kernel there).
// It stands in for gemv_row_kernel's blocks of 512 as well: the shared memory alone decides how
// many blocks an SM holds, and a cluster's blocks, where they go.
__global__ void __launch_bounds__(kGemvThreads) gemv_cluster_probe_kernel() {}

// Clusters of `size` blocks, `per_sm` blocks an SM at most, that the current device holds at once
// (0 where the query fails): a cluster's blocks share a GPC, and the GPCs' SM counts decide.
// Remembered per device, size and per_sm, so that a call under CUDA graph capture queries nothing.
int resident_clusters(int size, int per_sm) {
  static int seen[64][kGemvMaxSlices + 1][3];  // the count + 1; 0: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  int& known = seen[device][size][per_sm];
  if (known != 0) return known - 1;
  int per_block = 0, reserved = 0;
  cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
  int per_sm_smem = 0;
  cudaDeviceGetAttribute(&per_sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  const int smem = min_of(per_block, per_sm_smem / per_sm - reserved);
  const int clusters = query_resident_clusters(gemv_cluster_probe_kernel, size, kGemvThreads, smem);
  known = clusters + 1;
  return clusters;
}

struct GemvPlan {
  int64_t tiles = 0;    // column tiles (gridDim.x)
  int slices = 1;       // slices of k (gridDim.y)
  int64_t slice_k = 0;  // k a slice (a multiple of 8)
  int sum = kGemvDirect;
};

// Whether this call runs the one-row kernel (1) or gemv_kernel (0): WB_MATMUL_GEMV_KIND (unset:
// 1) for an a of one row on b n-major; gemv_kernel for any other call.
Status gemv_kind(int64_t m, bool b_kmajor, int* kind) {
  if (const Status e =
          number_switch("WB_MATMUL_GEMV_KIND", 0, 1, 1,
                        "matmul: WB_MATMUL_GEMV_KIND must be 0 (gemv_kernel) or 1 (the "
                        "one-row kernel); unset it for the default (1)",
                        kind)) {
    return e;
  }
  if (m != 1 || b_kmajor) *kind = 0;
  return nullptr;
}

// How the route reads b: n-major with 16-byte aligned rows (as the wgmma path, where both
// layouts hold), k-major (columns aligned), or n-major with rows off 16 bytes, read in place.
enum class BLayout { nmajor, kmajor, unaligned };
template <typename T>
BLayout layout_of(View<T> b) {
  if (rows16(b)) return BLayout::nmajor;
  if (cols16(b)) return BLayout::kmajor;
  return b.col == 1 ? BLayout::unaligned : BLayout::kmajor;  // kmajor: gemv_chosen refused it
}

// WB_MATMUL_GEMV_UNALIGNED (unset: 1): whether the route takes an n-major b whose rows are off
// 16 bytes as it is.
Status unaligned_switch(int* on) {
  return number_switch("WB_MATMUL_GEMV_UNALIGNED", 0, 1, 1,
                       "matmul: WB_MATMUL_GEMV_UNALIGNED must be 0 (such a b is copied) or 1 "
                       "(read in place); unset it for the default (1)",
                       on);
}

Status plan_gemv(int64_t m, int64_t n, int64_t k, bool b_kmajor, int kind, GemvPlan* plan) {
  int forced = 0;
  if (const Status e = number_switch("WB_MATMUL_GEMV_SPLITS", 1, kGemvMaxLaunchSlices, 0,
                                     "matmul: WB_MATMUL_GEMV_SPLITS must be 1 to 64; unset it for "
                                     "the default",
                                     &forced)) {
    return e;
  }
  const std::string_view sum = env("WB_MATMUL_GEMV_SUM");
  if (!sum.empty() && sum != "cluster" && sum != "launch") {
    return "matmul: WB_MATMUL_GEMV_SUM must be cluster or launch; unset it for the default";
  }
  if (sum == "cluster" && forced > kGemvMaxSlices) {
    return "matmul: WB_MATMUL_GEMV_SUM=cluster sums at most 8 slices (WB_MATMUL_GEMV_SPLITS)";
  }
  const DeviceFacts device = device_facts();
  const int64_t tile = b_kmajor ? kGemvTileK : kGemvTileN;
  const int64_t least = b_kmajor ? kMinSliceSteps : kMinSliceRows;
  // Blocks an SM: the one-row kernel's two (its launch bounds), else gemv_kernel's.
  const int per_sm = kind == 1 ? 2 : gemv_blocks_per_sm(static_cast<int>(m), b_kmajor);
  const bool clusters = device.clusters && sum != "launch";
  plan->tiles = (n + tile - 1) / tile;
  int slices = forced;
  if (slices == 0) {
    slices = 1;
    while (slices < kGemvMaxLaunchSlices &&
           plan->tiles * 2 * slices <= per_sm * int64_t{device.sms} && k / (2 * slices) >= least) {
      slices *= 2;
    }
    // More than a cluster's 8 slices (a c of few tiles: n <= 2048 n-major, 512 k-major): 8 in
    // clusters where they give at least half the SMs a block, else all of them and the second
    // launch's sum.
    const bool half_full = plan->tiles * kGemvMaxSlices * 2 >= device.sms;
    if (slices > kGemvMaxSlices && clusters && (half_full || sum == "cluster")) {
      slices = kGemvMaxSlices;
    }
  }
  // Slices of a multiple of 8 k (16-byte loads of a, and of b k-major), none of them empty.
  const auto cut = [&](int s) {
    plan->slice_k = ((k + s - 1) / s + 7) / 8 * 8;
    plan->slices = static_cast<int>((k + plan->slice_k - 1) / plan->slice_k);
  };
  cut(slices);
  // The cluster sum where every tile's cluster is resident at once: a cluster's blocks share a
  // GPC, so where the GPCs cannot hold them all, the default halves the slices (down to 2) until
  // they can; failing that, the two-launch sum's blocks (placed on any SM) run in one wave.
  bool cluster = clusters && plan->slices > 1 && plan->slices <= kGemvMaxSlices;
  if (cluster && sum != "cluster") {
    const GemvPlan first = *plan;
    while (forced == 0 && plan->slices > 2 &&
           resident_clusters(plan->slices, per_sm) < plan->tiles) {
      cut(plan->slices / 2);
    }
    cluster = resident_clusters(plan->slices, per_sm) >= plan->tiles;
    if (!cluster) *plan = first;
  }
  plan->sum = plan->slices == 1 ? kGemvDirect : cluster ? kGemvCluster : kGemvWorkspace;
  return nullptr;
}

// The kernel for m rows of a: the tier of M (1, 2, 4, 8) that holds them.
template <typename T, bool BKMajor>
const DeviceKernel& gemv_kernel_of(int64_t m) {
  if (m <= 1) return kernel<&kGemv, T, Val<1>, Val<BKMajor>>;
  if (m <= 2) return kernel<&kGemv, T, Val<2>, Val<BKMajor>>;
  if (m <= 4) return kernel<&kGemv, T, Val<4>, Val<BKMajor>>;
  return kernel<&kGemv, T, Val<8>, Val<BKMajor>>;
}
static_assert(kGemvMaxRows == 8, "gemv_kernel_of's tiers end at kGemvMaxRows");

// The one-row kernel (kind 1), or gemv_kernel's for m rows (kind 0); for an unaligned b,
// gemv_unaligned_kernel's tier (1, 4, 8: a tier of 4 for m = 2 has gemv_kernel<2>'s blocks an SM,
// so the plan and the bits are the same; a tier of 2 of its own would add two instantiations).
template <typename T>
const DeviceKernel& gemv_kernel_for(int kind, int64_t m, BLayout layout) {
  if (layout == BLayout::unaligned) {
    if (m <= 1) return kernel<&kGemvUnaligned, T, Val<1>>;
    return m <= 4 ? kernel<&kGemvUnaligned, T, Val<4>> : kernel<&kGemvUnaligned, T, Val<8>>;
  }
  if (kind == 1) return kernel<&kGemvRow, T>;
  return layout == BLayout::kmajor ? gemv_kernel_of<T, true>(m) : gemv_kernel_of<T, false>(m);
}
static_assert(gemv_blocks_per_sm(2, false) == gemv_blocks_per_sm(4, false) &&
                  gemv_blocks_per_sm(5, false) == gemv_blocks_per_sm(8, false),
              "gemv_unaligned_kernel's tiers hold the blocks an SM of the m they serve");

}  // namespace

// At m <= 8 the matmul reads b once and does at most 16 flops a 2-byte element: the time is b's
// read, which this route streams at the memory's rate (every GPU: the kernels need nothing newer
// than sm_80's loads, and an sm_90's cluster only for the sum), where the tensor-core routes work
// on tiles of 64 rows or more. Measured, it wins only at one row on b n-major (below).
template <typename T>
Status gemv_chosen(View<T> a, View<T> b, int64_t m, int64_t n, int64_t k, bool* chosen) {
  *chosen = false;
  int on = -1, rows = 1;
  if (const Status e = number_switch("WB_MATMUL_GEMV", 0, 1, -1,
                                     "matmul: WB_MATMUL_GEMV must be 0 (off) or 1 (m <= "
                                     "WB_MATMUL_GEMV_ROWS, either layout of b); unset it for the "
                                     "default (m = 1, b n-major)",
                                     &on)) {
    return e;
  }
  if (const Status e = number_switch("WB_MATMUL_GEMV_ROWS", 1, kGemvMaxRows, on == 1 ? 8 : 1,
                                     "matmul: WB_MATMUL_GEMV_ROWS must be 1 to 8; unset it for the "
                                     "default (1, or 8 with WB_MATMUL_GEMV=1)",
                                     &rows)) {
    return e;
  }
  // The default rule, from one H100 run (2026-11-26, against the split-k and narrow routes it
  // replaces, cuBLAS in the same run): a of one row on b n-major, 1 x 4096^2 0.92-0.95x cuBLAS
  // against 0.91-0.92x, 1 x 8192^2 0.99x against 0.96x; it lost at 2 to 8 rows (0.26-0.84x
  // against 0.88-0.91x) and on b k-major (1 x 4096^2 0.87-0.90x against 1.00-1.05x). An n-major
  // b whose rows are off 16 bytes is read in place, as any aligned one (the binding copied it
  // into padded rows before: at 1 x 4095^2, 69 us against cuBLAS's 22, the copy twice the GEMV).
  int unaligned = 1;
  if (const Status e = unaligned_switch(&unaligned)) return e;
  const bool layout =
      rows16(b) || (on == 1 && cols16(b)) || (unaligned == 1 && layout_of(b) == BLayout::unaligned);
  *chosen =
      on != 0 && m >= 1 && m <= rows && n <= INT32_MAX && k <= INT32_MAX && rows16(a) && layout;
  return nullptr;
}

namespace {

int64_t workspace_of(int64_t m, int64_t n, int64_t k, bool b_kmajor) {
  GemvPlan plan;
  int kind = 0;
  if (gemv_kind(m, b_kmajor, &kind) != nullptr) return 0;  // matmul_gemv says why
  if (plan_gemv(m, n, k, b_kmajor, kind, &plan) != nullptr || plan.sum != kGemvWorkspace) return 0;
  return plan.slices * m * n;
}

}  // namespace

template <typename T>
int64_t gemv_workspace(View<T> b, int64_t m, int64_t n, int64_t k) {
  return workspace_of(m, n, k, layout_of(b) == BLayout::kmajor);  // as matmul_gemv plans it
}

template <typename T>
Status matmul_gemv(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                   Stream stream) {
  if (m < 1 || m > kGemvMaxRows || n > INT32_MAX || k > INT32_MAX) {
    return "matmul: the GEMV route takes 1 to 8 rows of a and n, k below 2^31";
  }
  const BLayout layout = layout_of(b);
  const bool b_kmajor = layout == BLayout::kmajor;
  if (b_kmajor && !cols16(b)) {
    return "matmul: the GEMV route reads b with its rows or its columns contiguous";
  }
  int kind = 0;
  if (const Status e = gemv_kind(m, b_kmajor, &kind)) return e;
  GemvPlan plan;
  if (const Status e = plan_gemv(m, n, k, b_kmajor, kind, &plan)) return e;
  if (plan.tiles > INT32_MAX) return "matmul: too many column tiles for the GEMV route's grid";
  if (plan.sum == kGemvWorkspace && workspace == nullptr) {
    return "matmul: the GEMV route's split of k needs its workspace (matmul_cuda_workspace)";
  }
  LaunchConfig config{Dim3(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(plan.slices)),
                      Dim3(kGemvThreads)};
  if (plan.sum == kGemvCluster) config.cluster = Dim3{1, static_cast<unsigned>(plan.slices), 1};
  const int64_t ldb = b_kmajor ? b.col : b.row;
  const DeviceKernel& gemv = gemv_kernel_for<T>(kind, m, layout);
  const Status launched = gemv.launch(config, stream, a.data, a.row, b.data, ldb, c, workspace,
                                      static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                      static_cast<int>(plan.slice_k), plan.sum);
  if (launched != nullptr || plan.sum != kGemvWorkspace) return launched;
  // The slices' sums, added in slice order: enough blocks for a few a SM, each a strided walk.
  const int64_t size = m * n;
  const int64_t blocks =
      min_of<int64_t>((size + kGemvThreads - 1) / kGemvThreads, 4 * int64_t{device_facts().sms});
  LaunchConfig sum{Dim3(static_cast<unsigned>(blocks)), Dim3(kGemvThreads)};
  return kernel<&kGemvSum, T>.launch(sum, stream, static_cast<const float*>(workspace), c, size,
                                     plan.slices);
}

#define WB_GEMV_ENTRY_(T, _)                                                          \
  template Status gemv_chosen<T>(View<T>, View<T>, int64_t, int64_t, int64_t, bool*); \
  template int64_t gemv_workspace<T>(View<T>, int64_t, int64_t, int64_t);             \
  template Status matmul_gemv<T>(View<T>, View<T>, T*, float*, int64_t, int64_t, int64_t, Stream);
WB_REDUCED(WB_GEMV_ENTRY_, )

}  // namespace wb::matmul
