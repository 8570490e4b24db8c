// libFuzzer target for the store's wire protocol: RequestParser fed in
// several splittings of the same bytes, and every parsed request run through
// StoreDispatcher (the server's own dispatch code, not a copy) against a
// KvStore, with a small reply limit and memory budget.
//
// Invariants checked (a violation aborts, which libFuzzer reports as a
// crash and the replay test as a failure):
//  - Next() reports consumed > 0 and <= the bytes it was given;
//  - one chunk, one byte at a time, data-derived chunk sizes and a few
//    hash-chosen split points all yield the same requests, the same dialect
//    and the same final outcome (need-more with the same leftover, or the
//    same error);
//  - every request is well formed for its op and dialect and within the
//    StoreLimits the parser was given; a native stream is AUTH (32-byte
//    nonce), AUTH_PROOF (empty or 32 bytes), then neither again;
//  - KvStore::total_bytes() equals the charges (KvStore::EntryCharge,
//    QueueCharge, ItemCharge) of what it holds, and never exceeds
//    max_total_bytes;
//  - a rejected write changes nothing and reports no mutation; the reported
//    mutations, replayed into a second store, rebuild the same contents; a
//    simple model (std::map + deques) agrees with the store;
//  - wait callbacks never run inside Wait(), run at most once, never after
//    CancelWait(), and num_waits() counts the live registrations;
//  - every reply (including those of finished and timed-out waits) equals
//    what the model answers; no reply outgrows what it reserved (or
//    StoreDispatcher::kSmallReplyBytes); a request refused for memory (reply
//    over the limit, or over the budget with earlier replies unsent) is over
//    it by the model's measure, builds no reply and changes nothing; the
//    parser's key byte count matches the keys.
//
// Build: bazel build --config=fuzz //daemon/store:request_parser_fuzzer
// Run:   tools/fuzz.sh [SECONDS]
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/store_wire.h"
#include "daemon/store/kv_store.h"
#include "daemon/store/request_parser.h"
#include "daemon/store/store_dispatcher.h"

namespace muster {
namespace {

using wire::Dialect;
using wire::Op;

[[noreturn]] void InvariantFailed(const char* what, int line, const std::string& detail = "") {
  std::fprintf(stderr, "request_parser_fuzzer.cc:%d: invariant violated: %s%s%s\n", line, what,
               detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond)                           \
  do {                                             \
    if (!(cond)) InvariantFailed(#cond, __LINE__); \
  } while (0)
#define FUZZ_CHECK_MSG(cond, msg)                         \
  do {                                                    \
    if (!(cond)) InvariantFailed(#cond, __LINE__, (msg)); \
  } while (0)

// Small enough that a 4 KiB input reaches every limit.
wire::StoreLimits FuzzLimits() {
  wire::StoreLimits limits;
  limits.max_key_bytes = 48;
  limits.max_value_bytes = 384;
  limits.max_keys_per_request = 8;
  limits.max_request_bytes = 640;
  return limits;
}
constexpr uint64_t kMaxTotalBytes = 1200;
// Emulated connections parked in a wait at once.
constexpr size_t kMaxOpenWaits = 4;

// ---------------------------------------------------------------------------
// Parsing.

struct ParseOutcome {
  std::vector<StoreRequest> requests;
  bool failed = false;  // kError ended the stream
  std::string error;    // its message
  size_t consumed = 0;  // bytes of all parsed requests
  Dialect dialect = Dialect::kUnknown;
};

bool SameRequest(const StoreRequest& a, const StoreRequest& b) {
  return a.op == b.op && a.keys == b.keys && a.values == b.values && a.number == b.number &&
         a.nonce == b.nonce;
}

std::string Describe(const StoreRequest& r) {
  std::string s =
      absl::StrCat(wire::OpName(r.op), " keys=", r.keys.size(), " values=", r.values.size(),
                   " number=", r.number, " nonce=", r.nonce);
  for (const std::string& k : r.keys) absl::StrAppend(&s, " k'", wire::PrintableKey(k), "'");
  for (const std::string& v : r.values) absl::StrAppend(&s, " v'", wire::PrintableKey(v), "'");
  return s;
}

bool IsHandshake(Op op) { return op == Op::kAuth || op == Op::kAuthProof; }
bool IsNativeOnly(Op op) { return IsHandshake(op) || op == Op::kWaitFor || op == Op::kGetWaitFor; }
bool IsTorch2Only(Op op) {
  return op == Op::kValidate || op == Op::kPing || op == Op::kQueuePush || op == Op::kQueuePop ||
         op == Op::kQueueLen || op == Op::kListKeys;
}

// One parsed request is well formed for its op, its place in the stream and
// the dialect, and within the limits.
void CheckRequest(const StoreRequest& r, size_t index, Dialect dialect,
                  const wire::StoreLimits& limits) {
  const size_t nk = r.keys.size(), nv = r.values.size();
  switch (r.op) {
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      FUZZ_CHECK(nk == 1 && nv == 1);
      break;
    case Op::kCompareSet:
      FUZZ_CHECK(nk == 1 && nv == 2);
      break;
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kAdd:
      FUZZ_CHECK(nk == 1 && nv == 0);
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
    case Op::kWaitFor:
    case Op::kGetWaitFor:
      FUZZ_CHECK(nv == 0);
      break;
    case Op::kMultiSet:
      FUZZ_CHECK(nk == nv);
      break;
    case Op::kNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
    case Op::kPing:
      FUZZ_CHECK(nk == 0 && nv == 0);
      break;
    case Op::kValidate:
      FUZZ_CHECK(nk == 0 && nv == 0);
      FUZZ_CHECK(r.nonce == wire::kValidateMagic);
      break;
    case Op::kAuth:
      FUZZ_CHECK(nk == 0 && nv == 1);
      FUZZ_CHECK(r.values[0].size() == wire::kAuthNonceBytes);
      break;
    case Op::kAuthProof:
      FUZZ_CHECK(nk == 0 && nv == 1);
      FUZZ_CHECK(r.values[0].empty() || r.values[0].size() == wire::kAuthProofBytes);
      break;
  }
  // Handshakes only first, and only in their dialect.
  if (r.op == Op::kValidate) FUZZ_CHECK(index == 0 && dialect == Dialect::kTorch2);
  if (r.op == Op::kAuth) FUZZ_CHECK(index == 0 && dialect == Dialect::kNative);
  if (r.op == Op::kAuthProof) FUZZ_CHECK(index == 1 && dialect == Dialect::kNative);
  if (index == 0 && dialect == Dialect::kTorch2) FUZZ_CHECK(r.op == Op::kValidate);
  if (index == 0 && dialect == Dialect::kNative) FUZZ_CHECK(r.op == Op::kAuth);
  if (index == 1 && dialect == Dialect::kNative) FUZZ_CHECK(r.op == Op::kAuthProof);
  if (IsNativeOnly(r.op)) FUZZ_CHECK(dialect == Dialect::kNative);
  if (IsTorch2Only(r.op)) FUZZ_CHECK(dialect != Dialect::kTorch113);
  if (dialect == Dialect::kTorch113) FUZZ_CHECK(r.op != Op::kValidate && !IsHandshake(r.op));

  // Limits.
  FUZZ_CHECK(nk <= limits.max_keys_per_request);
  uint64_t total = 0;
  for (const std::string& k : r.keys) {
    FUZZ_CHECK(k.size() <= limits.max_key_bytes);
    total += k.size();
  }
  // The handshake's fixed-size fields are not store data.
  if (!IsHandshake(r.op)) {
    for (const std::string& v : r.values) {
      FUZZ_CHECK(v.size() <= limits.max_value_bytes);
      total += v.size();
    }
  }
  FUZZ_CHECK(total <= limits.max_request_bytes);
}

// Runs one parser over a stream, recording what it returns.
class ParseRun {
 public:
  // Key lists of more than 2 keys take the parser's resumable (key by key)
  // path, so every splitting below exercises it.
  explicit ParseRun(const wire::StoreLimits& limits)
      : limits_(limits), parser_(limits, /*resumable_keys=*/2) {}

  // One Next() call on `input`: the bytes consumed by a request, or 0 when
  // the parser needs more bytes or failed (then done() is true).
  size_t Step(absl::string_view input) {
    StoreRequest request;
    size_t consumed = 0;
    std::string error;
    RequestParser::Result r = parser_.Next(input, &request, &consumed, &error);
    FUZZ_CHECK(r != RequestParser::Result::kYield);  // only with a key budget
    if (r == RequestParser::Result::kNeedMore) return 0;
    if (r == RequestParser::Result::kError) {
      FUZZ_CHECK(!error.empty());
      out_.failed = true;
      out_.error = std::move(error);
      return 0;
    }
    FUZZ_CHECK(consumed > 0);
    FUZZ_CHECK(consumed <= input.size());
    FUZZ_CHECK(parser_.dialect() != Dialect::kUnknown);
    CheckRequest(request, out_.requests.size(), parser_.dialect(), limits_);
    out_.consumed += consumed;
    out_.requests.push_back(std::move(request));
    return consumed;
  }
  bool done() const { return out_.failed; }

  ParseOutcome Finish(size_t leftover, size_t size) {
    out_.dialect = parser_.dialect();
    if (!out_.failed) FUZZ_CHECK(out_.consumed + leftover == size);
    if (out_.requests.empty()) {
      FUZZ_CHECK(out_.dialect == Dialect::kUnknown ||
                 (out_.failed && out_.dialect == Dialect::kNative));
    }
    return std::move(out_);
  }

 private:
  const wire::StoreLimits& limits_;
  RequestParser parser_;
  ParseOutcome out_;
};

// The reference: all of `data` at once, parsed in place (libFuzzer's buffer
// is exactly `size` bytes, so ASan catches any read past its end).
ParseOutcome ParseWhole(const uint8_t* data, size_t size, const wire::StoreLimits& limits) {
  ParseRun run(limits);
  absl::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!run.done()) {
    size_t used = run.Step(rest);
    if (used == 0) break;
    rest.remove_prefix(used);
  }
  return run.Finish(rest.size(), size);
}

// Feeds `data` in chunks of next_chunk() bytes, the way StoreServer::
// ProcessInput does (append, parse until kNeedMore, drop the consumed
// prefix once all of it is consumed). With `exact_copy`, each Next() gets
// its bytes in a heap block of exactly that size, so ASan catches any read
// past what it was given.
template <typename ChunkFn>
ParseOutcome ParseChunked(const uint8_t* data, size_t size, const wire::StoreLimits& limits,
                          bool exact_copy, ChunkFn next_chunk) {
  ParseRun run(limits);
  std::string in;
  size_t off = 0;
  size_t fed = 0;
  while (!run.done()) {
    if (fed < size) {
      size_t n = next_chunk();
      if (n == 0) n = 1;
      if (n > size - fed) n = size - fed;
      in.append(reinterpret_cast<const char*>(data) + fed, n);
      fed += n;
    }
    while (!run.done()) {
      const size_t avail = in.size() - off;
      absl::string_view input(in.data() + off, avail);
      std::unique_ptr<char[]> copy;
      if (exact_copy && avail > 0) {
        copy.reset(new char[avail]);
        std::memcpy(copy.get(), input.data(), avail);
        input = absl::string_view(copy.get(), avail);
      }
      size_t used = run.Step(input);
      if (used == 0) break;
      off += used;
    }
    if (off == in.size()) {
      in.clear();
      off = 0;
    }
    if (fed >= size) break;
  }
  return run.Finish(in.size() - off, size);
}

void CheckSameOutcome(const ParseOutcome& want, const ParseOutcome& got, const char* how) {
  FUZZ_CHECK_MSG(want.failed == got.failed,
                 absl::StrCat(how, ": one chunk ", want.failed ? "failed: " + want.error : "ok",
                              ", split ", got.failed ? "failed: " + got.error : "ok"));
  FUZZ_CHECK_MSG(want.error == got.error,
                 absl::StrCat(how, ": '", want.error, "' vs '", got.error, "'"));
  FUZZ_CHECK_MSG(
      want.requests.size() == got.requests.size(),
      absl::StrCat(how, ": ", want.requests.size(), " vs ", got.requests.size(), " requests"));
  for (size_t i = 0; i < want.requests.size(); ++i) {
    FUZZ_CHECK_MSG(SameRequest(want.requests[i], got.requests[i]),
                   absl::StrCat(how, ": request ", i, ": ", Describe(want.requests[i]), " vs ",
                                Describe(got.requests[i])));
  }
  FUZZ_CHECK_MSG(want.dialect == got.dialect, how);
  if (!want.failed) FUZZ_CHECK_MSG(want.consumed == got.consumed, how);
}

uint64_t Fnv1a(const uint8_t* data, size_t size) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < size; ++i) {
    h ^= data[i];
    h *= 1099511628211ULL;
  }
  return h;
}

// ---------------------------------------------------------------------------
// Applying requests.

struct RecordedMutation {
  Mutation::Type type;
  std::string key;
  std::string value;
};

// The reply-size limit and memory budget of the emulated server: small, so
// a MULTI_GET of a few big values (the amplification the server must
// refuse before building) and a backlog of unsent replies reach them.
constexpr uint64_t kFuzzMaxReplyBytes = 1024;
constexpr uint64_t kFuzzBudgetBytes = 2048;
// Unsent replies are "sent" (their budget released) after every this many
// requests, so replies pile up in between.
constexpr size_t kDrainEvery = 4;

// MUSTER_FUZZ_VERBOSE=1: what each request did (for triage).
bool Verbose() {
  static const bool verbose = std::getenv("MUSTER_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// Runs requests through StoreDispatcher (the server's own dispatch) against
// a KvStore, with several emulated connections parked in waits, and checks
// each reply against a simple model (std::map + deques) and the store after
// each request.
// A LIST_KEYS reply (i64 count, then u64-length-prefixed keys, in the
// store's order) with its keys sorted, to compare with the model's.
std::string SortedKeyList(const std::string& reply) {
  FUZZ_CHECK(reply.size() >= 8);
  std::vector<std::string> keys;
  for (size_t pos = 8; pos < reply.size();) {
    FUZZ_CHECK(reply.size() - pos >= 8);
    uint64_t n;
    std::memcpy(&n, reply.data() + pos, 8);
    FUZZ_CHECK(n <= reply.size() - pos - 8);
    keys.push_back(reply.substr(pos + 8, n));
    pos += 8 + n;
  }
  std::sort(keys.begin(), keys.end());
  std::string sorted = reply.substr(0, 8);
  for (const std::string& k : keys) wire::PutBytes(&sorted, k);
  return sorted;
}

class Emulator {
 public:
  explicit Emulator(Dialect dialect)
      : kv_(kMaxTotalBytes), dispatcher_(&kv_, kFuzzMaxReplyBytes), dialect_(dialect) {
    kv_.SetMutationListener([this](const Mutation& m) {
      mutations_.push_back(RecordedMutation{m.type, std::string(m.key), std::string(m.value)});
    });
  }

  void Apply(const StoreRequest& parsed) {
    StoreRequest req = parsed;  // Execute may move the keys away
    mutations_.clear();
    ExpireWaits();
    const uint64_t bytes_before = kv_.total_bytes();
    const int64_t keys_before = kv_.NumKeys();
    // The model's answer, from the state before the request.
    std::string want;  // reply body, if the request succeeds
    std::optional<std::string> to_store;
    bool had = false;
    switch (req.op) {
      case Op::kPing:
        wire::PutU32(&want, req.nonce);
        break;
      case Op::kWatchKey:
        wire::PutU8(&want, wire::kWatchRegistered);
        break;
      case Op::kCompareSet: {
        std::string reply;
        to_store =
            wire::CompareSetResult(ModelGet(req.keys[0]), req.values[0], req.values[1], &reply);
        wire::PutBytes(&want, reply);
        break;
      }
      case Op::kGet: {
        std::optional<std::string> v = ModelGet(req.keys[0]);
        wire::PutBytes(&want, v.value_or(""));
        break;
      }
      case Op::kMultiGet:
        for (const std::string& k : req.keys) wire::PutBytes(&want, ModelGet(k).value_or(""));
        break;
      case Op::kCheck:
        wire::PutU8(&want, ModelHasAll(req.keys) ? wire::kCheckReady : wire::kCheckNotReady);
        break;
      case Op::kCancelWait:
        wire::PutU8(&want, wire::kWaitCanceled);
        break;
      case Op::kNumKeys:
        wire::PutI64(&want, static_cast<int64_t>(model_map_.size()));
        break;
      case Op::kDeleteKey:
        had = model_map_.count(req.keys[0]) > 0;
        wire::PutI64(&want, had ? 1 : 0);
        break;
      case Op::kListKeys:
        wire::PutI64(&want, static_cast<int64_t>(model_map_.size()));
        for (const auto& [k, v] : model_map_) wire::PutBytes(&want, k);  // sorted, unique
        break;
      case Op::kQueuePop: {
        auto it = model_queues_.find(req.keys[0]);
        int64_t len = it == model_queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
        wire::PutI64(&want, len);
        if (len > 0) wire::PutBytes(&want, it->second.front());
        break;
      }
      case Op::kQueueLen: {
        auto it = model_queues_.find(req.keys[0]);
        wire::PutI64(&want,
                     it == model_queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
        break;
      }
      default:
        break;
    }

    Context ctx(this);
    StoreRequest run = req;  // Execute may take the values; the model needs them
    dispatcher_.Execute(run, ctx);
    ctx.CheckBound();
    if (req.op == Op::kListKeys && ctx.failure.ok()) ctx.reply = SortedKeyList(ctx.reply);
    const bool failed = !ctx.failure.ok();
    const bool refused = ctx.refused_for_memory;
    if (Verbose()) {
      std::fprintf(stderr, "  %s -> %s\n", wire::OpName(req.op),
                   failed ? std::string(ctx.failure.message()).c_str()
                          : absl::StrCat(ctx.reply.size(), " reply bytes").c_str());
    }
    if (failed) {
      // A failed request built no reply and, refused for memory, changed
      // nothing either (the reply is measured before the store is touched).
      FUZZ_CHECK(ctx.reply.empty());
      if (refused) Rejected(ctx.failure, bytes_before, keys_before);
    } else if (req.op != Op::kWait && req.op != Op::kWaitFor && req.op != Op::kGetWaitFor &&
               req.op != Op::kAdd) {
      // Every other successful request answers exactly what the model says
      // (the writes' replies are empty: SET, APPEND, MULTI_SET, QUEUE_PUSH).
      FUZZ_CHECK_MSG(ctx.reply == want,
                     absl::StrCat(wire::OpName(req.op), ": reply of ", ctx.reply.size(),
                                  " bytes, model says ", want.size()));
    }

    switch (req.op) {
      case Op::kSet:
        if (!failed) {
          ExpectMutations(1);
          ModelSet(req.keys[0], req.values[0]);
        } else {
          Rejected(ctx.failure, bytes_before, keys_before);
        }
        break;
      case Op::kAppend:
        if (!failed) {
          ExpectMutations(1);
          ModelSet(req.keys[0], model_map_[req.keys[0]] + req.values[0]);
        } else {
          Rejected(ctx.failure, bytes_before, keys_before);
        }
        break;
      case Op::kMultiSet:
        if (!failed) {
          ExpectMutations(req.keys.size());
          for (size_t i = 0; i < req.keys.size(); ++i) ModelSet(req.keys[i], req.values[i]);
        } else {
          Rejected(ctx.failure, bytes_before, keys_before);
        }
        break;
      case Op::kQueuePush:
        if (!failed) {
          ExpectMutations(1);
          model_queues_[req.keys[0]].push_back(req.values[0]);
        } else {
          Rejected(ctx.failure, bytes_before, keys_before);
        }
        break;
      case Op::kCompareSet:
        if (!failed) {
          ExpectMutations(to_store.has_value() ? 1 : 0);
          if (to_store.has_value()) ModelSet(req.keys[0], *to_store);
        } else {
          FUZZ_CHECK(refused || to_store.has_value());  // only a store can fail
          Rejected(ctx.failure, bytes_before, keys_before);
        }
        break;
      case Op::kAdd: {
        std::optional<std::string> current = ModelGet(req.keys[0]);
        std::optional<int64_t> counter;
        if (current.has_value()) counter = wire::ParseCounter(*current);
        if (!failed) {
          FUZZ_CHECK(!current.has_value() || counter.has_value());
          int64_t sum = current.has_value()
                            ? static_cast<int64_t>(static_cast<uint64_t>(*counter) +
                                                   static_cast<uint64_t>(req.number))
                            : req.number;
          std::string reply;
          wire::PutI64(&reply, sum);
          FUZZ_CHECK(ctx.reply == reply);
          ExpectMutations(1);
          ModelSet(req.keys[0], absl::StrCat(sum));
        } else {
          if (ctx.failure.code() == absl::StatusCode::kFailedPrecondition) {
            FUZZ_CHECK(current.has_value() && !counter.has_value());
          }
          Rejected(ctx.failure, bytes_before, keys_before);
        }
        break;
      }
      case Op::kCheck:
        FUZZ_CHECK(kv_.Check(parsed.keys) == kv_.MissingKeys(parsed.keys).empty());
        break;
      case Op::kDeleteKey:
        ExpectMutations(had ? 1 : 0);
        model_map_.erase(req.keys[0]);
        FUZZ_CHECK(kv_.Find(req.keys[0]) == nullptr);
        break;
      case Op::kQueuePop:
        if (!failed) {
          auto it = model_queues_.find(req.keys[0]);
          bool popped = it != model_queues_.end();
          ExpectMutations(popped ? 1 : 0);
          if (popped) {
            it->second.pop_front();
            if (it->second.empty()) model_queues_.erase(it);
          }
        }
        break;
      case Op::kMultiGet:
      case Op::kGet:
      case Op::kListKeys:
        // Refused only if the model's reply (plus its status byte) is over
        // the reply limit or the budget.
        if (refused) {
          FUZZ_CHECK(want.size() + 2 > kFuzzMaxReplyBytes ||
                     pending_ + want.size() + 2 > kFuzzBudgetBytes);
        }
        FUZZ_CHECK(mutations_.empty());
        break;
      default:
        break;
    }
    CompleteReleased();
    for (const RecordedMutation& m : mutations_) Replay(m);
    CheckAccounting();
    CheckWaits();
    if (++applied_ % kDrainEvery == 0) pending_ = 0;
  }

  // End of the stream: every connection goes away, and the store must still
  // match the model and its replayed log.
  void Finish() {
    while (!open_waits_.empty()) CancelNewestWait();
    FUZZ_CHECK(kv_.num_waits() == 0);
    while (kv_.ReapCancelled(64) > 0) {
    }
    FUZZ_CHECK(kv_.pending_reap_keys() == 0);
    CheckAccounting();
    CheckSameContents(shadow_);
    std::vector<std::string> keys = kv_.ListKeys();
    FUZZ_CHECK(keys.size() == model_map_.size());
    for (const std::string& k : keys) {
      const std::string* v = kv_.Find(k);
      FUZZ_CHECK(v != nullptr);
      auto it = model_map_.find(k);
      FUZZ_CHECK(it != model_map_.end() && it->second == *v);
    }
    std::map<std::string, std::deque<std::string>> queues;
    kv_.ForEachQueueItem([&](absl::string_view k, absl::string_view item) {
      queues[std::string(k)].emplace_back(item);
    });
    FUZZ_CHECK(queues == model_queues_);
  }

 private:
  // The dispatcher's view of the emulated connection: records the reply
  // (without the native status byte), the failure, and checks that a reply
  // never outgrows what it reserved.
  struct Context : StoreDispatcher::Context {
    explicit Context(Emulator* e) : emulator(e) {}
    wire::Dialect dialect() const override { return emulator->dialect_; }
    bool ReserveReply(uint64_t bytes, wire::Op op) override {
      FUZZ_CHECK(reserved == 0);  // one reply per request
      FUZZ_CHECK(bytes <= kFuzzMaxReplyBytes);
      if (emulator->pending_ + bytes > kFuzzBudgetBytes) {
        RefuseForMemory(absl::StrCat("reply of ", bytes, " bytes to ", wire::OpName(op)));
        return false;
      }
      reserved = bytes;
      emulator->pending_ += bytes;
      return true;
    }
    void RefuseForMemory(std::string why) override {
      refused_for_memory = true;
      Fail(absl::ResourceExhaustedError(why));
    }
    std::string& Reply() override {
      FUZZ_CHECK(!replied);  // one reply per request
      FUZZ_CHECK(failure.ok());
      replied = true;
      if (dialect() == Dialect::kNative) status_bytes = 1;
      return reply;
    }
    void Fail(const absl::Status& why) override {
      FUZZ_CHECK(!why.ok());
      FUZZ_CHECK(failure.ok());  // failed once, then nothing more
      failure = why;
    }
    void StartWait(StoreWaitKind kind, std::vector<std::string> keys, uint64_t key_bytes,
                   int64_t timeout_ms) override {
      emulator->StartWait(kind, std::move(keys), key_bytes, timeout_ms);
    }
    void CancelWait() override { emulator->CancelNewestWait(); }

    // The reply stayed within what was reserved (status byte included), or
    // within kSmallReplyBytes when nothing was.
    void CheckBound() const {
      uint64_t bytes = reply.size() + status_bytes;
      if (reserved > 0) {
        FUZZ_CHECK_MSG(bytes <= reserved,
                       absl::StrCat(bytes, " reply bytes, ", reserved, " reserved"));
      } else {
        FUZZ_CHECK(bytes <= StoreDispatcher::kSmallReplyBytes);
      }
    }

    Emulator* emulator;
    std::string reply;
    uint64_t status_bytes = 0;
    uint64_t reserved = 0;
    bool replied = false;
    bool refused_for_memory = false;
    absl::Status failure;
  };

  struct OpenWait {
    uint64_t slot;
    KvStore::WaitId id;
    int ttl;  // requests until a WAIT_FOR times out; -1: never
  };
  enum class WaitState { kRegistering, kOpen, kFired, kCancelled };
  struct WaitInfo {
    WaitState state;
    StoreWaitKind kind;
    std::vector<std::string> keys;
  };

  std::optional<std::string> ModelGet(const std::string& key) const {
    auto it = model_map_.find(key);
    if (it == model_map_.end()) return std::nullopt;
    return it->second;
  }
  bool ModelHasAll(const std::vector<std::string>& keys) const {
    for (const std::string& k : keys) {
      if (model_map_.count(k) == 0 && model_queues_.count(k) == 0) return false;
    }
    return true;
  }
  void ModelSet(const std::string& key, const std::string& value) { model_map_[key] = value; }

  void ExpectMutations(size_t n) {
    FUZZ_CHECK_MSG(mutations_.size() == n,
                   absl::StrCat(mutations_.size(), " mutations reported, want ", n));
  }

  void Rejected(const absl::Status& s, uint64_t bytes_before, int64_t keys_before) {
    FUZZ_CHECK(!s.ok());
    FUZZ_CHECK(s.code() == absl::StatusCode::kResourceExhausted ||
               s.code() == absl::StatusCode::kFailedPrecondition);
    // All or nothing: a rejected write leaves no trace.
    FUZZ_CHECK(mutations_.empty());
    FUZZ_CHECK(kv_.total_bytes() == bytes_before);
    FUZZ_CHECK(kv_.NumKeys() == keys_before);
  }

  void Replay(const RecordedMutation& m) {
    switch (m.type) {
      case Mutation::Type::kSet:
        FUZZ_CHECK(shadow_.Set(m.key, m.value).ok());
        break;
      case Mutation::Type::kDelete:
        shadow_.Delete(m.key);
        break;
      case Mutation::Type::kAppend:
        FUZZ_CHECK(shadow_.Append(m.key, m.value).ok());
        break;
      case Mutation::Type::kQueuePush:
        FUZZ_CHECK(shadow_.QueuePush(m.key, m.value).ok());
        break;
      case Mutation::Type::kQueuePop: {
        std::string ignored;
        FUZZ_CHECK(shadow_.QueuePop(m.key, &ignored) > 0);
        break;
      }
    }
  }

  void CheckAccounting() {
    uint64_t sum = 0;
    std::vector<std::string> keys = kv_.ListKeys();
    for (const std::string& k : keys) {
      const std::string* v = kv_.Find(k);
      FUZZ_CHECK(v != nullptr);
      sum += KvStore::ChargeOf(k, *v);
    }
    std::set<std::string> queues;
    kv_.ForEachQueueItem([&](absl::string_view k, absl::string_view item) {
      sum += KvStore::ItemCharge(item.size());
      if (queues.insert(std::string(k)).second) sum += KvStore::QueueCharge(k.size());
    });
    FUZZ_CHECK_MSG(kv_.total_bytes() == sum,
                   absl::StrCat("total_bytes()=", kv_.total_bytes(),
                                " but the charges of what it holds=", sum));
    FUZZ_CHECK_MSG(kv_.total_bytes() <= kMaxTotalBytes,
                   absl::StrCat("total_bytes()=", kv_.total_bytes(),
                                " exceeds max_total_bytes=", kMaxTotalBytes));
    FUZZ_CHECK(kv_.NumKeys() == static_cast<int64_t>(keys.size()));
    FUZZ_CHECK(kv_.NumKeys() == static_cast<int64_t>(model_map_.size()));
    FUZZ_CHECK(shadow_.total_bytes() == kv_.total_bytes());
    FUZZ_CHECK(shadow_.NumKeys() == kv_.NumKeys());
  }

  void CheckSameContents(const KvStore& other) {
    std::vector<std::string> keys = kv_.ListKeys();
    FUZZ_CHECK(keys == other.ListKeys());
    for (const std::string& k : keys) {
      const std::string* a = kv_.Find(k);
      const std::string* b = other.Find(k);
      FUZZ_CHECK(a != nullptr && b != nullptr && *a == *b);
    }
    std::vector<std::pair<std::string, std::string>> qa, qb;
    kv_.ForEachQueueItem([&](absl::string_view k, absl::string_view v) { qa.emplace_back(k, v); });
    other.ForEachQueueItem(
        [&](absl::string_view k, absl::string_view v) { qb.emplace_back(k, v); });
    std::stable_sort(qa.begin(), qa.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    std::stable_sort(qb.begin(), qb.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    FUZZ_CHECK(qa == qb);
  }

  // Parks an emulated connection the way StoreServer::StartWait does; key
  // lists of more than 2 keys register in slices (BeginWait, AddWaitKeys,
  // EndWait), as the server's long lists do.
  void StartWait(StoreWaitKind kind, std::vector<std::string> keys, uint64_t key_bytes,
                 int64_t timeout_ms) {
    if (key_bytes != 0) {  // the parser's count matches the keys
      uint64_t sum = 0;
      for (const std::string& k : keys) sum += k.size();
      FUZZ_CHECK(sum == key_bytes);
    }
    // A further parked connection beyond the cap hangs up first.
    if (open_waits_.size() >= kMaxOpenWaits) CancelOldestWait();
    uint64_t slot = waits_.size();
    waits_.push_back(WaitInfo{WaitState::kRegistering, kind, keys});
    in_wait_ = true;
    KvStore::WaitId id = 0;
    if (keys.size() > 2) {
      id = kv_.BeginWait([this, slot] { Fired(slot); }, keys.size());
      for (size_t i = 0; i < keys.size(); i += 2) {
        kv_.AddWaitKeys(id, keys.data() + i, std::min<size_t>(2, keys.size() - i));
      }
      if (!kv_.EndWait(id)) id = 0;
    } else {
      id = kv_.Wait(keys, [this, slot] { Fired(slot); });
    }
    in_wait_ = false;
    FUZZ_CHECK(waits_[slot].state == WaitState::kRegistering);  // never run inside Wait()
    bool ready = kv_.Check(keys);
    FUZZ_CHECK(ready == ModelHasAll(keys));
    if (id == 0) {
      FUZZ_CHECK(ready);
      waits_[slot].state = WaitState::kFired;
      Complete(slot, /*timed_out=*/false);
      return;
    }
    FUZZ_CHECK(!ready);
    FUZZ_CHECK(!keys.empty());
    waits_[slot].state = WaitState::kOpen;
    ++live_;
    int ttl = -1;
    if (kind != StoreWaitKind::kTorchWait && timeout_ms > 0) ttl = static_cast<int>(timeout_ms % 5);
    open_waits_.push_back(OpenWait{slot, id, ttl});
  }

  void Fired(uint64_t slot) {
    FUZZ_CHECK(!in_wait_);
    FUZZ_CHECK(slot < waits_.size());
    FUZZ_CHECK_MSG(waits_[slot].state == WaitState::kOpen,
                   absl::StrCat("wait callback in state ", static_cast<int>(waits_[slot].state)));
    waits_[slot].state = WaitState::kFired;
    --live_;
    released_.push_back(slot);
  }

  // The server answers released waits after the request that released
  // them (StoreServer::ResumeWaits).
  void CompleteReleased() {
    std::vector<uint64_t> slots;
    slots.swap(released_);
    for (uint64_t slot : slots) Complete(slot, /*timed_out=*/false);
  }

  // Builds the wait's reply through the dispatcher and checks it.
  void Complete(uint64_t slot, bool timed_out) {
    const WaitInfo& w = waits_[slot];
    std::string want;
    if (w.kind == StoreWaitKind::kTorchWait) {
      wire::PutU8(&want, wire::kStopWaiting);
    } else if (timed_out) {
      wire::PutU8(&want, wire::kWaitTimedOut);
      std::vector<std::string> missing;
      uint64_t missing_count = 0;
      for (const std::string& k : w.keys) {
        if (ModelHasAll({k})) continue;
        if (missing_count++ < wire::kMaxNamedMissingKeys) missing.push_back(k);
      }
      wire::PutU64(&want, missing_count);
      wire::PutKeyList(&want, missing);
    } else {
      wire::PutU8(&want, wire::kWaitDone);
      if (w.kind == StoreWaitKind::kGetWaitFor) {
        for (const std::string& k : w.keys) wire::PutBytes(&want, ModelGet(k).value_or(""));
      }
    }
    Context ctx(this);
    dispatcher_.CompleteWait(w.kind, w.keys, timed_out, ctx);
    ctx.CheckBound();
    if (Verbose()) {
      std::fprintf(stderr, "  wait %s -> %s\n", timed_out ? "timed out" : "done",
                   ctx.failure.ok() ? absl::StrCat(ctx.reply.size(), " reply bytes").c_str()
                                    : std::string(ctx.failure.message()).c_str());
    }
    if (ctx.failure.ok()) {
      FUZZ_CHECK(ctx.reply == want);
    } else {
      FUZZ_CHECK(ctx.refused_for_memory && ctx.reply.empty());
    }
  }

  void Cancel(const OpenWait& w) {
    if (waits_[w.slot].state == WaitState::kOpen) {
      waits_[w.slot].state = WaitState::kCancelled;
      --live_;
    }
    // Harmless for ids that already fired (FinishWait after a timeout).
    kv_.CancelWait(w.id);
    kv_.CancelWait(w.id);
  }

  void CancelNewestWait() {
    if (open_waits_.empty()) return;
    OpenWait w = open_waits_.back();
    open_waits_.pop_back();
    Cancel(w);
  }

  void CancelOldestWait() {
    OpenWait w = open_waits_.front();
    open_waits_.pop_front();
    Cancel(w);
  }

  // Fired registrations leave; WAIT_FOR timeouts count down per request and
  // are answered with the keys still missing.
  void ExpireWaits() {
    std::deque<OpenWait> keep;
    for (OpenWait& w : open_waits_) {
      if (waits_[w.slot].state != WaitState::kOpen) continue;
      if (w.ttl == 0) {
        Cancel(w);
        Complete(w.slot, /*timed_out=*/true);
        continue;
      }
      if (w.ttl > 0) --w.ttl;
      keep.push_back(w);
    }
    open_waits_.swap(keep);
    CheckWaits();
  }

  void CheckWaits() {
    FUZZ_CHECK_MSG(kv_.num_waits() == live_,
                   absl::StrCat("num_waits()=", kv_.num_waits(), " live=", live_));
  }

  KvStore kv_;
  StoreDispatcher dispatcher_;
  const Dialect dialect_;
  KvStore shadow_;  // rebuilt from the reported mutations
  std::vector<RecordedMutation> mutations_;
  std::map<std::string, std::string> model_map_;
  std::map<std::string, std::deque<std::string>> model_queues_;
  std::deque<OpenWait> open_waits_;
  std::vector<WaitInfo> waits_;
  std::vector<uint64_t> released_;  // fired, to be answered
  size_t live_ = 0;
  bool in_wait_ = false;
  uint64_t pending_ = 0;  // reply bytes reserved and not yet "sent"
  size_t applied_ = 0;
};

}  // namespace
}  // namespace muster

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muster;
  const wire::StoreLimits limits = FuzzLimits();

  // Reference: everything in one chunk.
  ParseOutcome whole = ParseWhole(data, size, limits);

  if (size > 0) {
    // One byte at a time.
    CheckSameOutcome(
        whole, ParseChunked(data, size, limits, /*exact_copy=*/false, [] { return size_t{1}; }),
        "byte by byte");

    // Chunk sizes 1..32 taken from the input itself, read backwards.
    size_t i = 0;
    CheckSameOutcome(whole,
                     ParseChunked(data, size, limits, /*exact_copy=*/true,
                                  [&] { return size_t{1} + (data[size - 1 - (i++ % size)] & 31); }),
                     "data-derived chunks");

    // Two to five big chunks at split points chosen by a hash of the input.
    uint64_t h = Fnv1a(data, size);
    size_t pieces = 2 + h % 4;
    std::vector<size_t> lengths;
    size_t left = size;
    for (size_t p = 0; p + 1 < pieces && left > 1; ++p) {
      h = h * 6364136223846793005ULL + 1442695040888963407ULL;
      size_t n = 1 + (h >> 33) % left;
      lengths.push_back(n);
      left -= n;
    }
    lengths.push_back(left);
    size_t j = 0;
    CheckSameOutcome(whole,
                     ParseChunked(data, size, limits, /*exact_copy=*/true,
                                  [&] { return j < lengths.size() ? lengths[j++] : size; }),
                     "hash-chosen split points");
  }

  // MUSTER_FUZZ_VERBOSE=1: what the input parsed to (for triage).
  if (Verbose()) {
    std::fprintf(stderr, "%zu bytes: %s, %zu requests, %s\n", size,
                 wire::DialectName(whole.dialect), whole.requests.size(),
                 whole.failed ? ("error: " + whole.error).c_str()
                              : absl::StrCat(size - whole.consumed, " bytes left over").c_str());
    for (const StoreRequest& r : whole.requests)
      std::fprintf(stderr, "  %s\n", Describe(r).c_str());
  }

  // Apply what the server would have handled (everything before an error).
  Emulator emulator(whole.dialect);
  for (const StoreRequest& req : whole.requests) emulator.Apply(req);
  emulator.Finish();
  return 0;
}
