// wb/types.h: the scalar types and the stream handle that kernel TUs see.
//
// No torch header and no CUDA header is needed to use this file, so a kernel TU that includes it
// compiles in about half a second. f16 and bf16 are 2-byte storage types with the same layout as
// c10::Half / __half and c10::BFloat16 / __nv_bfloat16; kernels compute on them in float through
// to_acc() / from_acc<T>(), which round to nearest even exactly as PyTorch does. On the device the
// conversions are single PTX instructions, so CUDA TUs need not include cuda_fp16.h and
// cuda_bf16.h (about 0.6 s of every nvcc run).
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC (device-only TUs, *.kernel.cu) has no C++ library headers: the fixed-width integer
// types of an LP64 host, as <cstdint> defines them, so host and device code agree on names.
using int8_t = signed char;
using int16_t = short;
using int32_t = int;
using int64_t = long;
using uint8_t = unsigned char;
using uint16_t = unsigned short;
using uint32_t = unsigned int;
using uint64_t = unsigned long;
using uintptr_t = unsigned long;
#else
#include <cstdint>
#include <cstring>
#endif

#if defined(__CUDACC__)
#define WB_HD __host__ __device__ __forceinline__
#else
#define WB_HD inline
#endif

namespace wb {

struct alignas(2) f16 {
  uint16_t bits;
};
struct alignas(2) bf16 {
  uint16_t bits;
};

// A cudaStream_t on CUDA; unused by CPU kernels.
using Stream = void*;

// What a launcher returns: nullptr on success, else the CUDA error text (a static string).
using Status = const char*;

// The accumulator type of a scalar type: float for the 2-byte types and float, double for double.
template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
template <typename T>
using acc_t = typename Acc<T>::type;

// The smaller of two values, for launch arithmetic: std::min's <algorithm> adds about 5,000
// lines to every nvcc run's host and device passes.
template <typename T>
constexpr T min_of(T a, T b) {
  return b < a ? b : a;
}

#if !defined(__CUDACC_RTC__)  // host conversions: NVRTC compiles device code only
namespace detail {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// IEEE half -> float, exact (subnormals, inf and NaN included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    exp = 113;  // renormalise a subnormal: 127 - 15 + 1
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    return bits_to_float(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// float -> IEEE half, round to nearest even; the algorithm c10::Half uses (FP16 library, MIT).
inline uint16_t float_to_half(float f) {
  const float scale_to_inf = bits_to_float(0x77800000u);   // 2^112
  const float scale_to_zero = bits_to_float(0x08800000u);  // 2^-110
  float base = ((f < 0 ? -f : f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = float_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

// float -> bfloat16, round to nearest even; NaN stays a quiet NaN (as c10::BFloat16).
inline uint16_t float_to_bf16(float f) {
  if (f != f) return 0x7fc0u;
  const uint32_t u = float_to_bits(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace detail
#endif

WB_HD float to_acc(float x) { return x; }
WB_HD double to_acc(double x) { return x; }
WB_HD float to_acc(f16 x) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
#else
  return detail::half_to_float(x.bits);
#endif
}
WB_HD float to_acc(bf16 x) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
#else
  return detail::bits_to_float(static_cast<uint32_t>(x.bits) << 16);
#endif
}

template <typename T>
WB_HD T from_acc(acc_t<T> v) {
  return static_cast<T>(v);
}
template <>
WB_HD f16 from_acc<f16>(float v) {
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return f16{h};
#else
  return f16{detail::float_to_half(v)};
#endif
}
template <>
WB_HD bf16 from_acc<bf16>(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return bf16{h};
#elif defined(__CUDA_ARCH__)  // no bf16 conversion instruction before sm_80
  if (v != v) return bf16{0x7fc0u};
  const uint32_t u = __float_as_uint(v);
  return bf16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
#else
  return bf16{detail::float_to_bf16(v)};
#endif
}

}  // namespace wb
