#include "common/store_wire.h"

#include <catch2/catch.hpp>
#include <limits>

namespace muster::wire {
namespace {

TEST_CASE("command bytes follow PyTorch 1.13 and 2.2+ numbering") {
  CHECK(CommandByte(Dialect::kTorch113, Op::kSet) == 0);
  CHECK(CommandByte(Dialect::kTorch113, Op::kAdd) == 3);
  CHECK(CommandByte(Dialect::kTorch113, Op::kDeleteKey) == 8);
  CHECK_FALSE(CommandByte(Dialect::kTorch113, Op::kPing).has_value());
  CHECK(CommandByte(Dialect::kTorch2, Op::kValidate) == 0);
  CHECK(CommandByte(Dialect::kTorch2, Op::kSet) == 1);
  CHECK(CommandByte(Dialect::kTorch2, Op::kDeleteKey) == 8);
  CHECK(CommandByte(Dialect::kTorch2, Op::kPing) == 13);
  CHECK(CommandByte(Dialect::kTorch2, Op::kListKeys) == 17);
  CHECK_FALSE(CommandByte(Dialect::kTorch2, Op::kGetWaitFor).has_value());
  CHECK(CommandByte(Dialect::kNative, Op::kGetWaitFor) == kGetWaitForByte);
  CHECK(OpFromByte(Dialect::kTorch113, 5) == Op::kWait);
  CHECK(OpFromByte(Dialect::kTorch2, 6) == Op::kWait);
  CHECK_FALSE(OpFromByte(Dialect::kTorch2, kWaitForByte).has_value());
  CHECK_FALSE(OpFromByte(Dialect::kTorch2, 200).has_value());
  // The handshake has command bytes but is never an ordinary request.
  CHECK(CommandByte(Dialect::kNative, Op::kAuth) == kAuthByte);
  CHECK(CommandByte(Dialect::kNative, Op::kAuthProof) == kAuthProofByte);
  CHECK_FALSE(OpFromByte(Dialect::kNative, kAuthByte).has_value());
  CHECK_FALSE(OpFromByte(Dialect::kNative, kAuthProofByte).has_value());
  CHECK_FALSE(OpFromByte(Dialect::kTorch113, kAuthProofByte).has_value());
}

TEST_CASE("encoding is little-endian with u64 length prefixes") {
  std::string out;
  PutU8(&out, 7);
  PutU32(&out, kValidateMagic);
  PutBytes(&out, "ab");
  CHECK(out == std::string("\x07\xCE\xF7\x85\x3C\x02\0\0\0\0\0\0\0ab", 15));
}

TEST_CASE("ParseCounter follows strtoll: leading digits, sign, overflow") {
  CHECK(ParseCounter("42") == 42);
  CHECK(ParseCounter(" -7") == -7);
  CHECK(ParseCounter("+3") == 3);
  CHECK(ParseCounter("12abc") == 12);
  CHECK_FALSE(ParseCounter("abc").has_value());
  CHECK_FALSE(ParseCounter("").has_value());
  CHECK_FALSE(ParseCounter("-").has_value());
  CHECK(ParseCounter("9223372036854775807") == std::numeric_limits<int64_t>::max());
  CHECK(ParseCounter("-9223372036854775808") == std::numeric_limits<int64_t>::min());
  CHECK_FALSE(ParseCounter("9223372036854775808").has_value());
}

TEST_CASE("CompareSetResult follows c10d for missing and present keys") {
  std::string reply;
  // Missing key, empty expected: created with desired.
  CHECK(CompareSetResult(std::nullopt, "", "new", &reply) == "new");
  CHECK(reply == "new");
  // Missing key, non-empty expected: nothing stored, reply is expected.
  CHECK_FALSE(CompareSetResult(std::nullopt, "a", "b", &reply).has_value());
  CHECK(reply == "a");
  // Present and equal: swapped.
  CHECK(CompareSetResult(std::string("a"), "a", "b", &reply) == "b");
  CHECK(reply == "b");
  // Present and different: unchanged, reply is the current value.
  CHECK_FALSE(CompareSetResult(std::string("x"), "a", "b", &reply).has_value());
  CHECK(reply == "x");
}

}  // namespace
}  // namespace muster::wire
