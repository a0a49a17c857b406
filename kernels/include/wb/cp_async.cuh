// wb/cp_async.cuh: asynchronous 16-byte copies of global memory into shared memory (cp.async,
// sm_80+), in groups a thread closes and waits on, for kernels that stage their input in shared
// memory without holding it in registers:
//   wb::copy_async16(dst, src)        16 bytes from global src to this block's shared dst, not
//                                     through L1 (both 16-byte aligned)
//   wb::copy_async_commit()           closes the thread's group of copies issued since the last
//   wb::copy_async_wait<Pending>()    until at most Pending of the thread's latest groups are in
//                                     flight (the earlier ones have landed and are seen by it)
#pragma once

#include "wb/types.h"

namespace wb {

__device__ __forceinline__ void copy_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
#endif
}
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int Pending>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
#endif
}

}  // namespace wb
