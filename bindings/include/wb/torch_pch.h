// wb/torch_pch.h: the torch headers every binding TU includes, precompiled once per toolchain.
//
// Binding TUs are compiled with `-include wb/torch_pch.h` and, first on their include path, a
// folder of the cache that holds only `wb/torch_pch.h.gch` (workbench/config.py). GCC takes the
// precompiled header where it finds a usable one and this text otherwise, so a compile that has
// none (a machine that fetches its objects through a compiler launcher, or clang) still builds,
// and the preprocessed text, which sccache hashes, never names a folder of the cache.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#ifdef WB_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
