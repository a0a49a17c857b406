// wb/dtypes.h: named dtype sets and the macro that instantiates a kernel launcher for a set.
//
// A dtype set is an X-macro: WB_FLOATING(X, ...) expands X(T, ...) once per scalar type T.
// Kernel TUs use a set to instantiate their launcher template; bindings use the same set to
// dispatch a torch dtype to T (WB_DISPATCH in wb/binding.h), so the two sides cannot disagree.
//
// Usage, in a kernel TU, after the launcher template is defined:
//
//   template <typename T>
//   wb::Status scale_cuda(const T* x, double s, T* out, int64_t n, wb::Stream stream) { ... }
//   WB_INSTANTIATE(WB_FLOATING, scale_cuda)
#pragma once

#include "wb/types.h"

#define WB_FLOAT32(X, ...) X(float, __VA_ARGS__)
#define WB_FLOAT64(X, ...) X(double, __VA_ARGS__)
#define WB_REDUCED(X, ...) X(::wb::f16, __VA_ARGS__) X(::wb::bf16, __VA_ARGS__)
#define WB_FLOAT32_64(X, ...) WB_FLOAT32(X, __VA_ARGS__) WB_FLOAT64(X, __VA_ARGS__)
#define WB_FLOATING(X, ...) WB_FLOAT32_64(X, __VA_ARGS__) WB_REDUCED(X, __VA_ARGS__)

#define WB_INSTANTIATE_ONE_(T, FN) template decltype(FN<T>) FN<T>;

// Explicitly instantiates the function template FN for every scalar type in the set SET.
#define WB_INSTANTIATE(SET, FN) SET(WB_INSTANTIATE_ONE_, FN)
