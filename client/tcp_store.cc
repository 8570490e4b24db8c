#include "muster/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/store_auth.h"
#include "common/store_wire.h"

namespace muster {

using wire::Dialect;
using wire::Op;

namespace {

int PollMillis(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// Milliseconds for the native WAIT_FOR timeout field; 0 means no timeout.
int64_t TimeoutMillis(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return 0;
  return std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout));
}

// How long past the server-side timeout the client waits for its answer.
constexpr absl::Duration kReplyGrace = absl::Seconds(10);

absl::Time DeadlineAfter(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return absl::InfiniteFuture();
  return absl::Now() + d;
}

// The first wire::kMaxNamedMissingKeys of `keys`, then how many there are.
std::string WaitedKeysText(const std::vector<std::string>& keys) {
  std::vector<std::string> printable;
  for (size_t i = 0; i < keys.size() && i < wire::kMaxNamedMissingKeys; ++i) {
    printable.push_back(wire::PrintableKey(keys[i]));
  }
  std::string text = absl::StrJoin(printable, ", ");
  if (printable.size() < keys.size()) {
    absl::StrAppend(&text, ", ... (", printable.size(), " of ", keys.size(), " named)");
  }
  return text;
}

}  // namespace

// One blocking TCP connection with deadline-bounded reads and writes.
class TcpStore::Connection {
 public:
  Connection(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~Connection() { ::close(fd_); }

  static absl::StatusOr<std::unique_ptr<Connection>> Open(const std::string& host, int port,
                                                          absl::Time deadline) {
    std::string peer = absl::StrCat(host, ":", port);
    absl::Duration backoff = absl::Milliseconds(10);
    absl::Status last;
    while (true) {
      addrinfo hints{};
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* result = nullptr;
      int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
      if (rc != 0) {
        last = absl::UnavailableError(
            absl::StrCat("cannot resolve store host '", host, "': ", gai_strerror(rc)));
      } else {
        for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
          int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
          if (fd < 0) continue;
          if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            ::freeaddrinfo(result);
            int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            return std::make_unique<Connection>(fd, peer);
          }
          last = ErrnoToStatus(errno, absl::StrCat("cannot connect to store at ", peer));
          ::close(fd);
        }
        ::freeaddrinfo(result);
      }
      if (absl::Now() + backoff > deadline) break;
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
    return absl::UnavailableError(last.message());
  }

  const std::string& peer() const { return peer_; }

  absl::Status Send(absl::string_view data, absl::Time deadline) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += n;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd p{fd_, POLLOUT, 0};
        int r = ::poll(&p, 1, PollMillis(deadline));
        if (r == 0) return absl::DeadlineExceededError("timed out sending to the store");
        continue;
      }
      return ErrnoToStatus(errno, "store connection lost while sending");
    }
    return absl::OkStatus();
  }

  // Reads through a small buffer, so a reply's status byte and payload
  // usually cost one recv() together.
  absl::Status ReadExact(char* out, size_t size, absl::Time deadline) {
    size_t done = 0;
    while (done < size) {
      if (buffered_begin_ < buffered_end_) {
        size_t n = std::min(size - done, buffered_end_ - buffered_begin_);
        std::memcpy(out + done, buffer_ + buffered_begin_, n);
        buffered_begin_ += n;
        done += n;
        continue;
      }
      // Large remainders go straight to the caller's memory.
      bool direct = size - done >= sizeof(buffer_);
      ssize_t n = direct ? ::recv(fd_, out + done, size - done, MSG_DONTWAIT)
                         : ::recv(fd_, buffer_, sizeof(buffer_), MSG_DONTWAIT);
      if (n > 0) {
        if (direct) {
          done += n;
        } else {
          buffered_begin_ = 0;
          buffered_end_ = n;
        }
        continue;
      }
      if (n == 0) {
        return absl::UnavailableError("the store closed the connection");
      }
      if (errno == EAGAIN || errno == EINTR) {
        pollfd p{fd_, POLLIN, 0};
        int r = ::poll(&p, 1, PollMillis(deadline));
        if (r == 0) return absl::DeadlineExceededError("timed out waiting for the store's reply");
        continue;
      }
      return ErrnoToStatus(errno, "store connection lost while reading");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint8_t> ReadU8(absl::Time deadline) {
    uint8_t v;
    RETURN_IF_ERROR(ReadExact(reinterpret_cast<char*>(&v), 1, deadline));
    return v;
  }
  absl::StatusOr<int64_t> ReadI64(absl::Time deadline) {
    int64_t v;
    RETURN_IF_ERROR(ReadExact(reinterpret_cast<char*>(&v), 8, deadline));
    return v;
  }
  absl::StatusOr<uint64_t> ReadU64(absl::Time deadline) {
    uint64_t v;
    RETURN_IF_ERROR(ReadExact(reinterpret_cast<char*>(&v), 8, deadline));
    return v;
  }
  absl::StatusOr<std::string> ReadBytes(absl::Time deadline) {
    ASSIGN_OR_RETURN(uint64_t len, ReadU64(deadline));
    if (len > (uint64_t{1} << 36)) {
      return absl::DataLossError(absl::StrCat("store reply claims ", len, " bytes"));
    }
    std::string s(len, '\0');
    RETURN_IF_ERROR(ReadExact(s.data(), len, deadline));
    return s;
  }
  absl::StatusOr<std::vector<std::string>> ReadKeyList(absl::Time deadline) {
    ASSIGN_OR_RETURN(uint64_t n, ReadU64(deadline));
    if (n > (uint64_t{1} << 32)) return absl::DataLossError("store reply: bad key count");
    std::vector<std::string> keys(n);
    for (auto& k : keys) {
      ASSIGN_OR_RETURN(k, ReadBytes(deadline));
    }
    return keys;
  }

 private:
  int fd_;
  std::string peer_;
  char buffer_[4096];
  size_t buffered_begin_ = 0;
  size_t buffered_end_ = 0;
};

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options) {
  set_timeout(options.timeout);
}

TcpStore::~TcpStore() = default;

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const TcpStoreOptions& options) {
  if (options.port <= 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("store port must be in [1, 65535], got ", options.port));
  }
  std::unique_ptr<TcpStore> store(new TcpStore(options));
  absl::MutexLock lock(&store->mu_);
  RETURN_IF_ERROR(store->EnsureConnected());
  return store;
}

absl::Status TcpStore::EnsureConnected() {
  if (conn_ != nullptr) return absl::OkStatus();
  absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    ASSIGN_OR_RETURN(conn_, Connection::Open(options_.host, options_.port, deadline));
    if (!native()) return absl::OkStatus();
    // A store at its connection limits closes new connections unanswered:
    // like a refused connect, worth retrying until the deadline.
    bool closed_unanswered = false;
    absl::Status shaken = Handshake(deadline, &closed_unanswered);
    if (shaken.ok() || !closed_unanswered || absl::Now() + backoff > deadline) return shaken;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

// The native handshake (common/store_wire.h): the server proves it knows the
// token before this client proves it; the token itself is never sent.
absl::Status TcpStore::Handshake(absl::Time deadline, bool* closed_unanswered) {
  *closed_unanswered = false;
  absl::StatusOr<std::string> client_nonce = store_auth::RandomNonce();
  if (!client_nonce.ok()) return Fail(client_nonce.status());
  std::string hello;
  wire::PutU8(&hello, wire::kAuthByte);
  wire::PutU32(&hello, wire::kAuthMagic);
  hello += *client_nonce;
  absl::Status sent = conn_->Send(hello, deadline);
  if (!sent.ok()) {
    *closed_unanswered = sent.code() == absl::StatusCode::kUnavailable;
    return Fail(sent);
  }
  auto status = conn_->ReadU8(deadline);
  if (!status.ok()) {
    *closed_unanswered = status.status().code() == absl::StatusCode::kUnavailable;
    return Fail(status.status());
  }
  if (*status != wire::kReplyOk) return FailWithErrorReply(deadline);
  std::string server_nonce(wire::kAuthNonceBytes, '\0');
  absl::Status read = conn_->ReadExact(server_nonce.data(), server_nonce.size(), deadline);
  if (!read.ok()) return Fail(read);
  auto proof_len = conn_->ReadU64(deadline);
  if (!proof_len.ok()) return Fail(proof_len.status());
  if (*proof_len != 0 && *proof_len != wire::kAuthProofBytes) {
    return Fail(absl::DataLossError(
        absl::StrCat("malformed authentication challenge (a proof of ", *proof_len, " bytes)")));
  }
  std::string server_proof(*proof_len, '\0');
  read = conn_->ReadExact(server_proof.data(), server_proof.size(), deadline);
  if (!read.ok()) return Fail(read);
  std::string client_proof;  // empty: this client has no token
  if (!options_.token.empty()) {
    if (server_proof.empty()) {
      return Fail(absl::UnauthenticatedError(
          "the server has no store token (started without --store-token-file?), so it cannot "
          "prove it knows this client's token; refusing it (the token was not sent)"));
    }
    if (!store_auth::ProofEquals(
            server_proof, store_auth::ServerProof(options_.token, *client_nonce, server_nonce))) {
      return Fail(absl::UnauthenticatedError(
          "the server does not know this client's store token (its proof does not match): the "
          "tokens differ, or this is not the intended store; refusing it (the token was not "
          "sent)"));
    }
    client_proof = store_auth::ClientProof(options_.token, server_nonce, *client_nonce);
  }
  std::string proof;
  wire::PutU8(&proof, wire::kAuthProofByte);
  wire::PutBytes(&proof, client_proof);
  RETURN_IF_ERROR(SendAndReadStatus(proof, deadline));
  uint64_t limits[4];
  read = conn_->ReadExact(reinterpret_cast<char*>(limits), sizeof(limits), deadline);
  if (!read.ok()) return Fail(read);
  max_key_bytes_ = limits[0];
  max_value_bytes_ = limits[1];
  max_keys_per_request_ = limits[2];
  return absl::OkStatus();
}

absl::Status TcpStore::Fail(absl::Status status) {
  std::string peer =
      conn_ != nullptr ? conn_->peer() : absl::StrCat(options_.host, ":", options_.port);
  conn_.reset();  // the next call reconnects
  return absl::Status(status.code(), absl::StrCat("store at ", peer, ": ", status.message()));
}

absl::Status TcpStore::SendAndReadStatus(const std::string& request, absl::Time deadline) {
  absl::Status sent = conn_->Send(request, deadline);
  if (!sent.ok()) return Fail(sent);
  auto status = conn_->ReadU8(deadline);
  if (!status.ok()) return Fail(status.status());
  if (*status == wire::kReplyOk) return absl::OkStatus();
  return FailWithErrorReply(deadline);
}

absl::Status TcpStore::FailWithErrorReply(absl::Time deadline) {
  auto code = conn_->ReadU8(deadline);
  auto message = conn_->ReadBytes(deadline);
  if (!code.ok() || !message.ok()) return Fail(absl::UnavailableError("malformed error reply"));
  return Fail(absl::Status(static_cast<absl::StatusCode>(*code), *message));
}

absl::Status TcpStore::SendRequest(const std::string& request, absl::Time deadline) {
  if (native()) return SendAndReadStatus(request, deadline);
  absl::Status sent = conn_->Send(request, deadline);
  return sent.ok() ? sent : Fail(sent);
}

absl::Status TcpStore::CheckSizes(const std::vector<std::string>& keys,
                                  const std::vector<std::string>& values) const {
  if (keys.size() > max_keys_per_request_) {
    return absl::InvalidArgumentError(absl::StrCat(
        keys.size(), " keys exceed the store's limit of ", max_keys_per_request_, " per request"));
  }
  for (const std::string& k : keys) {
    if (k.size() > max_key_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key of ", k.size(), " bytes exceeds the store's limit of ", max_key_bytes_));
    }
  }
  for (const std::string& v : values) {
    if (v.size() > max_value_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "value of ", v.size(), " bytes exceeds the store's limit of ", max_value_bytes_));
    }
  }
  return absl::OkStatus();
}

namespace {

std::string Command(Dialect d, Op op) {
  std::string s;
  wire::PutU8(&s, *wire::CommandByte(d, op));
  return s;
}

}  // namespace

absl::Status TcpStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  RETURN_IF_ERROR(CheckSizes({std::string(key)}, {std::string(value)}));
  Dialect d = native() ? Dialect::kNative : Dialect::kTorch113;
  std::string req = Command(d, Op::kSet);
  wire::PutBytes(&req, key);
  wire::PutBytes(&req, value);
  absl::Status sent = conn_->Send(req, DeadlineAfter(timeout()));
  return sent.ok() ? sent : Fail(sent);
}

absl::Status TcpStore::WaitKeys(const std::vector<std::string>& keys, absl::Duration timeout,
                                std::vector<std::string>* values) {
  RETURN_IF_ERROR(EnsureConnected());
  RETURN_IF_ERROR(CheckSizes(keys, {}));
  if (native()) {
    std::string req = Command(Dialect::kNative, values ? Op::kGetWaitFor : Op::kWaitFor);
    wire::PutKeyList(&req, keys);
    wire::PutI64(&req, TimeoutMillis(timeout));
    absl::Time deadline =
        DeadlineAfter(timeout == absl::InfiniteDuration() ? timeout : timeout + kReplyGrace);
    RETURN_IF_ERROR(SendAndReadStatus(req, deadline));
    auto outcome = conn_->ReadU8(deadline);
    if (!outcome.ok()) return Fail(outcome.status());
    if (*outcome == wire::kWaitTimedOut) {
      auto count = conn_->ReadU64(deadline);
      if (!count.ok()) return Fail(count.status());
      auto missing = conn_->ReadKeyList(deadline);
      if (!missing.ok()) return Fail(missing.status());
      return absl::DeadlineExceededError(absl::StrCat("store wait timed out after ",
                                                      absl::FormatDuration(timeout), "; ",
                                                      wire::MissingKeysText(*missing, *count)));
    }
    if (values != nullptr) {
      values->clear();
      for (size_t i = 0; i < keys.size(); ++i) {
        auto v = conn_->ReadBytes(deadline);
        if (!v.ok()) return Fail(v.status());
        values->push_back(std::move(*v));
      }
    }
    return absl::OkStatus();
  }
  // PyTorch 1.13: WAIT (no server-side timeout; a timed-out connection is
  // dropped so a late wake-up cannot desynchronize it), then GET each key.
  std::string req = Command(Dialect::kTorch113, Op::kWait);
  wire::PutKeyList(&req, keys);
  absl::Time deadline = DeadlineAfter(timeout);
  absl::Status sent = conn_->Send(req, deadline);
  if (!sent.ok()) return Fail(sent);
  auto reply = conn_->ReadU8(deadline);
  if (!reply.ok()) {
    if (reply.status().code() == absl::StatusCode::kDeadlineExceeded) {
      conn_.reset();
      return absl::DeadlineExceededError(absl::StrCat("store wait timed out after ",
                                                      absl::FormatDuration(timeout),
                                                      " for keys: ", WaitedKeysText(keys)));
    }
    return Fail(reply.status());
  }
  if (values != nullptr) {
    values->clear();
    for (const std::string& k : keys) {
      std::string get = Command(Dialect::kTorch113, Op::kGet);
      wire::PutBytes(&get, k);
      absl::Time d = DeadlineAfter(this->timeout());
      absl::Status s = conn_->Send(get, d);
      if (!s.ok()) return Fail(s);
      auto v = conn_->ReadBytes(d);
      if (!v.ok()) return Fail(v.status());
      values->push_back(std::move(*v));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> values;
  RETURN_IF_ERROR(WaitKeys({std::string(key)}, timeout, &values));
  return std::move(values[0]);
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return WaitKeys(keys, timeout, nullptr);
}

absl::StatusOr<std::vector<std::string>> TcpStore::MultiGet(const std::vector<std::string>& keys,
                                                            absl::Duration timeout) {
  if (!Supports(StoreCapability::kMultiGet)) {
    return absl::UnimplementedError("MultiGet needs the native protocol");
  }
  absl::MutexLock lock(&mu_);
  std::vector<std::string> values;
  RETURN_IF_ERROR(WaitKeys(keys, timeout, &values));
  return values;
}

absl::StatusOr<int64_t> TcpStore::Add(absl::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  RETURN_IF_ERROR(CheckSizes({std::string(key)}, {}));
  absl::Time deadline = DeadlineAfter(timeout());
  std::string req = Command(native() ? Dialect::kNative : Dialect::kTorch113, Op::kAdd);
  wire::PutBytes(&req, key);
  wire::PutI64(&req, delta);
  RETURN_IF_ERROR(SendRequest(req, deadline));
  auto v = conn_->ReadI64(deadline);
  if (!v.ok()) {
    return Fail(native() ? v.status()
                         : absl::UnavailableError(absl::StrCat(
                               v.status().message(),
                               " (a PyTorch store drops the connection on ADD to a non-number)")));
  }
  return *v;
}

absl::StatusOr<std::string> TcpStore::CompareSet(absl::string_view key, absl::string_view expected,
                                                 absl::string_view desired) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  RETURN_IF_ERROR(CheckSizes({std::string(key)}, {std::string(expected), std::string(desired)}));
  absl::Time deadline = DeadlineAfter(timeout());
  std::string req = Command(native() ? Dialect::kNative : Dialect::kTorch113, Op::kCompareSet);
  wire::PutBytes(&req, key);
  wire::PutBytes(&req, expected);
  wire::PutBytes(&req, desired);
  RETURN_IF_ERROR(SendRequest(req, deadline));
  auto v = conn_->ReadBytes(deadline);
  if (!v.ok()) return Fail(v.status());
  return *v;
}

absl::StatusOr<bool> TcpStore::Check(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  RETURN_IF_ERROR(CheckSizes(keys, {}));
  absl::Time deadline = DeadlineAfter(timeout());
  std::string req = Command(native() ? Dialect::kNative : Dialect::kTorch113, Op::kCheck);
  wire::PutKeyList(&req, keys);
  RETURN_IF_ERROR(SendRequest(req, deadline));
  auto v = conn_->ReadU8(deadline);
  if (!v.ok()) return Fail(v.status());
  return *v == wire::kCheckReady;
}

absl::StatusOr<bool> TcpStore::DeleteKey(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  RETURN_IF_ERROR(CheckSizes({std::string(key)}, {}));
  absl::Time deadline = DeadlineAfter(timeout());
  std::string req = Command(native() ? Dialect::kNative : Dialect::kTorch113, Op::kDeleteKey);
  wire::PutBytes(&req, key);
  RETURN_IF_ERROR(SendRequest(req, deadline));
  auto v = conn_->ReadI64(deadline);
  if (!v.ok()) return Fail(v.status());
  return *v == 1;
}

absl::StatusOr<int64_t> TcpStore::NumKeys() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  absl::Time deadline = DeadlineAfter(timeout());
  std::string req = Command(native() ? Dialect::kNative : Dialect::kTorch113, Op::kNumKeys);
  RETURN_IF_ERROR(SendRequest(req, deadline));
  auto v = conn_->ReadI64(deadline);
  if (!v.ok()) return Fail(v.status());
  return *v;
}

bool TcpStore::Supports(StoreCapability) const { return native(); }

absl::Status TcpStore::Append(absl::string_view key, absl::string_view value) {
  if (!native()) return absl::UnimplementedError("Append needs the native protocol");
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  RETURN_IF_ERROR(CheckSizes({std::string(key)}, {std::string(value)}));
  std::string req = Command(Dialect::kNative, Op::kAppend);
  wire::PutBytes(&req, key);
  wire::PutBytes(&req, value);
  absl::Status sent = conn_->Send(req, DeadlineAfter(timeout()));
  return sent.ok() ? sent : Fail(sent);
}

absl::Status TcpStore::MultiSet(const std::vector<std::string>& keys,
                                const std::vector<std::string>& values) {
  if (!native()) return absl::UnimplementedError("MultiSet needs the native protocol");
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MultiSet: ", keys.size(), " keys but ", values.size(), " values"));
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  RETURN_IF_ERROR(CheckSizes(keys, values));
  std::string req = Command(Dialect::kNative, Op::kMultiSet);
  wire::PutU64(&req, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    wire::PutBytes(&req, keys[i]);
    wire::PutBytes(&req, values[i]);
  }
  absl::Status sent = conn_->Send(req, DeadlineAfter(timeout()));
  return sent.ok() ? sent : Fail(sent);
}

absl::StatusOr<std::vector<std::string>> TcpStore::ListKeys() {
  if (!native()) return absl::UnimplementedError("ListKeys needs the native protocol");
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  absl::Time deadline = DeadlineAfter(timeout());
  RETURN_IF_ERROR(SendAndReadStatus(Command(Dialect::kNative, Op::kListKeys), deadline));
  auto n = conn_->ReadI64(deadline);
  if (!n.ok()) return Fail(n.status());
  std::vector<std::string> keys;
  for (int64_t i = 0; i < *n; ++i) {
    auto k = conn_->ReadBytes(deadline);
    if (!k.ok()) return Fail(k.status());
    keys.push_back(std::move(*k));
  }
  std::sort(keys.begin(), keys.end());  // the server sends them unsorted
  return keys;
}

absl::StatusOr<std::string> TcpStore::RawExchange(absl::string_view request, size_t reply_bytes) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnected());
  absl::Time deadline = DeadlineAfter(timeout());
  absl::Status sent = conn_->Send(request, deadline);
  if (!sent.ok()) return Fail(sent);
  std::string reply(reply_bytes, '\0');
  absl::Status read = conn_->ReadExact(reply.data(), reply_bytes, deadline);
  if (!read.ok()) return Fail(read);
  return reply;
}

}  // namespace muster
