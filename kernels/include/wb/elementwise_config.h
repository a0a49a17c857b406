// wb/elementwise_config.h: the elementwise launcher's parameters, shared by its device body
// (wb/elementwise_device.cuh) and its two launchers (wb/elementwise.cuh, which nvcc compiles with
// the kernel, and wb/elementwise_launch.h, which launches a device-only TU's kernel). No CUDA or
// torch header: NVRTC compiles it too.
#pragma once

#include "wb/types.h"

// The tuning parameters; the defaults are the measured launcher.
#ifndef WB_TUNE_THREADS
#define WB_TUNE_THREADS 128  // threads per block
#endif
#ifndef WB_TUNE_VECS
#define WB_TUNE_VECS 2  // vectors (elements on the scalar path) per thread and input
#endif
#ifndef WB_TUNE_L1
#define WB_TUNE_L1 0  // the L1 policy of vector loads: kL1BySize (the values are below)
#endif

namespace wb {
namespace detail {

constexpr int kThreads = WB_TUNE_THREADS;
constexpr int kVecs = WB_TUNE_VECS;
static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024,
              "WB_TUNE_THREADS: a multiple of 32 from 32 to 1024");
static_assert(kVecs >= 1 && kVecs <= 8, "WB_TUNE_VECS: 1 to 8");

// The values of WB_TUNE_L1: how the 16-byte vector loads treat L1 (scalar loads never skip it).
constexpr int kL1BySize = 0;  // skip L1 when the launch moves at most 1.5x the L2 (skip_l1)
constexpr int kL1Skip = 1;    // skip L1 at any size: ld.global.nc.L1::no_allocate
constexpr int kL1Keep = 2;    // never skip L1: plain ld.global.nc at any size (version 4)
constexpr int kL1 = WB_TUNE_L1;
static_assert(kL1 == kL1BySize || kL1 == kL1Skip || kL1 == kL1Keep,
              "WB_TUNE_L1: 0 (by size), 1 (always skip L1) or 2 (never skip L1)");

// Elements per launch: indices in a launch fit in 32 bits with room to spare, and the count is
// a multiple of every vector's length, so the pointers of the next launch keep their 16-byte
// alignment (and of every block's work where kThreads and kVecs are powers of two, so each
// launch but the last then covers whole blocks).
constexpr int64_t kLaunchItems = int64_t{1} << 30;

// One block per kThreads * kVecs * N elements (at most 2^30 / 32 = 2^25 blocks for a launch).
template <int N>
inline int grid(int n) {
  return (n + kThreads * kVecs * N - 1) / (kThreads * kVecs * N);
}

// Whether a launch that reads and writes `bytes` in all should skip L1 for its loads.
inline bool skip_l1(int64_t bytes, int64_t l2) { return 2 * bytes <= 3 * l2; }

}  // namespace detail
}  // namespace wb
