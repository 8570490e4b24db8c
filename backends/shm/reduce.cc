// CPU reduction kernels. Layout:
//  - bit-exact, branch-free 16-bit <-> float conversions (inline, so that the
//    block conversion loops vectorize);
//  - elementwise functors (Add, Mul, Min, Max, bitwise, bool logic, scaled
//    add), each a tiny inline call the vectorizer can see through;
//  - loop templates instantiated per element type and functor, inlined into
//    an instruction-set policy: Baseline (the compiler's default target,
//    SSE2 on x86-64) and, on x86-64 CPUs with AVX2 and F16C, Avx2, chosen
//    once at run time. One switch per call, never per element;
//  - the public entry points, which check the (dtype, op) pair once and
//    dispatch.
// Integer SUM/PRODUCT and bitwise ops run on the unsigned view of the buffer
// (two's complement wrap-around without signed-overflow UB); MIN/MAX run on
// the signed type. float16/bfloat16 are widened to float (in blocks of
// kBlock elements, or 16 at a time in AVX2 registers), combined in float and
// rounded back after every step; every path gives the same bits.
#include "backends/shm/reduce.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

// On x86-64, AVX2+F16C kernels are chosen at run time when the CPU has them.
// MUSTER_REDUCE_BASELINE_ONLY leaves them out (the test of the portable
// kernels builds with it).
#if defined(__x86_64__) && !defined(MUSTER_REDUCE_BASELINE_ONLY)
#define MUSTER_REDUCE_AVX2 1
#include <immintrin.h>
// Functions compiled for AVX2+F16C, called only when the CPU has both.
#define MUSTER_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace muster {
namespace {

// ---------------------------------------------------------------------------
// Bit casts and 16-bit conversions.

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// cond ? a : b as mask arithmetic: GCC will not if-convert a ternary whose
// arms contain float operations, and a branch stops vectorization.
inline uint32_t Select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

// binary16 -> binary32, exact. Subnormals are renormalized by a float
// subtraction of two normal numbers, so DAZ/FTZ modes do not affect it.
inline float HalfToFloatInline(uint16_t h) {
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent+mantissa
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = em & 0x0f800000u;       // the 5 exponent bits, shifted
  const uint32_t normal = em + (112u << 23);   // rebias 15 -> 127
  const uint32_t inf_nan = em + (224u << 23);  // exponent 31 -> 255, payload kept
  const uint32_t subnormal =                   // m * 2^-24
      FloatBits(BitsFloat(em + (113u << 23)) - BitsFloat(113u << 23));
  const uint32_t bits = Select(exp == 0x0f800000u, inf_nan, Select(exp == 0, subnormal, normal));
  return BitsFloat(bits | sign);
}

// binary32 -> binary16, round to nearest even; overflow gives inf, NaN stays
// a (quiet) NaN keeping the sign and the top payload bits.
inline uint16_t FloatToHalfInline(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal half: rebias 127 -> 15 and round the 13 dropped bits to even; a
  // carry out of the mantissa correctly bumps the exponent (up to inf).
  const uint32_t normal = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal half (|f| < 2^-14): adding 0.5 makes the float ulp 2^-24, the
  // half subnormal step, so the FPU's round-to-nearest-even does the work.
  const uint32_t subnormal = FloatBits(BitsFloat(a) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const uint32_t big = Select(a > 0x7f800000u, nan, 0x7c00u);
  const uint32_t bits =  // thresholds: 2^16 and 2^-14
      Select(a >= 0x47800000u, big, Select(a < 0x38800000u, subnormal, normal));
  return static_cast<uint16_t>(bits | sign);
}

inline float BFloat16ToFloatInline(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t FloatToBFloat16Inline(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;  // quiet; the truncated payload may be 0
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// Block codecs for the 16-bit types: Decode/Encode convert n <= kBlock
// elements. The portable ones are the scalar conversions above, which GCC
// vectorizes for the baseline ISA (SSE2).
struct HalfCodec {
  static void Decode(const uint16_t* __restrict src, float* __restrict dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloatInline(src[i]);
  }
  static void Encode(const float* __restrict src, uint16_t* __restrict dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalfInline(src[i]);
  }
};

struct BFloat16Codec {
  static void Decode(const uint16_t* __restrict src, float* __restrict dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloatInline(src[i]);
  }
  static void Encode(const float* __restrict src, uint16_t* __restrict dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16Inline(src[i]);
  }
};

// ---------------------------------------------------------------------------
// Elementwise functors. Integer Add/Mul/bitwise are only used on unsigned
// types; the static_cast undoes the promotion of 8-bit operands to int. The
// float functors also take 8 floats at once (__m256) for the AVX2 16-bit
// kernels, with the same semantics.

struct Add {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a + b);
  }
#if defined(MUSTER_REDUCE_AVX2)
  MUSTER_TARGET_AVX2 __m256 operator()(__m256 a, __m256 b) const { return _mm256_add_ps(a, b); }
#endif
};

struct Mul {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a * b);
  }
#if defined(MUSTER_REDUCE_AVX2)
  MUSTER_TARGET_AVX2 __m256 operator()(__m256 a, __m256 b) const { return _mm256_mul_ps(a, b); }
#endif
};

// NaN-propagating min/max (torch.minimum/maximum); `a != a` is false for
// integers and folds away.
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    const T r = a < b ? a : b;  // b when b is NaN
    return a != a ? a : r;
  }
#if defined(MUSTER_REDUCE_AVX2)
  MUSTER_TARGET_AVX2 __m256 operator()(__m256 a, __m256 b) const {
    const __m256 r = _mm256_blendv_ps(b, a, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
    return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
#endif
};

struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    const T r = a > b ? a : b;
    return a != a ? a : r;
  }
#if defined(MUSTER_REDUCE_AVX2)
  MUSTER_TARGET_AVX2 __m256 operator()(__m256 a, __m256 b) const {
    const __m256 r = _mm256_blendv_ps(b, a, _mm256_cmp_ps(a, b, _CMP_GT_OQ));
    return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
#endif
};

struct BitAnd {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a & b);
  }
};

struct BitOr {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a | b);
  }
};

struct BitXor {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a ^ b);
  }
};

// bool: any nonzero byte is true; results are always 0 or 1.
struct BoolOr {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a | b) != 0; }
};

struct BoolAnd {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) & (b != 0); }
};

struct BoolXor {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) ^ (b != 0); }
};

// PREMUL_SUM step: acc + scale * in.
template <typename T>
struct AddScaled {
  T scale;
  T operator()(T a, T b) const { return a + b * scale; }
#if defined(MUSTER_REDUCE_AVX2)
  MUSTER_TARGET_AVX2 __m256 operator()(__m256 a, __m256 b) const {
    return _mm256_add_ps(a, _mm256_mul_ps(b, _mm256_set1_ps(scale)));
  }
#endif
};

// Unary maps for ReduceInit (PREMUL_SUM, bool) and ReduceFinish (AVG).
template <typename T>
struct Scale {
  T scale;
  T operator()(T x) const { return x * scale; }
#if defined(MUSTER_REDUCE_AVX2)
  MUSTER_TARGET_AVX2 __m256 operator()(__m256 x) const {
    return _mm256_mul_ps(x, _mm256_set1_ps(scale));
  }
#endif
};

template <typename T>
struct DivideBy {
  T divisor;
  T operator()(T x) const { return x / divisor; }
#if defined(MUSTER_REDUCE_AVX2)
  MUSTER_TARGET_AVX2 __m256 operator()(__m256 x) const {
    return _mm256_div_ps(x, _mm256_set1_ps(divisor));
  }
#endif
};

struct BoolNormalize {
  uint8_t operator()(uint8_t x) const { return x != 0; }
};

// ---------------------------------------------------------------------------
// Loop templates. The Impl loops are always inlined into an instruction-set
// policy (Baseline, Avx2 below), so that each policy compiles them for its
// own ISA.

constexpr size_t kBlock = 256;

template <typename T, typename Op>
__attribute__((always_inline)) inline void CombineImpl(T* __restrict acc, const T* __restrict in,
                                                       size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) acc[i] = op(acc[i], in[i]);
}

template <typename Codec, typename Op>
__attribute__((always_inline)) inline void Combine16Impl(uint16_t* __restrict acc,
                                                         const uint16_t* __restrict in, size_t n,
                                                         Op op) {
  alignas(64) float a[kBlock];
  alignas(64) float b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    Codec::Decode(acc + base, a, m);
    Codec::Decode(in + base, b, m);
    for (size_t i = 0; i < m; ++i) a[i] = op(a[i], b[i]);
    Codec::Encode(a, acc + base, m);
  }
}

// Each block is decoded completely before it is written, so `out` may equal
// `in`.
template <typename Codec, typename F>
__attribute__((always_inline)) inline void Map16Impl(uint16_t* out, const uint16_t* in, size_t n,
                                                     F f) {
  alignas(64) float a[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    Codec::Decode(in + base, a, m);
    for (size_t i = 0; i < m; ++i) a[i] = f(a[i]);
    Codec::Encode(a, out + base, m);
  }
}

// Native-type maps, used once per reduction (ReduceInit, ReduceFinish), so
// only built for the baseline ISA.
template <typename T, typename F>
void MapRestrict(T* __restrict out, const T* __restrict in, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) out[i] = f(in[i]);
}

template <typename T, typename F>
void MapInPlace(T* x, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) x[i] = f(x[i]);
}

// out[i] = f(in[i]); `out` may equal `in` (ReduceInit's documented alias).
template <typename T, typename F>
void Map(T* out, const T* in, size_t n, F f) {
  if (out == in) {
    MapInPlace(out, n, f);
  } else {
    MapRestrict(out, in, n, f);
  }
}

// An instruction-set policy: Combine (native types), Combine16 and Map16
// (16-bit types, with the policy's Half/BFloat16 codecs). Baseline is the
// compiler's default target (SSE2 on x86-64).
struct Baseline {
  using Half = HalfCodec;
  using BFloat16 = BFloat16Codec;
  template <typename T, typename Op>
  static void Combine(T* acc, const T* in, size_t n, Op op) {
    CombineImpl(acc, in, n, op);
  }
  template <typename Codec, typename Op>
  static void Combine16(uint16_t* acc, const uint16_t* in, size_t n, Op op) {
    Combine16Impl<Codec>(acc, in, n, op);
  }
  template <typename Codec, typename F>
  static void Map16(uint16_t* out, const uint16_t* in, size_t n, F f) {
    Map16Impl<Codec>(out, in, n, f);
  }
};

#if defined(MUSTER_REDUCE_AVX2)
// x86-64 CPUs with AVX2 and F16C (Haswell/Zen and later) get the same loops
// compiled for AVX2, and float16 converts with vcvtph2ps/vcvtps2ph: round to
// nearest even, subnormals kept, NaN quieted keeping the top payload bits --
// bit-identical to the portable FloatToHalf. The unit tests cross-check the
// kernels against the portable scalar conversions on whatever CPU runs them.

// Load16/Store16 convert 16 elements to/from two __m256 (in an order of the
// codec's choosing; Store16 undoes Load16's); Decode/Encode convert any n
// (the tails).
struct HalfCodecF16C {
  static constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  MUSTER_TARGET_AVX2 static __m256 Load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  MUSTER_TARGET_AVX2 static void Store8(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kRound));
  }
  MUSTER_TARGET_AVX2 static void Load16(const uint16_t* p, __m256* lo, __m256* hi) {
    *lo = Load8(p);
    *hi = Load8(p + 8);
  }
  MUSTER_TARGET_AVX2 static void Store16(uint16_t* p, __m256 lo, __m256 hi) {
    Store8(p, lo);
    Store8(p + 8, hi);
  }
  // The tails go through a padded buffer, so they take the same path.
  MUSTER_TARGET_AVX2 static void Decode(const uint16_t* src, float* dst, size_t n) {
    for (; n >= 8; n -= 8, src += 8, dst += 8) _mm256_storeu_ps(dst, Load8(src));
    if (n > 0) {
      uint16_t h[8] = {};
      float f[8];
      std::memcpy(h, src, n * sizeof(uint16_t));
      _mm256_storeu_ps(f, Load8(h));
      std::memcpy(dst, f, n * sizeof(float));
    }
  }
  MUSTER_TARGET_AVX2 static void Encode(const float* src, uint16_t* dst, size_t n) {
    for (; n >= 8; n -= 8, src += 8, dst += 8) Store8(dst, _mm256_loadu_ps(src));
    if (n > 0) {
      float f[8] = {};
      uint16_t h[8];
      std::memcpy(f, src, n * sizeof(float));
      Store8(h, _mm256_loadu_ps(f));
      std::memcpy(dst, h, n * sizeof(uint16_t));
    }
  }
};

// The portable bfloat16 algorithm in AVX2, bit for bit. Load16 puts the
// even-indexed elements in `lo` and the odd-indexed ones in `hi`, which
// takes no shuffles: a bfloat16 is the high half of a float.
struct BFloat16CodecAvx2 {
  MUSTER_TARGET_AVX2 static void Load16(const uint16_t* p, __m256* lo, __m256* hi) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xffff0000u)));
  }
  // Rounds to nearest even; the bfloat16 is the high 16 bits of each lane.
  MUSTER_TARGET_AVX2 static __m256i Round(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    const __m256i nan = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));  // quiet
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, nan, is_nan);
  }
  MUSTER_TARGET_AVX2 static void Store16(uint16_t* p, __m256 lo, __m256 hi) {
    const __m256i even = _mm256_srli_epi32(Round(lo), 16);
    const __m256i odd = Round(hi);  // its low halves are dropped by the blend
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_blend_epi16(even, odd, 0xAA));
  }
  MUSTER_TARGET_AVX2 static void Decode(const uint16_t* __restrict src, float* __restrict dst,
                                        size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloatInline(src[i]);
  }
  MUSTER_TARGET_AVX2 static void Encode(const float* __restrict src, uint16_t* __restrict dst,
                                        size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16Inline(src[i]);
  }
};

// The 16-bit loops convert 16 elements at a time in registers and apply the
// functors' __m256 overloads; the last n % 16 go through the block loops.
struct Avx2 {
  using Half = HalfCodecF16C;
  using BFloat16 = BFloat16CodecAvx2;
  template <typename T, typename Op>
  MUSTER_TARGET_AVX2 static void Combine(T* acc, const T* in, size_t n, Op op) {
    CombineImpl(acc, in, n, op);
  }
  template <typename Codec, typename Op>
  MUSTER_TARGET_AVX2 static void Combine16(uint16_t* __restrict acc, const uint16_t* __restrict in,
                                           size_t n, Op op) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      __m256 a0, a1, b0, b1;
      Codec::Load16(acc + i, &a0, &a1);
      Codec::Load16(in + i, &b0, &b1);
      Codec::Store16(acc + i, op(a0, b0), op(a1, b1));
    }
    if (i < n) Combine16Impl<Codec>(acc + i, in + i, n - i, op);
  }
  template <typename Codec, typename F>
  MUSTER_TARGET_AVX2 static void Map16(uint16_t* out, const uint16_t* in, size_t n, F f) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      __m256 x0, x1;
      Codec::Load16(in + i, &x0, &x1);
      Codec::Store16(out + i, f(x0), f(x1));
    }
    if (i < n) Map16Impl<Codec>(out + i, in + i, n - i, f);
  }
};

// Calls fn(isa) with the best policy for this CPU.
template <typename Fn>
void WithIsa(Fn fn) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (avx2) return fn(Avx2{});
  return fn(Baseline{});
}
#else
template <typename Fn>
void WithIsa(Fn fn) {
  return fn(Baseline{});
}
#endif

// ---------------------------------------------------------------------------
// Per-category dispatch. Pairs rejected by Supported() never get here.

[[noreturn]] void Unsupported(const char* where, DType dtype, ReduceOp op) {
  std::fprintf(stderr, "muster: %s called with unsupported dtype %s (%d) / op %s (%d)\n", where,
               DTypeName(dtype), static_cast<int>(dtype), ReduceOpName(op), static_cast<int>(op));
  std::abort();
}

template <typename Isa, typename T>  // float or double; complex uses these on its real view
void IntoFloating(T* acc, const T* in, size_t n, ReduceOp op, double scale) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return Isa::Combine(acc, in, n, Add{});
    case ReduceOp::kProduct:
      return Isa::Combine(acc, in, n, Mul{});
    case ReduceOp::kMin:
      return Isa::Combine(acc, in, n, Min{});
    case ReduceOp::kMax:
      return Isa::Combine(acc, in, n, Max{});
    case ReduceOp::kPremulSum:
      return Isa::Combine(acc, in, n, AddScaled<T>{static_cast<T>(scale)});
    default:
      return;  // unreachable: filtered by Supported()
  }
}

template <typename Isa, typename Codec>
void Into16(uint16_t* acc, const uint16_t* in, size_t n, ReduceOp op, double scale) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return Isa::template Combine16<Codec>(acc, in, n, Add{});
    case ReduceOp::kProduct:
      return Isa::template Combine16<Codec>(acc, in, n, Mul{});
    case ReduceOp::kMin:
      return Isa::template Combine16<Codec>(acc, in, n, Min{});
    case ReduceOp::kMax:
      return Isa::template Combine16<Codec>(acc, in, n, Max{});
    case ReduceOp::kPremulSum:
      return Isa::template Combine16<Codec>(acc, in, n,
                                            AddScaled<float>{static_cast<float>(scale)});
    default:
      return;
  }
}

template <typename Isa, typename T>  // signed or unsigned integer
void IntoInteger(T* acc, const T* in, size_t n, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  U* uacc = reinterpret_cast<U*>(acc);
  const U* uin = reinterpret_cast<const U*>(in);
  switch (op) {
    case ReduceOp::kSum:
      return Isa::Combine(uacc, uin, n, Add{});
    case ReduceOp::kProduct:
      return Isa::Combine(uacc, uin, n, Mul{});
    case ReduceOp::kMin:
      return Isa::Combine(acc, in, n, Min{});
    case ReduceOp::kMax:
      return Isa::Combine(acc, in, n, Max{});
    case ReduceOp::kBand:
      return Isa::Combine(uacc, uin, n, BitAnd{});
    case ReduceOp::kBor:
      return Isa::Combine(uacc, uin, n, BitOr{});
    case ReduceOp::kBxor:
      return Isa::Combine(uacc, uin, n, BitXor{});
    default:
      return;
  }
}

template <typename Isa>
void IntoBool(uint8_t* acc, const uint8_t* in, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return Isa::Combine(acc, in, n, BoolOr{});
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return Isa::Combine(acc, in, n, BoolAnd{});
    case ReduceOp::kBxor:
      return Isa::Combine(acc, in, n, BoolXor{});
    default:
      return;
  }
}

template <typename Isa>
void IntoDispatch(void* acc, const void* in, size_t count, DType dtype, ReduceOp op, double scale) {
  switch (dtype) {
    case DType::kFloat16:
      return Into16<Isa, typename Isa::Half>(static_cast<uint16_t*>(acc),
                                             static_cast<const uint16_t*>(in), count, op, scale);
    case DType::kBFloat16:
      return Into16<Isa, typename Isa::BFloat16>(
          static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), count, op, scale);
    case DType::kFloat32:
      return IntoFloating<Isa>(static_cast<float*>(acc), static_cast<const float*>(in), count, op,
                               scale);
    case DType::kFloat64:
      return IntoFloating<Isa>(static_cast<double*>(acc), static_cast<const double*>(in), count, op,
                               scale);
    case DType::kComplex64:
      return IntoFloating<Isa>(static_cast<float*>(acc), static_cast<const float*>(in), 2 * count,
                               op, scale);
    case DType::kComplex128:
      return IntoFloating<Isa>(static_cast<double*>(acc), static_cast<const double*>(in), 2 * count,
                               op, scale);
    case DType::kInt8:
      return IntoInteger<Isa>(static_cast<int8_t*>(acc), static_cast<const int8_t*>(in), count, op);
    case DType::kUInt8:
      return IntoInteger<Isa>(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(in), count,
                              op);
    case DType::kInt32:
      return IntoInteger<Isa>(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), count,
                              op);
    case DType::kInt64:
      return IntoInteger<Isa>(static_cast<int64_t*>(acc), static_cast<const int64_t*>(in), count,
                              op);
    case DType::kBool:
      return IntoBool<Isa>(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(in), count, op);
  }
}

// Runs f on the 16-bit dtype's codec for the best ISA: out[i] = f(in[i]),
// rounded back.
template <typename F>
void Map16Dispatch(DType dtype, uint16_t* out, const uint16_t* in, size_t n, F f) {
  WithIsa([&](auto isa) {
    using Isa = decltype(isa);
    if (dtype == DType::kFloat16) {
      Isa::template Map16<typename Isa::Half>(out, in, n, f);
    } else {
      Isa::template Map16<typename Isa::BFloat16>(out, in, n, f);
    }
  });
}

bool ValidDType(DType dtype) { return static_cast<int>(dtype) < kNumDTypes; }
bool ValidOp(ReduceOp op) { return static_cast<int>(op) < kNumReduceOps; }

// The dtype x op rules from the header.
bool Supported(DType dtype, ReduceOp op) {
  if (!ValidDType(dtype) || !ValidOp(op)) return false;
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  const bool floating_only = op == ReduceOp::kAvg || op == ReduceOp::kPremulSum;
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      return !bitwise;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBool:
      return !floating_only;
    case DType::kComplex64:
    case DType::kComplex128:
      return op == ReduceOp::kSum || floating_only;
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API.

absl::Status CheckReduce(DType dtype, ReduceOp op) {
  if (!ValidDType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  if (!ValidOp(op)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", static_cast<int>(op)));
  }
  if (!Supported(dtype, op)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op ", ReduceOpName(op), " does not support dtype ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

void ReduceInit(void* acc, const void* first, size_t count, DType dtype, ReduceOp op,
                double scale) {
  if (!Supported(dtype, op)) Unsupported("ReduceInit", dtype, op);
  if (count == 0) return;
  if (op == ReduceOp::kPremulSum) {
    switch (dtype) {
      case DType::kFloat16:
      case DType::kBFloat16:
        return Map16Dispatch(dtype, static_cast<uint16_t*>(acc),
                             static_cast<const uint16_t*>(first), count,
                             Scale<float>{static_cast<float>(scale)});
      case DType::kFloat32:
      case DType::kComplex64:
        return Map(static_cast<float*>(acc), static_cast<const float*>(first),
                   dtype == DType::kComplex64 ? 2 * count : count,
                   Scale<float>{static_cast<float>(scale)});
      case DType::kFloat64:
      case DType::kComplex128:
        return Map(static_cast<double*>(acc), static_cast<const double*>(first),
                   dtype == DType::kComplex128 ? 2 * count : count, Scale<double>{scale});
      default:
        return;
    }
  }
  if (dtype == DType::kBool) {
    return Map(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(first), count,
               BoolNormalize{});
  }
  if (acc != first) std::memmove(acc, first, count * DTypeSize(dtype));
}

void ReduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op, double scale) {
  if (!Supported(dtype, op)) Unsupported("ReduceInto", dtype, op);
  if (count == 0) return;
  WithIsa([&](auto isa) { IntoDispatch<decltype(isa)>(acc, in, count, dtype, op, scale); });
}

void ReduceFinish(void* acc, size_t count, DType dtype, ReduceOp op, int contributions) {
  if (!Supported(dtype, op)) Unsupported("ReduceFinish", dtype, op);
  // Only AVG has a finishing step; dividing by 1 is the identity, and a
  // non-positive count has no meaningful average, so both leave `acc` as is.
  if (op != ReduceOp::kAvg || contributions <= 1 || count == 0) return;
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return Map16Dispatch(dtype, static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(acc),
                           count, DivideBy<float>{static_cast<float>(contributions)});
    case DType::kFloat32:
    case DType::kComplex64:
      return MapInPlace(static_cast<float*>(acc), dtype == DType::kComplex64 ? 2 * count : count,
                        DivideBy<float>{static_cast<float>(contributions)});
    case DType::kFloat64:
    case DType::kComplex128:
      return MapInPlace(static_cast<double*>(acc), dtype == DType::kComplex128 ? 2 * count : count,
                        DivideBy<double>{static_cast<double>(contributions)});
    default:
      return;
  }
}

float HalfToFloat(uint16_t h) { return HalfToFloatInline(h); }
uint16_t FloatToHalf(float f) { return FloatToHalfInline(f); }
float BFloat16ToFloat(uint16_t b) { return BFloat16ToFloatInline(b); }
uint16_t FloatToBFloat16(float f) { return FloatToBFloat16Inline(f); }

}  // namespace muster

#if defined(MUSTER_REDUCE_AVX2)
#undef MUSTER_TARGET_AVX2
#undef MUSTER_REDUCE_AVX2
#endif
