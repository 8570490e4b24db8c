#include "daemon/store/store_dispatcher.h"

#include <catch2/catch.hpp>

namespace muster {
namespace {

using wire::Op;

// Records what the dispatcher asks of a connection.
struct FakeContext : StoreDispatcher::Context {
  wire::Dialect dialect_ = wire::Dialect::kTorch2;
  uint64_t budget = UINT64_MAX;
  uint64_t reserved = 0;
  std::string out;
  absl::Status failure;
  bool refused_for_memory = false;
  StoreWaitKind wait_kind = StoreWaitKind::kNone;
  std::vector<std::string> wait_keys;
  bool cancelled = false;

  wire::Dialect dialect() const override { return dialect_; }
  bool ReserveReply(uint64_t bytes, wire::Op) override {
    if (bytes > budget) {
      RefuseForMemory("over budget");
      return false;
    }
    reserved = bytes;
    return true;
  }
  void RefuseForMemory(std::string why) override {
    refused_for_memory = true;
    failure = absl::ResourceExhaustedError(why);
  }
  std::string& Reply() override {
    if (dialect_ == wire::Dialect::kNative) wire::PutU8(&out, wire::kReplyOk);
    return out;
  }
  void Fail(const absl::Status& why) override { failure = why; }
  void StartWait(StoreWaitKind kind, std::vector<std::string> keys, uint64_t, int64_t) override {
    wait_kind = kind;
    wait_keys = std::move(keys);
  }
  void CancelWait() override { cancelled = true; }
};

StoreRequest Request(Op op, std::vector<std::string> keys, std::vector<std::string> values = {}) {
  StoreRequest r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

std::string Bytes(absl::string_view v) {
  std::string out;
  wire::PutBytes(&out, v);
  return out;
}

TEST_CASE("the dispatcher answers GET and MULTI_GET from the store, missing keys empty") {
  KvStore kv;
  StoreDispatcher d(&kv, 1 << 20);
  REQUIRE(kv.Set("a", "1").ok());
  FakeContext ctx;
  StoreRequest get = Request(Op::kGet, {"a"});
  d.Execute(get, ctx);
  CHECK(ctx.failure.ok());
  CHECK(ctx.out == Bytes("1"));
  CHECK(ctx.reserved == 8 + 1 + 1);

  FakeContext multi;
  multi.dialect_ = wire::Dialect::kNative;
  StoreRequest mget = Request(Op::kMultiGet, {"a", "zz", "a"});
  d.Execute(mget, multi);
  CHECK(multi.out == std::string(1, '\0') + Bytes("1") + Bytes("") + Bytes("1"));
  CHECK(multi.out.size() <= multi.reserved);
}

TEST_CASE("a MULTI_GET over the reply limit is refused before anything is built") {
  KvStore kv;
  StoreDispatcher d(&kv, 4096);
  REQUIRE(kv.Set("big", std::string(1000, 'b')).ok());
  FakeContext ctx;
  StoreRequest mget = Request(Op::kMultiGet, std::vector<std::string>(5, "big"));
  d.Execute(mget, ctx);
  CHECK(ctx.refused_for_memory);
  CHECK(ctx.failure.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(ctx.failure.message()).find("--store-max-reply-bytes=4096") !=
        std::string::npos);
  CHECK(ctx.out.empty());
  // Over the caller's budget (but under the limit): refused the same way.
  FakeContext tight;
  tight.budget = 100;
  StoreRequest get = Request(Op::kGet, {"big"});
  d.Execute(get, tight);
  CHECK(tight.refused_for_memory);
  CHECK(tight.out.empty());
}

TEST_CASE("a write the store cannot hold fails the request and changes nothing") {
  KvStore kv(10);
  StoreDispatcher d(&kv, 1 << 20);
  FakeContext ctx;
  StoreRequest set = Request(Op::kSet, {"key"}, {"much too long"});
  d.Execute(set, ctx);
  CHECK(ctx.failure.code() == absl::StatusCode::kResourceExhausted);
  CHECK_FALSE(ctx.refused_for_memory);
  CHECK(kv.NumKeys() == 0);
}

TEST_CASE("waits are parked by the caller and answered by CompleteWait") {
  KvStore kv;
  StoreDispatcher d(&kv, 1 << 20);
  FakeContext ctx;
  ctx.dialect_ = wire::Dialect::kNative;
  StoreRequest wait = Request(Op::kGetWaitFor, {"x", "y"});
  wait.number = 500;
  d.Execute(wait, ctx);
  CHECK(ctx.wait_kind == StoreWaitKind::kGetWaitFor);
  CHECK(ctx.wait_keys == std::vector<std::string>{"x", "y"});
  CHECK(ctx.out.empty());

  REQUIRE(kv.Set("x", "1").ok());
  FakeContext timed_out;
  timed_out.dialect_ = wire::Dialect::kNative;
  d.CompleteWait(StoreWaitKind::kGetWaitFor, ctx.wait_keys, /*timed_out=*/true, timed_out);
  std::string want(1, '\0');
  wire::PutU8(&want, wire::kWaitTimedOut);
  wire::PutU64(&want, 1);  // missing, of which the first are named
  wire::PutKeyList(&want, {"y"});
  CHECK(timed_out.out == want);

  REQUIRE(kv.Set("y", "2").ok());
  FakeContext done;
  done.dialect_ = wire::Dialect::kNative;
  d.CompleteWait(StoreWaitKind::kGetWaitFor, ctx.wait_keys, /*timed_out=*/false, done);
  want = std::string(1, '\0');
  wire::PutU8(&want, wire::kWaitDone);
  want += Bytes("1") + Bytes("2");
  CHECK(done.out == want);

  FakeContext torch;
  d.CompleteWait(StoreWaitKind::kTorchWait, {"x"}, /*timed_out=*/false, torch);
  CHECK(torch.out == std::string(1, static_cast<char>(wire::kStopWaiting)));

  FakeContext cancel;
  StoreRequest c = Request(Op::kCancelWait, {});
  d.Execute(c, cancel);
  CHECK(cancel.cancelled);
  CHECK(cancel.out == std::string(1, static_cast<char>(wire::kWaitCanceled)));
}

TEST_CASE("IsWrite names exactly the requests that change the store") {
  for (Op op : {Op::kSet, Op::kAppend, Op::kMultiSet, Op::kQueuePush, Op::kCompareSet, Op::kAdd,
                Op::kDeleteKey, Op::kQueuePop}) {
    CHECK(StoreDispatcher::IsWrite(op));
  }
  for (Op op : {Op::kGet, Op::kMultiGet, Op::kCheck, Op::kWait, Op::kNumKeys, Op::kListKeys,
                Op::kQueueLen, Op::kPing, Op::kWaitFor, Op::kGetWaitFor, Op::kCancelWait}) {
    CHECK_FALSE(StoreDispatcher::IsWrite(op));
  }
}

}  // namespace
}  // namespace muster
