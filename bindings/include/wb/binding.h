// wb/binding.h: the torch-aware half of the registry, for host TUs under bindings/.
//
//   WB_DEF("muladd(Tensor a, Tensor b, float c) -> Tensor");   // declare an op's schema
//   WB_IMPL(CPU, m) { m.impl("muladd", &muladd_cpu); }        // its kernel for a dispatch key
//   WB_DISPATCH(WB_FLOATING, x.scalar_type(), "scale", "x", [&] { run<scalar_t>(...); });
//
// Nothing here touches the dispatcher while the library loads. The driver reads the schemas
// (wb_describe), defines them once per process from Python, and then calls
// wb_register(ns) to add this build's kernels and wb_unregister() before the library is closed,
// so an edited build replaces the old one under the same torch.ops.<ns>.<op> name.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <initializer_list>
#include <string>

#include "wb/dtypes.h"

namespace wb {

template <typename T>
struct TorchDtype;
template <>
struct TorchDtype<float> {
  static constexpr c10::ScalarType value = c10::ScalarType::Float;
};
template <>
struct TorchDtype<double> {
  static constexpr c10::ScalarType value = c10::ScalarType::Double;
};
template <>
struct TorchDtype<f16> {
  static constexpr c10::ScalarType value = c10::ScalarType::Half;
};
template <>
struct TorchDtype<bf16> {
  static constexpr c10::ScalarType value = c10::ScalarType::BFloat16;
};

// A typed pointer to a tensor's data as the kernel's scalar type (f16 for Half, ...).
template <typename T>
T* data(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

[[noreturn]] inline void unsupported_dtype(const char* op, const char* arg, c10::ScalarType got,
                                           std::initializer_list<c10::ScalarType> supported) {
  std::string names;
  for (auto s : supported) names += std::string(names.empty() ? "" : ", ") + c10::toString(s);
  TORCH_CHECK_TYPE(false, op, ": ", arg, " has dtype ", got,
                   ", which is not supported; expected one of ", names);
  __builtin_unreachable();
}

inline void check_same_dtype(const char* op, const char* ref_name, const at::Tensor& ref,
                             const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": expected ", name,
                   " to have the same dtype as ", ref_name, " (", ref.scalar_type(), "), got ",
                   t.scalar_type());
}

inline void check_same_shape(const char* op, const char* ref_name, const at::Tensor& ref,
                             const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.sizes() == ref.sizes(), op, ": expected ", name, " to have the same shape as ",
              ref_name, " ", ref.sizes(), ", got ", t.sizes());
}

inline void check_device(const char* op, const char* name, const at::Tensor& t,
                         c10::Device expected) {
  TORCH_CHECK(t.device() == expected, op, ": expected ", name, " on ", expected, ", got ", name,
              " on ", t.device(), "; move all tensor arguments to one device");
}

namespace detail {

using ImplFn = void (*)(torch::Library&);
void add_schema(const char* schema);
void add_impl(c10::DispatchKey key, ImplFn fn, const char* file, uint32_t line);

struct SchemaRegistrar {
  explicit SchemaRegistrar(const char* schema) { add_schema(schema); }
};
struct ImplRegistrar {
  ImplRegistrar(c10::DispatchKey key, ImplFn fn, const char* file, uint32_t line) {
    add_impl(key, fn, file, line);
  }
};

}  // namespace detail
}  // namespace wb

#define WB_CONCAT_(a, b) a##b
#define WB_CONCAT(a, b) WB_CONCAT_(a, b)

// Declares an operator schema; the namespace is chosen at load time.
#define WB_DEF(SCHEMA) static ::wb::detail::SchemaRegistrar WB_CONCAT(wb_def_, __COUNTER__)(SCHEMA)

// Opens a block that registers kernels for one dispatch key (CPU, CUDA, ...) on `m`.
#define WB_IMPL(KEY, m) WB_IMPL_(KEY, m, WB_CONCAT(wb_impl_, __COUNTER__))
#define WB_IMPL_(KEY, m, UID)                                                                \
  static void UID(torch::Library&);                                                          \
  static ::wb::detail::ImplRegistrar WB_CONCAT(UID, _registrar)(c10::DispatchKey::KEY, &UID, \
                                                                __FILE__, __LINE__);         \
  static void UID(torch::Library& m)

#define WB_DISPATCH_CASE_(T, ...)    \
  case ::wb::TorchDtype<T>::value: { \
    using scalar_t = T;              \
    return __VA_ARGS__();            \
  }
#define WB_DTYPE_ENUM_(T, ...) ::wb::TorchDtype<T>::value,

// Calls the lambda with `scalar_t` bound to the kernel scalar type of DTYPE, for DTYPE in SET;
// any other dtype raises a TypeError naming OP, the argument ARG and the supported dtypes.
#define WB_DISPATCH(SET, DTYPE, OP, ARG, ...)                                 \
  [&] {                                                                       \
    const ::c10::ScalarType wb_dtype_ = (DTYPE);                              \
    switch (wb_dtype_) {                                                      \
      SET(WB_DISPATCH_CASE_, __VA_ARGS__)                                     \
      default:                                                                \
        ::wb::unsupported_dtype(OP, ARG, wb_dtype_, {SET(WB_DTYPE_ENUM_, )}); \
    }                                                                         \
  }()
