#include "daemon/store/store_frontend.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/store_auth.h"
#include "daemon/store/request_parser.h"

namespace muster {

namespace {

absl::StatusOr<int> ListenOn(const std::string& address, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  bool any = address.empty() || address == "0.0.0.0" || address == "::";
  addrinfo* result = nullptr;
  int rc =
      ::getaddrinfo(any ? "::" : address.c_str(), std::to_string(port).c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve store address '", address, "': ", gai_strerror(rc)));
  }
  int fd = ::socket(result->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(result);
    return ErrnoToStatus(errno, "store socket");
  }
  int one = 1, off = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (result->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  if (::bind(fd, result->ai_addr, result->ai_addrlen) != 0 || ::listen(fd, 4096) != 0) {
    int err = errno;
    ::freeaddrinfo(result);
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("cannot bind the store to ", any ? "*" : address, ":",
                                           port, err == EADDRINUSE ? " (port in use)" : ""));
  }
  ::freeaddrinfo(result);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  *bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                                  : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  return fd;
}

// SO_RCVTIMEO: a blocking recv on `fd` fails EAGAIN after `timeout`
// (at least 1 ms; zero clears it).
bool SetReceiveTimeout(int fd, absl::Duration timeout) {
  timeval tv{};
  if (timeout > absl::ZeroDuration()) {
    tv = absl::ToTimeval(std::max(timeout, absl::Milliseconds(1)));
  }
  return ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0;
}

bool SendAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

struct StoreFrontend::Connection {
  int fd = -1;
  sockaddr_storage peer{};
  std::thread thread;
  std::atomic<bool> done{false};
  // With a token, until the peer authenticates (or is allowed without).
  std::atomic<bool> authenticating{false};
  // Closed to admit a newcomer (the unauthenticated pool was full), or its
  // thread is ending: counts in neither pool.
  std::atomic<bool> leaving{false};
  absl::Time accepted;
  WaitCancel* wait = nullptr;  // guarded by StoreFrontend::mu_
};

absl::StatusOr<std::unique_ptr<StoreFrontend>> StoreFrontend::Start(
    StoreFrontendOptions options, std::shared_ptr<BlockingStore> store) {
  if (options.max_unauthenticated_connections == 0) {
    return absl::InvalidArgumentError("--store-max-unauthenticated-connections must be positive");
  }
  if (options.auth_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--store-auth-timeout-seconds must be positive");
  }
  std::unique_ptr<StoreFrontend> f(new StoreFrontend(std::move(options), std::move(store)));
  ASSIGN_OR_RETURN(f->listen_fd_,
                   ListenOn(f->options_.listen_address, f->options_.port, &f->port_));
  f->epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (f->epoll_fd_ < 0) return ErrnoToStatus(errno, "store front-end: epoll_create1");
  f->acceptor_ = std::thread([p = f.get()] { p->AcceptLoop(); });
  f->watcher_ = std::thread([p = f.get()] { p->WatchLoop(); });
  return f;
}

absl::Status StoreFrontend::Watch(int fd, WaitCancel* cancel) {
  absl::MutexLock lock(&watch_mu_);
  watched_[fd] = Watched{cancel, false};
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    int err = errno;
    watched_.erase(fd);
    return ErrnoToStatus(err, "store front-end: epoll_ctl");
  }
  return absl::OkStatus();
}

bool StoreFrontend::Unwatch(int fd) {
  absl::MutexLock lock(&watch_mu_);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  auto it = watched_.find(fd);
  bool interrupted = it != watched_.end() && it->second.interrupted;
  if (it != watched_.end()) watched_.erase(it);
  return interrupted;
}

// Thread: cancels the wait of a connection whose client sent or closed.
void StoreFrontend::WatchLoop() {
  epoll_event events[64];
  while (!stopping_.load()) {
    int n = ::epoll_wait(epoll_fd_, events, 64, 100);
    absl::MutexLock lock(&watch_mu_);
    for (int i = 0; i < n; ++i) {
      // Cancel runs under watch_mu_, so Unwatch (and the wait's end) cannot
      // free the WaitCancel meanwhile.
      auto it = watched_.find(events[i].data.fd);
      if (it == watched_.end() || it->second.interrupted) continue;
      it->second.interrupted = true;
      it->second.cancel->Cancel();
    }
  }
}

StoreFrontend::StoreFrontend(StoreFrontendOptions options, std::shared_ptr<BlockingStore> store)
    : options_(std::move(options)), store_(std::move(store)) {}

StoreFrontend::~StoreFrontend() { Stop(); }

void StoreFrontend::Stop() {
  if (stopping_.exchange(true)) return;
  if (acceptor_.joinable()) acceptor_.join();
  if (watcher_.joinable()) watcher_.join();
  ::close(listen_fd_);
  std::vector<std::unique_ptr<Connection>> conns;
  {
    absl::MutexLock lock(&mu_);
    for (auto& c : conns_) {
      ::shutdown(c->fd, SHUT_RDWR);
      if (c->wait != nullptr) c->wait->Cancel();
    }
    conns.swap(conns_);
  }
  for (auto& c : conns) {
    if (c->thread.joinable()) c->thread.join();
    ::close(c->fd);
  }
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  epoll_fd_ = -1;
}

// Thread: accepts connections until Stop, reaping finished ones.
void StoreFrontend::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    auto c = std::make_unique<Connection>();
    socklen_t len = sizeof(c->peer);
    c->fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&c->peer), &len, SOCK_CLOEXEC);
    if (c->fd < 0) continue;
    int one = 1;
    ::setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const bool pending =
        !options_.token.empty() && !options_.allow_unauthenticated.Contains(c->peer);
    absl::MutexLock lock(&mu_);
    uint64_t authenticating = 0, authenticated = 0;
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        ::close((*it)->fd);
        it = conns_.erase(it);
      } else {
        authenticating += (*it)->authenticating.load() && !(*it)->leaving.load() ? 1 : 0;
        authenticated += !(*it)->authenticating.load() && !(*it)->leaving.load() ? 1 : 0;
        ++it;
      }
    }
    c->accepted = absl::Now();
    if (pending && authenticating >= options_.max_unauthenticated_connections &&
        !ReplaceOldestUnauthenticated(c->accepted)) {
      MLOG(WARNING) << "store: refusing a connection past --store-max-unauthenticated-connections="
                    << options_.max_unauthenticated_connections
                    << " (connections that have not authenticated yet)";
      ::close(c->fd);
      continue;
    }
    if (!pending && authenticated >= options_.max_connections) {
      MLOG(WARNING) << "store: refusing a connection past --store-max-connections="
                    << options_.max_connections;
      ::close(c->fd);
      continue;
    }
    c->authenticating.store(pending);
    Connection* raw = c.get();
    conns_.push_back(std::move(c));
    raw->thread = std::thread([this, raw] {
      connections_.fetch_add(1);
      Serve(raw);
      raw->leaving.store(true);  // out of both pools before `done`
      connections_.fetch_sub(1);
      ::shutdown(raw->fd, SHUT_RDWR);
      raw->done.store(true);
    });
  }
}

bool StoreFrontend::ReplaceOldestUnauthenticated(absl::Time now) {
  Connection* oldest = nullptr;
  for (const auto& c : conns_) {
    if (c->done.load() || !c->authenticating.load() || c->leaving.load()) continue;
    if (oldest == nullptr || c->accepted < oldest->accepted) oldest = c.get();
  }
  // No muster client takes this long to authenticate: the oldest is idle
  // or hostile, and a newcomer may be a token holder.
  const absl::Duration patience = std::min(options_.auth_timeout / 4, absl::Seconds(1));
  if (oldest == nullptr || now - oldest->accepted < patience) return false;
  MLOG(WARNING) << "store: closing a connection unauthenticated for "
                << absl::FormatDuration(now - oldest->accepted)
                << " to admit a new one: --store-max-unauthenticated-connections="
                << options_.max_unauthenticated_connections << " reached";
  oldest->leaving.store(true);
  ::shutdown(oldest->fd, SHUT_RDWR);  // its thread's recv returns: it ends
  return true;
}

bool StoreFrontend::Authenticated(Connection* c) {
  absl::MutexLock lock(&mu_);
  if (c->leaving.load()) return false;
  if (!c->authenticating.load()) return true;
  uint64_t authenticated = 0;
  for (const auto& other : conns_) {
    if (!other->done.load() && !other->authenticating.load() && !other->leaving.load()) {
      ++authenticated;
    }
  }
  if (authenticated >= options_.max_connections) return false;
  if (!SetReceiveTimeout(c->fd, absl::ZeroDuration())) return false;
  c->authenticating.store(false);
  return true;
}

// Thread (one per connection): reads requests, runs them, writes replies.
void StoreFrontend::Serve(Connection* c) {
  RequestParser parser(options_.limits);
  std::string in;
  char buf[64 << 10];
  std::string expected_proof;
  bool authenticated = false;
  bool may_skip_auth = options_.token.empty() || options_.allow_unauthenticated.Contains(c->peer);
  const absl::Time auth_deadline = absl::Now() + options_.auth_timeout;
  BlockingStore& store = *store_;

  auto native = [&] { return parser.dialect() == wire::Dialect::kNative; };
  // Sends a reply body (the native status byte first).
  auto reply = [&](const std::string& body) {
    std::string out;
    if (native()) wire::PutU8(&out, wire::kReplyOk);
    out += body;
    return SendAll(c->fd, out);
  };
  // Fails the request: a native client is told why; the connection ends.
  auto fail = [&](const absl::Status& why) {
    MLOG(WARNING) << "store: closing a " << wire::DialectName(parser.dialect())
                  << " connection: " << why.message();
    if (native()) {
      std::string out;
      wire::PutU8(&out, wire::kReplyError);
      wire::PutU8(&out, static_cast<uint8_t>(why.code()));
      wire::PutBytes(&out, why.message());
      SendAll(c->fd, out);
    }
    return false;
  };
  // Blocks in a wait while watching the socket; nullopt: cancelled by input
  // or a close (then nothing is answered), else the wait's status.
  // `block` runs the blocking call with the connection's WaitCancel.
  auto blocking =
      [&](const std::function<absl::Status(WaitCancel*)>& block) -> std::optional<absl::Status> {
    // Input that came with the request cancels it as input arriving during
    // the wait does (the watcher sees only what comes next): a 1.13
    // client's next request (it gave up), a 2.x CANCEL_WAIT sent right
    // behind its WAIT.
    if (!in.empty() && (parser.dialect() == wire::Dialect::kTorch113 ||
                        (parser.dialect() == wire::Dialect::kTorch2 &&
                         static_cast<uint8_t>(in[0]) ==
                             *wire::CommandByte(wire::Dialect::kTorch2, wire::Op::kCancelWait)))) {
      return std::nullopt;
    }
    WaitCancel cancel;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_.load()) return absl::UnavailableError("musterd's store is shutting down");
      c->wait = &cancel;
    }
    // Blocks on this thread; the watcher thread cancels it when the client
    // sends or closes meanwhile.
    if (absl::Status watched = Watch(c->fd, &cancel); !watched.ok()) {
      absl::MutexLock lock(&mu_);
      c->wait = nullptr;
      return watched;
    }
    absl::Status s = block(&cancel);
    bool interrupted = Unwatch(c->fd);
    {
      absl::MutexLock lock(&mu_);
      c->wait = nullptr;
    }
    if (interrupted && absl::IsCancelled(s)) return std::nullopt;
    return s;
  };
  // PyTorch's WAIT (and the native WAIT_FOR) count a non-empty queue of the
  // key's name as present, like KvStore; GET_WAIT_FOR wants the value.
  auto wait = [&](const std::vector<std::string>& keys, absl::Duration timeout,
                  bool queues = false) -> std::optional<absl::Status> {
    return blocking([&](WaitCancel* cancel) {
      return queues ? store.WaitCancellableOrQueued(keys, timeout, cancel)
                    : store.WaitCancellable(keys, timeout, cancel);
    });
  };
  // The one key of the last WAIT that finished, until the next request: a
  // PyTorch blocking queue_pop is WAIT(key) then QUEUE_POP(key), and
  // KvStore wakes one waiter per push; here every waiter wakes, so a pop
  // that follows its WAIT and finds the queue emptied by another popper
  // waits for the next item (until the client gives up and closes or
  // sends) instead of failing "queue is empty".
  std::optional<std::string> waited_key;
  auto values_body = [&](const std::vector<std::string>& keys, std::string* out) -> absl::Status {
    // The keys exist (the wait ended), but the read may meet an etcd leader
    // election (about a second): 1 s failed Gets mid-failover.
    ASSIGN_OR_RETURN(std::vector<std::string> values, store.MultiGet(keys, absl::Seconds(10)));
    for (const std::string& v : values) wire::PutBytes(out, v);
    return absl::OkStatus();
  };

  for (;;) {
    StoreRequest req;
    size_t consumed = 0;
    std::string error;
    RequestParser::Result r = parser.Next(in, &req, &consumed, &error);
    if (r == RequestParser::Result::kError) {
      fail(absl::InvalidArgumentError(error));
      return;
    }
    if (r == RequestParser::Result::kNeedMore || r == RequestParser::Result::kYield) {
      if (r == RequestParser::Result::kYield) continue;
      if (!authenticated && !may_skip_auth) {
        // Until it authenticates the peer has what is left of auth_timeout;
        // a torch client (which cannot) is refused at its first bytes.
        if (parser.dialect() == wire::Dialect::kUnknown &&
            RequestParser::TorchDialectOf(in) != wire::Dialect::kUnknown) {
          return (void)fail(absl::PermissionDeniedError(
              "unauthenticated client refused: the store requires a token (--store-token-file)"));
        }
        const absl::Duration left = auth_deadline - absl::Now();
        if (left <= absl::ZeroDuration() || !SetReceiveTimeout(c->fd, left)) {
          MLOG(WARNING) << "store: closing a connection not authenticated within "
                        << "--store-auth-timeout-seconds="
                        << absl::ToDoubleSeconds(options_.auth_timeout);
          return;
        }
      }
      ssize_t n = ::recv(c->fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !authenticated && !may_skip_auth) {
        continue;  // the auth deadline, above
      }
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
      continue;
    }
    in.erase(0, consumed);
    using wire::Op;
    std::string body;
    // What the previous request left: the key of a WAIT that finished.
    // Reads that start from now on may answer this request (ValuesSince).
    const absl::Time arrived = absl::Now();
    std::optional<std::string> waited = std::move(waited_key);
    waited_key.reset();
    if (req.op == Op::kAuth) {
      absl::StatusOr<std::string> server_nonce = store_auth::RandomNonce();
      if (!server_nonce.ok()) return (void)fail(server_nonce.status());
      body = *server_nonce;
      if (options_.token.empty()) {
        wire::PutBytes(&body, "");
      } else {
        wire::PutBytes(&body,
                       store_auth::ServerProof(options_.token, req.values[0], *server_nonce));
        expected_proof = store_auth::ClientProof(options_.token, *server_nonce, req.values[0]);
      }
      if (!reply(body)) return;
      continue;
    }
    if (req.op == Op::kAuthProof) {
      if (!options_.token.empty()) {
        if (req.values[0].empty()) {
          return (void)fail(absl::UnauthenticatedError(
              "this store requires a token (--store-token-file) and the client has none"));
        }
        if (!store_auth::ProofEquals(req.values[0], expected_proof)) {
          return (void)fail(absl::UnauthenticatedError(
              "authentication failed: the client's proof does not match this store's token"));
        }
      }
      authenticated = true;
      if (!Authenticated(c)) {
        return (void)fail(absl::ResourceExhaustedError(
            absl::StrCat("--store-max-connections=", options_.max_connections, " reached")));
      }
      wire::PutU64(&body, options_.limits.max_key_bytes);
      wire::PutU64(&body, options_.limits.max_value_bytes);
      wire::PutU64(&body, options_.limits.max_keys_per_request);
      wire::PutU64(&body, options_.limits.max_request_bytes);
      if (!reply(body)) return;
      continue;
    }
    if (!authenticated && !may_skip_auth) {
      return (void)fail(absl::PermissionDeniedError(
          "unauthenticated client refused: the store requires a token (--store-token-file)"));
    }
    authenticated = true;
    absl::Status s;
    bool has_reply = true;
    switch (req.op) {
      case Op::kAuth:
      case Op::kAuthProof:
      case Op::kValidate:
        has_reply = false;
        break;
      case Op::kPing:
        wire::PutU32(&body, req.nonce);
        break;
      case Op::kSet:
        s = store.Set(req.keys[0], req.values[0]);
        has_reply = false;
        break;
      case Op::kAppend:
        s = store.Append(req.keys[0], req.values[0]);
        has_reply = false;
        break;
      case Op::kMultiSet:
        s = store.MultiSet(req.keys, req.values);
        has_reply = false;
        break;
      case Op::kCompareSet: {
        absl::StatusOr<std::string> v = store.CompareSet(req.keys[0], req.values[0], req.values[1]);
        if (v.ok()) wire::PutBytes(&body, *v);
        s = v.status();
        break;
      }
      case Op::kGet: {
        // A missing key answers an empty value, like StoreServer.
        absl::StatusOr<std::vector<std::string>> missing = store.Missing({req.keys[0]});
        s = missing.status();
        if (s.ok() && !missing->empty()) {
          wire::PutBytes(&body, "");
        } else if (s.ok()) {
          s = values_body(req.keys, &body);
        }
        break;
      }
      case Op::kAdd: {
        absl::StatusOr<int64_t> v = store.Add(req.keys[0], req.number);
        if (v.ok()) wire::PutI64(&body, *v);
        s = v.status();
        break;
      }
      case Op::kCheck: {
        absl::StatusOr<std::vector<std::string>> missing = store.MissingOrQueued(req.keys);
        if (missing.ok()) {
          wire::PutU8(&body, missing->empty() ? wire::kCheckReady : wire::kCheckNotReady);
        }
        s = missing.status();
        break;
      }
      case Op::kWait: {
        std::optional<absl::Status> w = wait(req.keys, absl::Hours(24 * 365), true);
        if (!w.has_value()) continue;  // the client gave up on it
        s = *w;
        wire::PutU8(&body, wire::kStopWaiting);
        if (s.ok() && req.keys.size() == 1) waited_key = req.keys[0];
        break;
      }
      case Op::kWaitFor:
      case Op::kGetWaitFor: {
        absl::Duration timeout =
            req.number > 0 ? absl::Milliseconds(req.number) : absl::Hours(24 * 365);
        bool queues = req.op == Op::kWaitFor;
        std::optional<absl::Status> w = wait(req.keys, timeout, queues);
        if (!w.has_value()) continue;
        if (absl::IsDeadlineExceeded(*w)) {
          absl::StatusOr<std::vector<std::string>> missing =
              queues ? store.MissingOrQueued(req.keys) : store.Missing(req.keys);
          s = missing.status();
          if (s.ok()) {
            wire::PutU8(&body, wire::kWaitTimedOut);
            wire::PutU64(&body, missing->size());
            std::vector<std::string> named(
                missing->begin(),
                missing->begin() + std::min<size_t>(missing->size(), wire::kMaxNamedMissingKeys));
            wire::PutKeyList(&body, named);
          }
          break;
        }
        s = *w;
        if (!s.ok()) break;
        wire::PutU8(&body, wire::kWaitDone);
        if (req.op == Op::kGetWaitFor) {
          // The wait's waiters wake together: one read for all of them.
          absl::StatusOr<std::vector<std::string>> values = store.ValuesSince(req.keys, arrived);
          s = values.status();
          if (s.ok()) {
            for (const std::string& v : *values) wire::PutBytes(&body, v);
          }
        }
        break;
      }
      case Op::kCancelWait:
        wire::PutU8(&body, wire::kWaitCanceled);
        break;
      case Op::kNumKeys: {
        absl::StatusOr<int64_t> v = store.NumKeys();
        if (v.ok()) wire::PutI64(&body, *v);
        s = v.status();
        break;
      }
      case Op::kDeleteKey: {
        absl::StatusOr<bool> v = store.DeleteKey(req.keys[0]);
        if (v.ok()) wire::PutI64(&body, *v ? 1 : 0);
        s = v.status();
        break;
      }
      case Op::kWatchKey:
        wire::PutU8(&body, wire::kWatchRegistered);
        break;
      case Op::kMultiGet:
        s = values_body(req.keys, &body);
        break;
      case Op::kListKeys: {
        absl::StatusOr<std::vector<std::string>> keys = store.ListKeys();
        if (keys.ok()) {
          wire::PutI64(&body, static_cast<int64_t>(keys->size()));
          for (const std::string& k : *keys) wire::PutBytes(&body, k);
        }
        s = keys.status();
        break;
      }
      case Op::kQueuePush:
        s = store.QueuePush(req.keys[0], req.values[0]);
        has_reply = false;
        break;
      case Op::kQueuePop: {
        std::string value;
        absl::StatusOr<int64_t> before =
            store.QueuePop(req.keys[0], &value, absl::ZeroDuration(), nullptr);
        if (before.ok() && *before == 0 && waited == req.keys[0]) {
          std::optional<absl::Status> w = blocking([&](WaitCancel* cancel) {
            before = store.QueuePop(req.keys[0], &value, absl::Hours(24 * 365), cancel);
            return before.status();
          });
          if (!w.has_value()) continue;  // the client gave up on it
        }
        s = before.status();
        if (s.ok()) {
          wire::PutI64(&body, *before);
          if (*before > 0) wire::PutBytes(&body, value);
        }
        break;
      }
      case Op::kQueueLen: {
        absl::StatusOr<int64_t> v = store.QueueLen(req.keys[0]);
        if (v.ok()) wire::PutI64(&body, *v);
        s = v.status();
        break;
      }
    }
    if (!s.ok()) return (void)fail(s);
    // SET, APPEND and MULTI_SET have no reply in any dialect.
    if (has_reply && !reply(body)) return;
  }
}

}  // namespace muster
