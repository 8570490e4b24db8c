#include "daemon/store/request_parser.h"

#include <catch2/catch.hpp>

namespace muster {
namespace {

using wire::Dialect;
using wire::Op;

std::string Torch113Set(const std::string& key, const std::string& value) {
  std::string s;
  wire::PutU8(&s, 0);
  wire::PutBytes(&s, key);
  wire::PutBytes(&s, value);
  return s;
}

std::string Validate() {
  std::string s;
  wire::PutU8(&s, 0);
  wire::PutU32(&s, wire::kValidateMagic);
  return s;
}

std::string AuthHello(const std::string& nonce) {
  std::string s;
  wire::PutU8(&s, wire::kAuthByte);
  wire::PutU32(&s, wire::kAuthMagic);
  s += nonce;
  return s;
}

std::string AuthProof(const std::string& proof) {
  std::string s;
  wire::PutU8(&s, wire::kAuthProofByte);
  wire::PutBytes(&s, proof);
  return s;
}

TEST_CASE("the first bytes pick the dialect") {
  wire::StoreLimits limits;
  StoreRequest req;
  size_t used = 0;
  std::string err;
  {
    RequestParser p(limits);
    std::string in = Validate();
    REQUIRE(p.Next(in, &req, &used, &err) == RequestParser::Result::kRequest);
    CHECK(req.op == Op::kValidate);
    CHECK(used == 5);
    CHECK(p.dialect() == Dialect::kTorch2);
  }
  {
    RequestParser p(limits);
    std::string in = Torch113Set("/k", "v");
    REQUIRE(p.Next(in, &req, &used, &err) == RequestParser::Result::kRequest);
    CHECK(req.op == Op::kSet);
    CHECK(req.keys[0] == "/k");
    CHECK(req.values[0] == "v");
    CHECK(p.dialect() == Dialect::kTorch113);
  }
  {
    RequestParser p(limits);
    std::string in = AuthHello(std::string(32, 'n'));
    REQUIRE(p.Next(in, &req, &used, &err) == RequestParser::Result::kRequest);
    CHECK(req.op == Op::kAuth);
    CHECK(req.values == std::vector<std::string>{std::string(32, 'n')});
    CHECK(used == 1 + 4 + 32);
    CHECK(p.dialect() == Dialect::kNative);
  }
  {
    // 1.13 ADD init/ (byte 3) is GET in 2.x; the 1.13 meaning wins here.
    RequestParser p(limits);
    std::string in;
    wire::PutU8(&in, 3);
    wire::PutBytes(&in, "init/");
    wire::PutI64(&in, 1);
    REQUIRE(p.Next(in, &req, &used, &err) == RequestParser::Result::kRequest);
    CHECK(req.op == Op::kAdd);
    CHECK(req.number == 1);
  }
}

TEST_CASE("requests split at every byte boundary parse the same") {
  wire::StoreLimits limits;
  std::string stream = Validate();
  wire::PutU8(&stream, 2);  // COMPARE_SET
  wire::PutBytes(&stream, "key");
  wire::PutBytes(&stream, "old");
  wire::PutBytes(&stream, "new");
  wire::PutU8(&stream, 11);  // MULTI_SET (count sent as i64 by torch)
  wire::PutI64(&stream, 2);
  wire::PutBytes(&stream, "a");
  wire::PutBytes(&stream, "1");
  wire::PutBytes(&stream, "b");
  wire::PutBytes(&stream, "2");
  wire::PutU8(&stream, 13);  // PING
  wire::PutU32(&stream, 1234);
  for (size_t chunk = 1; chunk <= stream.size(); ++chunk) {
    RequestParser p(limits);
    std::string buffer;
    std::vector<StoreRequest> got;
    for (size_t fed = 0; fed < stream.size();) {
      size_t n = std::min(chunk, stream.size() - fed);
      buffer.append(stream, fed, n);
      fed += n;
      while (true) {
        StoreRequest req;
        size_t used = 0;
        std::string err;
        auto r = p.Next(buffer, &req, &used, &err);
        REQUIRE(r != RequestParser::Result::kError);
        if (r == RequestParser::Result::kNeedMore) break;
        got.push_back(req);
        buffer.erase(0, used);
      }
    }
    INFO("chunk " << chunk);
    REQUIRE(got.size() == 4);
    CHECK(buffer.empty());
    CHECK(got[1].op == Op::kCompareSet);
    CHECK(got[1].values == std::vector<std::string>{"old", "new"});
    CHECK(got[2].op == Op::kMultiSet);
    CHECK(got[2].keys == std::vector<std::string>{"a", "b"});
    CHECK(got[2].values == std::vector<std::string>{"1", "2"});
    CHECK(got[3].op == Op::kPing);
    CHECK(got[3].nonce == 1234);
  }
}

TEST_CASE("limits are enforced from the length field, before the body arrives") {
  wire::StoreLimits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 32;
  limits.max_keys_per_request = 4;
  limits.max_request_bytes = 100;
  StoreRequest req;
  size_t used = 0;
  std::string err;
  {
    RequestParser p(limits);
    std::string in;
    wire::PutU8(&in, 0);
    wire::PutU64(&in, 17);  // key length only; no body yet
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err == "key of 17 bytes exceeds --store-max-key-bytes=16");
  }
  {
    RequestParser p(limits);
    std::string in;
    wire::PutU8(&in, 0);
    wire::PutBytes(&in, "k");
    wire::PutU64(&in, 1ull << 40);
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err == "value of 1099511627776 bytes exceeds --store-max-value-bytes=32");
  }
  {
    RequestParser p(limits);
    std::string in;
    wire::PutU8(&in, 5);  // 1.13 WAIT
    wire::PutU64(&in, 5);
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err == "5 keys in one request exceeds --store-max-keys-per-request=4");
  }
  {
    RequestParser p(limits);
    std::string in = Validate();
    REQUIRE(p.Next(in, &req, &used, &err) == RequestParser::Result::kRequest);
    in.clear();
    wire::PutU8(&in, 11);
    wire::PutU64(&in, 4);
    for (int i = 0; i < 4; ++i) {
      wire::PutBytes(&in, "key");
      wire::PutBytes(&in, std::string(30, 'v'));
    }
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err.find("--store-max-request-bytes=100") != std::string::npos);
  }
}

TEST_CASE("unknown commands and misplaced VALIDATE are errors") {
  wire::StoreLimits limits;
  StoreRequest req;
  size_t used = 0;
  std::string err;
  {
    RequestParser p(limits);
    std::string in = "\x63";
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err == "unknown command byte 99 for a torch-1.13 client");
  }
  {
    RequestParser p(limits);
    std::string in = Validate() + Validate();
    REQUIRE(p.Next(in, &req, &used, &err) == RequestParser::Result::kRequest);
    CHECK(p.Next(in.substr(used), &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err == "VALIDATE is only allowed as the first request");
  }
  {
    RequestParser p(limits);
    std::string in;
    wire::PutU8(&in, 0);
    wire::PutU32(&in, wire::kValidateMagic);
    REQUIRE(p.Next(in, &req, &used, &err) == RequestParser::Result::kRequest);
    in = std::string("\x14", 1);  // 20: unassigned in 2.x
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kError);
  }
}

TEST_CASE("the native handshake: AUTH with a nonce, then AUTH_PROOF, then requests") {
  wire::StoreLimits limits;
  const std::string nonce = "0123456789abcdef0123456789abcdef";
  const std::string proof(32, '\xee');
  std::string get;
  wire::PutU8(&get, *wire::CommandByte(Dialect::kNative, Op::kGet));
  wire::PutBytes(&get, "k");
  for (const std::string& sent_proof : {proof, std::string()}) {
    std::string stream = AuthHello(nonce) + AuthProof(sent_proof) + get;
    // Split at every byte boundary: the same three requests.
    for (size_t chunk = 1; chunk <= stream.size(); ++chunk) {
      RequestParser p(limits);
      std::string buffer;
      std::vector<StoreRequest> got;
      for (size_t fed = 0; fed < stream.size();) {
        size_t n = std::min(chunk, stream.size() - fed);
        buffer.append(stream, fed, n);
        fed += n;
        while (true) {
          StoreRequest req;
          size_t used = 0;
          std::string err;
          auto r = p.Next(buffer, &req, &used, &err);
          INFO(err);
          REQUIRE(r != RequestParser::Result::kError);
          if (r == RequestParser::Result::kNeedMore) break;
          got.push_back(req);
          buffer.erase(0, used);
        }
      }
      INFO("chunk " << chunk);
      REQUIRE(got.size() == 3);
      CHECK(buffer.empty());
      CHECK(got[0].op == Op::kAuth);
      CHECK(got[0].values == std::vector<std::string>{nonce});
      CHECK(got[1].op == Op::kAuthProof);
      CHECK(got[1].values == std::vector<std::string>{sent_proof});
      CHECK(got[2].op == Op::kGet);
      CHECK(got[2].keys == std::vector<std::string>{"k"});
    }
  }
}

TEST_CASE("malformed or misplaced handshake messages are errors") {
  wire::StoreLimits limits;
  StoreRequest req;
  size_t used = 0;
  std::string err;
  const std::string nonce(32, 'n');
  {
    // A client from before the challenge-response: AUTH + u64 length + token.
    // Refused from the first 5 bytes, before any of the token is read.
    RequestParser p(limits);
    std::string in;
    wire::PutU8(&in, wire::kAuthByte);
    wire::PutU64(&in, 6);
    CHECK(p.Next(in.substr(0, 5), &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err.find("without the challenge-response magic") != std::string::npos);
    CHECK(err.find("upgrade the client") != std::string::npos);
    CHECK(p.dialect() == Dialect::kNative);  // so it gets a native error reply
  }
  {
    // AUTH whose nonce has not fully arrived.
    RequestParser p(limits);
    std::string in = AuthHello(nonce).substr(0, 20);
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kNeedMore);
  }
  {
    // A proof of the wrong size, refused from its length field.
    RequestParser p(limits);
    std::string in = AuthHello(nonce);
    REQUIRE(p.Next(in, &req, &used, &err) == RequestParser::Result::kRequest);
    in.clear();
    wire::PutU8(&in, wire::kAuthProofByte);
    wire::PutU64(&in, 16);
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err == "AUTH_PROOF of 16 bytes (must be 0 or 32)");
    RequestParser huge(limits);
    REQUIRE(huge.Next(AuthHello(nonce), &req, &used, &err) == RequestParser::Result::kRequest);
    in.clear();
    wire::PutU8(&in, wire::kAuthProofByte);
    wire::PutU64(&in, uint64_t{1} << 40);
    CHECK(huge.Next(in, &req, &used, &err) == RequestParser::Result::kError);
  }
  {
    // Skipping AUTH_PROOF: any other command after AUTH.
    RequestParser p(limits);
    REQUIRE(p.Next(AuthHello(nonce), &req, &used, &err) == RequestParser::Result::kRequest);
    std::string in;
    wire::PutU8(&in, *wire::CommandByte(Dialect::kNative, Op::kGet));
    wire::PutBytes(&in, "k");
    CHECK(p.Next(in, &req, &used, &err) == RequestParser::Result::kError);
    CHECK(err == "a native client must send AUTH_PROOF after AUTH, got command byte 3");
  }
  {
    // A second AUTH, or a second AUTH_PROOF, after the handshake.
    for (const std::string& again : {AuthHello(nonce), AuthProof(std::string(32, 'p'))}) {
      RequestParser p(limits);
      REQUIRE(p.Next(AuthHello(nonce), &req, &used, &err) == RequestParser::Result::kRequest);
      REQUIRE(p.Next(AuthProof(""), &req, &used, &err) == RequestParser::Result::kRequest);
      CHECK(p.Next(again, &req, &used, &err) == RequestParser::Result::kError);
      CHECK(err.find("unknown command byte") != std::string::npos);
    }
  }
  {
    // AUTH_PROOF as a first message is a 1.13 client's unknown command.
    RequestParser p(limits);
    CHECK(p.Next(AuthProof(std::string(32, 'p')), &req, &used, &err) ==
          RequestParser::Result::kError);
    CHECK(err == "unknown command byte 166 for a torch-1.13 client");
  }
  {
    // Torch 2.x clients cannot use the native handshake commands.
    RequestParser p(limits);
    REQUIRE(p.Next(Validate(), &req, &used, &err) == RequestParser::Result::kRequest);
    CHECK(p.Next(AuthHello(nonce), &req, &used, &err) == RequestParser::Result::kError);
  }
}

TEST_CASE("a declared value length is known before its bytes arrive (min_needed)") {
  RequestParser parser(wire::StoreLimits{});
  std::string partial;
  wire::PutU8(&partial, 0);  // 1.13 SET
  wire::PutBytes(&partial, "k");
  wire::PutU64(&partial, 16 << 20);
  partial += "abc";
  StoreRequest req;
  size_t consumed = 0;
  std::string error;
  REQUIRE(parser.Next(partial, &req, &consumed, &error) == RequestParser::Result::kNeedMore);
  CHECK(parser.min_needed() == 1 + 8 + 1 + 8 + (16u << 20));
}

TEST_CASE("a MULTI_SET arriving a field at a time is not parsed again per field") {
  // 4096 pairs of empty keys and values, fed 8 bytes (one length field) at
  // a time. Once the count is in, the parser asks for every pair's length
  // prefixes (min_needed), so it parses the request again only when they
  // can all be there: a handful of parses, not one per field (8192, each
  // from the start: quadratic).
  constexpr int64_t kPairs = 4096;
  std::string stream = Validate();
  const size_t validate_bytes = stream.size();
  wire::PutU8(&stream, 11);  // MULTI_SET
  wire::PutI64(&stream, kPairs);
  for (int64_t i = 0; i < 2 * kPairs; ++i) wire::PutBytes(&stream, "");
  RequestParser p(wire::StoreLimits{});
  std::string buffer = stream.substr(0, validate_bytes);
  StoreRequest req;
  size_t used = 0;
  std::string err;
  REQUIRE(p.Next(buffer, &req, &used, &err) == RequestParser::Result::kRequest);
  buffer.erase(0, used);
  int parses = 0;
  bool done = false;
  for (size_t fed = validate_bytes; fed < stream.size() && !done;) {
    const size_t n = fed == validate_bytes ? 9 : std::min<size_t>(8, stream.size() - fed);
    buffer.append(stream, fed, n);
    fed += n;
    if (buffer.size() >= p.min_needed()) ++parses;  // Next looks at the bytes
    auto r = p.Next(buffer, &req, &used, &err);
    REQUIRE(r != RequestParser::Result::kError);
    if (fed == validate_bytes + 9) CHECK(p.min_needed() == 1 + 8 + 16 * kPairs);
    done = r == RequestParser::Result::kRequest;
  }
  REQUIRE(done);
  CHECK(req.op == Op::kMultiSet);
  CHECK(req.keys.size() == static_cast<size_t>(kPairs));
  CHECK(req.values.size() == static_cast<size_t>(kPairs));
  CHECK(used == stream.size() - validate_bytes);
  CHECK(parses <= 3);
}

TEST_CASE("a MULTI_SET's min_needed never asks for more than the request holds") {
  // Keys and values of different lengths, fed a byte at a time: whatever
  // the parser has seen, what it asks for fits in the whole request, and
  // the request parses once it is all there.
  std::string stream = Validate();
  const size_t validate_bytes = stream.size();
  wire::PutU8(&stream, 11);  // MULTI_SET
  wire::PutI64(&stream, 5);
  for (int i = 0; i < 5; ++i) {
    wire::PutBytes(&stream, std::string(i * 7, 'k'));
    wire::PutBytes(&stream, std::string((4 - i) * 5, 'v'));
  }
  RequestParser p(wire::StoreLimits{});
  StoreRequest req;
  size_t used = 0;
  std::string err;
  REQUIRE(p.Next(stream.substr(0, validate_bytes), &req, &used, &err) ==
          RequestParser::Result::kRequest);
  const size_t request_bytes = stream.size() - validate_bytes;
  RequestParser::Result r = RequestParser::Result::kNeedMore;
  for (size_t n = 1; n <= request_bytes; ++n) {
    r = p.Next(absl::string_view(stream).substr(validate_bytes, n), &req, &used, &err);
    INFO("after " << n << " of " << request_bytes << " bytes");
    REQUIRE(r != RequestParser::Result::kError);
    if (r == RequestParser::Result::kRequest) break;
    CHECK(p.min_needed() <= request_bytes);
    CHECK(p.min_needed() > n);
  }
  REQUIRE(r == RequestParser::Result::kRequest);
  CHECK(used == request_bytes);
  CHECK(req.keys[4] == std::string(28, 'k'));
  CHECK(req.values[0] == std::string(20, 'v'));
}

TEST_CASE("long key lists parse key by key within a key budget, the same as in one go") {
  std::vector<std::string> keys;
  for (int i = 0; i < 1000; ++i) keys.push_back("key/" + std::to_string(i));
  for (Op op : {Op::kWait, Op::kMultiGet, Op::kCheck}) {
    std::string bytes;
    wire::PutU8(&bytes, *wire::CommandByte(Dialect::kTorch113, op));
    wire::PutKeyList(&bytes, keys);
    bytes += Torch113Set("after", "v");
    RequestParser parser(wire::StoreLimits{});
    StoreRequest req;
    size_t consumed = 0;
    std::string error;
    int yields = 0, need_more = 0;
    size_t fed = 0;
    RequestParser::Result r;
    while (true) {
      size_t budget = 100;
      absl::string_view input(bytes.data(), std::min(fed, bytes.size()));
      r = parser.Next(input, &req, &consumed, &error, &budget);
      if (r == RequestParser::Result::kYield) {
        ++yields;
        CHECK(budget == 0);
        CHECK(parser.held_bytes() > 0);
      } else if (r == RequestParser::Result::kNeedMore) {
        ++need_more;
        fed += 3001;  // bytes arrive in odd-sized pieces
      } else {
        break;
      }
    }
    REQUIRE(r == RequestParser::Result::kRequest);
    CHECK(req.op == op);
    CHECK(req.keys == keys);
    CHECK(yields >= 5);
    CHECK(need_more > 1);
    CHECK(parser.held_bytes() == 0);
    CHECK(parser.dialect() == Dialect::kTorch113);
    // The next request follows as usual.
    absl::string_view rest(bytes.data() + consumed, bytes.size() - consumed);
    REQUIRE(parser.Next(rest, &req, &consumed, &error) == RequestParser::Result::kRequest);
    CHECK(req.op == Op::kSet);
    CHECK(consumed == rest.size());
  }
}

TEST_CASE("an oversized key deep in a long key list is an error with the usual message") {
  wire::StoreLimits limits;
  limits.max_key_bytes = 16;
  std::vector<std::string> keys(500, "short");
  keys[400] = std::string(17, 'x');
  std::string bytes;
  wire::PutU8(&bytes, *wire::CommandByte(Dialect::kTorch113, Op::kWait));
  wire::PutKeyList(&bytes, keys);
  RequestParser parser(limits);
  StoreRequest req;
  size_t consumed = 0;
  std::string error;
  CHECK(parser.Next(bytes, &req, &consumed, &error) == RequestParser::Result::kError);
  CHECK(error == "key of 17 bytes exceeds --store-max-key-bytes=16");
}

}  // namespace
}  // namespace muster
