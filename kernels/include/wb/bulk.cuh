// wb/bulk.cuh: bulk copies of global memory into shared memory that complete on an mbarrier
// (sm_90+), for kernels that stream their input through a ring of shared-memory stages:
//   wb::smem_addr(p)                      a shared-memory pointer as the 32-bit address PTX expects
//   wb::mbar_init(bar, count)             an mbarrier whose phase completes after `count` arrivals
//   wb::mbar_expect(bar, bytes)           the calling thread's arrival, announcing `bytes` more
//                                         that bulk copies complete on bar
//   wb::mbar_wait(bar, parity)            until the phase of bar with this parity has completed
//   wb::bulk_load(dst, src, bytes, bar)   bytes (a multiple of 16) from global src (16-byte
//                                         aligned) to this block's shared dst, counted on bar
// Defined for the host pass and for device code of sm_90 or later.
#pragma once

#include "wb/types.h"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
namespace wb {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

}  // namespace wb
#endif
