// matmul_wgmma_narrow.cu: the host launcher of the wgmma matmul's narrow route for an a of few
// rows (the kernel is wgmma_narrow_kernel, wgmma_narrow.cuh, in the device-only TU
// matmul_wgmma_narrow.kernel.cu, a module of its own).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k] row-major; b: [k, n] row-major (n-major) or column-major (k-major); rows 16-byte
//   aligned; c: [m, n] contiguous. float16 / bfloat16, float32 accumulation, rounded once.
//
// k whole on 64 x BN tiles, a block a tile, no workspace and no second launch. BN: 32 where
// 64-wide tiles would fill at most half the SMs (m <= 64 x n = 4096: 128 tiles of 64 x 32 for
// 132 SMs), else 64 (m = 128: 128 tiles of 64 x 64), as cuBLAS picks for these shapes
// (nvjet_sm90_tst_64x32 and _64x64 on an H100); WB_WGMMA_NARROW_BN=32 | 64 forces one. Paired
// (WB_WGMMA_FEW=narrow), the blocks run in clusters of two that share one operand's tile by TMA
// multicast: a's (two tiles side by side) where a has one row of tiles, else b's (one above the
// other; the 128-row tile of an a of more than 256 rows under WB_WGMMA_MID=pairs: a's);
// WB_WGMMA_NARROW_PAIR=m | n forces the direction. Which route a few-rows shape takes:
// few_rows_route (the rule, and WB_WGMMA_FEW). Stages of 128 k (NarrowKind, wgmma_narrow.h).
// WB_WGMMA_NARROW_ROWS=64 | 128 | 256 picks the tile's rows: 128 is the 128-row tile (two consumer
// warpgroups, kNarrowTall) and BN counts 128-row tiles; unset, the default's (default_rows).
// 256 is the split tile (kNarrowSplitKind, narrow_split): one row of 256-row tiles over a few-rows
// a, BN 64 or 128 (WB_WGMMA_NARROW_BN; unset, 64 where two slices of its tiles fit the SMs, else
// 128), k cut into S = 1, 2 or 4 slices (WB_WGMMA_NARROW_SPLIT; unset, the most whose clusters
// all fit the device at once, each of 4 k steps or more) run as a cluster of S blocks, summed in
// slice order through distributed shared memory (the same bits every call); narrow and narrow1 run
// it alike.
//   Check and time:  wb check matmul --device cuda;  python -m pytest -m cuda
//   tests/test_matmul_narrow.py tests/test_matmul_narrow_tall.py
#include <string_view>

#include "matmul/matmul.h"
#include "matmul/wgmma_narrow.h"
#include "matmul/wgmma_shape.h"
#include "matmul/wgmma_tma.h"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/dtypes.h"
#include "wb/module.h"

namespace wb::matmul {

WB_DEVICE_TEMPLATE(kNarrow, "matmul_wgmma_narrow.kernel.cu", "wb::matmul::wgmma_narrow_kernel");
WB_DEVICE_TEMPLATE(kNarrow32Shape, "matmul_wgmma_narrow.kernel.cu",
                   "wb::matmul::wgmma_narrow32_shape");
WB_DEVICE_TEMPLATE(kNarrow64Shape, "matmul_wgmma_narrow.kernel.cu",
                   "wb::matmul::wgmma_narrow64_shape");
WB_DEVICE_TEMPLATE(kNarrowTall32Shape, "matmul_wgmma_narrow.kernel.cu",
                   "wb::matmul::wgmma_narrow_tall32_shape");
WB_DEVICE_TEMPLATE(kNarrowTall64Shape, "matmul_wgmma_narrow.kernel.cu",
                   "wb::matmul::wgmma_narrow_tall64_shape");
WB_DEVICE_TEMPLATE(kNarrowSplit64Shape, "matmul_wgmma_narrow.kernel.cu",
                   "wb::matmul::wgmma_narrow_split64_shape");
WB_DEVICE_TEMPLATE(kNarrowSplit128Shape, "matmul_wgmma_narrow.kernel.cu",
                   "wb::matmul::wgmma_narrow_split128_shape");

namespace {

// The kernel of the 64-row tile (kNarrowDeep) or the 128-row one (tall: kNarrowTallKind).
template <typename T, bool BKMajor, int BN>
const DeviceKernel& narrow_kernel_of(bool tall) {
  if (tall) return kernel<&kNarrow, T, Val<BKMajor>, Val<BN>, Val<kNarrowTallKind>>;
  return kernel<&kNarrow, T, Val<BKMajor>, Val<BN>, Val<int{kNarrowDeep}>>;
}
template <typename T>
const DeviceKernel& narrow_kernel(bool b_kmajor, int bn, bool tall) {
  if (b_kmajor) {
    return bn == 32 ? narrow_kernel_of<T, true, 32>(tall) : narrow_kernel_of<T, true, 64>(tall);
  }
  return bn == 32 ? narrow_kernel_of<T, false, 32>(tall) : narrow_kernel_of<T, false, 64>(tall);
}

// The 256-row split tile's kernel (kNarrowSplitKind), BN 64 or 128.
template <typename T>
const DeviceKernel& narrow_split_kernel(bool b_kmajor, int bn) {
  if (b_kmajor) {
    return bn == 64 ? kernel<&kNarrow, T, Val<true>, Val<64>, Val<kNarrowSplitKind>>
                    : kernel<&kNarrow, T, Val<true>, Val<128>, Val<kNarrowSplitKind>>;
  }
  return bn == 64 ? kernel<&kNarrow, T, Val<false>, Val<64>, Val<kNarrowSplitKind>>
                  : kernel<&kNarrow, T, Val<false>, Val<128>, Val<kNarrowSplitKind>>;
}

using detail::env;  // an environment switch's value ("" where unset)

// The split tile's columns: WB_WGMMA_NARROW_BN=64 | 128, else 64 where two slices of its tiles fit
// the SMs (n <= 4224 on 132 SMs), else 128 (n = 8192: 64 tiles).
Status narrow_split_bn(int64_t m, int64_t n, int* bn) {
  const std::string_view v = env("WB_WGMMA_NARROW_BN");
  if (v == "64" || v == "128") {
    *bn = v == "64" ? 64 : 128;
    return nullptr;
  }
  if (!v.empty()) {
    return "matmul: WB_WGMMA_NARROW_BN must be 64 or 128 on the 256-row tile "
           "(WB_WGMMA_NARROW_ROWS=256); unset it for the default";
  }
  const int64_t tiles64 = (m + 255) / 256 * ((n + 63) / 64);
  *bn = 2 * tiles64 <= sm_count() ? 64 : 128;
  return nullptr;
}

// The 64- or 128-row tile's columns (the 256-row tile's: narrow_split_bn): WB_WGMMA_NARROW_BN,
// else 32 where rows x 64 tiles fill at most half the SMs.
Status narrow_bn(int64_t m, int64_t n, int rows, int* bn) {
  const std::string_view v = env("WB_WGMMA_NARROW_BN");
  if (v == "32" || v == "64") {
    *bn = v == "32" ? 32 : 64;
    return nullptr;
  }
  if (!v.empty()) return "matmul: WB_WGMMA_NARROW_BN must be 32 or 64; unset it for the default";
  const int64_t tiles64 = (m + rows - 1) / rows * ((n + 63) / 64);
  *bn = 2 * tiles64 <= sm_count() ? 32 : 64;
  return nullptr;
}

// The clusters' direction: WB_WGMMA_NARROW_PAIR, else along n (sharing a) where a has one row of
// tiles (no tile below to share b with) or, under the mid-size rule (mid_choice), on the 128-row
// tile of an a past the few-rows sizes (a's 128 rows are the larger part of what a block reads:
// shared, a block reads 64 + 64 rows a stage, where sharing b's 64 columns leaves 128 + 32), else
// along m (sharing b).
Status narrow_pair(int64_t m, int rows, bool mid, int* pair) {
  const std::string_view v = env("WB_WGMMA_NARROW_PAIR");
  if (v == "m" || v == "n") {
    *pair = v == "m" ? kNarrowPairM : kNarrowPairN;
    return nullptr;
  }
  if (!v.empty()) return "matmul: WB_WGMMA_NARROW_PAIR must be m or n; unset it for the default";
  *pair = m <= rows || (mid && rows == 128 && m > kMidRows) ? kNarrowPairN : kNarrowPairM;
  return nullptr;
}

// The narrow tiles of rows x BN (BN by narrow_bn) on c of m x n.
Status narrow_tiles(int64_t m, int64_t n, int rows, int* bn, int64_t* tiles) {
  if (const Status e = narrow_bn(m, n, rows, bn)) return e;
  *tiles = (m + rows - 1) / rows * ((n + *bn - 1) / *bn);
  return nullptr;
}

// The default's tile rows for a few-rows shape: 64, 128, 256 (the split tile), or 0 for split-k
// (few_rows_route's rule, measured there). "Half full": the last 128-row tile holds more than 64
// rows of a.
Status default_rows(int64_t m, int64_t n, int* rows) {
  int bn64 = 64, bn128 = 64;
  int64_t t64 = 0, t128 = 0;
  if (const Status e = narrow_tiles(m, n, 64, &bn64, &t64)) return e;
  if (const Status e = narrow_tiles(m, n, 128, &bn128, &t128)) return e;
  const int64_t s = sm_count(), last = m - (m - 1) / 128 * 128;
  const bool one_wave64 = 2 * t64 >= s && t64 <= s && (bn64 == 64 || m >= 32);
  const bool one_wave128 = t64 > s && 2 * t128 >= s && t128 <= s && last > 64;
  const bool wave_and_half64 = t64 > s && 2 * t64 <= 3 * s && m > 128;
  const bool split256 = 2 * t64 > 3 * s && m > 128 && m <= 256;
  *rows = one_wave64 ? 64 : one_wave128 ? 128 : wave_and_half64 ? 64 : split256 ? 256 : 0;
  return nullptr;
}

// The tile's rows: WB_WGMMA_NARROW_ROWS, else the default's (64 where it would run split-k).
Status narrow_rows(int64_t m, int64_t n, int* rows) {
  const std::string_view v = env("WB_WGMMA_NARROW_ROWS");
  if (v == "64" || v == "128" || v == "256") {
    *rows = v == "64" ? 64 : v == "128" ? 128 : 256;
    return nullptr;
  }
  if (!v.empty()) {
    return "matmul: WB_WGMMA_NARROW_ROWS must be 64, 128 or 256; unset it for the default";
  }
  if (const Status e = default_rows(m, n, rows)) return e;
  // Split-k's shapes take the 64-row tile; so does the split tile's where BN 32 is asked for (a
  // width only the 64- and 128-row tiles have).
  if (*rows == 0 || (*rows == 256 && env("WB_WGMMA_NARROW_BN") == "32")) *rows = 64;
  return nullptr;
}

// WB_WGMMA_NARROW_SPLIT=1 | 2 | 4, the split tile's slices of k (0 where unset). Read at every call
// of the narrow route, so that a bad value is refused whichever tile runs; the 64- and 128-row
// tiles take k whole and ignore it.
Status forced_slices(int* slices) {
  const std::string_view v = env("WB_WGMMA_NARROW_SPLIT");
  *slices = v == "1" ? 1 : v == "2" ? 2 : v == "4" ? 4 : 0;
  if (*slices != 0 || v.empty()) return nullptr;
  return "matmul: WB_WGMMA_NARROW_SPLIT must be 1, 2 or 4 (the 256-row tile's slices of k); unset "
         "it for the default";
}

// The split tile's slices for `tiles` tiles and k: the forced count, else the most of 4 and 2
// whose clusters all fit the device at once (one wave: 2 x 64 tiles on an H100's 132 SMs, which
// holds 66 clusters of two), each slice of kMinSteps k steps or more; else 1.
int narrow_slices(int64_t tiles, int64_t k, int forced, const WgmmaShape& tile) {
  if (forced != 0) return forced;
  const int64_t steps = (k + 63) / 64;
  const int smem = tile.smem + 1024;  // + the kernel's static mbarriers, rounded
  for (const int s : {4, 2}) {
    if (tiles * s <= sm_count() && steps >= kMinSteps * s &&
        resident_clusters(s, tile.threads, smem) >= tiles) {
      return s;
    }
  }
  return 1;
}

// c = a @ b on the 256-row split tile (kNarrowSplitKind): tiles x S blocks, in clusters of S (the
// slices of one tile) where S > 1. a's boxes: 64 k x 256 rows; b's: 64 k x BN columns (k-major) or
// 64 columns x 64 k (n-major, BN / 64 of them a stage).
template <typename T>
Status narrow_split(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, bool b_kmajor,
                    int forced, Stream stream) {
  int bn = 64;
  if (const Status e = narrow_split_bn(m, n, &bn)) return e;
  WgmmaShape tile{};
  const DeviceGlobal& shape =
      bn == 64 ? global<&kNarrowSplit64Shape> : global<&kNarrowSplit128Shape>;
  if (const Status e = shape.read(&tile)) return e;
  const int64_t tiles = (m + tile.bm - 1) / tile.bm * ((n + bn - 1) / bn);
  const int slices = narrow_slices(tiles, k, forced, tile);
  if (tiles * slices > INT32_MAX) return "matmul: too many tiles for the narrow route's grid";
  CUtensorMap map_a, map_b;
  const bool mapped = make_map(&map_a, a.data, k, m, a.row, tile.bk, tile.bm) &&
                      (b_kmajor ? make_map(&map_b, b.data, k, n, b.col, tile.bk, bn)
                                : make_map(&map_b, b.data, n, k, b.row, 64, tile.bk));
  if (!mapped) return "matmul: could not encode a TMA tensor map (cuTensorMapEncodeTiled)";
  LaunchConfig config{static_cast<unsigned>(tiles * slices), static_cast<unsigned>(tile.threads),
                      static_cast<unsigned>(tile.smem)};
  if (slices > 1) config.cluster = Dim3{static_cast<unsigned>(slices), 1, 1};
  return narrow_split_kernel<T>(b_kmajor, bn)
      .launch(config, stream, map_a, map_b, c, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), int{kNarrowAlone});
}

}  // namespace

// The default: narrow1 (k whole on the narrow tile, no clusters) where its tiles
// make one wave at least half full (SMs / 2 <= tiles <= SMs) and, on the 32-column tile, a has
// at least 32 rows; else split. Measured on an H100, 2026-11-26, bfloat16, k = 4096, cuBLAS over
// ours (bench/results/kernels.md, fourth pass): n = 4096, m = 32 / 48 / 64 / 96 / 128: 0.91 /
// 1.00 / 1.03 / 0.86 / 1.03x against split's 0.89 / 0.86 / 0.84 / 0.78 / 0.78x; m = 1 / 8 / 16:
// split's 0.91 / 0.88 / 0.99x against 0.75 / 0.77 / 0.93x (a 64-row tile for one row). n = 8192,
// m <= 64 (64-column tiles): 0.97-1.00x against 0.84-0.88x; m >= 96 (256 tiles and more): split
// 0.62-0.80x against 0.50-0.84x. n = 2048, m = 96 to 256: 0.75-0.94x against 0.64-0.78x; m <= 48
// (64 tiles): split 0.93-1.03x against 0.67-0.89x. The pairs (narrow) were no faster. Where
// 64-row tiles pass one wave: the 128-row tile where its tiles make one wave and its last is more
// than half full (224 / 256 x 4096: 0.82 / 0.89x against split's 0.68 / 0.68x; 96 / 128 x 8192:
// 0.85 / 0.97x against 0.85 / 0.82x), else for more than 128 rows the 64-row tile up to one wave
// and a half (160 / 192 x 4096: 0.61 / 0.72x against 0.57 / 0.64x; the 128-row tile, its last
// tile a quarter or half full, 0.48 / 0.60x); past that, for at most 256 rows, the 256-row split
// tile (one row of tiles, k in slices summed in clusters: 160 / 192 / 224 / 256 x 8192: 0.80 /
// 0.87 / 0.97 / 0.90x against split's 0.63 / 0.65 / 0.69 / 0.62x, H100, 2026-11-26; at 4096 it
// lost to the rule above: 0.60-0.84x against 0.69-0.89x); else split.
//
// The mid-size rule (WB_WGMMA_MID=on, the default; =off gives the rule above alone), for the
// square-ish shapes below a wave of built tiles (128^3 to 2048^3 on 132 SMs), as cuBLAS runs them
// (nvjet 64 x 8 tiles at 128^3, 64 x 128 in clusters of two at 1000^3, H100): `tiny` (the split
// plan leaves k whole on the built tile, whose tiles fill at most a quarter of the SMs: 128^3 one
// block, 256^3 two) takes narrow1 on the 64-row tile (128^3: 8 blocks of 64 x 32, 256^3: 32).
// WB_WGMMA_MID=pairs also runs the 128-row tile of an a of more than kMidRows rows (768^3: 72
// blocks, 1000^3 and 1024^3: 128) paired along n (narrow, narrow_pair): two tiles side by side
// share a's 128 rows by TMA multicast, so that a block reads 64 + 64 rows of the operands a stage
// where it read 128 + 64; =tile runs those on the whole-k kernel's 64 x 128 tile. Graph replays,
// L2 flushed, bf16, H100, 2026-11-26, us, off / on (tiny) / pairs / tile (cuBLAS): 128^3 12.2 /
// 11.0 (10.9); 256^3 9.5 / 8.0 (9.5); 768^3 9.2 / - / 10.0 / 9.5 (7.2); 1000^3 15.8 / - / 13.6 /
// 13.3 (11.4); 1024^3 10.5 / - / 12.0 / 10.5 (9.4): the pairs and the tile win at 1000^3 alone,
// so neither is the default.
//
// Since then the 64 x 128 tile (mid) is the default of the mid-size rule for an a of more than
// kMidRows rows, row-major, and more than kTallWideMaxN columns, where its m / 64 x n / 128
// tiles make from half a wave to kMidWaves (1.85) waves (below, 512^3's 32 tiles: the narrow
// tiles' 128 blocks, 0.98x cuBLAS). Graph replays, L2 flushed, bf16, H100, 2026-11-27, us,
// the route before / mid (cuBLAS), its tiles: 896^3 11.2 / 10.8 (9.5), 98; 960^3 16.8 / 11.3
// (9.8), 120; 1000^3 16.1 / 13.5 (11.9), 128; 1024^3 11.0 / 10.9 (9.8); 1088^3 17.2 / 15.4
// (11.1), 153; 1152^3 18.7 / 17.0 (11.6), 162; 1280^3 19.1 / 17.3 (11.9), 200; 1408^3 19.9 /
// 17.8 (15.0), 242; 1000 x 1000 x 4096 32.8 / 28.3 (26.6); 768 x 1536 x 768 14.4 / 13.4 (8.9);
// 1536 x 768 x 4096 44.1 / 36.9 (18.6); 1152 x 1152 x 4096 46.5 / 38.5 (22.5); 2048 x 512 x 2048
// 17.3 / 15.1 (12.7); level at 768^3, 1200 x 1000 x 1000 and 512 x 2048 x 2048; lost at 1000 x 1200
// x 3000 (160 tiles: 34.2 / 35.9, cuBLAS 18.9). Past the reach: 1536^3 (288 tiles) 22.6 / 26.0,
// 1000 x 2000 x 1000 (256) 16.9 / 19.0, 2048^3 28.6 / 40.1. Where k is long, a split of k on the
// built tile did better still (1152 x 1152 x 4096: two slices 32.7, 1536 x 768 x 4096: three
// 25.2) but lost elsewhere (1000 x 1000 x 4096: 32.9): not a rule yet.
//
// The tall rule (WB_WGMMA_TALL=on, the default; =off, not): an output of few columns and many
// rows (n <= kTallMaxN, kTallMinRows <= m <= kTallMaxRows, the LoRA-like x @ A) takes narrow1,
// whatever the rules above say. Graph replays, L2 flushed, bf16, k = 4096, H100, 2026-11-26, us,
// the route the rules above gave / narrow1 (cuBLAS): 1024 x 16 15.5 / 14.8 (11.7); 2048 x 16 22.3 /
// 14.9 (14.0); 2048 x 64 21.3 / 14.8 (12.6); 4096 x 16 37.3 / 20.9 (18.1); 4096 x 64 21.2 / 21.6
// (18.2); 8192 x 32 29.4 / 29.6 (28.4); n = 128: mixed (2048: 18.3 / 18.6, 8192: 35.8 / 35.4,
// the mid tile 30.5), so not there. It also beat computing c^T = b^T a^T (matmul_swaps) at every
// n from 16 to 128 (4096 x 16: 25.5).
//
// The tall rule's wider outputs (kTallMaxN < n <= kTallWideMaxN) go by the count of the 64-row
// narrow tiles (narrow_tiles): at most half the SMs, narrow1; at most one wave, the pairs
// (narrow); past one wave, the whole-k kernel's 64 x 128 tile in pairs (mid: m / 64 tiles, about
// one wave where the narrow ones make two). n = 128, k = 4096, bf16, H100, us, the few-rows rule
// before it / the new route (cuBLAS), two runs on two hosts: 1024 rows (64 tiles: narrow1) 16.4,
// 16.5 / 14.7, 14.8 (11.9); 2048 (128: narrow) 18.3, 18.6 / 16.3, 15.9 (14.3); 4096 (128: narrow)
// 21.1, 21.3 / 21.6, 21.6 (18.4); 8192 (256: mid) 38.6, 35.8 / 30.4, 30.4 (29.6).
Status tall_choice(bool* on) {
  const std::string_view v = env("WB_WGMMA_TALL");
  *on = v.empty() || v == "on";
  if (*on || v == "off") return nullptr;
  return "matmul: WB_WGMMA_TALL must be on (the default) or off; unset it";
}

// Whether v names a square tile (WB_WGMMA_FEW, WB_WGMMA_SQUARE), which *route then becomes.
bool square_named(std::string_view v, FewRoute* route) {
  if (v != "square" && v != "square192" && v != "square256") return false;
  *route = v == "square"      ? FewRoute::square
           : v == "square192" ? FewRoute::square192
                              : FewRoute::square256;
  return true;
}

Status few_rows_route(int64_t m, int64_t n, bool tiny, bool a_mmajor, FewRoute* route) {
  const std::string_view v = env("WB_WGMMA_FEW");
  if (square_named(v, route)) return nullptr;
  if (v == "split" || v == "narrow" || v == "narrow1" || v == "mid") {
    *route = v == "split"    ? FewRoute::split
             : v == "narrow" ? FewRoute::narrow
             : v == "mid"    ? FewRoute::mid
                             : FewRoute::narrow1;
    return nullptr;
  }
  if (!v.empty()) {
    return "matmul: WB_WGMMA_FEW must be split, narrow, narrow1, mid, square, square192 or "
           "square256; unset it for the default";
  }
  int rows = 0;
  MidRule mid = MidRule::off;
  bool tall = true;
  if (const Status e = default_rows(m, n, &rows)) return e;
  if (const Status e = mid_choice(&mid)) return e;
  if (const Status e = tall_choice(&tall)) return e;
  if (tall && m >= kTallMinRows && m <= kTallMaxRows && n <= kTallWideMaxN) {
    int bn = 0;
    int64_t tiles = 0;
    if (const Status e = narrow_tiles(m, n, 64, &bn, &tiles)) return e;
    *route = n <= kTallMaxN || 2 * tiles <= sm_count() ? FewRoute::narrow1
             : tiles <= sm_count()                     ? FewRoute::narrow
                                                       : FewRoute::mid;
    return nullptr;
  }
  *route = rows != 0 ? FewRoute::narrow1 : FewRoute::split;
  if (mid == MidRule::off) return nullptr;
  const int64_t tiles = mid_tiles(m, n);
  if (mid == MidRule::on && !a_mmajor && m > kMidRows && n > kTallWideMaxN &&
      2 * tiles >= sm_count() && kMidWavesDen * tiles <= kMidWavesNum * sm_count()) {
    *route = FewRoute::mid;
    return nullptr;
  }
  if (rows == 0 && tiny) *route = FewRoute::narrow1;
  if (mid == MidRule::on || rows != 128 || m <= kMidRows) return nullptr;
  *route = mid == MidRule::tile ? FewRoute::mid : FewRoute::narrow;
  return nullptr;
}

Status mid_choice(MidRule* rule) {
  const std::string_view v = env("WB_WGMMA_MID");
  *rule = v == "off"     ? MidRule::off
          : v == "tile"  ? MidRule::tile
          : v == "pairs" ? MidRule::pairs
                         : MidRule::on;
  if (v.empty() || v == "on" || v == "off" || v == "pairs" || v == "tile") return nullptr;
  return "matmul: WB_WGMMA_MID must be on (the default), pairs (also the 128-row narrow tile "
         "paired along n), tile (those on the 64 x 128 whole-k tile) or off (the few-rows rule "
         "alone); unset it";
}

// The square rule (WB_WGMMA_SQUARE=on, the default; =off: not), unless a switch of the route is
// set: a few shape of more than kMidRows rows (a of either layout) and more than kTallWideMaxN
// columns whose 128 x 128 tiles make more than half a wave and at most one runs them (square),
// else, past one wave of those, whose 192 x 128 ones make that (square192), k whole, a block a
// tile, unpaired (wgmma_square_kernel), in place of the route plan_route had (matmul_wgmma.cu: the
// built tile with k whole or in two slices, or the 64 x 128 tile): cuBLAS's tiles on such shapes
// are 128 x 128 and 192 x 96. H100, 2026-11-27, us, the route before / the square tile (cuBLAS),
// its tiles: 1152^3 16.4 / 12.4 (11.4), 81; 1408^3 18.0 / 13.5 (15.7), 121; 2048 x 1024 x 2048 22.8
// / 17.7 (17.5), 128; 4096 x 384 x 4096 38.7 / 27.8 (25.6), 96; 1024 x 2048 x 8192 61.6 / 53.0
// (52.8), 128. At half a wave or less it lost (1024^3, 64: 10.9 / 11.5), and in clusters of two
// sharing b (WB_WGMMA_CLUSTER=2) to itself alone at most of these shapes. The rest:
// bench/results/shapes.md.
//
// Past a wave of built tiles (the wave rule), of the built tile, the 192 x 128 one and the
// 256 x 128 one (the built tile on its side), the one whose waves take the least time, a wave of
// each costing a k step's time (kStepUs: 0.76 us the built tile at 4096^3 and 0.58 the 192-row one
// at 2048 x 1536 x 4096 on an H100; the 256-row one 1.02x the built one's at 4096^3 on an H100,
// its c staged in 64-byte chunks, 1.11x with c stored from registers); another tile only where it
// saves a twentieth: 3072^2 (288 built tiles, 3 waves; 384 of 192 rows, 3 waves) and 4096 x 4160
// (544 built tiles, 5 waves; 528 of 256 rows, 4 waves), not 4096^2 (4 waves; 6 of 192 rows, 4 of
// 256) or 8192^2.
// H100, 2026-11-27, us, the rule before / now (cuBLAS): 4096 x 4160 x 4096 220.0 / 186.2
// (182.4); 4096 x 4104 x 4096 319.8 / 225.7 (198.3); 1024 x 4224 x 4096 91.2 / 49.9 (48.6); the
// rest: bench/results/shapes.md. WB_WGMMA_SQUARE=square | square192 | square256 runs that tile for
// every shape (A/B).
constexpr int64_t kStepUsBuilt = 76, kStepUs192 = 58, kStepUs256 = 78;  // hundredths of a us
Status square_route(int64_t m, int64_t n, int64_t built_tiles, FewRoute* route) {
  const std::string_view v = env("WB_WGMMA_SQUARE");
  if (square_named(v, route)) return nullptr;
  if (!v.empty() && v != "on" && v != "off") {
    return "matmul: WB_WGMMA_SQUARE must be on (the default), off, or a tile to run everywhere: "
           "square, square192 or square256; unset it";
  }
  if (v == "off" || m <= kMidRows || n <= kTallWideMaxN) return nullptr;
  for (const char* name : {"WB_WGMMA_FEW", "WB_WGMMA_SPLITS", "WB_WGMMA_SPLIT_SUM",
                           "WB_WGMMA_SPLIT_TILE", "WB_WGMMA_NARROW_ROWS"}) {
    if (!env(name).empty()) return nullptr;  // an A/B run asked for its own route
  }
  const std::string_view mid = env("WB_WGMMA_MID");
  if (!mid.empty() && mid != "on") return nullptr;
  const int64_t sms = sm_count(), tiles = square_tiles(m, n, 128);
  const int64_t tiles192 = square_tiles(m, n, 192);
  if (built_tiles >= sms) {
    const auto waves = [sms](int64_t t) { return (t + sms - 1) / sms; };
    const int64_t built = kStepUsBuilt * waves(built_tiles), w192 = kStepUs192 * waves(tiles192);
    const int64_t w256 = kStepUs256 * waves(square_tiles(m, n, 256));
    if (20 * (w192 < w256 ? w192 : w256) < 19 * built) {
      *route = w192 <= w256 ? FewRoute::square192 : FewRoute::square256;
    }
    return nullptr;
  }
  const auto one_wave = [sms](int64_t t) { return 2 * t > sms && t <= sms; };
  if (one_wave(tiles)) {
    *route = FewRoute::square;
  } else if (tiles > sms && one_wave(tiles192)) {
    *route = FewRoute::square192;
  }
  return nullptr;
}
template <typename T>
Status matmul_wgmma_narrow(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k,
                           bool b_kmajor, bool paired, Stream stream) {
  int rows = 64, bn = 64, pair = kNarrowAlone, slices = 0;
  MidRule mid = MidRule::off;
  if (const Status e = forced_slices(&slices)) return e;
  if (const Status e = mid_choice(&mid)) return e;
  if (const Status e = narrow_rows(m, n, &rows)) return e;
  if (rows == 256) return narrow_split(a, b, c, m, n, k, b_kmajor, slices, stream);
  if (const Status e = narrow_bn(m, n, rows, &bn)) return e;
  if (paired) {
    if (const Status e = narrow_pair(m, rows, mid == MidRule::pairs, &pair)) return e;
  }
  // The block's threads and shared memory: the tile's.
  const DeviceGlobal& shape =
      rows == 128 ? (bn == 32 ? global<&kNarrowTall32Shape> : global<&kNarrowTall64Shape>)
                  : (bn == 32 ? global<&kNarrow32Shape> : global<&kNarrow64Shape>);
  WgmmaShape tile{};
  if (const Status e = shape.read(&tile)) return e;
  const int64_t tiles_m = (m + tile.bm - 1) / tile.bm, tiles_n = (n + bn - 1) / bn;
  // Groups of tiles a cluster (or a block) takes; paired, the last group's second tile may lie
  // past m or n (it runs, and stores nothing).
  const int64_t groups = pair == kNarrowPairM   ? (tiles_m + 1) / 2 * tiles_n
                         : pair == kNarrowPairN ? tiles_m * ((tiles_n + 1) / 2)
                                                : tiles_m * tiles_n;
  const int64_t blocks = pair == kNarrowAlone ? groups : 2 * groups;
  if (blocks > INT32_MAX) return "matmul: too many tiles for the narrow route's grid";
  // a: boxes of 64 k x BM rows (BM / 2, each block's half, sharing a). b k-major: 64 k x BN columns
  // (BN / 2, sharing b); n-major: BN columns x 64 k (32 k, sharing b), the 64-byte swizzle for
  // rows of 32 columns.
  CUtensorMap map_a, map_b;
  const int a_rows = pair == kNarrowPairN ? tile.bm / 2 : tile.bm;
  const int b_part = pair == kNarrowPairM ? 2 : 1;
  const bool mapped =
      make_map(&map_a, a.data, k, m, a.row, tile.bk, a_rows) &&
      (b_kmajor ? make_map(&map_b, b.data, k, n, b.col, tile.bk, bn / b_part)
                : make_map(&map_b, b.data, n, k, b.row, bn, tile.bk / b_part,
                           bn == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B));
  if (!mapped) return "matmul: could not encode a TMA tensor map (cuTensorMapEncodeTiled)";
  LaunchConfig config{static_cast<unsigned>(blocks), static_cast<unsigned>(tile.threads),
                      static_cast<unsigned>(tile.smem)};
  if (pair != kNarrowAlone) config.cluster = Dim3{2, 1, 1};
  return narrow_kernel<T>(b_kmajor, bn, rows == 128)
      .launch(config, stream, map_a, map_b, c, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), pair);
}
WB_INSTANTIATE(WB_REDUCED, matmul_wgmma_narrow)

}  // namespace wb::matmul
