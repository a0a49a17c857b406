// softmax/softmax_exp.cuh: the exponentials of softmax's long-row paths for float16 and bfloat16,
// where a thread holds its share of a row as loaded and takes exp twice an element (once for
// the row's sum, once for the output: softmax.cu's Forward::partial / store, take / out).
//
// WB_SOFTMAX_EXP picks how (read at each launch; float64 ignores it, and float32 reads only
// whether it is keep, on the wide path: Forward::keep keeps exp(x - m) in x's registers, any
// other value takes exp twice an element):
//   twice             exp(x - m) as __expf: a subtraction, a multiplication by log2(e) and an
//                     ex2.approx (MUFU) an element, each time.
//   fma               2^(x * log2(e) - c) with c = m * log2(e) for the sum (one FFMA and one
//                     MUFU an element), and c = M * log2(e) + log2(S) for the output, so that
//                     exp(x - M) / S needs no multiplication; the max of a pair of 16-bit values
//                     one instruction (max.bf16x2 / max.f16x2) and the output pairs packed by
//                     one conversion (cvt.rn.bf16x2.f32). Where |c| is 2^11 or more, or c is
//                     not finite (a row holding +Inf or NaN, only -Inf, or values past 2.3e38,
//                     where m * log2(e) overflows), the element takes twice's formula, so
//                     special rows come out as torch gives them, and the exponent's error from
//                     rounding c, |c| * 2^-24, stays below 8.5e-5 relative (bfloat16 rounds to
//                     4e-3, float16 to 5e-4). The default before keep: on an H100, 2026-11-26,
//                     the bfloat16 forward's share of a copy of the same bytes at 1024x65536,
//                     256x65536 and 64x262144 went 82 / 71 / 61% (twice) to 89 / 77 / 69% (fma;
//                     poly 87 / 74 / 67%). float16's default (and keep's, where it keeps nothing).
//   poly              fma, with every other exponential of the sum on the FMA pipe (ex2_poly: a
//                     degree-4 polynomial, 5.3e-6 relative), so that the forward of 2-byte rows,
//                     bound by its exponentials, shares them between the MUFU (16 lanes an SM)
//                     and the FMA pipe (128 lanes).
//   keep (or unset)   bfloat16 on the wide path (softmax.cu's Forward::keep): fma's sum, each
//                     exponential e = 2^(x * log2(e) - c) also kept as float16 (times 2^15) in
//                     the register that held its x, and the output e * 2^(c - M * log2(e)) / S
//                     from it: one exponential an element instead of two, the MUFU's load
//                     halved. Only where every e of the thread is a normal float16 (the thread's
//                     values within kKeepRange binades of its max, so 11 bits of e survive and
//                     the output is within 0.625 ulp of bfloat16, against 0.5), and c is
//                     usable; else the thread takes fma's (or twice's) formula. float16 output
//                     would lose half an ulp to the kept rounding: float16 and the other paths
//                     take fma. On H100s, 2026-11-28, against fma: 0-3.5% less time at those
//                     three sizes, never more (bench/results/kernels.md, the seventeenth pass).
#pragma once

#include <cstdlib>
#include <cstring>

#include "wb/cuda_host.h"
#include "wb/device.cuh"

namespace wb::softmax {

enum ExpMode : int { kExpTwice = 0, kExpFma = 1, kExpPoly = 2, kExpKeep = 3 };

// WB_SOFTMAX_EXP as an ExpMode; -1 for a value other than the four (kBadExp names it).
inline int exp_mode() {
  const char* v = wb::detail::env("WB_SOFTMAX_EXP").data();
  if (*v == '\0' || std::strcmp(v, "keep") == 0) return kExpKeep;
  if (std::strcmp(v, "fma") == 0) return kExpFma;
  if (std::strcmp(v, "twice") == 0) return kExpTwice;
  if (std::strcmp(v, "poly") == 0) return kExpPoly;
  return -1;
}

constexpr const char* kBadExp = "WB_SOFTMAX_EXP: expected keep, fma, poly or twice (or unset)";

// keep: a thread keeps its exponentials where its values span at most this many binades below
// its max (x * log2(e) - c >= -kKeepRange): each e * 2^15 is then at least 2^-14 (float16's
// smallest normal), with a binade to spare for the rounding of c and of the product.
constexpr float kKeepRange = 28.0f;
constexpr float kKeepScale = 15.0f;  // e * 2^15 <= 2^15, below float16's largest (65504)

constexpr float kLog2e = 1.4426950408889634f;

// Whether T's pairs take the packed instructions: 2-byte T read in 16-byte vectors, on sm_80+.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr bool kPackedArch = false;
#else
constexpr bool kPackedArch = true;
#endif
template <typename T, int N>
constexpr bool kPairs = kPackedArch && sizeof(T) == 2 && N % 2 == 0;

// 2^t, ex2.approx.ftz (MUFU): 2 ulp, 0 below 2^-126.
__device__ __forceinline__ float ex2(float t) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
  return e;
}

// 2^t, ex2.approx (MUFU) with subnormal results kept: for a factor that scales other values.
__device__ __forceinline__ float ex2_subnormal(float t) {
  float e;
  asm("ex2.approx.f32 %0, %1;" : "=f"(e) : "f"(t));
  return e;
}

// 2^t for t <= 1/2 (or NaN) on the FMA pipe: t = j + f with j = round(t), |f| <= 1/2, 2^f by a
// degree-4 polynomial (fitted to 2^f on [-1/2, 1/2]; 5.3e-6 relative in float arithmetic), times
// 2^j made from j's bits. t below -126 (-Inf included) gives about 2^-126 rather than 0: for a
// sum only. NaN stays NaN (max.NaN keeps it, and NaN * 2^j is NaN).
__device__ __forceinline__ float ex2_poly(float t) {
  constexpr float kShift = 12582912.0f + 127.0f;  // 1.5 * 2^23, plus the exponent bias
  float c = t;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(c) : "f"(t), "f"(-126.0f));
#else
  c = t < -126.0f ? -126.0f : t;
#endif
  const float r = __fadd_rn(c, kShift);  // its low 9 bits: j + 127
  const float f = __fsub_rn(c, __fsub_rn(r, kShift));
  float p = 0.009570376076220286f;
  p = fmaf(p, f, 0.05591872408717647f);
  p = fmaf(p, f, 0.24024745180557944f);
  p = fmaf(p, f, 0.6931216862906645f);
  p = fmaf(p, f, 0.9999992576914973f);
  return p * __uint_as_float(__float_as_uint(r) << 23);  // 2^j: (j + 127) << 23
}

// Word w (elements 2w, 2w + 1) of a held vector of a 2-byte type.
template <typename T, int N>
__device__ __forceinline__ uint32_t word_of(const Vec<T, N>& v, int w) {
  uint32_t word;
  __builtin_memcpy(&word, &v.v[2 * w], sizeof word);
  return word;
}

// Half `hi` (0: element 2w, 1: 2w + 1) of a word of T as float.
__device__ __forceinline__ float half_of(bf16, uint32_t word, int hi) {
  return __uint_as_float(hi ? word & 0xffff0000u : word << 16);
}
__device__ __forceinline__ float half_of(f16, uint32_t word, int hi) {
  return to_acc(f16{static_cast<uint16_t>(hi ? word >> 16 : word & 0xffffu)});
}

// The larger of each half of two words (a NaN half loses, as in fmax), and -Inf in both halves.
__device__ __forceinline__ uint32_t pair_max(bf16, uint32_t a, uint32_t b) {
  uint32_t d = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#endif
  return d;
}
__device__ __forceinline__ uint32_t pair_max(f16, uint32_t a, uint32_t b) {
  uint32_t d = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#endif
  return d;
}
// The smaller of each half of two words (a NaN half loses), for keep's span of a thread's values.
__device__ __forceinline__ uint32_t pair_min(bf16, uint32_t a, uint32_t b) {
  uint32_t d = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#endif
  return d;
}
__host__ __device__ constexpr uint32_t pair_pos_inf(bf16) { return 0x7f807f80u; }
__host__ __device__ constexpr uint32_t pair_neg_inf(bf16) { return 0xff80ff80u; }
__host__ __device__ constexpr uint32_t pair_neg_inf(f16) { return 0xfc00fc00u; }

// Two floats rounded to nearest even into a word of T: lo is element 2w, hi 2w + 1.
__device__ __forceinline__ uint32_t pair_of(bf16, float lo, float hi) {
  uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#endif
  return d;
}
__device__ __forceinline__ uint32_t pair_of(f16, float lo, float hi) {
  uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#endif
  return d;
}

// The max of a vector's elements (-Inf for none), pairwise.
template <typename T, int N>
__device__ __forceinline__ uint32_t vec_pair_max(uint32_t m, const Vec<T, N>& v) {
#pragma unroll
  for (int w = 0; w < N / 2; ++w) m = pair_max(T{}, m, word_of(v, w));
  return m;
}
template <typename T>
__device__ __forceinline__ float pair_final_max(uint32_t m) {
  return fmaxf(half_of(T{}, m, 0), half_of(T{}, m, 1));
}
template <typename T, int N>
__device__ __forceinline__ uint32_t vec_pair_min(uint32_t m, const Vec<T, N>& v) {
#pragma unroll
  for (int w = 0; w < N / 2; ++w) m = pair_min(T{}, m, word_of(v, w));
  return m;
}
template <typename T>
__device__ __forceinline__ float pair_final_min(uint32_t m) {
  return fminf(half_of(T{}, m, 0), half_of(T{}, m, 1));
}

// sum 2^(x * log2(e) - c) over a vector's elements; Poly: the odd ones by ex2_poly.
template <bool Poly, typename T, int N>
__device__ __forceinline__ float vec_exp2_sum(const Vec<T, N>& v, float c) {
  float sum = 0;
#pragma unroll
  for (int w = 0; w < N / 2; ++w) {
    const uint32_t word = word_of(v, w);
    sum += ex2(fmaf(half_of(T{}, word, 0), kLog2e, -c));
    const float t = fmaf(half_of(T{}, word, 1), kLog2e, -c);
    sum += Poly ? ex2_poly(t) : ex2(t);
  }
  return sum;
}

// keep: sum 2^(x * log2(e) - c) over a vector's elements (c: the thread's max * log2(e) less
// kKeepScale), each also rounded to float16 in place of its x (v then holds float16 words).
template <typename T, int N>
__device__ __forceinline__ float vec_exp2_keep(Vec<T, N>& v, float c) {
  float sum = 0;
#pragma unroll
  for (int w = 0; w < N / 2; ++w) {
    const uint32_t word = word_of(v, w);
    const float lo = ex2(fmaf(half_of(T{}, word, 0), kLog2e, -c));
    const float hi = ex2(fmaf(half_of(T{}, word, 1), kLog2e, -c));
    sum += lo;
    sum += hi;
    const uint32_t kept = pair_of(f16{}, lo, hi);
    __builtin_memcpy(&v.v[2 * w], &kept, sizeof kept);
  }
  return sum;
}

// The vector whose word w is out(word w of v): a pair of 2-byte elements mapped to a pair of T.
template <typename T, int N, typename Out>
__device__ __forceinline__ Vec<T, N> map_words(const Vec<T, N>& v, Out out) {
  Vec<T, N> o;
#pragma unroll
  for (int w = 0; w < N / 2; ++w) {
    const uint32_t word = out(word_of(v, w));
    __builtin_memcpy(&o.v[2 * w], &word, sizeof word);
  }
  return o;
}

// keep: the vector of kept float16 exponentials times f, rounded to T.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> vec_kept_out(const Vec<T, N>& v, float f) {
  return map_words(v, [f](uint32_t word) {
    return pair_of(T{}, half_of(f16{}, word, 0) * f, half_of(f16{}, word, 1) * f);
  });
}

// The vector of 2^(x * log2(e) - c), rounded to T.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> vec_exp2(const Vec<T, N>& v, float c) {
  return map_words(v, [c](uint32_t word) {
    return pair_of(T{}, ex2(fmaf(half_of(T{}, word, 0), kLog2e, -c)),
                   ex2(fmaf(half_of(T{}, word, 1), kLog2e, -c)));
  });
}

}  // namespace wb::softmax
