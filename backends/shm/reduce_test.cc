#include "backends/shm/reduce.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace muster {
namespace {

constexpr DType kAllDTypes[] = {
    DType::kFloat16, DType::kBFloat16,  DType::kFloat32,    DType::kFloat64,
    DType::kInt8,    DType::kUInt8,     DType::kInt32,      DType::kInt64,
    DType::kBool,    DType::kComplex64, DType::kComplex128,
};
constexpr ReduceOp kAllOps[] = {
    ReduceOp::kSum,  ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin,       ReduceOp::kMax,
    ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor,    ReduceOp::kPremulSum,
};
constexpr double kScale = 0.37;  // PREMUL_SUM scale; not a power of two on purpose

float Bits32ToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint32_t FloatToBits32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// The rules from reduce.h, restated independently of the implementation.
bool ExpectSupported(DType dtype, ReduceOp op) {
  const bool floating = dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
                        dtype == DType::kFloat32 || dtype == DType::kFloat64;
  const bool complex = dtype == DType::kComplex64 || dtype == DType::kComplex128;
  const bool integral = !floating && !complex;  // int8/uint8/int32/int64/bool
  switch (op) {
    case ReduceOp::kSum:
      return true;
    case ReduceOp::kAvg:
    case ReduceOp::kPremulSum:
      return floating || complex;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return floating || integral;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return integral;
  }
  return false;
}

// ---------------------------------------------------------------------------
// Per-dtype reference semantics, written the straightforward way: one element
// at a time, in contribution order.

template <typename T>
T NanAwareMin(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  return std::min(a, b);
}

template <typename T>
T NanAwareMax(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  return std::max(a, b);
}

template <typename T>
struct IntTraits {
  using Elem = T;
  static Elem Random(std::mt19937_64& rng, ReduceOp) { return static_cast<T>(rng()); }
  static Elem Init(Elem first, ReduceOp, double) { return first; }
  static Elem Combine(Elem a, Elem b, ReduceOp op, double) {
    // Wrap-around: compute modulo 2^64 and truncate.
    switch (op) {
      case ReduceOp::kSum:
        return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      case ReduceOp::kProduct:
        return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
      case ReduceOp::kMin:
        return std::min(a, b);
      case ReduceOp::kMax:
        return std::max(a, b);
      case ReduceOp::kBand:
        return static_cast<T>(a & b);
      case ReduceOp::kBor:
        return static_cast<T>(a | b);
      case ReduceOp::kBxor:
        return static_cast<T>(a ^ b);
      default:
        FAIL("unexpected op");
        return a;
    }
  }
  static Elem Finish(Elem a, ReduceOp, int) { return a; }
  static bool Equal(Elem a, Elem b) { return a == b; }
  static std::string Show(Elem a) { return std::to_string(static_cast<int64_t>(a)); }
};

struct BoolTraits {
  using Elem = uint8_t;
  static Elem Random(std::mt19937_64& rng, ReduceOp) { return rng() & 1; }
  static Elem Init(Elem first, ReduceOp, double) { return first; }
  static Elem Combine(Elem a, Elem b, ReduceOp op, double) {
    const bool x = a != 0;
    const bool y = b != 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        return x || y;
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return x && y;
      case ReduceOp::kBxor:
        return x != y;
      default:
        FAIL("unexpected op");
        return a;
    }
  }
  static Elem Finish(Elem a, ReduceOp, int) { return a; }
  static bool Equal(Elem a, Elem b) { return a == b; }
  static std::string Show(Elem a) { return std::to_string(a); }
};

template <typename T>  // float, double
struct FloatTraits {
  using Elem = T;
  static Elem Random(std::mt19937_64& rng, ReduceOp) {
    return std::uniform_real_distribution<T>(-4, 4)(rng);
  }
  static Elem Init(Elem first, ReduceOp op, double scale) {
    return op == ReduceOp::kPremulSum ? first * static_cast<T>(scale) : first;
  }
  static Elem Combine(Elem a, Elem b, ReduceOp op, double scale) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return a + b;
      case ReduceOp::kPremulSum:
        return a + b * static_cast<T>(scale);
      case ReduceOp::kProduct:
        return a * b;
      case ReduceOp::kMin:
        return NanAwareMin(a, b);
      case ReduceOp::kMax:
        return NanAwareMax(a, b);
      default:
        FAIL("unexpected op");
        return a;
    }
  }
  static Elem Finish(Elem a, ReduceOp op, int n) {
    return op == ReduceOp::kAvg ? a / static_cast<T>(n) : a;
  }
  static bool Equal(Elem a, Elem b) { return a == b || (std::isnan(a) && std::isnan(b)); }
  static std::string Show(Elem a) { return std::to_string(a); }
};

// float16 / bfloat16: every partial result is rounded to the 16-bit type.
template <float (*ToFloatFn)(uint16_t), uint16_t (*FromFloat)(float)>
struct Float16Traits {
  using Elem = uint16_t;
  static float ToFloat(uint16_t x) { return ToFloatFn(x); }
  static Elem Random(std::mt19937_64& rng, ReduceOp) {
    return FromFloat(std::uniform_real_distribution<float>(-8, 8)(rng));
  }
  static Elem Init(Elem first, ReduceOp op, double scale) {
    if (op != ReduceOp::kPremulSum) return first;
    return FromFloat(ToFloat(first) * static_cast<float>(scale));
  }
  static Elem Combine(Elem a, Elem b, ReduceOp op, double scale) {
    return FromFloat(FloatTraits<float>::Combine(ToFloat(a), ToFloat(b), op, scale));
  }
  static Elem Finish(Elem a, ReduceOp op, int n) {
    if (op != ReduceOp::kAvg) return a;
    return FromFloat(ToFloat(a) / static_cast<float>(n));
  }
  static bool Equal(Elem a, Elem b) { return FloatTraits<float>::Equal(ToFloat(a), ToFloat(b)); }
  static std::string Show(Elem a) {
    return std::to_string(ToFloat(a)) + " (" + std::to_string(a) + ")";
  }
};
using HalfTraits = Float16Traits<HalfToFloat, FloatToHalf>;
using BFloat16Traits = Float16Traits<BFloat16ToFloat, FloatToBFloat16>;

// Complex: the reference uses std::complex arithmetic, which for these ops is
// componentwise (what the real-view kernels compute).
template <typename T>
struct ComplexTraits {
  using Elem = std::complex<T>;
  static Elem Random(std::mt19937_64& rng, ReduceOp op) {
    T re = FloatTraits<T>::Random(rng, op);
    T im = FloatTraits<T>::Random(rng, op);
    return {re, im};
  }
  static Elem Init(Elem first, ReduceOp op, double scale) {
    return op == ReduceOp::kPremulSum ? first * static_cast<T>(scale) : first;
  }
  static Elem Combine(Elem a, Elem b, ReduceOp op, double scale) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return a + b;
      case ReduceOp::kPremulSum:
        return a + b * static_cast<T>(scale);
      default:
        FAIL("unexpected op");
        return a;
    }
  }
  static Elem Finish(Elem a, ReduceOp op, int n) {
    return op == ReduceOp::kAvg ? a / static_cast<T>(n) : a;
  }
  static bool Equal(Elem a, Elem b) {
    return FloatTraits<T>::Equal(a.real(), b.real()) && FloatTraits<T>::Equal(a.imag(), b.imag());
  }
  static std::string Show(Elem a) {
    return "(" + std::to_string(a.real()) + ", " + std::to_string(a.imag()) + ")";
  }
};

// A buffer of `len` elements placed one element into a larger allocation
// (so it is not aligned to more than the element size), with guard bytes on
// both sides that the kernels must not touch.
class GuardedBuffer {
 public:
  static constexpr uint8_t kGuard = 0xa5;
  GuardedBuffer(size_t len, size_t elem_size)
      : len_(len), elem_size_(elem_size), bytes_((len + 2) * elem_size + 16, kGuard) {
    // Allocations from operator new are 16-byte aligned; `elem_size` bytes in
    // is aligned to the element but (for elements < 16 bytes) not beyond.
  }
  void* data() { return bytes_.data() + elem_size_; }
  template <typename E>
  E* as() {
    return reinterpret_cast<E*>(data());
  }
  bool GuardsIntact() const {
    for (size_t i = 0; i < elem_size_; ++i) {
      if (bytes_[i] != kGuard) return false;
    }
    for (size_t i = (len_ + 1) * elem_size_; i < bytes_.size(); ++i) {
      if (bytes_[i] != kGuard) return false;
    }
    return true;
  }

 private:
  size_t len_;
  size_t elem_size_;
  std::vector<uint8_t> bytes_;
};

// Runs ReduceInit/Into/Finish over n contributions of `len` elements and
// compares with the Traits reference. With `alias`, the accumulator is the
// first contribution's own buffer (ReduceInit in place).
template <typename Traits>
void CheckAgainstReference(DType dtype, ReduceOp op, int n, size_t len, bool alias,
                           std::mt19937_64& rng) {
  using Elem = typename Traits::Elem;
  REQUIRE(sizeof(Elem) == DTypeSize(dtype));
  std::vector<GuardedBuffer> contributions;
  for (int c = 0; c < n; ++c) {
    contributions.emplace_back(len, sizeof(Elem));
    Elem* p = contributions.back().template as<Elem>();
    for (size_t i = 0; i < len; ++i) p[i] = Traits::Random(rng, op);
  }
  std::vector<Elem> expected(len);
  for (size_t i = 0; i < len; ++i) {
    Elem r = Traits::Init(contributions[0].template as<Elem>()[i], op, kScale);
    for (int c = 1; c < n; ++c) {
      r = Traits::Combine(r, contributions[c].template as<Elem>()[i], op, kScale);
    }
    expected[i] = Traits::Finish(r, op, n);
  }

  GuardedBuffer separate(len, sizeof(Elem));
  GuardedBuffer& acc = alias ? contributions[0] : separate;
  ReduceInit(acc.data(), contributions[0].data(), len, dtype, op, kScale);
  for (int c = 1; c < n; ++c)
    ReduceInto(acc.data(), contributions[c].data(), len, dtype, op, kScale);
  ReduceFinish(acc.data(), len, dtype, op, n);

  size_t mismatches = 0;
  size_t first_mismatch = 0;
  const Elem* got = acc.template as<Elem>();
  for (size_t i = 0; i < len; ++i) {
    if (!Traits::Equal(got[i], expected[i])) {
      if (mismatches++ == 0) first_mismatch = i;
    }
  }
  INFO(DTypeName(dtype) << " " << ReduceOpName(op) << " n=" << n << " len=" << len
                        << " alias=" << alias);
  if (mismatches > 0) {
    INFO("first mismatch at " << first_mismatch << ": got " << Traits::Show(got[first_mismatch])
                              << ", want " << Traits::Show(expected[first_mismatch]));
    CHECK(mismatches == 0);
  }
  for (const GuardedBuffer& b : contributions) CHECK(b.GuardsIntact());
  CHECK(separate.GuardsIntact());
}

template <typename Traits>
void CheckAllShapes(DType dtype, ReduceOp op) {
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 100 + static_cast<uint64_t>(op));
  for (int n = 1; n <= 4; ++n) {
    for (size_t len : {size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
      CheckAgainstReference<Traits>(dtype, op, n, len, /*alias=*/false, rng);
      CheckAgainstReference<Traits>(dtype, op, n, len, /*alias=*/true, rng);
    }
  }
}

void CheckKernel(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat16:
      return CheckAllShapes<HalfTraits>(dtype, op);
    case DType::kBFloat16:
      return CheckAllShapes<BFloat16Traits>(dtype, op);
    case DType::kFloat32:
      return CheckAllShapes<FloatTraits<float>>(dtype, op);
    case DType::kFloat64:
      return CheckAllShapes<FloatTraits<double>>(dtype, op);
    case DType::kInt8:
      return CheckAllShapes<IntTraits<int8_t>>(dtype, op);
    case DType::kUInt8:
      return CheckAllShapes<IntTraits<uint8_t>>(dtype, op);
    case DType::kInt32:
      return CheckAllShapes<IntTraits<int32_t>>(dtype, op);
    case DType::kInt64:
      return CheckAllShapes<IntTraits<int64_t>>(dtype, op);
    case DType::kBool:
      return CheckAllShapes<BoolTraits>(dtype, op);
    case DType::kComplex64:
      return CheckAllShapes<ComplexTraits<float>>(dtype, op);
    case DType::kComplex128:
      return CheckAllShapes<ComplexTraits<double>>(dtype, op);
  }
}

// Runs a full reduction over small vectors (n contributions). Elem is the
// element type or, for the 16-bit dtypes, uint8_t (raw bytes).
template <typename Elem>
std::vector<Elem> Reduce(DType dtype, ReduceOp op, std::vector<std::vector<Elem>> in,
                         double scale = 1.0) {
  std::vector<Elem> acc(in[0].size());
  const size_t count = acc.size() * sizeof(Elem) / DTypeSize(dtype);
  ReduceInit(acc.data(), in[0].data(), count, dtype, op, scale);
  for (size_t c = 1; c < in.size(); ++c) {
    REQUIRE(in[c].size() == acc.size());
    ReduceInto(acc.data(), in[c].data(), count, dtype, op, scale);
  }
  ReduceFinish(acc.data(), count, dtype, op, static_cast<int>(in.size()));
  return acc;
}

// Float-valued helpers for the four real floating dtypes.
std::vector<uint8_t> EncodeFloats(DType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* p = out.data() + i * DTypeSize(dtype);
    const double v = values[i];
    switch (dtype) {
      case DType::kFloat16: {
        const uint16_t h = FloatToHalf(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t b = FloatToBFloat16(static_cast<float>(v));
        std::memcpy(p, &b, 2);
        break;
      }
      case DType::kFloat32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      default: {
        std::memcpy(p, &v, 8);
        break;
      }
    }
  }
  return out;
}

std::vector<double> DecodeFloats(DType dtype, const std::vector<uint8_t>& bytes) {
  std::vector<double> out(bytes.size() / DTypeSize(dtype));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat16:
      case DType::kBFloat16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = dtype == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
        break;
      }
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, p, 4);
        out[i] = f;
        break;
      }
      default:
        std::memcpy(&out[i], p, 8);
        break;
    }
  }
  return out;
}

std::vector<double> ReduceFloats(DType dtype, ReduceOp op,
                                 const std::vector<std::vector<double>>& in, double scale = 1.0) {
  std::vector<std::vector<uint8_t>> encoded;
  for (const auto& v : in) encoded.push_back(EncodeFloats(dtype, v));
  return DecodeFloats(dtype, Reduce<uint8_t>(dtype, op, encoded, scale));
}

constexpr DType kRealFloatDTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                      DType::kFloat64};

// Slow references for the 16-bit roundings: the nearest-even value with
// `bits` significant bits and quantum at least 2^min_quantum_exp, computed in
// double (exact for every float input).
double RoundToFormat(float x, int bits, int min_quantum_exp, double overflow_at) {
  const double a = std::fabs(static_cast<double>(x));
  if (a >= overflow_at) return std::copysign(std::numeric_limits<double>::infinity(), x);
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int q = std::max(e - bits, min_quantum_exp);
  const double r = std::nearbyint(std::ldexp(a, -q));  // default mode: nearest even
  return std::copysign(std::ldexp(r, q), x);
}

double RefRoundHalf(float x) { return RoundToFormat(x, 11, -24, 65520.0); }
double RefRoundBFloat16(float x) { return RoundToFormat(x, 8, -133, std::ldexp(511.0, 119)); }

bool SameValue(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// ---------------------------------------------------------------------------
// Tests.

TEST_CASE("CheckReduce accepts exactly the dtype x op pairs of the header's rules") {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      const absl::Status status = CheckReduce(dtype, op);
      INFO(DTypeName(dtype) << " " << ReduceOpName(op) << ": " << status);
      if (ExpectSupported(dtype, op)) {
        CHECK(status.ok());
      } else {
        CHECK(status.code() == absl::StatusCode::kInvalidArgument);
        CHECK(std::string(status.message()) == std::string("reduce op ") + ReduceOpName(op) +
                                                   " does not support dtype " + DTypeName(dtype));
      }
    }
  }
}

TEST_CASE("CheckReduce names the pair in its error") {
  CHECK(CheckReduce(DType::kFloat32, ReduceOp::kBxor).message() ==
        "reduce op BXOR does not support dtype float32");
  CHECK(CheckReduce(DType::kInt32, ReduceOp::kAvg).message() ==
        "reduce op AVG does not support dtype int32");
  CHECK(CheckReduce(DType::kBool, ReduceOp::kPremulSum).message() ==
        "reduce op PREMUL_SUM does not support dtype bool");
  CHECK(CheckReduce(DType::kComplex64, ReduceOp::kMax).message() ==
        "reduce op MAX does not support dtype complex64");
  CHECK(CheckReduce(DType::kComplex128, ReduceOp::kProduct).message() ==
        "reduce op PRODUCT does not support dtype complex128");
  CHECK(CheckReduce(DType::kBFloat16, ReduceOp::kBand).message() ==
        "reduce op BAND does not support dtype bfloat16");
}

TEST_CASE("CheckReduce rejects out-of-range enum values") {
  CHECK(CheckReduce(static_cast<DType>(kNumDTypes), ReduceOp::kSum).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(CheckReduce(DType::kFloat32, static_cast<ReduceOp>(kNumReduceOps)).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(CheckReduce(static_cast<DType>(200), static_cast<ReduceOp>(200)).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Kernels match the reference for every supported dtype and op") {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      if (!CheckReduce(dtype, op).ok()) continue;
      CheckKernel(dtype, op);
    }
  }
}

TEST_CASE("DType names, sizes and parsing") {
  CHECK(DTypeSize(DType::kFloat16) == 2);
  CHECK(DTypeSize(DType::kBFloat16) == 2);
  CHECK(DTypeSize(DType::kFloat32) == 4);
  CHECK(DTypeSize(DType::kFloat64) == 8);
  CHECK(DTypeSize(DType::kInt8) == 1);
  CHECK(DTypeSize(DType::kUInt8) == 1);
  CHECK(DTypeSize(DType::kInt32) == 4);
  CHECK(DTypeSize(DType::kInt64) == 8);
  CHECK(DTypeSize(DType::kBool) == 1);
  CHECK(DTypeSize(DType::kComplex64) == 8);
  CHECK(DTypeSize(DType::kComplex128) == 16);

  for (DType dtype : kAllDTypes) {
    auto parsed = ParseDType(DTypeName(dtype));
    REQUIRE(parsed.ok());
    CHECK(*parsed == dtype);
  }
  const std::pair<const char*, DType> aliases[] = {
      {"float16", DType::kFloat16},     {"fp16", DType::kFloat16},
      {"half", DType::kFloat16},        {"bfloat16", DType::kBFloat16},
      {"bf16", DType::kBFloat16},       {"float32", DType::kFloat32},
      {"fp32", DType::kFloat32},        {"float", DType::kFloat32},
      {"float64", DType::kFloat64},     {"fp64", DType::kFloat64},
      {"double", DType::kFloat64},      {"int8", DType::kInt8},
      {"uint8", DType::kUInt8},         {"int32", DType::kInt32},
      {"int", DType::kInt32},           {"int64", DType::kInt64},
      {"long", DType::kInt64},          {"bool", DType::kBool},
      {"complex64", DType::kComplex64}, {"complex128", DType::kComplex128},
  };
  for (const auto& [name, dtype] : aliases) {
    auto parsed = ParseDType(name);
    INFO(name);
    REQUIRE(parsed.ok());
    CHECK(*parsed == dtype);
  }
  for (const char* bad : {"", "float8", "complex32", "int16", "fp32 ", "uint64"}) {
    auto parsed = ParseDType(bad);
    INFO(bad);
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(std::string(ParseDType("float8").status().message()).find("float8") != std::string::npos);
  CHECK(ParseDType(nullptr).status().code() == absl::StatusCode::kInvalidArgument);

  CHECK(std::string(ReduceOpName(ReduceOp::kSum)) == "SUM");
  CHECK(std::string(ReduceOpName(ReduceOp::kAvg)) == "AVG");
  CHECK(std::string(ReduceOpName(ReduceOp::kProduct)) == "PRODUCT");
  CHECK(std::string(ReduceOpName(ReduceOp::kMin)) == "MIN");
  CHECK(std::string(ReduceOpName(ReduceOp::kMax)) == "MAX");
  CHECK(std::string(ReduceOpName(ReduceOp::kBand)) == "BAND");
  CHECK(std::string(ReduceOpName(ReduceOp::kBor)) == "BOR");
  CHECK(std::string(ReduceOpName(ReduceOp::kBxor)) == "BXOR");
  CHECK(std::string(ReduceOpName(ReduceOp::kPremulSum)) == "PREMUL_SUM");
}

TEST_CASE("HalfToFloat / FloatToHalf on known bit patterns") {
  CHECK(FloatToHalf(1.0f) == 0x3C00);
  CHECK(HalfToFloat(0x3C00) == 1.0f);
  CHECK(FloatToHalf(-2.0f) == 0xC000);
  CHECK(FloatToHalf(65504.0f) == 0x7BFF);
  CHECK(HalfToFloat(0x7BFF) == 65504.0f);
  CHECK(FloatToHalf(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(HalfToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(HalfToFloat(0x03FF) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(FloatToHalf(std::ldexp(1.0f, -14)) == 0x0400);     // smallest normal
  CHECK(FloatToHalf(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(FloatToHalf(-std::numeric_limits<float>::infinity()) == 0xFC00);
  CHECK(std::isinf(HalfToFloat(0x7C00)));
  CHECK(HalfToFloat(0xFC00) < 0);
  CHECK(FloatToHalf(0.0f) == 0x0000);
  CHECK(FloatToHalf(-0.0f) == 0x8000);
  CHECK(std::signbit(HalfToFloat(0x8000)));
  CHECK(FloatToHalf(1e6f) == 0x7C00);    // overflow
  CHECK(FloatToHalf(1e-10f) == 0x0000);  // underflow
  CHECK(FloatToHalf(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(FloatToHalf(-std::numeric_limits<float>::denorm_min()) == 0x8000);

  // NaN stays NaN (sign kept), in both directions.
  const uint16_t qnan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  CHECK((qnan & 0x7C00) == 0x7C00);
  CHECK((qnan & 0x03FF) != 0);
  CHECK(FloatToHalf(Bits32ToFloat(0x7F800001)) != 0x7C00);  // tiny payload: not inf
  CHECK(std::isnan(HalfToFloat(FloatToHalf(Bits32ToFloat(0x7F800001)))));
  CHECK((FloatToHalf(Bits32ToFloat(0xFFC00000)) & 0x8000) == 0x8000);
  CHECK(std::isnan(HalfToFloat(0x7E00)));
  CHECK(std::isnan(HalfToFloat(0x7C01)));  // signaling
  CHECK(std::isnan(HalfToFloat(0xFFFF)));

  // Round to nearest, ties to even.
  CHECK(FloatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);      // tie: 1.0 is even
  CHECK(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);  // tie: 0x3C02 is even
  CHECK(FloatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3C01);
  CHECK(FloatToHalf(65519.0f) == 0x7BFF);
  CHECK(FloatToHalf(65520.0f) == 0x7C00);               // tie between 65504 and 65536: inf
  CHECK(FloatToHalf(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 0x0001
  CHECK(FloatToHalf(std::ldexp(3.0f, -25)) == 0x0002);  // tie between 0x0001 and 0x0002
  CHECK(FloatToHalf(std::ldexp(1.0f, -25) * 1.0001f) == 0x0001);
  CHECK(FloatToHalf(std::ldexp(2047.0f, -25)) == 0x0400);  // largest subnormal + 1/2: even
  CHECK(FloatToHalf(std::ldexp(2045.0f, -25)) == 0x03FE);  // 0x3FE.8 -> 0x3FE
}

TEST_CASE("HalfToFloat is exact for every bit pattern and FloatToHalf inverts it") {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint32_t exp = (h >> 10) & 0x1F;
    const uint32_t mant = h & 0x3FF;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    double want;
    if (exp == 0) {
      want = sign * std::ldexp(static_cast<double>(mant), -24);
    } else if (exp == 31) {
      want = mant == 0 ? sign * std::numeric_limits<double>::infinity()
                       : std::numeric_limits<double>::quiet_NaN();
    } else {
      want = sign * std::ldexp(1024.0 + mant, static_cast<int>(exp) - 25);
    }
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    INFO("half 0x" << std::hex << h);
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
      const uint16_t back = FloatToHalf(got);
      REQUIRE((back & 0x7C00) == 0x7C00);
      REQUIRE((back & 0x03FF) != 0);
      REQUIRE((back & 0x8000) == (h & 0x8000));
    } else {
      REQUIRE(SameValue(got, want));
      REQUIRE(FloatToHalf(got) == h);
    }
  }
}

TEST_CASE("FloatToHalf rounds like a slow reference") {
  std::mt19937_64 rng(7);
  std::vector<float> inputs;
  // Every midpoint between adjacent finite halves, and its float neighbours.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double lo = HalfToFloat(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7C00 ? 65536.0 : HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  // Random floats with exponents around the half range.
  for (int i = 0; i < 200000; ++i) {
    const uint32_t exp = 90 + static_cast<uint32_t>(rng() % 60);  // 2^-37 .. 2^22
    const uint32_t bits = (static_cast<uint32_t>(rng()) & 0x807FFFFFu) | (exp << 23);
    inputs.push_back(Bits32ToFloat(bits));
  }
  size_t bad = 0;
  for (float x : inputs) {
    const double got = HalfToFloat(FloatToHalf(x));
    const double want = RefRoundHalf(x);
    if (!SameValue(got, want)) {
      if (bad++ < 5) {
        UNSCOPED_INFO("x=" << x << " (0x" << std::hex << FloatToBits32(x) << std::dec << ") got "
                           << got << " want " << want);
      }
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("BFloat16 conversions on known bit patterns") {
  CHECK(FloatToBFloat16(1.0f) == 0x3F80);
  CHECK(BFloat16ToFloat(0x3F80) == 1.0f);
  CHECK(FloatToBFloat16(-2.0f) == 0xC000);
  CHECK(FloatToBFloat16(0.0f) == 0x0000);
  CHECK(FloatToBFloat16(-0.0f) == 0x8000);
  CHECK(FloatToBFloat16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(FloatToBFloat16(-std::numeric_limits<float>::infinity()) == 0xFF80);
  // Ties to even.
  CHECK(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);      // tie: 0x3F80 even
  CHECK(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);  // tie: 0x3F82 even
  CHECK(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3F81);
  CHECK(FloatToBFloat16(Bits32ToFloat(0x3F808000)) == 0x3F80);
  CHECK(FloatToBFloat16(Bits32ToFloat(0x3F818000)) == 0x3F82);
  // Overflow rounds to inf; the largest finite bfloat16 is kept.
  CHECK(FloatToBFloat16(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(FloatToBFloat16(Bits32ToFloat(0x7F7F0000)) == 0x7F7F);
  // Subnormals round like everything else.
  CHECK(FloatToBFloat16(Bits32ToFloat(0x00008000)) == 0x0000);  // tie: 0 even
  CHECK(FloatToBFloat16(Bits32ToFloat(0x00018000)) == 0x0002);  // tie: 2 even
  // NaN stays NaN, sign kept, even with a payload only in the low bits.
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFF800001u, 0xFFC00000u}) {
    const uint16_t b = FloatToBFloat16(Bits32ToFloat(nan));
    INFO(std::hex << nan << " -> " << b);
    CHECK(std::isnan(BFloat16ToFloat(b)));
    CHECK((b & 0x8000) == ((nan >> 16) & 0x8000));
  }
}

TEST_CASE("BFloat16 round trip for every bit pattern and rounding against a reference") {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    INFO("bfloat16 0x" << std::hex << b);
    REQUIRE(FloatToBits32(f) == b << 16);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
    } else {
      REQUIRE(FloatToBFloat16(f) == b);
    }
  }
  std::mt19937_64 rng(11);
  size_t bad = 0;
  for (int i = 0; i < 500000; ++i) {
    const float x = Bits32ToFloat(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) continue;
    const double got = BFloat16ToFloat(FloatToBFloat16(x));
    const double want = RefRoundBFloat16(x);
    if (!SameValue(got, want) && bad++ < 5) {
      UNSCOPED_INFO("x=0x" << std::hex << FloatToBits32(x) << std::dec << " got " << got << " want "
                           << want);
    }
  }
  CHECK(bad == 0);
}

// Every 16-bit pattern (NaNs, infinities, subnormals, zeros) as the
// accumulator against a permutation of them, through each op; the reference
// uses the portable scalar conversions, so this also cross-checks any
// hardware conversion path the kernels take on this CPU.
template <typename Traits>
void CheckEveryPattern(DType dtype) {
  std::vector<uint16_t> first(65536), second(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    first[i] = static_cast<uint16_t>(i);
    second[i] = static_cast<uint16_t>(i * 40503u);  // odd multiplier: a permutation
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin,
                      ReduceOp::kMax, ReduceOp::kPremulSum}) {
    // Start one element in, so the length (65535) is not a multiple of any
    // vector width.
    const size_t n = 65535;
    std::vector<uint16_t> acc(n);
    ReduceInit(acc.data(), first.data() + 1, n, dtype, op, kScale);
    ReduceInto(acc.data(), second.data() + 1, n, dtype, op, kScale);
    ReduceFinish(acc.data(), n, dtype, op, 2);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      uint16_t want = Traits::Init(first[i + 1], op, kScale);
      want = Traits::Finish(Traits::Combine(want, second[i + 1], op, kScale), op, 2);
      const bool both_nan =
          std::isnan(Traits::ToFloat(acc[i])) && std::isnan(Traits::ToFloat(want));
      // MIN/MAX may pick either of two equal values (+0 / -0); everything
      // else must match bit for bit.
      const bool same = op == ReduceOp::kMin || op == ReduceOp::kMax ? Traits::Equal(acc[i], want)
                                                                     : acc[i] == want || both_nan;
      if (!same && bad++ < 5) {
        UNSCOPED_INFO(DTypeName(dtype)
                      << " " << ReduceOpName(op) << " " << std::hex << "0x" << first[i + 1]
                      << ", 0x" << second[i + 1] << ": got 0x" << acc[i] << " want 0x" << want);
      }
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("16-bit kernels match the scalar conversions on every bit pattern") {
  CheckEveryPattern<HalfTraits>(DType::kFloat16);
  CheckEveryPattern<BFloat16Traits>(DType::kBFloat16);
}

TEST_CASE("MIN and MAX propagate NaN on floating dtypes") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> a = {nan, 1, nan, 2, -inf, inf, -1};
  const std::vector<double> b = {1, nan, nan, 3, 5, nan, -inf};
  for (DType dtype : kRealFloatDTypes) {
    INFO(DTypeName(dtype));
    const auto mn = ReduceFloats(dtype, ReduceOp::kMin, {a, b});
    const auto mx = ReduceFloats(dtype, ReduceOp::kMax, {a, b});
    for (int i : {0, 1, 2, 5}) {
      CHECK(std::isnan(mn[i]));
      CHECK(std::isnan(mx[i]));
    }
    CHECK(mn[3] == 2);
    CHECK(mx[3] == 3);
    CHECK(mn[4] == -inf);
    CHECK(mx[4] == 5);
    CHECK(mn[6] == -inf);
    CHECK(mx[6] == -1);
    // A NaN in a middle contribution survives later ones.
    const auto mn3 = ReduceFloats(dtype, ReduceOp::kMin, {{1.0}, {nan}, {-5.0}});
    const auto mx3 = ReduceFloats(dtype, ReduceOp::kMax, {{1.0}, {nan}, {5.0}});
    CHECK(std::isnan(mn3[0]));
    CHECK(std::isnan(mx3[0]));
  }
}

TEST_CASE("Integer SUM and PRODUCT wrap around like two's complement") {
  CHECK(Reduce<int8_t>(DType::kInt8, ReduceOp::kSum, {{127, -128, 100}, {1, -1, 100}}) ==
        std::vector<int8_t>{-128, 127, -56});
  CHECK(Reduce<uint8_t>(DType::kUInt8, ReduceOp::kSum, {{255, 200}, {1, 100}}) ==
        std::vector<uint8_t>{0, 44});
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  CHECK(Reduce<int32_t>(DType::kInt32, ReduceOp::kSum, {{kMax32, kMin32}, {1, -1}}) ==
        std::vector<int32_t>{kMin32, kMax32});
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  CHECK(Reduce<int64_t>(DType::kInt64, ReduceOp::kSum, {{kMax64, kMin64}, {1, -1}}) ==
        std::vector<int64_t>{kMin64, kMax64});

  CHECK(Reduce<int8_t>(DType::kInt8, ReduceOp::kProduct, {{16, -128, 3}, {16, -1, 43}}) ==
        std::vector<int8_t>{0, -128, -127});
  CHECK(Reduce<uint8_t>(DType::kUInt8, ReduceOp::kProduct, {{16, 3}, {16, 171}}) ==
        std::vector<uint8_t>{0, 1});
  CHECK(Reduce<int32_t>(DType::kInt32, ReduceOp::kProduct, {{65536, kMin32}, {65536, -1}}) ==
        std::vector<int32_t>{0, kMin32});
  CHECK(Reduce<int64_t>(DType::kInt64, ReduceOp::kProduct,
                        {{int64_t{1} << 62, kMin64, 3}, {4, -1, -5}, {1, 1, 7}}) ==
        std::vector<int64_t>{0, kMin64, -105});
}

TEST_CASE("Integer MIN/MAX are signed or unsigned per dtype; bitwise ops") {
  CHECK(Reduce<int8_t>(DType::kInt8, ReduceOp::kMin, {{-1, 5}, {1, -128}}) ==
        std::vector<int8_t>{-1, -128});
  CHECK(Reduce<uint8_t>(DType::kUInt8, ReduceOp::kMin, {{255, 5}, {1, 128}}) ==
        std::vector<uint8_t>{1, 5});
  CHECK(Reduce<uint8_t>(DType::kUInt8, ReduceOp::kMax, {{255, 5}, {1, 128}}) ==
        std::vector<uint8_t>{255, 128});
  CHECK(Reduce<int64_t>(DType::kInt64, ReduceOp::kMax, {{-1, 5}, {1, -128}, {0, 7}}) ==
        std::vector<int64_t>{1, 7});
  CHECK(Reduce<int32_t>(DType::kInt32, ReduceOp::kBand, {{-1, 0x0F0F}, {0x1234, 0x00FF}}) ==
        std::vector<int32_t>{0x1234, 0x000F});
  CHECK(Reduce<int32_t>(DType::kInt32, ReduceOp::kBor, {{-2, 0x0F00}, {1, 0x00F0}}) ==
        std::vector<int32_t>{-1, 0x0FF0});
  CHECK(Reduce<int8_t>(DType::kInt8, ReduceOp::kBxor, {{-1, 0x55}, {0x0F, 0x0F}, {0, 0x55}}) ==
        std::vector<int8_t>{-16, 0x0F});
}

TEST_CASE("bool ops are logical and produce 0/1") {
  const std::vector<uint8_t> a = {0, 0, 1, 1};
  const std::vector<uint8_t> b = {0, 1, 0, 1};
  const std::vector<uint8_t> any = {0, 1, 1, 1};
  const std::vector<uint8_t> all = {0, 0, 0, 1};
  const std::vector<uint8_t> odd = {0, 1, 1, 0};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kBor}) {
    INFO(ReduceOpName(op));
    CHECK(Reduce<uint8_t>(DType::kBool, op, {a, b}) == any);
  }
  for (ReduceOp op : {ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kBand}) {
    INFO(ReduceOpName(op));
    CHECK(Reduce<uint8_t>(DType::kBool, op, {a, b}) == all);
  }
  CHECK(Reduce<uint8_t>(DType::kBool, ReduceOp::kBxor, {a, b}) == odd);
  // SUM of many trues stays 1 (logical OR, not a count).
  CHECK(Reduce<uint8_t>(DType::kBool, ReduceOp::kSum, {{1}, {1}, {1}, {1}}) ==
        std::vector<uint8_t>{1});
  // Any nonzero byte counts as true, and results are still 0/1.
  const std::vector<uint8_t> c = {0, 2, 0xFF, 0x80};
  const std::vector<uint8_t> d = {0x10, 0, 0x01, 0x80};
  CHECK(Reduce<uint8_t>(DType::kBool, ReduceOp::kBor, {c, d}) == std::vector<uint8_t>{1, 1, 1, 1});
  CHECK(Reduce<uint8_t>(DType::kBool, ReduceOp::kBand, {c, d}) == std::vector<uint8_t>{0, 0, 1, 1});
  CHECK(Reduce<uint8_t>(DType::kBool, ReduceOp::kBxor, {c, d}) == std::vector<uint8_t>{1, 1, 0, 0});
  CHECK(Reduce<uint8_t>(DType::kBool, ReduceOp::kMin, {c}) == std::vector<uint8_t>{0, 1, 1, 1});
}

TEST_CASE("AVG divides the sum by the number of contributions") {
  for (DType dtype : kRealFloatDTypes) {
    INFO(DTypeName(dtype));
    CHECK(ReduceFloats(dtype, ReduceOp::kAvg, {{1, -8, 0}, {2, 0, 0}, {3, 4, 0}, {4, 0, 0}}) ==
          std::vector<double>{2.5, -1, 0});
    CHECK(ReduceFloats(dtype, ReduceOp::kAvg, {{1.5, -3}}) == std::vector<double>{1.5, -3});
  }
  // 7/3 is inexact: the 16-bit types divide in float and round once.
  CHECK(ReduceFloats(DType::kFloat16, ReduceOp::kAvg, {{1}, {2}, {4}})[0] ==
        HalfToFloat(FloatToHalf(7.0f / 3.0f)));
  CHECK(ReduceFloats(DType::kBFloat16, ReduceOp::kAvg, {{1}, {2}, {4}})[0] ==
        BFloat16ToFloat(FloatToBFloat16(7.0f / 3.0f)));
  CHECK(ReduceFloats(DType::kFloat32, ReduceOp::kAvg, {{1}, {2}, {4}})[0] == 7.0f / 3.0f);
  CHECK(ReduceFloats(DType::kFloat64, ReduceOp::kAvg, {{1}, {2}, {4}})[0] == 7.0 / 3.0);
  CHECK(Reduce<std::complex<float>>(DType::kComplex64, ReduceOp::kAvg, {{{1, 2}}, {{3, -4}}}) ==
        std::vector<std::complex<float>>{{2, -1}});
  CHECK(Reduce<std::complex<double>>(DType::kComplex128, ReduceOp::kAvg,
                                     {{{1, 2}}, {{3, 4}}, {{5, 6}}, {{7, 8}}}) ==
        std::vector<std::complex<double>>{{4, 5}});
}

TEST_CASE("PREMUL_SUM scales every contribution before summing") {
  for (DType dtype : kRealFloatDTypes) {
    INFO(DTypeName(dtype));
    CHECK(ReduceFloats(dtype, ReduceOp::kPremulSum, {{2, -4}, {4, 8}, {6, 1}}, 0.5) ==
          std::vector<double>{6, 2.5});
    CHECK(ReduceFloats(dtype, ReduceOp::kPremulSum, {{3}}, 0.25) == std::vector<double>{0.75});
  }
  CHECK(ReduceFloats(DType::kFloat64, ReduceOp::kPremulSum, {{1}, {2}}, 1.0 / 3.0)[0] ==
        1.0 * (1.0 / 3.0) + 2.0 * (1.0 / 3.0));
  CHECK(ReduceFloats(DType::kFloat32, ReduceOp::kPremulSum, {{1}, {2}}, 0.1)[0] ==
        1.0f * 0.1f + 2.0f * 0.1f);
  // 16-bit: the product stays in float, the running sum is rounded each step.
  const float s = 0.1f;
  const uint16_t h0 = FloatToHalf(HalfToFloat(FloatToHalf(3.0f)) * s);
  const uint16_t h1 = FloatToHalf(HalfToFloat(h0) + HalfToFloat(FloatToHalf(5.0f)) * s);
  CHECK(ReduceFloats(DType::kFloat16, ReduceOp::kPremulSum, {{3}, {5}}, 0.1)[0] == HalfToFloat(h1));
  CHECK(Reduce<std::complex<float>>(DType::kComplex64, ReduceOp::kPremulSum, {{{1, 2}}, {{3, 4}}},
                                    2.0) == std::vector<std::complex<float>>{{8, 12}});
  CHECK(Reduce<std::complex<double>>(DType::kComplex128, ReduceOp::kPremulSum,
                                     {{{1, -2}}, {{3, 4}}},
                                     -0.5) == std::vector<std::complex<double>>{{-2, -1}});
}

TEST_CASE("PREMUL_SUM ReduceInit works in place") {
  std::vector<float> x = {1, 2, 3};
  ReduceInit(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kPremulSum, 2.0);
  CHECK(x == std::vector<float>{2, 4, 6});
  std::vector<uint16_t> h(1000, FloatToHalf(1.5f));
  ReduceInit(h.data(), h.data(), h.size(), DType::kFloat16, ReduceOp::kPremulSum, 3.0);
  CHECK(std::all_of(h.begin(), h.end(), [](uint16_t v) { return HalfToFloat(v) == 4.5f; }));
}

TEST_CASE("complex SUM is the float SUM of the real view") {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> dist(-100, 100);
  const size_t count = 1001;
  std::vector<float> a(2 * count), b(2 * count);
  for (float& v : a) v = dist(rng);
  for (float& v : b) v = dist(rng);
  std::vector<float> as_complex = a;
  std::vector<float> as_real = a;
  ReduceInto(as_complex.data(), b.data(), count, DType::kComplex64, ReduceOp::kSum, 1.0);
  ReduceInto(as_real.data(), b.data(), 2 * count, DType::kFloat32, ReduceOp::kSum, 1.0);
  CHECK(as_complex == as_real);

  CHECK(Reduce<std::complex<float>>(DType::kComplex64, ReduceOp::kSum,
                                    {{{1, 2}, {0.5f, -1}}, {{3, 4}, {0.25f, 1}}}) ==
        std::vector<std::complex<float>>{{4, 6}, {0.75f, 0}});
  CHECK(Reduce<std::complex<double>>(DType::kComplex128, ReduceOp::kSum,
                                     {{{1, 2}}, {{3, 4}}, {{-4, -6}}}) ==
        std::vector<std::complex<double>>{{0, 0}});
}

TEST_CASE("16-bit SUM rounds every partial result") {
  // 2048 + 1 + 1 in float16: each partial 2049 rounds back to 2048 (ties to
  // even), so the result is 2048, not the exactly rounded 2050.
  CHECK(ReduceFloats(DType::kFloat16, ReduceOp::kSum, {{2048}, {1}, {1}}) ==
        std::vector<double>{2048});
  CHECK(ReduceFloats(DType::kBFloat16, ReduceOp::kSum, {{256}, {1}, {1}}) ==
        std::vector<double>{256});
  CHECK(ReduceFloats(DType::kFloat16, ReduceOp::kSum, {{60000}, {10000}}) ==
        std::vector<double>{std::numeric_limits<double>::infinity()});
}

TEST_CASE("AVG with a single contribution leaves the values alone") {
  std::vector<uint16_t> h = {FloatToHalf(1.25f), 0x7E01, 0x8001};
  const std::vector<uint16_t> before = h;
  ReduceFinish(h.data(), h.size(), DType::kFloat16, ReduceOp::kAvg, 1);
  CHECK(h == before);
}

TEST_CASE("Zero-length reductions touch nothing") {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      if (!CheckReduce(dtype, op).ok()) continue;
      ReduceInit(nullptr, nullptr, 0, dtype, op, 2.0);
      ReduceInto(nullptr, nullptr, 0, dtype, op, 2.0);
      ReduceFinish(nullptr, 0, dtype, op, 3);
    }
  }
  SUCCEED();
}

}  // namespace
}  // namespace muster
