#include "daemon/store/store_dispatcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muster {

bool StoreDispatcher::IsWrite(wire::Op op) {
  switch (op) {
    case wire::Op::kSet:
    case wire::Op::kAppend:
    case wire::Op::kMultiSet:
    case wire::Op::kQueuePush:
    case wire::Op::kCompareSet:
    case wire::Op::kAdd:
    case wire::Op::kDeleteKey:
    case wire::Op::kQueuePop:
      return true;
    default:
      return false;
  }
}

uint64_t StoreDispatcher::ValuesReplyBytes(const std::vector<std::string>& keys) const {
  uint64_t bytes = 0;
  for (const std::string& k : keys) {
    const std::string* v = kv_->Find(k);
    bytes += 8 + (v ? v->size() : 0);
  }
  return bytes;
}

bool StoreDispatcher::Admit(uint64_t bytes, wire::Op op, Context& ctx) {
  bytes += 1;  // the native status byte
  if (bytes > max_reply_bytes_) {
    ctx.RefuseForMemory(absl::StrCat("reply of ", bytes, " bytes to ", wire::OpName(op),
                                     " exceeds --store-max-reply-bytes=", max_reply_bytes_));
    return false;
  }
  return ctx.ReserveReply(bytes, op);
}

void StoreDispatcher::Execute(StoreRequest& req, Context& ctx) {
  using wire::Op;
  KvStore& kv = *kv_;
  switch (req.op) {
    case Op::kAuth:
    case Op::kAuthProof:
    case Op::kValidate:
      return;
    case Op::kPing:
      wire::PutU32(&ctx.Reply(), req.nonce);
      return;
    case Op::kSet:
      if (absl::Status s = kv.SetOwned(req.keys[0], std::move(req.values[0])); !s.ok()) {
        Reject(s, ctx);
      }
      return;
    case Op::kAppend:
      if (absl::Status s = kv.Append(req.keys[0], req.values[0]); !s.ok()) Reject(s, ctx);
      return;
    case Op::kMultiSet:
      if (absl::Status s = kv.MultiSet(req.keys, req.values); !s.ok()) Reject(s, ctx);
      return;
    case Op::kQueuePush:
      if (absl::Status s = kv.QueuePush(req.keys[0], req.values[0]); !s.ok()) Reject(s, ctx);
      return;
    case Op::kCompareSet: {
      const std::string* current = kv.Find(req.keys[0]);
      uint64_t longest = std::max<uint64_t>(current ? current->size() : 0,
                                            std::max(req.values[0].size(), req.values[1].size()));
      if (!Admit(8 + longest, req.op, ctx)) return;
      auto r = kv.CompareSet(req.keys[0], req.values[0], req.values[1]);
      if (!r.ok()) return Reject(r.status(), ctx);
      wire::PutBytes(&ctx.Reply(), *r);
      return;
    }
    case Op::kGet: {
      // A missing key answers an empty value (like PyTorch's libuv server)
      // rather than dropping the connection.
      const std::string* v = kv.Find(req.keys[0]);
      if (!Admit(8 + (v ? v->size() : 0), req.op, ctx)) return;
      wire::PutBytes(&ctx.Reply(), v ? absl::string_view(*v) : absl::string_view());
      return;
    }
    case Op::kAdd: {
      auto r = kv.Add(req.keys[0], req.number);
      if (!r.ok()) return Reject(r.status(), ctx);
      wire::PutI64(&ctx.Reply(), *r);
      return;
    }
    case Op::kCheck:
      wire::PutU8(&ctx.Reply(), kv.Check(req.keys) ? wire::kCheckReady : wire::kCheckNotReady);
      return;
    case Op::kWait:
      ctx.StartWait(StoreWaitKind::kTorchWait, std::move(req.keys), req.key_bytes, 0);
      return;
    case Op::kWaitFor:
      ctx.StartWait(StoreWaitKind::kWaitFor, std::move(req.keys), req.key_bytes, req.number);
      return;
    case Op::kGetWaitFor:
      ctx.StartWait(StoreWaitKind::kGetWaitFor, std::move(req.keys), req.key_bytes, req.number);
      return;
    case Op::kCancelWait:
      ctx.CancelWait();
      wire::PutU8(&ctx.Reply(), wire::kWaitCanceled);
      return;
    case Op::kNumKeys:
      wire::PutI64(&ctx.Reply(), kv.NumKeys());
      return;
    case Op::kDeleteKey:
      wire::PutI64(&ctx.Reply(), kv.Delete(req.keys[0]) ? 1 : 0);
      return;
    case Op::kWatchKey:
      // Registered, but no change events are ever pushed (allowed: the 1.13
      // Python API cannot watch keys).
      wire::PutU8(&ctx.Reply(), wire::kWatchRegistered);
      return;
    case Op::kMultiGet: {
      if (!Admit(ValuesReplyBytes(req.keys), req.op, ctx)) return;
      std::string& out = ctx.Reply();
      for (const std::string& k : req.keys) {
        const std::string* v = kv.Find(k);
        wire::PutBytes(&out, v ? absl::string_view(*v) : absl::string_view());
      }
      return;
    }
    case Op::kListKeys: {
      uint64_t count = 0, bytes = 0;
      kv.MeasureKeys("", &count, &bytes);
      if (!Admit(8 + 8 * count + bytes, req.op, ctx)) return;
      // Straight from the map, unsorted (clients sort): copying and
      // sorting 1.1 M keys held the store's loop for a second.
      std::string& out = ctx.Reply();
      wire::PutI64(&out, static_cast<int64_t>(count));
      kv.ForEachKey([&out](absl::string_view k) { wire::PutBytes(&out, k); });
      return;
    }
    case Op::kQueuePop: {
      const std::string* front = kv.QueueFront(req.keys[0]);
      if (!Admit(16 + (front ? front->size() : 0), req.op, ctx)) return;
      std::string value;
      int64_t before = kv.QueuePop(req.keys[0], &value);
      std::string& out = ctx.Reply();
      wire::PutI64(&out, before);
      if (before > 0) wire::PutBytes(&out, value);
      return;
    }
    case Op::kQueueLen:
      wire::PutI64(&ctx.Reply(), kv.QueueLen(req.keys[0]));
      return;
  }
}

void StoreDispatcher::CompleteWait(StoreWaitKind kind, const std::vector<std::string>& keys,
                                   bool timed_out, Context& ctx) {
  if (kind == StoreWaitKind::kNone) return;
  std::vector<std::string> missing;  // the first few (wire::kMaxNamedMissingKeys)
  uint64_t missing_count = 0;
  uint64_t reply_bytes = 1;
  if (kind != StoreWaitKind::kTorchWait && timed_out) {
    missing_count = kv_->MissingKeys(keys, wire::kMaxNamedMissingKeys, &missing);
    reply_bytes += 8 + 8;
    for (const std::string& k : missing) reply_bytes += 8 + k.size();
  } else if (kind == StoreWaitKind::kGetWaitFor) {
    reply_bytes += ValuesReplyBytes(keys);
  }
  if (!Admit(reply_bytes,
             kind == StoreWaitKind::kGetWaitFor ? wire::Op::kGetWaitFor : wire::Op::kWaitFor,
             ctx)) {
    return;
  }
  std::string& out = ctx.Reply();
  if (kind == StoreWaitKind::kTorchWait) {
    wire::PutU8(&out, wire::kStopWaiting);
  } else if (timed_out) {
    wire::PutU8(&out, wire::kWaitTimedOut);
    wire::PutU64(&out, missing_count);
    wire::PutKeyList(&out, missing);
  } else {
    wire::PutU8(&out, wire::kWaitDone);
    if (kind == StoreWaitKind::kGetWaitFor) {
      for (const std::string& k : keys) {
        const std::string* v = kv_->Find(k);
        wire::PutBytes(&out, v ? absl::string_view(*v) : absl::string_view());
      }
    }
  }
}

}  // namespace muster
