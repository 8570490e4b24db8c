#include "daemon/store/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/store_auth.h"
#include "daemon/store/request_parser.h"
#include "daemon/store/store_dispatcher.h"
#include "daemon/store/store_log.h"

namespace muster {
namespace {

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr size_t kReadChunk = 64 << 10;
// Per readable event, so one busy client cannot starve the others.
constexpr size_t kMaxReadPerEvent = 1 << 20;
// How often a failing durability log is tried again.
constexpr absl::Duration kLogProbeInterval = absl::Seconds(1);
// What a parked wait costs per key beyond the key bytes (hash-map and set
// nodes, std::string headers); its key bytes are held three times (the
// connection's list, the registration's, the per-key index).
constexpr uint64_t kWaitKeyOverhead = 128;
// Waits on more keys than this register in slices (see kWorkSlice), so a
// 131,072-key WAIT does not stall other clients while it registers.
constexpr size_t kWaitInlineKeys = 256;
// Deferred work (registering long waits, unlinking cancelled ones, freeing
// long key lists) runs in chunks of this many keys, for at most kWorkSlice
// of each loop iteration (at least one chunk, so it always progresses).
constexpr size_t kWorkChunk = 128;
constexpr absl::Duration kWorkSlice = absl::Milliseconds(1);
// While only bulk work is pending, the loop waits this long for events
// between work slices.
constexpr int kBulkPauseMs = 1;
// Key lists longer than this are freed in chunks, not at once.
constexpr size_t kFreeInlineKeys = 1024;
constexpr int kAcceptsPerIteration = 64;
// Charges up to this size may use the memory budget's last eighth.
constexpr uint64_t kSmallCharge = 64 << 10;
// Keys of long key lists parsed per loop iteration across all connections
// (RequestParser's key budget); a connection that runs out yields and
// continues in the next iteration.
constexpr size_t kParseKeysPerIteration = 2048;
// Bytes read per loop iteration across all connections; past it each
// readable connection still gets one small read (kSmallRead), so small
// clients keep moving while big senders wait for the next iteration.
constexpr size_t kReadPerIteration = 512 << 10;
constexpr size_t kSmallRead = 4096;
// The durability log writes at most this much per loop iteration (a 16 MiB
// record takes 16 iterations; replies that depend on it wait for all of
// them, every other client is served meanwhile).
constexpr uint64_t kLogSliceBytes = 1 << 20;
// A request that moved more bytes than this (its own size plus its reply's)
// ends its connection's turn in this loop iteration: two 16 MiB requests
// sent together are handled in two iterations.
constexpr size_t kLargeRequest = 1 << 20;
// A loop iteration that uses more CPU than this stalled every client; it is
// logged (rate-limited) so a regression or an overload is visible.
constexpr absl::Duration kSlowIteration = absl::Milliseconds(10);

absl::Duration ThreadCpuTime() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

// `key_bytes`: the keys' total size if the parser counted it (long lists,
// which then need no second pass), else 0.
uint64_t WaitCharge(const std::vector<std::string>& keys, uint64_t key_bytes) {
  if (key_bytes == 0) {
    for (const std::string& k : keys) key_bytes += k.size();
  }
  return 3 * key_bytes + kWaitKeyOverhead * keys.size();
}

absl::StatusOr<int> Listen(const std::string& address, int port, int* bound_port) {
  int fd = -1;
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  bool any = address.empty() || address == "0.0.0.0" || address == "::";
  if (any) {
    fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      int off = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
      auto& a6 = reinterpret_cast<sockaddr_in6&>(addr);
      a6.sin6_family = AF_INET6;
      a6.sin6_addr = in6addr_any;
      a6.sin6_port = htons(port);
      addr_len = sizeof(a6);
    } else {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      auto& a4 = reinterpret_cast<sockaddr_in&>(addr);
      a4.sin_family = AF_INET;
      a4.sin_addr.s_addr = htonl(INADDR_ANY);
      a4.sin_port = htons(port);
      addr_len = sizeof(a4);
    }
  } else {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* result = nullptr;
    int rc = ::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &result);
    if (rc != 0 || result == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot resolve store address '", address, "': ", gai_strerror(rc)));
    }
    std::memcpy(&addr, result->ai_addr, result->ai_addrlen);
    addr_len = result->ai_addrlen;
    fd = ::socket(result->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ::freeaddrinfo(result);
  }
  if (fd < 0) return ErrnoToStatus(errno, "store socket");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("cannot bind the store to ", any ? "*" : address, ":",
                                           port, err == EADDRINUSE ? " (port in use)" : ""));
  }
  if (::listen(fd, 65535) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "store listen");
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  *bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                                  : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  return fd;
}

}  // namespace

class StoreServer::Impl : public StoreServer::Loop {
 public:
  explicit Impl(StoreServerOptions options)
      : options_(std::move(options)),
        kv_(UINT64_MAX),
        dispatcher_(&kv_, options_.max_reply_bytes) {}

  ~Impl() override {
    Stop();
    for (auto& [id, conn] : conns_) ::close(conn->fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  absl::Status Init(int* port) {
    if (!options_.state_dir.empty()) {
      RecoveryStats recovery;
      StoreLogOptions log_options;
      log_options.fsync = options_.fsync;
      log_options.recover = options_.recover;
      ASSIGN_OR_RETURN(log_, StoreLog::Open(options_.state_dir, log_options, &kv_, &recovery));
      MLOG(INFO) << "store: recovered " << kv_.NumKeys() << " keys from " << recovery.records
                 << " log records in " << log_->path();
      kv_.SetMutationListener([this](const Mutation& m) { log_->Record(m); });
    }
    kv_.set_max_total_bytes(options_.max_total_bytes);
    ASSIGN_OR_RETURN(listen_fd_, Listen(options_.listen_address, options_.port, port));
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) return ErrnoToStatus(errno, "store epoll/eventfd");
    Watch(listen_fd_, kListenerId, EPOLLIN, EPOLL_CTL_ADD);
    Watch(wake_fd_, kWakeId, EPOLLIN, EPOLL_CTL_ADD);
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      stop_requested_.store(true);
    }
    uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
  }

  bool Post(std::function<void(Loop&)> task) {
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      if (stop_requested_.load()) return false;
      tasks_.push_back(std::move(task));
    }
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    return true;
  }

  Stats stats() const {
    Stats s;
    s.keys = stat_keys_.load();
    s.connections = stat_connections_.load();
    s.bytes = stat_bytes_.load();
    s.refused_connections = stat_refused_.load();
    s.unauthenticated_connections = stat_unauthenticated_.load();
    s.refused_unauthenticated = stat_refused_unauthenticated_.load();
    s.replaced_unauthenticated = stat_replaced_unauthenticated_.load();
    s.auth_timeouts = stat_auth_timeouts_.load();
    std::lock_guard<std::mutex> lock(stat_mu_);
    s.log_error = stat_log_error_;
    s.memory_bytes = stat_memory_.load();
    s.refused_for_memory = stat_refused_memory_.load();
    s.slow_iterations = stat_slow_iterations_.load();
    s.max_iteration_cpu = absl::Microseconds(stat_max_iteration_us_.load());
    return s;
  }

  // Loop interface.
  KvStore& kv() override { return kv_; }
  TimerId AddTimer(absl::Time deadline, std::function<void()> fn) override {
    TimerId id = next_timer_id_++;
    timers_.emplace(std::make_pair(deadline, id), std::move(fn));
    timer_deadlines_[id] = deadline;
    return id;
  }
  void CancelTimer(TimerId id) override {
    auto it = timer_deadlines_.find(id);
    if (it == timer_deadlines_.end()) return;
    timers_.erase(std::make_pair(it->second, id));
    timer_deadlines_.erase(it);
  }
  void AfterFlush(std::function<void()> fn) override { after_flush_.push_back(std::move(fn)); }
  absl::Status flush_status() const override { return flush_status_; }
  bool ReadsUnlogged(const std::vector<std::string>& keys) const override {
    if (!HasUnlogged()) return false;
    for (const std::string& k : keys) {
      if (log_->Touched(k)) return true;
    }
    return false;
  }
  bool HasUnlogged() const override { return log_ != nullptr && log_->has_pending(); }
  absl::Status writable() const override { return log_failing_ ? LogRefusal() : absl::OkStatus(); }
  bool stopping() const override { return stopping_; }

 private:
  using WaitKind = StoreWaitKind;

  struct Connection {
    uint64_t id = 0;
    int fd = -1;
    std::string peer;
    bool unauthenticated_allowed = false;
    bool authenticated = false;
    // In pending_auth_ (the unauthenticated pool) until it
    // authenticates or closes; auth_timer closes it at the deadline.
    bool pending_auth = false;
    TimerId auth_timer = 0;
    absl::Time accepted_at;
    // Native handshake: the challenge went out; the proof it must send back
    // (empty when the server has no token).
    bool challenged = false;
    std::string expected_proof;
    RequestParser parser;
    std::string in;
    size_t in_off = 0;
    std::string out;
    size_t out_off = 0;
    uint32_t events = 0;   // what epoll watches now
    bool closing = false;  // stop reading; close once `out` is sent
    WaitKind wait_kind = WaitKind::kNone;
    KvStore::WaitId wait_id = 0;
    TimerId wait_timer = 0;
    std::vector<std::string> wait_keys;
    // out.size() when this iteration's first reply was queued (out_epoch ==
    // epoch_): what a failed log flush cuts the output back to.
    uint64_t out_epoch = 0;
    size_t out_mark = 0;
    uint64_t write_epoch = 0;  // epoch_ of its last write request
    // epoch_ of its last reply that read a write not yet in the log.
    uint64_t depend_epoch = 0;
    // Memory accounting: what this connection holds of the budget now (its
    // share of budget_used_) and, of that, its parked wait's key lists.
    uint64_t charged = 0;
    uint64_t wait_charge = 0;
    // A long key list registering in slices: wait_keys[0, wait_registered)
    // are registered; the connection is in registering_.
    bool wait_registering = false;
    size_t wait_registered = 0;
    bool yielded = false;  // in yielded_
    // EOF came while requests it sent still waited their turn (yielded):
    // they run in the next iterations (ContinueYielded), then it closes.
    bool peer_gone = false;
    // Requests handled so far, and the pace check of a large request
    // arriving (ArmRequestPace): its timer and the count when armed.
    uint64_t requests_done = 0;
    TimerId pace_timer = 0;
    uint64_t pace_requests = 0;

    explicit Connection(const wire::StoreLimits& limits) : parser(limits) {}
    size_t pending_out() const { return out.size() - out_off; }
    bool native() const { return parser.dialect() == wire::Dialect::kNative; }
  };

  void Watch(int fd, uint64_t id, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, op, fd, &ev);
  }

  void SetEvents(Connection& c, uint32_t events) {
    if (c.events == events) return;
    c.events = events;
    Watch(c.fd, c.id, events, EPOLL_CTL_MOD);
  }

  // At most 20 warnings a second; the rest are counted and summarized.
  void Warn(const std::string& message) {
    absl::Time now = absl::Now();
    if (now - warn_window_start_ > absl::Seconds(1)) {
      if (warn_suppressed_ > 0) {
        MLOG(WARNING) << "store: " << warn_suppressed_ << " similar warnings suppressed";
      }
      warn_window_start_ = now;
      warn_count_ = 0;
      warn_suppressed_ = 0;
    }
    if (++warn_count_ <= 20) {
      MLOG(WARNING) << "store: " << message;
    } else {
      ++warn_suppressed_;
    }
  }

  void Run() {
    std::vector<epoll_event> events(256);
    while (true) {
      if (stop_requested_.load()) break;
      int timeout_ms = -1;
      if (!timers_.empty()) {
        absl::Duration d = timers_.begin()->first.first - absl::Now();
        timeout_ms =
            d <= absl::ZeroDuration()
                ? 0
                : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d) + 1, 60000));
      }
      if (listener_paused_) timeout_ms = timeout_ms < 0 ? 100 : std::min(timeout_ms, 100);
      if (log_writing_) timeout_ms = 0;  // the rest of a log batch is due now
      if (!registering_.empty() || !yielded_.empty() || DeferredPending()) {
        // More bulk work queued: continue at once if a client is waiting,
        // else after a short pause, so bulk work takes at most about half
        // of a core and the loop thread stays quick to wake (the scheduler
        // favours threads that sleep) when a client sends a request.
        timeout_ms = timeout_ms < 0 ? kBulkPauseMs : std::min(timeout_ms, kBulkPauseMs);
      }
      int n = ::epoll_wait(epoll_fd_, events.data(), events.size(), timeout_ms);
      if (n < 0 && errno != EINTR) {
        MLOG(ERROR) << "store: epoll_wait: " << std::strerror(errno);
        break;
      }
      absl::Duration cpu_start = ThreadCpuTime();
      parse_keys_left_ = kParseKeysPerIteration;
      read_bytes_left_ = kReadPerIteration;
      ContinueYielded();
      absl::Duration t_yielded = ThreadCpuTime();
      for (int i = 0; i < n; ++i) {
        uint64_t id = events[i].data.u64;
        if (id == kListenerId) {
          AcceptAll();
        } else if (id == kWakeId) {
          uint64_t count;
          (void)!::read(wake_fd_, &count, sizeof(count));
          RunTasks();
        } else {
          auto it = conns_.find(id);
          if (it == conns_.end()) continue;
          if (events[i].events & EPOLLOUT) MarkDirty(*it->second);
          // ReadFrom may close (and free) the connection.
          if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ReadFrom(*it->second);
        }
      }
      if (listener_paused_ && absl::Now() >= listener_resume_) {
        listener_paused_ = false;
        Watch(listen_fd_, kListenerId, EPOLLIN, EPOLL_CTL_MOD);
      }
      absl::Duration t_events = ThreadCpuTime();
      RunDueTimers(absl::Now());
      absl::Duration t_timers = ThreadCpuTime();
      work_deadline_ = absl::Now() + kWorkSlice;
      RegisterWaitSlices();
      absl::Duration t_register = ThreadCpuTime();
      DeferredWork();
      absl::Duration t_deferred = ThreadCpuTime();
      EndIteration();
      absl::Duration t_end = ThreadCpuTime();
      absl::Duration cpu = t_end - cpu_start;
      if (cpu > absl::Microseconds(stat_max_iteration_us_.load())) {
        stat_max_iteration_us_ = absl::ToInt64Microseconds(cpu);
      }
      if (cpu > kSlowIteration) {
        ++stat_slow_iterations_;
        auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
        Warn(absl::StrFormat(
            "slow loop iteration: %d ms of CPU (%d events; ms in: long key lists %.1f, events "
            "%.1f, timers %.1f, wait registration %.1f, deferred frees %.1f, flush and send "
            "%.1f); every client waited",
            absl::ToInt64Milliseconds(cpu), n, ms(t_yielded - cpu_start), ms(t_events - t_yielded),
            ms(t_timers - t_events), ms(t_register - t_timers), ms(t_deferred - t_register),
            ms(t_end - t_deferred)));
      }
    }
    // Shutdown: fire every timer early so posted waits can finish.
    stopping_ = true;
    RunTasks();
    RunDueTimers(absl::InfiniteFuture());
    EndIteration();
    for (auto& [id, conn] : conns_) ::close(conn->fd);
    conns_.clear();
    stat_connections_ = 0;
  }

  void RunTasks() {
    std::vector<std::function<void(Loop&)>> tasks;
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task(*this);
  }

  void RunDueTimers(absl::Time now) {
    while (!timers_.empty() && timers_.begin()->first.first <= now) {
      auto it = timers_.begin();
      TimerId id = it->first.second;
      std::function<void()> fn = std::move(it->second);
      timers_.erase(it);
      timer_deadlines_.erase(id);
      fn();
    }
  }

  // Resumes parked connections, flushes the log, then sends replies.
  void ResumeWaits() {
    while (!resumed_.empty()) {
      std::vector<uint64_t> ids;
      ids.swap(resumed_);
      for (uint64_t id : ids) {
        auto it = conns_.find(id);
        if (it != conns_.end()) FinishWait(*it->second, /*timed_out=*/false);
      }
    }
  }

  void EndIteration() {
    ResumeWaits();
    flush_status_ = log_ != nullptr ? log_->Flush(kv_, stopping_ ? UINT64_MAX : kLogSliceBytes)
                                    : absl::OkStatus();
    log_writing_ = flush_status_.ok() && log_ != nullptr && log_->has_pending();
    if (log_writing_) return HoldDependentReplies();
    if (!flush_status_.ok()) {
      LogFailed();
    } else if (log_ != nullptr && log_->failing()) {
      // This batch is durable, but the log refuses what follows (a
      // compaction's directory sync failed).
      RefuseWritesUntilProbed();
    }
    wrote_.clear();
    ++epoch_;  // replies queued from here on belong to the next flush
    std::vector<std::function<void()>> after;
    after.swap(after_flush_);
    for (auto& fn : after) fn();
    std::vector<uint64_t> dirty;
    dirty.swap(dirty_);
    for (uint64_t id : dirty) {
      auto it = conns_.find(id);
      if (it != conns_.end()) Send(*it->second);
    }
    stat_keys_ = kv_.NumKeys();
    stat_bytes_ = kv_.total_bytes();
    stat_connections_ = static_cast<int64_t>(conns_.size());
    stat_unauthenticated_ = static_cast<int64_t>(pending_auth_.size());
    stat_memory_ = budget_used_;
  }

  // The log batch is only partly written: this epoch goes on into the next
  // iteration (writes then join the batch). Replies that depend on it wait
  // in dirty_ (and AfterFlush callbacks with them); the others go out now.
  void HoldDependentReplies() {
    std::vector<uint64_t> dirty;
    dirty.swap(dirty_);
    for (uint64_t id : dirty) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      Connection& c = *it->second;
      if (c.write_epoch == epoch_ || c.depend_epoch == epoch_) {
        dirty_.push_back(id);
        continue;
      }
      Send(c);
      // What it sent depended on nothing unlogged; a later reply of this
      // epoch marks the output afresh (see MarkDirty).
      if (conns_.count(id) != 0) c.out_epoch = 0;
    }
    std::sort(dirty_.begin(), dirty_.end());
    dirty_.erase(std::unique(dirty_.begin(), dirty_.end()), dirty_.end());
    stat_memory_ = budget_used_;
  }

  // Memory accounting. A connection is charged its input buffer (or what
  // the request being received declared, if more: the buffer will grow to
  // it), its unsent replies and its parked wait; budget_used_ is the sum.

  static uint64_t InputCharge(const Connection& c) {
    if (c.closing) return c.in.capacity();  // nothing more will be buffered
    return std::max<uint64_t>(c.in.capacity(), c.in_off + c.parser.min_needed()) +
           c.parser.held_bytes();
  }

  // Brings c.charged (and budget_used_) up to date; call after any change.
  void Recharge(Connection& c) {
    uint64_t now = InputCharge(c) + c.out.capacity() + c.wait_charge;
    budget_used_ = budget_used_ - c.charged + now;
    c.charged = now;
  }

  // Fails the current request of `c` for memory: closes the connection (a
  // native client is told why first) with a log line naming the peer.
  void RefuseForMemory(Connection& c, std::string why) {
    ++stat_refused_memory_;
    Reject(c, absl::ResourceExhaustedError(std::move(why)));
    std::string().swap(c.in);  // the refused request's bytes are not needed
    c.in_off = 0;
    Recharge(c);
  }

  // Large charges may use 7/8 of the budget; the last eighth is kept for
  // small requests, so ordinary clients are served while big ones fill it.
  uint64_t BudgetFor(uint64_t bytes) const {
    const uint64_t budget = options_.memory_budget_bytes;
    return bytes > kSmallCharge ? budget - budget / 8 : budget;
  }

  std::string BudgetText() const {
    return absl::StrCat("--store-memory-budget-bytes=", options_.memory_budget_bytes, " (",
                        budget_used_, " bytes in use by all connections)");
  }

  // After input arrived or a request was parsed: the connection's buffered
  // (and declared) input must fit its share and the budget. The buffer is
  // then reserved at the declared size, so it grows once, to what was
  // charged. False if the connection was refused.
  bool AdmitInput(Connection& c) {
    uint64_t input = InputCharge(c);
    if (input + c.wait_charge > options_.max_connection_bytes) {
      RefuseForMemory(c, absl::StrCat("request needs ", input, " bytes buffered",
                                      c.wait_charge ? " besides its parked wait" : "",
                                      ", exceeding --store-max-connection-bytes=",
                                      options_.max_connection_bytes));
      return false;
    }
    uint64_t after = budget_used_ - c.charged + input + c.out.capacity() + c.wait_charge;
    if (after > budget_used_ && after > BudgetFor(after - budget_used_)) {
      RefuseForMemory(
          c, absl::StrCat("request needs ", input, " bytes buffered, exceeding ", BudgetText()));
      return false;
    }
    uint64_t declared = c.in_off + c.parser.min_needed();
    if (declared > c.in.capacity() && c.parser.min_needed() > 0) c.in.reserve(declared);
    Recharge(c);
    ArmRequestPace(c);
    return true;
  }

  // A large request is arriving: it must be in within the grace plus its
  // size at the minimum rate (CheckRequestPace).
  void ArmRequestPace(Connection& c) {
    if (c.pace_timer != 0 || InputCharge(c) <= kSmallCharge) return;
    c.pace_requests = c.requests_done;
    const double seconds = static_cast<double>(InputCharge(c)) /
                           static_cast<double>(std::max<uint64_t>(options_.min_request_rate, 1));
    c.pace_timer = AddTimer(absl::Now() + options_.request_grace + absl::Seconds(seconds),
                            [this, id = c.id] { CheckRequestPace(id); });
  }

  void CheckRequestPace(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Connection& c = *it->second;
    c.pace_timer = 0;
    if (c.closing || InputCharge(c) <= kSmallCharge) return;
    if (c.requests_done != c.pace_requests) {  // that one arrived; this is the next
      ArmRequestPace(c);
      return;
    }
    RefuseForMemory(c, absl::StrCat("a request of ", c.in_off + c.parser.min_needed(), " bytes (",
                                    c.in.size() - c.in_off, " received) did not arrive within ",
                                    absl::FormatDuration(options_.request_grace), " plus 1 s per ",
                                    options_.min_request_rate,
                                    " bytes; a request arriving holds the store's memory budget"));
  }

  // Before a reply of `bytes` (status byte included; the dispatcher
  // checked max_reply_bytes) is built: it must fit the budget; then `out` is
  // reserved for it. False if refused.
  bool ReserveReply(Connection& c, uint64_t bytes, wire::Op op) {
    if (budget_used_ + bytes > BudgetFor(bytes)) {
      RefuseForMemory(c, absl::StrCat("reply of ", bytes, " bytes to ", wire::OpName(op),
                                      " would exceed ", BudgetText()));
      return false;
    }
    c.out.reserve(c.out.size() + bytes);
    return true;
  }

  // This iteration's log write failed: nothing of it may look acknowledged.
  // Its mutations are rolled back to what the file holds, and every
  // connection that wrote, or whose reply of this iteration read a key the
  // failed batch touched (see ReadsUnloggedWrite), gets an error instead;
  // replies that read only durable state still go out. Writes are refused
  // until ProbeLog() finds the log writable again.
  void LogFailed() {
    RefuseWritesUntilProbed();
    if (absl::Status s = log_->Rollback(&kv_); !s.ok()) {
      MLOG(ERROR) << "store: rolling back unlogged writes: " << s.message();
    }
    absl::Status refused = LogRefusal();
    flush_status_ = refused;
    // Torch's SET has no reply: connections that wrote are failed too.
    std::vector<uint64_t> dirty;
    dirty.swap(dirty_);
    dirty.insert(dirty.end(), wrote_.begin(), wrote_.end());
    for (uint64_t id : dirty) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      Connection& c = *it->second;
      bool depends = c.write_epoch == epoch_ || c.depend_epoch == epoch_;
      if (c.closing || !depends) {
        dirty_.push_back(id);
        continue;
      }
      if (c.out_epoch == epoch_) c.out.resize(c.out_mark);
      Reject(c, refused);
    }
    // Waits released by the rolled-back writes see the restored state.
    ResumeWaits();
  }

  // The log cannot take writes: refuse them until ProbeLog() finds it can.
  void RefuseWritesUntilProbed() {
    if (log_failing_) return;
    std::string cause(log_->error().message());
    log_failing_ = true;
    MLOG(ERROR) << "store: cannot write the durability log " << log_->path() << ": " << cause
                << "; refusing writes until it can be written again (reads go on)";
    {
      std::lock_guard<std::mutex> lock(stat_mu_);
      stat_log_error_ = cause;
    }
    AddTimer(absl::Now() + kLogProbeInterval, [this] { ProbeLog(); });
  }

  absl::Status LogRefusal() const {
    return absl::UnavailableError(absl::StrCat(
        "store write refused: musterd cannot write its durability log (", log_->error().message(),
        "); reads still work, writes resume once the log can be written again"));
  }

  // Every kLogProbeInterval while the log fails: is it writable again?
  void ProbeLog() {
    if (stopping_ || !log_failing_) return;
    absl::Status s = log_->Probe();
    if (!s.ok()) {
      AddTimer(absl::Now() + kLogProbeInterval, [this] { ProbeLog(); });
      return;
    }
    log_failing_ = false;
    {
      std::lock_guard<std::mutex> lock(stat_mu_);
      stat_log_error_.clear();
    }
    MLOG(WARNING) << "store: the durability log " << log_->path()
                  << " can be written again; accepting writes";
  }

  uint64_t authenticated_connections() const { return conns_.size() - pending_auth_.size(); }

  // How long the oldest unauthenticated connection must have been trying
  // before a new one may replace it (a muster client needs two round trips).
  absl::Duration ReplaceAfter() const {
    return std::min(options_.auth_timeout / 4, absl::Seconds(1));
  }

  // The unauthenticated pool is full: closes its oldest connection if it had
  // its chance, to make room. False if the newcomer must be refused instead.
  bool ReplaceOldestUnauthenticated(const std::string& newcomer) {
    if (pending_auth_.empty()) return false;
    auto it = conns_.find(*pending_auth_.begin());
    if (it == conns_.end()) return false;
    Connection& oldest = *it->second;
    absl::Duration age = absl::Now() - oldest.accepted_at;
    if (age < ReplaceAfter()) return false;
    ++stat_replaced_unauthenticated_;
    Warn(absl::StrCat("closing unauthenticated connection from ", oldest.peer, " after ",
                      absl::FormatDuration(absl::Trunc(age, absl::Milliseconds(1))),
                      " to admit one from ", newcomer, ": --store-max-unauthenticated-connections=",
                      options_.max_unauthenticated_connections, " reached"));
    Close(oldest.id);
    return true;
  }

  // The authentication deadline of connection `id` passed.
  void AuthDeadline(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Connection& c = *it->second;
    c.auth_timer = 0;
    if (stopping_ || !c.pending_auth || c.closing) return;
    ++stat_auth_timeouts_;
    Reject(c, absl::DeadlineExceededError(
                  absl::StrCat("not authenticated within --store-auth-timeout-seconds=",
                               absl::ToDoubleSeconds(options_.auth_timeout))));
  }

  // Moves `c` from the unauthenticated pool to the authenticated one.
  absl::Status LeavePendingAuth(Connection& c) {
    if (!c.pending_auth) return absl::OkStatus();
    if (authenticated_connections() >= options_.max_connections) {
      ++stat_refused_;
      return absl::ResourceExhaustedError(absl::StrCat(
          "--store-max-connections=", options_.max_connections, " reached; try again later"));
    }
    DropPendingAuth(c);
    return absl::OkStatus();
  }

  void DropPendingAuth(Connection& c) {
    if (!c.pending_auth) return;
    c.pending_auth = false;
    pending_auth_.erase(c.id);
    CancelTimer(c.auth_timer);
    c.auth_timer = 0;
  }

  void AcceptAll() {
    // A bounded batch per iteration (the listener is level-triggered): a
    // burst of connections does not delay the clients already connected.
    for (int batch = 0; batch < kAcceptsPerIteration; ++batch) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return;
        if (errno == EMFILE || errno == ENFILE) {
          Warn(absl::StrCat("cannot accept more connections: ", std::strerror(errno),
                            " (raise LimitNOFILE / ulimit -n); pausing accept for 100 ms"));
          listener_paused_ = true;
          listener_resume_ = absl::Now() + absl::Milliseconds(100);
          Watch(listen_fd_, kListenerId, 0, EPOLL_CTL_MOD);
          return;
        }
        Warn(absl::StrCat("accept: ", std::strerror(errno)));
        return;
      }
      std::string peer = FormatPeer(addr);
      // With a token, only allow_unauthenticated peers are admitted (by
      // address) now; everyone else must authenticate first.
      bool pending = !options_.token.empty() && !options_.allow_unauthenticated.Contains(addr);
      if (pending) {
        if (pending_auth_.size() >= options_.max_unauthenticated_connections &&
            !ReplaceOldestUnauthenticated(peer)) {
          ++stat_refused_unauthenticated_;
          Warn(absl::StrCat("refused connection from ", peer,
                            ": --store-max-unauthenticated-connections=",
                            options_.max_unauthenticated_connections,
                            " reached (connections that have not authenticated yet)"));
          ::close(fd);
          continue;
        }
      } else if (authenticated_connections() >= options_.max_connections) {
        ++stat_refused_;
        Warn(absl::StrCat("refused connection from ", peer,
                          ": --store-max-connections=", options_.max_connections, " reached"));
        ::close(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto conn = std::make_unique<Connection>(options_.limits);
      conn->id = next_conn_id_++;
      conn->fd = fd;
      conn->peer = std::move(peer);
      conn->unauthenticated_allowed = !pending;
      conn->accepted_at = absl::Now();
      if (pending) {
        uint64_t id = conn->id;
        conn->pending_auth = true;
        pending_auth_.insert(id);
        conn->auth_timer =
            AddTimer(conn->accepted_at + options_.auth_timeout, [this, id] { AuthDeadline(id); });
      }
      conn->events = EPOLLIN;
      Watch(fd, conn->id, EPOLLIN, EPOLL_CTL_ADD);
      MLOG(DEBUG) << "store: connection " << conn->id << " from " << conn->peer;
      conns_[conn->id] = std::move(conn);
    }
  }

  void ReadFrom(Connection& c) {
    if (c.closing) {
      // Not reading any more; drop whatever arrives, notice EOF.
      char sink[4096];
      ssize_t n = ::read(c.fd, sink, sizeof(sink));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) Close(c.id);
      return;
    }
    // Read into the loop's scratch buffer and append only what arrived: no
    // zero-filling, and an idle connection keeps no buffer. A short read
    // means the socket is drained (epoll is level-triggered and reports any
    // later data), which saves the read that would return EAGAIN.
    size_t total = 0;
    size_t limit = std::min(kMaxReadPerEvent, std::max(read_bytes_left_, kSmallRead));
    while (total < limit) {
      size_t want = std::min(sizeof(read_buffer_), limit - total);
      if (c.in.size() + want > c.in.capacity() && c.in.size() > kSmallRead) {
        // Growing a large buffer copies all of it. That counts against the
        // read budget (past it, the first such growth of an iteration still
        // goes ahead, so every connection progresses), or 100 clients whose
        // long requests cross the same size would all copy in one iteration.
        size_t copy = c.in.size();
        if (copy > read_bytes_left_ && read_bytes_left_ < kReadPerIteration) break;
        read_bytes_left_ -= std::min(read_bytes_left_, copy);
        c.in.reserve(std::max(2 * c.in.capacity(), c.in.size() + want));
      }
      ssize_t n = ::read(c.fd, read_buffer_, want);
      if (n > 0) {
        c.in.append(read_buffer_, n);
        total += n;
        read_bytes_left_ -= std::min<size_t>(read_bytes_left_, n);
        if (static_cast<size_t>(n) < want) break;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      // EOF or error: the client is gone. What it sent before closing still
      // counts (a SET followed by close must not be lost); then close.
      MLOG(DEBUG) << "store: connection " << c.id << " from " << c.peer << " closed by peer";
      if (c.challenged && !c.authenticated && c.in_off == c.in.size()) {
        // A muster client that hangs up after the challenge did not accept
        // this server's proof: most likely it holds another token.
        Warn(absl::StrCat("native client from ", c.peer,
                          " hung up during authentication (does it hold a different store "
                          "token?)"));
      }
      uint64_t id = c.id;
      ProcessInput(c);
      if (conns_.find(id) == conns_.end()) return;
      if (c.yielded) {
        // A large request took its own turn: what was sent after it is kept
        // too. Nothing more to read (epoll would report the EOF again).
        c.peer_gone = true;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
        return;
      }
      Close(id);
      return;
    }
    ProcessInput(c);
  }

  void ProcessInput(Connection& c) {
    uint64_t id = c.id;
    while (!c.closing) {
      if (c.wait_kind != WaitKind::kNone) {
        if (c.parser.dialect() == wire::Dialect::kTorch113 && c.in.size() > c.in_off) {
          // A 1.13 client sends nothing while it really waits: it timed out.
          MLOG(DEBUG) << "store: " << c.peer << " abandoned its WAIT";
          CancelConnectionWait(c);
        } else if (c.parser.dialect() == wire::Dialect::kTorch2 && c.in.size() > c.in_off &&
                   static_cast<uint8_t>(c.in[c.in_off]) ==
                       *wire::CommandByte(wire::Dialect::kTorch2, wire::Op::kCancelWait)) {
          // handled below as a normal request
        } else {
          break;  // parked until the wait ends
        }
      }
      if (c.pending_out() > options_.max_output_bytes) {
        SetEvents(c, EPOLLOUT);  // resume reading once replies drained
        break;
      }
      StoreRequest request;
      size_t consumed = 0;
      std::string error;
      absl::string_view input(c.in.data() + c.in_off, c.in.size() - c.in_off);
      // A peer that must authenticate may only start the native handshake:
      // a torch client is refused at its first bytes, before its partial
      // request is charged (and its buffer reserved) what it declares.
      if (!c.authenticated && !c.unauthenticated_allowed &&
          c.parser.dialect() == wire::Dialect::kUnknown) {
        if (wire::Dialect torch = RequestParser::TorchDialectOf(input);
            torch != wire::Dialect::kUnknown) {
          RefuseUnauthenticated(c, torch);
          break;
        }
      }
      RequestParser::Result r =
          c.parser.Next(input, &request, &consumed, &error, &parse_keys_left_);
      if (r == RequestParser::Result::kNeedMore) break;
      if (r == RequestParser::Result::kYield) {
        if (!c.yielded) yielded_.push_back(id);
        c.yielded = true;
        break;
      }
      if (r == RequestParser::Result::kError) {
        Reject(c, absl::InvalidArgumentError(error));
        break;
      }
      c.in_off += consumed;
      ++c.requests_done;
      const size_t out_before = c.out.size();
      Handle(c, request);
      if (conns_.find(id) == conns_.end()) return;  // closed while handling
      Recharge(c);
      if (consumed + (c.out.size() - std::min(out_before, c.out.size())) > kLargeRequest &&
          c.in_off < c.in.size()) {
        // A large request (a 16 MiB SET, or a GET of one) has its own
        // iteration: the next one waits for the next iteration.
        if (!c.yielded) yielded_.push_back(id);
        c.yielded = true;
        break;
      }
    }
    if (c.in_off > 0 && (c.in_off == c.in.size() || c.in_off > (1 << 20))) {
      c.in.erase(0, c.in_off);
      c.in_off = 0;
    }
    // Shrink a large buffer unless the request being received declared
    // that much (AdmitInput reserved it).
    if (c.in.empty() && c.in.capacity() > 4096 && c.parser.min_needed() == 0) {
      std::string().swap(c.in);  // idle connections hold no buffer
    } else if (c.in.capacity() > (4 << 20) && c.in.size() < (1 << 20) &&
               c.in_off + c.parser.min_needed() < c.in.capacity() / 2) {
      c.in.shrink_to_fit();
    }
    if (!c.closing) {
      AdmitInput(c);
    } else {
      Recharge(c);
    }
  }

  // Connections whose long key list ran out of this iteration's parse
  // budget continue, oldest first.
  void ContinueYielded() {
    std::deque<uint64_t> ids;
    ids.swap(yielded_);
    for (uint64_t id : ids) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      it->second->yielded = false;
      ProcessInput(*it->second);
      auto after = conns_.find(id);
      if (after != conns_.end() && after->second->peer_gone && !after->second->yielded) Close(id);
    }
  }

  void MarkDirty(Connection& c) {
    if (c.out_epoch != epoch_) {
      c.out_epoch = epoch_;
      c.out_mark = c.out.size();
    }
    dirty_.push_back(c.id);
  }

  // Starts a reply: native replies carry a status byte.
  std::string& Reply(Connection& c) {
    MarkDirty(c);
    if (c.native()) wire::PutU8(&c.out, wire::kReplyOk);
    return c.out;
  }

  // Closes the connection because of what the client sent; a native client
  // is told why first.
  void Reject(Connection& c, const absl::Status& why) {
    Warn(absl::StrCat("closing connection from ", c.peer, " (",
                      wire::DialectName(c.parser.dialect()), " client): ", why.message()));
    MarkDirty(c);
    if (c.native()) {
      wire::PutU8(&c.out, wire::kReplyError);
      wire::PutU8(&c.out, static_cast<uint8_t>(why.code()));
      wire::PutBytes(&c.out, why.message());
    }
    c.closing = true;
    CancelConnectionWait(c);
    MarkDirty(c);
  }

  void Send(Connection& c) {
    if (c.peer_gone) {
      // Nobody reads the replies: they are dropped (a send to the closed
      // peer would fail and close the connection before the requests it
      // sent last ran); ContinueYielded closes it once they did.
      c.out.clear();
      c.out_off = 0;
      Recharge(c);
      if (c.closing) Close(c.id);
      return;
    }
    while (c.pending_out() > 0) {
      ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.pending_out(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out_off += n;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        SetEvents(c, c.closing ? EPOLLOUT : (EPOLLIN | EPOLLOUT));
        if (c.pending_out() > options_.max_output_bytes) SetEvents(c, EPOLLOUT);
        if (c.out_off > (4 << 20)) {  // release what was sent of a large reply
          c.out.erase(0, c.out_off);
          c.out_off = 0;
          c.out.shrink_to_fit();
        }
        Recharge(c);
        return;
      }
      Close(c.id);  // peer gone
      return;
    }
    c.out.clear();
    c.out_off = 0;
    if (c.out.capacity() > 4096) std::string().swap(c.out);
    Recharge(c);
    if (c.closing) {
      Close(c.id);
      return;
    }
    bool was_throttled = !(c.events & EPOLLIN);
    SetEvents(c, EPOLLIN);
    if (was_throttled) ProcessInput(c);
  }

  void Close(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Connection& c = *it->second;
    CancelConnectionWait(c);
    DropPendingAuth(c);
    CancelTimer(c.pace_timer);
    deferred_bytes_ += c.parser.held_bytes();  // stays charged until freed
    budget_used_ += c.parser.held_bytes();
    FreeLater(c.parser.TakeHeldKeys());
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    budget_used_ -= c.charged;
    conns_.erase(it);
  }

  void CancelConnectionWait(Connection& c) {
    if (c.wait_kind == WaitKind::kNone) return;
    kv_.CancelWait(c.wait_id);
    CancelTimer(c.wait_timer);
    c.wait_kind = WaitKind::kNone;
    c.wait_id = 0;
    c.wait_timer = 0;
    FreeLater(std::move(c.wait_keys));
    c.wait_keys.clear();
    RetireWaitCharge(c);
    c.wait_registering = false;
    Recharge(c);
  }

  // Registers the waits in registering_ in chunks, round robin, within
  // this iteration's work slice; a wait whose last chunk is in and is
  // already satisfied finishes now.
  void RegisterWaitSlices() {
    bool first = true;
    while (!registering_.empty() && (first || absl::Now() < work_deadline_)) {
      first = false;
      uint64_t id = registering_.front();
      registering_.pop_front();
      auto it = conns_.find(id);
      if (it == conns_.end() || !it->second->wait_registering) continue;
      Connection& c = *it->second;
      size_t n = std::min(kWorkChunk, c.wait_keys.size() - c.wait_registered);
      kv_.AddWaitKeys(c.wait_id, c.wait_keys.data() + c.wait_registered, n);
      c.wait_registered += n;
      if (c.wait_registered < c.wait_keys.size()) {
        registering_.push_back(id);
        continue;
      }
      c.wait_registering = false;
      if (!kv_.EndWait(c.wait_id)) {
        c.wait_id = 0;
        FinishWait(c, /*timed_out=*/false);
      }
    }
  }

  // Long key lists are not freed at once (131,072 strings take milliseconds
  // to destroy): they wait here and DeferredWork frees them in chunks.
  void FreeLater(std::vector<std::string> keys) {
    if (keys.size() <= kFreeInlineKeys) return;
    graveyard_.push_back(std::move(keys));
  }

  bool DeferredPending() const { return !graveyard_.empty() || kv_.pending_reap_keys() > 0; }

  // Unlinks cancelled waits from the store's index and frees long key lists,
  // in chunks, for what is left of this iteration's work slice. Memory they
  // held stays charged (deferred_bytes_) until all of it is done.
  void DeferredWork() {
    bool first = true;
    while (DeferredPending() && (first || absl::Now() < work_deadline_)) {
      first = false;
      if (kv_.ReapCancelled(kWorkChunk) > 0) continue;
      std::vector<std::string>& keys = graveyard_.front();
      for (size_t i = 0; i < kWorkChunk && !keys.empty(); ++i) keys.pop_back();
      if (keys.empty()) graveyard_.pop_front();
    }
    if (!DeferredPending() && deferred_bytes_ > 0) {
      budget_used_ -= deferred_bytes_;
      deferred_bytes_ = 0;
    }
  }

  // A parked wait ends: its charge stays with the server until the deferred
  // work of freeing (and, cancelled, unlinking) its key lists is done.
  void RetireWaitCharge(Connection& c) {
    deferred_bytes_ += c.wait_charge;
    budget_used_ += c.wait_charge;
    c.wait_charge = 0;
  }

  // Parks `c` until `keys` exist (or the native timeout passes).
  void StartWait(Connection& c, WaitKind kind, std::vector<std::string> keys, uint64_t key_bytes,
                 int64_t timeout_ms) {
    uint64_t id = c.id;
    uint64_t charge = WaitCharge(keys, key_bytes);
    if (InputCharge(c) + charge > options_.max_connection_bytes) {
      RefuseForMemory(c, absl::StrCat("wait for ", keys.size(), " keys needs ", charge,
                                      " bytes, exceeding --store-max-connection-bytes=",
                                      options_.max_connection_bytes));
      return FreeLater(std::move(keys));
    }
    if (budget_used_ + charge > BudgetFor(charge)) {
      RefuseForMemory(c, absl::StrCat("wait for ", keys.size(), " keys needs ", charge,
                                      " bytes, exceeding ", BudgetText()));
      return FreeLater(std::move(keys));
    }
    c.wait_charge = charge;
    Recharge(c);
    c.wait_kind = kind;
    c.wait_keys = std::move(keys);
    if (c.wait_keys.size() > kWaitInlineKeys) {
      c.wait_id = kv_.BeginWait([this, id] { resumed_.push_back(id); }, c.wait_keys.size());
      c.wait_registering = true;
      c.wait_registered = 0;
      registering_.push_back(id);
    } else {
      c.wait_id = kv_.Wait(c.wait_keys, [this, id] { resumed_.push_back(id); });
      if (c.wait_id == 0) {
        // Met at once: ProcessInput, which runs this request, goes on to
        // the next one itself (resuming from here would recurse once per
        // pipelined wait, and enough of them overflow the stack).
        FinishWait(c, /*timed_out=*/false, /*resume_input=*/false);
        return;
      }
    }
    if (kind != WaitKind::kTorchWait && timeout_ms > 0) {
      c.wait_timer = AddTimer(absl::Now() + absl::Milliseconds(timeout_ms), [this, id] {
        auto it = conns_.find(id);
        if (it == conns_.end()) return;
        it->second->wait_timer = 0;
        FinishWait(*it->second, /*timed_out=*/true);
      });
    }
  }

  // Ends `c`'s wait and answers it; then, with `resume_input`, runs the
  // requests buffered behind it (not when called from inside ProcessInput).
  void FinishWait(Connection& c, bool timed_out, bool resume_input = true) {
    WaitKind kind = c.wait_kind;
    if (kind == WaitKind::kNone) return;  // cancelled meanwhile
    std::vector<std::string> keys = std::move(c.wait_keys);
    if (timed_out) kv_.CancelWait(c.wait_id);
    CancelTimer(c.wait_timer);
    c.wait_kind = WaitKind::kNone;
    c.wait_id = 0;
    c.wait_timer = 0;
    RetireWaitCharge(c);
    c.wait_registering = false;
    Recharge(c);
    // A wait released (or measured) while writes are unlogged may have
    // been released by one of them.
    if (HasUnlogged()) c.depend_epoch = epoch_;
    if (stopping_ && timed_out && c.native()) {
      Reject(c, absl::UnavailableError("musterd is shutting down"));
    } else {
      ConnContext ctx(this, c);
      dispatcher_.CompleteWait(kind, keys, timed_out, ctx);
    }
    FreeLater(std::move(keys));  // a long list is freed in chunks
    Recharge(c);
    if (resume_input && !c.closing) ProcessInput(c);
  }

  // Handles the native handshake (see common/store_wire.h) and admits torch
  // clients by address. True if `req` is an ordinary request to run now.
  bool Authenticate(Connection& c, const StoreRequest& req) {
    if (req.op == wire::Op::kAuth) {  // the parser only yields it first
      absl::StatusOr<std::string> server_nonce = store_auth::RandomNonce();
      if (!server_nonce.ok()) {
        Reject(c, server_nonce.status());
        return false;
      }
      std::string& out = Reply(c);
      out += *server_nonce;
      if (options_.token.empty()) {
        wire::PutBytes(&out, "");  // nothing to prove
      } else {
        wire::PutBytes(&out, store_auth::ServerProof(options_.token, req.values[0], *server_nonce));
        c.expected_proof = store_auth::ClientProof(options_.token, *server_nonce, req.values[0]);
      }
      c.challenged = true;
      return false;
    }
    if (req.op == wire::Op::kAuthProof) {  // only right after AUTH
      std::string expected = std::move(c.expected_proof);
      c.expected_proof.clear();
      if (!options_.token.empty()) {
        if (req.values[0].empty()) {
          Reject(c, absl::UnauthenticatedError(
                        "this store requires a token (--store-token-file) and the client has "
                        "none; give the client the store token"));
          return false;
        }
        if (!store_auth::ProofEquals(req.values[0], expected)) {
          Reject(c, absl::UnauthenticatedError(
                        "authentication failed: the client's proof does not match this "
                        "store's token (wrong store token)"));
          return false;
        }
      }
      if (absl::Status admitted = LeavePendingAuth(c); !admitted.ok()) {
        Reject(c, admitted);
        return false;
      }
      c.authenticated = true;
      std::string& out = Reply(c);
      wire::PutU64(&out, options_.limits.max_key_bytes);
      wire::PutU64(&out, options_.limits.max_value_bytes);
      wire::PutU64(&out, options_.limits.max_keys_per_request);
      wire::PutU64(&out, options_.limits.max_request_bytes);
      return false;  // the handshake is fully handled
    }
    if (!c.unauthenticated_allowed) {
      RefuseUnauthenticated(c, c.parser.dialect());
      return false;
    }
    c.authenticated = true;
    return true;
  }

  void RefuseUnauthenticated(Connection& c, wire::Dialect dialect) {
    Reject(c, absl::PermissionDeniedError(absl::StrCat(
                  "unauthenticated ", wire::DialectName(dialect),
                  " client refused: the store requires a token (--store-token-file) and ",
                  "this peer is not in --store-allow-unauthenticated")));
  }

  // The dispatcher's view of one connection, for one request or wait.
  class ConnContext : public StoreDispatcher::Context {
   public:
    ConnContext(Impl* impl, Connection& c) : impl_(impl), c_(c) {}
    wire::Dialect dialect() const override { return c_.parser.dialect(); }
    bool ReserveReply(uint64_t bytes, wire::Op op) override {
      return impl_->ReserveReply(c_, bytes, op);
    }
    void RefuseForMemory(std::string why) override { impl_->RefuseForMemory(c_, std::move(why)); }
    std::string& Reply() override { return impl_->Reply(c_); }
    void Fail(const absl::Status& why) override { impl_->Reject(c_, why); }
    void StartWait(StoreWaitKind kind, std::vector<std::string> keys, uint64_t key_bytes,
                   int64_t timeout_ms) override {
      impl_->StartWait(c_, kind, std::move(keys), key_bytes, timeout_ms);
    }
    void CancelWait() override { impl_->CancelConnectionWait(c_); }

   private:
    Impl* impl_;
    Connection& c_;
  };

  void Handle(Connection& c, StoreRequest& req) {
    if (!c.authenticated && !Authenticate(c, req)) return;
    if (StoreDispatcher::IsWrite(req.op) && log_ != nullptr) {
      if (log_failing_) return Reject(c, LogRefusal());
      if (c.write_epoch != epoch_) {
        c.write_epoch = epoch_;
        wrote_.push_back(c.id);
      }
    }
    if (ReadsUnloggedWrite(req)) c.depend_epoch = epoch_;
    ConnContext ctx(this, c);
    const int64_t start = absl::GetCurrentTimeNanos();
    const wire::Op op = req.op;
    dispatcher_.Execute(req, ctx);
    metrics_.Record(op, static_cast<double>(absl::GetCurrentTimeNanos() - start) * 1e-9);
  }

  // Whether the reply to read request `req` may depend on a write of this
  // iteration that is not in the log yet (so must fail if that write is
  // rolled back). A read of keys untouched since the last flush answered
  // from durable state, and keeps its reply when the flush fails.
  bool ReadsUnloggedWrite(const StoreRequest& req) const {
    if (!HasUnlogged()) return false;
    switch (req.op) {
      case wire::Op::kGet:
      case wire::Op::kMultiGet:
      case wire::Op::kCheck:
      case wire::Op::kQueueLen:
        return ReadsUnlogged(req.keys);
      case wire::Op::kNumKeys:
      case wire::Op::kListKeys:
        return true;  // every key counts
      default:
        // Writes are tracked as writes; waits when they finish (FinishWait);
        // PING, WATCH_KEY, CANCEL_WAIT read nothing.
        return false;
    }
  }

  const StoreServerOptions options_;
  KvStore kv_;
  StoreDispatcher dispatcher_;

 public:
  StoreMetrics metrics_;

 private:
  std::unique_ptr<StoreLog> log_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;

  // std::mutex rather than absl::Mutex: Debian's Abseil is not built for
  // ThreadSanitizer, which then could not see this hand-off.
  std::mutex tasks_mu_;
  std::vector<std::function<void(Loop&)>> tasks_;  // guarded by tasks_mu_
  std::atomic<bool> stop_requested_{false};

  // Loop-thread state.
  bool stopping_ = false;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Connection>> conns_;
  // Connections with pending_auth, oldest (lowest id) first.
  std::set<uint64_t> pending_auth_;
  uint64_t next_conn_id_ = 2;                        // 0 and 1 are the listener and the wake fd
  std::vector<uint64_t> dirty_;                      // connections with replies to send
  std::vector<uint64_t> resumed_;                    // connections whose wait was satisfied
  std::deque<uint64_t> registering_;                 // connections whose wait registers in slices
  std::deque<uint64_t> yielded_;                     // connections with a long key list to parse on
  absl::Time work_deadline_;                         // end of this iteration's work slice
  std::deque<std::vector<std::string>> graveyard_;   // long key lists to free (FreeLater)
  uint64_t deferred_bytes_ = 0;                      // charged for deferred work (in budget_used_)
  size_t parse_keys_left_ = kParseKeysPerIteration;  // this iteration's parse budget
  size_t read_bytes_left_ = kReadPerIteration;       // and its read budget
  std::map<std::pair<absl::Time, TimerId>, std::function<void()>> timers_;
  absl::flat_hash_map<TimerId, absl::Time> timer_deadlines_;
  TimerId next_timer_id_ = 1;
  std::vector<std::function<void()>> after_flush_;
  absl::Status flush_status_;
  // Counts log flushes (see Connection::out_epoch).
  uint64_t epoch_ = 1;
  bool log_failing_ = false;
  // The log batch of this epoch is partly written (HoldDependentReplies).
  bool log_writing_ = false;
  std::vector<uint64_t> wrote_;  // connections with a write request this epoch
  char read_buffer_[kReadChunk];
  bool listener_paused_ = false;
  absl::Time listener_resume_;
  absl::Time warn_window_start_;
  int warn_count_ = 0;
  int warn_suppressed_ = 0;

  std::atomic<int64_t> stat_keys_{0};
  std::atomic<int64_t> stat_connections_{0};
  std::atomic<uint64_t> stat_bytes_{0};
  std::atomic<uint64_t> stat_refused_{0};
  std::atomic<int64_t> stat_unauthenticated_{0};
  std::atomic<uint64_t> stat_refused_unauthenticated_{0};
  std::atomic<uint64_t> stat_replaced_unauthenticated_{0};
  std::atomic<uint64_t> stat_auth_timeouts_{0};
  mutable std::mutex stat_mu_;
  std::string stat_log_error_;  // guarded by stat_mu_
  std::atomic<uint64_t> stat_memory_{0};
  std::atomic<uint64_t> stat_refused_memory_{0};
  std::atomic<uint64_t> stat_slow_iterations_{0};
  std::atomic<int64_t> stat_max_iteration_us_{0};
  uint64_t budget_used_ = 0;  // sum of every connection's `charged`
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(StoreServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store-port must be in [0, 65535], got ", options.port));
  }
  if (options.max_unauthenticated_connections == 0) {
    return absl::InvalidArgumentError("--store-max-unauthenticated-connections must be positive");
  }
  if (options.auth_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--store-auth-timeout-seconds must be positive");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  int port = 0;
  RETURN_IF_ERROR(impl->Init(&port));
  std::unique_ptr<StoreServer> server(new StoreServer(std::move(impl)));
  server->port_ = port;
  return server;
}

StoreServer::~StoreServer() { Stop(); }
void StoreServer::Stop() { impl_->Stop(); }
StoreServer::Stats StoreServer::stats() const { return impl_->stats(); }
const StoreMetrics& StoreServer::metrics() const { return impl_->metrics_; }
bool StoreServer::Post(std::function<void(Loop&)> task) { return impl_->Post(std::move(task)); }

absl::Status NoValue(const std::string& key) {
  return absl::NotFoundError(absl::StrCat("store key '", key,
                                          "' has no value (it holds only a queue, or it was "
                                          "deleted while other keys were awaited)"));
}

void WhenPresent(StoreServer::Loop& loop, std::vector<std::string> keys, absl::Duration timeout,
                 std::function<void()> ready, std::function<void(absl::Status)> expired) {
  // Whichever of "the keys exist" and "the timer fired" comes first wins.
  struct State {
    bool done = false;
    KvStore::WaitId wait = 0;
    StoreServer::TimerId timer = 0;
  };
  auto state = std::make_shared<State>();
  StoreServer::Loop* l = &loop;
  auto on_ready = [state, l, ready = std::move(ready)] {
    if (state->done) return;
    state->done = true;
    if (state->timer != 0) l->CancelTimer(state->timer);
    ready();
  };
  state->wait = loop.kv().Wait(keys, on_ready);
  if (state->wait == 0) {
    on_ready();
    return;
  }
  const absl::Time deadline = timeout == absl::InfiniteDuration()
                                  ? absl::Now() + absl::Hours(24 * 365)
                                  : absl::Now() + timeout;
  state->timer = loop.AddTimer(
      deadline, [state, l, keys = std::move(keys), timeout, expired = std::move(expired)] {
        if (state->done) return;
        state->done = true;
        l->kv().CancelWait(state->wait);
        if (l->stopping()) {
          expired(absl::UnavailableError("musterd's store is shutting down"));
          return;
        }
        std::vector<std::string> named;
        uint64_t missing = l->kv().MissingKeys(keys, wire::kMaxNamedMissingKeys, &named);
        expired(absl::DeadlineExceededError(absl::StrCat("store wait timed out after ",
                                                         absl::FormatDuration(timeout), "; ",
                                                         wire::MissingKeysText(named, missing))));
      });
}

}  // namespace muster
