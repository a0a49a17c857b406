// wb_defer.h: a registration block of any library type, deferred to wbc_register().
//
// wb_compat_stable.h records STABLE_TORCH_LIBRARY blocks through this (it must not include
// <torch/library.h>); bindings/compat/deferred.cpp makes them in wbc_register() beside the
// TORCH_LIBRARY blocks, and drops them in wbc_unregister().
#pragma once

#include <cstdint>

namespace wb::compat {

using OpaqueMake = void* (*)(const void* block);  // makes the block's library; throws on error
using OpaqueDrop = void (*)(void* library);       // unregisters it

// rank: 0 a definition, 1 a fragment, 2 kernels (definitions are made first).
__attribute__((visibility("hidden"))) void defer_opaque(int rank, const char* ns, OpaqueMake make,
                                                        OpaqueDrop drop, const void* block);

}  // namespace wb::compat
