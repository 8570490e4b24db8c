#include "daemon/store/request_parser.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

enum class Step { kOk, kNeedMore, kError };

// Reads fields from the front of the input; never past its end.
class Reader {
 public:
  // A dry reader checks lengths and limits but copies nothing: the parser
  // runs dry until a whole request is buffered, so a large value arriving
  // in many segments is copied once, not once per segment.
  Reader(absl::string_view input, const wire::StoreLimits& limits, bool dry, std::string* error,
         uint64_t total = 0)
      : input_(input), limits_(limits), dry_(dry), error_(error), total_(total) {}

  size_t position() const { return pos_; }
  // Bytes of keys and values so far (with the `total` it started from).
  uint64_t total() const { return total_; }
  // After kNeedMore: the input size below which retrying is pointless.
  size_t needed() const { return needed_; }
  bool dry() const { return dry_; }
  // The fields still to come after the one being read take at least
  // `bytes` (their length prefixes): a kNeedMore asks for them too.
  void ExpectAfter(uint64_t bytes) { after_ = bytes; }

  Step U8(uint8_t* v) {
    if (pos_ + 1 > input_.size()) return NeedMore(1);
    *v = static_cast<uint8_t>(input_[pos_++]);
    return Step::kOk;
  }
  Step U32(uint32_t* v) {
    if (pos_ + 4 > input_.size()) return NeedMore(4);
    std::memcpy(v, input_.data() + pos_, 4);
    pos_ += 4;
    return Step::kOk;
  }
  Step U64(uint64_t* v) {
    if (pos_ + 8 > input_.size()) return NeedMore(8);
    std::memcpy(v, input_.data() + pos_, 8);
    pos_ += 8;
    return Step::kOk;
  }
  // Exactly `n` bytes (a fixed-size field).
  Step Fixed(std::string* out, size_t n) {
    if (pos_ + n > input_.size()) return NeedMore(n);
    if (!dry_) out->assign(input_.data() + pos_, n);
    pos_ += n;
    return Step::kOk;
  }
  Step I64(int64_t* v) {
    uint64_t u = 0;  // stays 0 when the field is not all there yet
    Step s = U64(&u);
    *v = static_cast<int64_t>(u);
    return s;
  }
  // A u64-length-prefixed byte string of at most `limit` bytes.
  Step Bytes(std::string* out, uint64_t limit, const char* what, const char* flag) {
    uint64_t len;
    if (Step s = U64(&len); s != Step::kOk) return s;
    if (len > limit) {
      *error_ = absl::StrCat(what, " of ", len, " bytes exceeds ", flag, "=", limit);
      return Step::kError;
    }
    total_ += len;
    if (total_ > limits_.max_request_bytes) {
      *error_ = absl::StrCat("request of more than ", total_, " bytes exceeds ",
                             "--store-max-request-bytes=", limits_.max_request_bytes);
      return Step::kError;
    }
    if (pos_ + len > input_.size()) return NeedMore(len);
    if (!dry_) out->assign(input_.data() + pos_, len);
    pos_ += len;
    return Step::kOk;
  }
  Step Key(std::string* out) {
    return Bytes(out, limits_.max_key_bytes, "key", "--store-max-key-bytes");
  }
  Step Value(std::string* out) {
    return Bytes(out, limits_.max_value_bytes, "value", "--store-max-value-bytes");
  }
  Step Count(uint64_t* n) {
    if (Step s = U64(n); s != Step::kOk) return s;
    if (*n > limits_.max_keys_per_request) {
      *error_ = absl::StrCat(*n, " keys in one request exceeds --store-max-keys-per-request=",
                             limits_.max_keys_per_request);
      return Step::kError;
    }
    return Step::kOk;
  }
  void Error(std::string message) { *error_ = std::move(message); }
  Step KeyList(std::vector<std::string>* keys) {
    uint64_t n;
    if (Step s = Count(&n); s != Step::kOk) return s;
    keys->resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      if (Step s = Key(&(*keys)[i]); s != Step::kOk) return s;
    }
    return Step::kOk;
  }

 private:
  Step NeedMore(uint64_t bytes) {
    needed_ = pos_ + bytes + after_;
    return Step::kNeedMore;
  }

  absl::string_view input_;
  const wire::StoreLimits& limits_;
  bool dry_;
  std::string* error_;
  size_t pos_ = 0;
  size_t needed_ = 0;
  uint64_t total_;
  uint64_t after_ = 0;
};

#define STEP(expr)                        \
  do {                                    \
    Step step_ = (expr);                  \
    if (step_ != Step::kOk) return step_; \
  } while (0)

// Parses the body of `op` (after its command byte).
Step ParseBody(wire::Op op, Reader& r, StoreRequest* req) {
  using wire::Op;
  switch (op) {
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      req->keys.resize(1);
      req->values.resize(1);
      STEP(r.Key(&req->keys[0]));
      return r.Value(&req->values[0]);
    case Op::kCompareSet:
      req->keys.resize(1);
      req->values.resize(2);
      STEP(r.Key(&req->keys[0]));
      STEP(r.Value(&req->values[0]));
      return r.Value(&req->values[1]);
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      req->keys.resize(1);
      return r.Key(&req->keys[0]);
    case Op::kAdd:
      req->keys.resize(1);
      STEP(r.Key(&req->keys[0]));
      return r.I64(&req->number);
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return r.KeyList(&req->keys);
    case Op::kWaitFor:
    case Op::kGetWaitFor:
      STEP(r.KeyList(&req->keys));
      return r.I64(&req->number);
    case Op::kMultiSet: {
      // A dry run keeps nothing, and when it runs out it asks for the
      // length prefixes of every pair still to come as well: a MULTI_SET
      // arriving a field at a time is parsed again only once they are all
      // there (or a declared length is), not once per field (quadratic in
      // its up to 131072 pairs, all on the store's loop).
      uint64_t n;
      STEP(r.Count(&n));
      std::string skipped;
      if (!r.dry()) {
        req->keys.resize(n);
        req->values.resize(n);
      }
      for (uint64_t i = 0; i < n; ++i) {
        r.ExpectAfter((n - i) * 16 - 8);
        STEP(r.Key(r.dry() ? &skipped : &req->keys[i]));
        r.ExpectAfter((n - i - 1) * 16);
        STEP(r.Value(r.dry() ? &skipped : &req->values[i]));
      }
      r.ExpectAfter(0);
      return Step::kOk;
    }
    case Op::kNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      return Step::kOk;
    case Op::kPing:
      return r.U32(&req->nonce);
    case Op::kValidate: {
      uint32_t magic;
      STEP(r.U32(&magic));
      req->nonce = magic;
      return Step::kOk;
    }
    case Op::kAuth: {
      uint32_t magic;
      STEP(r.U32(&magic));
      if (magic != wire::kAuthMagic) {
        r.Error(absl::StrCat("native AUTH without the challenge-response magic (got 0x",
                             absl::Hex(magic, absl::kZeroPad8),
                             "): the client predates it and would send its token in clear; "
                             "upgrade the client"));
        return Step::kError;
      }
      req->values.resize(1);
      return r.Fixed(&req->values[0], wire::kAuthNonceBytes);
    }
    case Op::kAuthProof: {
      uint64_t len;
      STEP(r.U64(&len));
      if (len != 0 && len != wire::kAuthProofBytes) {
        r.Error(absl::StrCat("AUTH_PROOF of ", len, " bytes (must be 0 or ", wire::kAuthProofBytes,
                             ")"));
        return Step::kError;
      }
      req->values.resize(1);
      return r.Fixed(&req->values[0], len);
    }
  }
  return Step::kError;
}

bool IsKeyListOp(wire::Op op) {
  using wire::Op;
  return op == Op::kCheck || op == Op::kWait || op == Op::kMultiGet || op == Op::kWaitFor ||
         op == Op::kGetWaitFor;
}

}  // namespace

RequestParser::Result RequestParser::ContinueKeyList(absl::string_view input, StoreRequest* request,
                                                     size_t* consumed, std::string* error,
                                                     size_t* key_budget) {
  Reader r(input.substr(1 + resume_pos_), limits_, /*dry=*/false, error, resume_total_);
  size_t done = 0;  // bytes of r's input in complete keys
  Result result = Result::kRequest;
  while (partial_.keys.size() < resume_count_) {
    if (key_budget != nullptr) {
      if (*key_budget == 0) {
        result = Result::kYield;
        break;
      }
      --*key_budget;
    }
    std::string key;
    Step step = r.Key(&key);
    if (step == Step::kError) {
      resuming_ = false;
      partial_ = StoreRequest();
      resume_held_ = 0;
      if (resume_dialect_ == wire::Dialect::kNative) dialect_ = resume_dialect_;
      return Result::kError;
    }
    if (step == Step::kNeedMore) {
      min_needed_ = 1 + resume_pos_ + r.needed();
      result = Result::kNeedMore;
      break;
    }
    done = r.position();
    resume_total_ = r.total();
    resume_held_ += key.size() + sizeof(std::string);
    partial_.keys.push_back(std::move(key));
  }
  resume_pos_ += done;
  if (result == Result::kYield) {
    min_needed_ = 1 + resume_pos_;
    return result;
  }
  if (result == Result::kNeedMore) return result;
  if (partial_.op == wire::Op::kWaitFor || partial_.op == wire::Op::kGetWaitFor) {
    Reader tail(input.substr(1 + resume_pos_), limits_, /*dry=*/false, error);
    if (tail.I64(&partial_.number) != Step::kOk) {
      min_needed_ = 1 + resume_pos_ + tail.needed();
      return Result::kNeedMore;
    }
    resume_pos_ += tail.position();
  }
  *request = std::move(partial_);
  request->key_bytes = resume_total_;
  partial_ = StoreRequest();
  *consumed = 1 + resume_pos_;
  resuming_ = false;
  resume_held_ = 0;
  min_needed_ = 0;
  dialect_ = resume_dialect_;
  ++parsed_;
  return Result::kRequest;
}

wire::Dialect RequestParser::TorchDialectOf(absl::string_view input) {
  if (input.empty() || static_cast<uint8_t>(input[0]) == wire::kAuthByte) {
    return wire::Dialect::kUnknown;
  }
  if (input[0] != 0) return wire::Dialect::kTorch113;
  if (input.size() < 5) return wire::Dialect::kUnknown;
  uint32_t magic;
  std::memcpy(&magic, input.data() + 1, 4);
  return magic == wire::kValidateMagic ? wire::Dialect::kTorch2 : wire::Dialect::kTorch113;
}

RequestParser::Result RequestParser::Next(absl::string_view input, StoreRequest* request,
                                          size_t* consumed, std::string* error,
                                          size_t* key_budget) {
  *request = StoreRequest();
  if (input.empty() || input.size() < min_needed_) return Result::kNeedMore;
  if (resuming_) return ContinueKeyList(input, request, consumed, error, key_budget);
  uint8_t command = static_cast<uint8_t>(input[0]);
  wire::Dialect dialect = dialect_;
  if (dialect == wire::Dialect::kUnknown) {
    if (command == wire::kAuthByte) {
      dialect = wire::Dialect::kNative;
    } else if (command == 0) {
      // VALIDATE (2.2+) and SET (1.13) share byte 0: the magic decides.
      if (input.size() < 5) return Result::kNeedMore;
      uint32_t magic;
      std::memcpy(&magic, input.data() + 1, 4);
      dialect = magic == wire::kValidateMagic ? wire::Dialect::kTorch2 : wire::Dialect::kTorch113;
    } else {
      dialect = wire::Dialect::kTorch113;
    }
  }
  std::optional<wire::Op> op;
  if (dialect == wire::Dialect::kNative && parsed_ == 0) {
    op = wire::Op::kAuth;
  } else if (dialect == wire::Dialect::kNative && parsed_ == 1) {
    if (command != wire::kAuthProofByte) {
      *error = absl::StrCat("a native client must send AUTH_PROOF after AUTH, got command byte ",
                            static_cast<int>(command));
      return Result::kError;
    }
    op = wire::Op::kAuthProof;
  } else {
    op = wire::OpFromByte(dialect, command);
  }
  if (!op.has_value()) {
    *error = absl::StrCat("unknown command byte ", static_cast<int>(command), " for a ",
                          wire::DialectName(dialect), " client");
    return Result::kError;
  }
  if (*op == wire::Op::kValidate && dialect_ != wire::Dialect::kUnknown) {
    *error = "VALIDATE is only allowed as the first request";
    return Result::kError;
  }
  if (IsKeyListOp(*op)) {
    Reader count_reader(input.substr(1), limits_, /*dry=*/true, error);
    uint64_t count = 0;
    switch (count_reader.Count(&count)) {
      case Step::kNeedMore:
        min_needed_ = 1 + count_reader.needed();
        return Result::kNeedMore;
      case Step::kError:
        if (dialect == wire::Dialect::kNative) dialect_ = dialect;
        return Result::kError;
      case Step::kOk:
        break;
    }
    if (count > resumable_keys_) {
      resuming_ = true;
      resume_dialect_ = dialect;
      partial_ = StoreRequest();
      partial_.op = *op;
      partial_.keys.reserve(count);
      resume_count_ = count;
      resume_pos_ = count_reader.position();
      resume_total_ = 0;
      resume_held_ = count * sizeof(std::string);
      return ContinueKeyList(input, request, consumed, error, key_budget);
    }
  }
  Reader dry(input.substr(1), limits_, /*dry=*/true, error);
  switch (ParseBody(*op, dry, request)) {
    case Step::kNeedMore:
      min_needed_ = 1 + dry.needed();
      return Result::kNeedMore;
    case Step::kError:
      // A malformed AUTH still came from a native client: it is told why in
      // a native error reply (e.g. an old client, which reads those too).
      if (dialect == wire::Dialect::kNative) dialect_ = dialect;
      return Result::kError;
    case Step::kOk:
      break;
  }
  *request = StoreRequest();
  request->op = *op;
  Reader reader(input.substr(1), limits_, /*dry=*/false, error);
  if (ParseBody(*op, reader, request) != Step::kOk) {
    *error = "internal parser error";  // the dry run accepted these bytes
    return Result::kError;
  }
  min_needed_ = 0;
  if (*op == wire::Op::kValidate && request->nonce != wire::kValidateMagic) {
    *error = "VALIDATE with a wrong magic number";
    return Result::kError;
  }
  dialect_ = dialect;
  ++parsed_;
  *consumed = 1 + reader.position();
  return Result::kRequest;
}

}  // namespace muster
