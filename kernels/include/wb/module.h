// wb/module.h: host launchers of kernels that live in a device-only TU (*.kernel.cu).
//
// A family's kernels can live in a file named NAME.kernel.cu that holds device code only. The
// workbench compiles it on its own (NVRTC, to a cubin per GPU architecture) and the library
// loads the cubin as a module, so an edit that touches only that file reloads by swapping the
// module in the running library: no host compile, no link, no dlopen. The host launcher (in the
// family's ordinary .cu) names each kernel it launches, template arguments included:
//
//   // scale.cu: the host launcher
//   WB_DEVICE_TEMPLATE(kScale, "scale.kernel.cu", "wb::scale::scale_kernel");
//
//   template <typename T>
//   Status scale_cuda(const T* x, float s, T* out, int64_t n, Stream stream) {
//     const wb::DeviceKernel& k = wb::kernel<&kScale, wb::Val<4>, T>;  // scale_kernel<4, float>
//     return k.launch({grid, 128}, stream, static_cast<int>(n), s, out, x);
//   }
//
// wb::kernel<&K, A...> is a variable template: every instantiation the launchers use is named
// when the library is loaded (before any call), and the workbench compiles exactly those
// instantiations (NVRTC name expressions). Template arguments: wb::Val<V> for a value (an integer
// or a bool), or a type: the scalar types (float, double, wb::f16, wb::bf16, the integer types),
// or a type named with WB_DEVICE_TYPE_NAME(ns::Type); at global scope.
//
// A device-only TU may also define values its launchers read, for what the host must know of how
// the kernels were compiled (a tile's size, its shared memory): `__constant__ Shape shape = {..};`
// in the TU, and wb::global<&kShape>.read(&value) on the host, where kShape names it like a kernel
// template. The value is read once per device and module (after a swap, the new module's).
//
// Each argument of launch() is passed as the kernel parameter at its position, by its bytes: the
// types must be the kernel's own (an int64_t for an int parameter is a different size). The
// first launch of each kernel checks the size of each argument against the kernel's parameter at
// its position (a missing parameter included) and fails with both listed when they differ; a
// launch with fewer arguments than the kernel has parameters is not caught.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "wb/types.h"

namespace wb {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT
};

// What a launch needs besides its arguments. cluster: thread-block cluster dimensions (sm_90);
// {0} for none.
struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  unsigned smem = 0;  // dynamic shared memory in bytes (above 48 KiB is opted into per kernel)
  Dim3 cluster{0, 0, 0};
  int carveout = -1;  // percent of L1 + shared memory preferred as shared; -1: the driver's choice
};

// What DeviceKernel::attribute reads: the driver's CU_FUNC_ATTRIBUTE_* of the same number.
enum class KernelAttr : int {
  max_threads = 0,  // the most threads a block may have (the kernel's launch bounds)
  static_smem = 1,  // bytes of static shared memory
  local_bytes = 3,  // bytes of local memory per thread (spills)
  num_regs = 4,     // registers per thread
};

// A kernel template of a device-only TU: the file (relative to the family's folder) and the
// template's qualified name. Declare one with WB_DEVICE_TEMPLATE.
struct DeviceTemplate {
  const char* file;
  const char* name;
};
#define WB_DEVICE_TEMPLATE(var, file, name) \
  static constexpr ::wb::DeviceTemplate var { file, name }

// A template argument that is a value: wb::Val<4>, wb::Val<true>.
template <auto V>
struct Val {};

namespace detail {

struct KernelSlot;  // defined by the library (bindings/registry.cpp)

// Registers the kernel `expression` of device TU `file`; called while the library loads.
KernelSlot* register_kernel(const char* file, std::string expression);

Status launch_kernel(KernelSlot* slot, const LaunchConfig& config, Stream stream, void** args,
                     const size_t* sizes, int count);
Status kernel_attribute(KernelSlot* slot, KernelAttr attribute, int* value);
Status read_global(KernelSlot* slot, void* out, size_t size);

template <typename T>
struct TypeName {
  static_assert(sizeof(T) == 0,
                "name this type for device kernels: WB_DEVICE_TYPE_NAME(ns::Type); at global "
                "scope, or pass wb::Val<V> for a value");
};

template <typename A>
struct IsVal : std::false_type {};
template <auto V>
struct IsVal<Val<V>> : std::true_type {
  static std::string text() {
    using U = decltype(V);
    static_assert(std::is_integral_v<U>, "wb::Val takes integers and bools");
    if constexpr (std::is_same_v<U, bool>) {
      return V ? "true" : "false";
    } else if constexpr (std::is_signed_v<U>) {
      return std::to_string(static_cast<long long>(V));
    } else {
      return std::to_string(static_cast<unsigned long long>(V));
    }
  }
};

template <typename A>
std::string one_arg() {
  if constexpr (IsVal<A>::value) {
    return IsVal<A>::text();
  } else {
    return TypeName<A>::value;
  }
}

template <typename... A>
std::string expression(const char* name) {
  std::string text = name;
  if constexpr (sizeof...(A) > 0) {
    text += '<';
    ((text += one_arg<A>(), text += ','), ...);
    text.back() = '>';
  }
  return text;
}

}  // namespace detail

#define WB_DEVICE_TYPE_NAME(type)               \
  template <>                                   \
  struct wb::detail::TypeName<type> {           \
    static constexpr const char* value = #type; \
  }

// One instantiation of a device kernel template, launched through the module the workbench
// loaded for its file (see the top of this file).
class DeviceKernel {
 public:
  DeviceKernel(const DeviceTemplate* t, std::string expression)
      : slot_(detail::register_kernel(t->file, std::move(expression))) {}

  template <typename... Args>
  Status launch(const LaunchConfig& config, Stream stream, const Args&... args) const {
    static_assert((std::is_trivially_copyable_v<Args> && ...),
                  "kernel arguments are copied by their bytes: pass trivially copyable values");
    void* pointers[] = {const_cast<void*>(static_cast<const void*>(&args))..., nullptr};
    const size_t sizes[] = {sizeof(Args)..., 0};
    return detail::launch_kernel(slot_, config, stream, pointers, sizes,
                                 static_cast<int>(sizeof...(Args)));
  }

  // The kernel's attribute on the current device, as loaded from the live module.
  Status attribute(KernelAttr a, int* value) const {
    return detail::kernel_attribute(slot_, a, value);
  }

 private:
  detail::KernelSlot* slot_;
};

// A variable of a device-only TU (a __constant__ or __device__ one), read by the host.
class DeviceGlobal {
 public:
  DeviceGlobal(const DeviceTemplate* t, std::string expression)
      : slot_(detail::register_kernel(t->file, "&" + std::move(expression))) {}

  // Copies the variable's value, as the live module on the current device holds it, into *out;
  // its size must be the variable's.
  template <typename T>
  Status read(T* out) const {
    static_assert(std::is_trivially_copyable_v<T>, "read a trivially copyable type");
    return detail::read_global(slot_, out, sizeof(T));
  }

 private:
  detail::KernelSlot* slot_;
};

// The variable K (or K<A...>, for a variable template) of a device-only TU.
template <const DeviceTemplate* K, typename... A>
inline const DeviceGlobal global{K, detail::expression<A...>(K->name)};

// The instantiation K<A...> of a device kernel template: wb::kernel<&kScale, wb::Val<4>, float>.
template <const DeviceTemplate* K, typename... A>
inline const DeviceKernel kernel{K, detail::expression<A...>(K->name)};

}  // namespace wb

// The scalar types' names (the integer types by their C++ names: int64_t is long here).
WB_DEVICE_TYPE_NAME(float);
WB_DEVICE_TYPE_NAME(double);
WB_DEVICE_TYPE_NAME(wb::f16);
WB_DEVICE_TYPE_NAME(wb::bf16);
WB_DEVICE_TYPE_NAME(bool);
WB_DEVICE_TYPE_NAME(signed char);
WB_DEVICE_TYPE_NAME(unsigned char);
WB_DEVICE_TYPE_NAME(short);
WB_DEVICE_TYPE_NAME(int);
WB_DEVICE_TYPE_NAME(unsigned int);
WB_DEVICE_TYPE_NAME(long);
WB_DEVICE_TYPE_NAME(long long);
