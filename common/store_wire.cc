#include "common/store_wire.h"

#include <cctype>
#include <cstring>
#include <limits>

namespace muster::wire {
namespace {

struct ByteOp {
  uint8_t byte;
  Op op;
};

// PyTorch 1.13 (0..8) and the mid-2023 additions (9..12).
constexpr ByteOp kTorch113Ops[] = {
    {0, Op::kSet},         {1, Op::kCompareSet}, {2, Op::kGet},       {3, Op::kAdd},
    {4, Op::kCheck},       {5, Op::kWait},       {6, Op::kNumKeys},   {7, Op::kWatchKey},
    {8, Op::kDeleteKey},   {9, Op::kAppend},     {10, Op::kMultiGet}, {11, Op::kMultiSet},
    {12, Op::kCancelWait},
};

// PyTorch 2.2+ (VALIDATE at 0 shifted everything by one up to DELETE_KEY).
constexpr ByteOp kTorch2Ops[] = {
    {0, Op::kValidate},    {1, Op::kSet},       {2, Op::kCompareSet}, {3, Op::kGet},
    {4, Op::kAdd},         {5, Op::kCheck},     {6, Op::kWait},       {7, Op::kNumKeys},
    {8, Op::kDeleteKey},   {9, Op::kAppend},    {10, Op::kMultiGet},  {11, Op::kMultiSet},
    {12, Op::kCancelWait}, {13, Op::kPing},     {14, Op::kQueuePush}, {15, Op::kQueuePop},
    {16, Op::kQueueLen},   {17, Op::kListKeys},
};

constexpr ByteOp kNativeExtraOps[] = {
    {kAuthByte, Op::kAuth},
    {kAuthProofByte, Op::kAuthProof},
    {kWaitForByte, Op::kWaitFor},
    {kGetWaitForByte, Op::kGetWaitFor},
};

}  // namespace

const char* DialectName(Dialect d) {
  switch (d) {
    case Dialect::kUnknown:
      return "unknown";
    case Dialect::kTorch113:
      return "torch-1.13";
    case Dialect::kTorch2:
      return "torch-2";
    case Dialect::kNative:
      return "native";
  }
  return "?";
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kValidate:
      return "VALIDATE";
    case Op::kSet:
      return "SET";
    case Op::kCompareSet:
      return "COMPARE_SET";
    case Op::kGet:
      return "GET";
    case Op::kAdd:
      return "ADD";
    case Op::kCheck:
      return "CHECK";
    case Op::kWait:
      return "WAIT";
    case Op::kNumKeys:
      return "GETNUMKEYS";
    case Op::kWatchKey:
      return "WATCH_KEY";
    case Op::kDeleteKey:
      return "DELETE_KEY";
    case Op::kAppend:
      return "APPEND";
    case Op::kMultiGet:
      return "MULTI_GET";
    case Op::kMultiSet:
      return "MULTI_SET";
    case Op::kCancelWait:
      return "CANCEL_WAIT";
    case Op::kPing:
      return "PING";
    case Op::kQueuePush:
      return "QUEUE_PUSH";
    case Op::kQueuePop:
      return "QUEUE_POP";
    case Op::kQueueLen:
      return "QUEUE_LEN";
    case Op::kListKeys:
      return "LIST_KEYS";
    case Op::kAuth:
      return "AUTH";
    case Op::kAuthProof:
      return "AUTH_PROOF";
    case Op::kWaitFor:
      return "WAIT_FOR";
    case Op::kGetWaitFor:
      return "GET_WAIT_FOR";
  }
  return "?";
}

std::optional<uint8_t> CommandByte(Dialect dialect, Op op) {
  if (dialect == Dialect::kTorch113) {
    for (const ByteOp& b : kTorch113Ops) {
      if (b.op == op) return b.byte;
    }
    return std::nullopt;
  }
  for (const ByteOp& b : kTorch2Ops) {
    if (b.op == op) return b.byte;
  }
  if (dialect == Dialect::kNative) {
    for (const ByteOp& b : kNativeExtraOps) {
      if (b.op == op) return b.byte;
    }
  }
  return std::nullopt;
}

std::optional<Op> OpFromByte(Dialect dialect, uint8_t byte) {
  if (dialect == Dialect::kTorch113) {
    for (const ByteOp& b : kTorch113Ops) {
      if (b.byte == byte) return b.op;
    }
    return std::nullopt;
  }
  for (const ByteOp& b : kTorch2Ops) {
    if (b.byte == byte) return b.op;
  }
  if (dialect == Dialect::kNative) {
    for (const ByteOp& b : kNativeExtraOps) {
      // The handshake's commands are only valid in their place, which the
      // parser checks itself.
      if (b.byte == byte && b.op != Op::kAuth && b.op != Op::kAuthProof) return b.op;
    }
  }
  return std::nullopt;
}

void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }

void PutU32(std::string* out, uint32_t v) {
  char buf[4];
  std::memcpy(buf, &v, 4);  // little-endian hosts only (x86-64, aarch64)
  out->append(buf, 4);
}

void PutU64(std::string* out, uint64_t v) {
  char buf[8];
  std::memcpy(buf, &v, 8);
  out->append(buf, 8);
}

void PutI64(std::string* out, int64_t v) { PutU64(out, static_cast<uint64_t>(v)); }

void PutBytes(std::string* out, absl::string_view bytes) {
  PutU64(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

void PutKeyList(std::string* out, const std::vector<std::string>& keys) {
  PutU64(out, keys.size());
  for (const std::string& k : keys) PutBytes(out, k);
}

std::string MissingKeysText(const std::vector<std::string>& named, uint64_t total) {
  std::string out = "missing keys: ";
  for (size_t i = 0; i < named.size(); ++i) {
    if (i > 0) out += ", ";
    out += PrintableKey(named[i]);
  }
  if (named.size() < total) {
    out += ", ... (";
    out += std::to_string(named.size());
    out += " of ";
    out += std::to_string(total);
    out += " missing keys named)";
  }
  return out;
}

std::string PrintableKey(absl::string_view key) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < key.size() && i < 80; ++i) {
    unsigned char c = key[i];
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (key.size() > 80) out += "...";
  return out;
}

std::optional<int64_t> ParseCounter(absl::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  if (i >= text.size() || !std::isdigit(static_cast<unsigned char>(text[i]))) return std::nullopt;
  uint64_t magnitude = 0;
  const uint64_t limit = negative ? uint64_t{1} << 63 : std::numeric_limits<int64_t>::max();
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    uint64_t digit = text[i] - '0';
    if (magnitude > (limit - digit) / 10) return std::nullopt;
    magnitude = magnitude * 10 + digit;
  }
  if (negative)
    return magnitude == (uint64_t{1} << 63) ? std::numeric_limits<int64_t>::min()
                                            : -static_cast<int64_t>(magnitude);
  return static_cast<int64_t>(magnitude);
}

std::optional<std::string> CompareSetResult(const std::optional<std::string>& current,
                                            absl::string_view expected, absl::string_view desired,
                                            std::string* reply) {
  if (!current.has_value()) {
    if (expected.empty()) {
      *reply = std::string(desired);
      return std::string(desired);
    }
    *reply = std::string(expected);  // c10d replies `expected` and stores nothing
    return std::nullopt;
  }
  if (*current == expected) {
    *reply = std::string(desired);
    return std::string(desired);
  }
  *reply = *current;
  return std::nullopt;
}

}  // namespace muster::wire
