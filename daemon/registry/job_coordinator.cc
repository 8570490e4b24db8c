#include "daemon/registry/job_coordinator.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "muster/tcp_store.h"

namespace muster {
namespace {

constexpr absl::Duration kSlice = absl::Milliseconds(200);
constexpr size_t kMaxIdleConnections = 4;

std::string EncodeRank(const RemoteRank& r) {
  // Readers of three fields (earlier versions) ignore the fourth.
  return absl::StrCat(r.host, "\t", r.pid, "\t", r.daemon, "\t", r.control);
}

RemoteRank DecodeRank(int rank, const std::string& text) {
  RemoteRank r;
  r.rank = rank;
  std::vector<std::string> f = absl::StrSplit(text, '\t');
  if (f.size() >= 1) r.host = f[0];
  if (f.size() >= 2) (void)absl::SimpleAtoi(f[1], &r.pid);
  if (f.size() >= 3) r.daemon = f[2];
  if (f.size() >= 4) r.control = f[3];
  return r;
}

std::string RankKey(int rank) { return absl::StrCat("rank/", rank); }
std::string AliveKey(int rank) { return absl::StrCat("alive/", rank); }
// An alive/<r> key no longer held by a lease (the rank failed or left).
constexpr char kReleased[] = "-";

// A condition: the wake counter moved past what a waiter saw.
struct WakeArgs {
  const uint64_t* wakes;
  uint64_t seen;
};
bool Woken(WakeArgs* a) { return *a->wakes != a->seen; }

}  // namespace

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("store address '", address, "' is not HOST:PORT"));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  if (!absl::SimpleAtoi(address.substr(colon + 1), port) || *port <= 0 || *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("store address '", address, "': bad port"));
  }
  return absl::OkStatus();
}

JobStoreAccess TcpJobStore(const std::string& master, const std::string& token) {
  TcpStoreOptions options;
  absl::Status address = SplitHostPort(master, &options.host, &options.port);
  options.token = token;
  options.connect_timeout = absl::Seconds(1);
  options.timeout = absl::Seconds(30);
  JobStoreAccess access;
  access.connect = [address, options]() -> absl::StatusOr<std::unique_ptr<Store>> {
    RETURN_IF_ERROR(address);
    ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::Connect(options));
    return std::unique_ptr<Store>(std::move(store));
  };
  return access;
}

JobCoordinator::JobCoordinator(std::string job_id, int64_t generation, JobStoreAccess access)
    : job_id_(std::move(job_id)),
      prefix_(absl::StrCat("muster/", job_id_, "/", generation, "/")),
      access_(std::move(access)),
      claim_id_(absl::StrCat(::getpid(), "/", absl::ToUnixNanos(absl::Now()), "/",
                             reinterpret_cast<uintptr_t>(this))) {}

JobCoordinator::~JobCoordinator() {
  Cancel();
  if (lost_watch_) lost_watch_();
  if (watcher_.joinable()) watcher_.join();
}

void JobCoordinator::Cancel() {
  stopping_ = true;
  Interrupt();
}

void JobCoordinator::Interrupt() {
  absl::MutexLock lock(&wake_mu_);
  ++wakes_;
}

absl::StatusOr<std::unique_ptr<Store>> JobCoordinator::Acquire() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      auto store = std::move(idle_.back());
      idle_.pop_back();
      return store;
    }
  }
  // The job's store may start after this daemon: keep trying for a while,
  // in short attempts so that Cancel() is noticed.
  absl::Time give_up = absl::Now() + absl::Minutes(5);
  while (true) {
    if (stopping_) return absl::UnavailableError("musterd is shutting down");
    auto store = access_.connect();
    if (store.ok()) return store;
    if (store.status().code() != absl::StatusCode::kUnavailable || absl::Now() > give_up) {
      return Annotate(store.status(),
                      absl::StrCat("job ", job_id_, ": cannot reach the job's store"));
    }
    absl::MutexLock lock(&wake_mu_);
    WakeArgs args{&wakes_, wakes_};
    wake_mu_.AwaitWithTimeout(absl::Condition(&Woken, &args), absl::Milliseconds(50));
  }
}

void JobCoordinator::Release(std::unique_ptr<Store> store) {
  absl::MutexLock lock(&mu_);
  if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(store));
}

absl::Status JobCoordinator::WaitForKeys(Store& store, const std::vector<std::string>& keys,
                                         absl::Time deadline,
                                         const std::function<std::string()>& interrupted) {
  auto check = [&]() -> absl::Status {
    if (stopping_) return absl::UnavailableError("musterd is shutting down");
    std::string reason = interrupted();
    if (!reason.empty()) return absl::AbortedError(reason);
    return absl::OkStatus();
  };
  if (!access_.watch) {
    // Polled: a wait in slices, re-checking between them.
    while (true) {
      RETURN_IF_ERROR(check());
      absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("timed out");
      absl::Status s = store.Wait(keys, std::min(left, kSlice));
      if (s.code() != absl::StatusCode::kDeadlineExceeded) return s;
    }
  }
  // Notified: the store tells when the keys exist, Interrupt() when to
  // re-check; no polling.
  struct Ready {
    bool done = false;
    absl::Status status;
  };
  auto ready = std::make_shared<Ready>();  // guarded by wake_mu_
  JobStoreAccess::Cancel cancel = access_.watch(keys, [this, ready](absl::Status s) {
    absl::MutexLock lock(&wake_mu_);
    ready->done = true;
    ready->status = std::move(s);
    ++wakes_;
  });
  absl::Status result;
  while (true) {
    uint64_t seen;
    {
      absl::MutexLock lock(&wake_mu_);
      seen = wakes_;
      if (ready->done) {
        result = ready->status;
        break;
      }
    }
    if (absl::Status s = check(); !s.ok()) {
      result = s;
      break;
    }
    absl::MutexLock lock(&wake_mu_);
    WakeArgs args{&wakes_, seen};
    if (!wake_mu_.AwaitWithDeadline(absl::Condition(&Woken, &args), deadline)) {
      result = absl::DeadlineExceededError("timed out");
      break;
    }
  }
  cancel();
  return result;
}

absl::StatusOr<bool> JobCoordinator::PublishRank(int world_size, const RemoteRank& rank,
                                                 absl::Duration takeover_wait) {
  ASSIGN_OR_RETURN(auto store, Acquire());
  std::string mine = absl::StrCat(world_size);
  ASSIGN_OR_RETURN(std::string world, store->CompareSet(prefix_ + "world_size", "", mine));
  if (world != mine) {
    Release(std::move(store));
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank.rank, " says world size ",
                                                   world_size, " but job ", job_id_,
                                                   " already has world size ", world));
  }
  const std::string key = prefix_ + RankKey(rank.rank);
  const std::string gone_key = absl::StrCat(prefix_, "gone/", rank.rank);
  std::string record = EncodeRank(rank);
  ASSIGN_OR_RETURN(std::string held, store->CompareSet(key, "", record));
  if (held == record) {
    Release(std::move(store));
    HoldLiveness(rank);
    return false;
  }
  // Another process held the rank: take it over once its daemon reported
  // it gone (a process killed a moment ago is reported within a second).
  absl::Time give_up = absl::Now() + takeover_wait;
  while (true) {
    ASSIGN_OR_RETURN(bool reported, store->Check({gone_key}));
    if (reported) {
      ASSIGN_OR_RETURN(std::string gone, store->Get(gone_key, absl::Seconds(5)));
      if (gone == held) {
        ASSIGN_OR_RETURN(std::string now, store->CompareSet(key, held, record));
        if (now == record) {
          Release(std::move(store));
          HoldLiveness(rank);
          return true;
        }
        held = now;  // another process took it first
      }
    }
    if (absl::Now() >= give_up || stopping_) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  Release(std::move(store));
  RemoteRank other = DecodeRank(rank.rank, held);
  return absl::AlreadyExistsError(absl::StrCat(
      "rank ", rank.rank, " of job ", job_id_, " is already registered by host ", other.host,
      " pid ", other.pid, " (still alive); a restarted job needs a new generation"));
}

void JobCoordinator::HoldLiveness(const RemoteRank& rank) {
  if (access_.liveness == nullptr) return;
  const NodeLiveness& l = *access_.liveness;
  absl::Status held =
      l.hold(prefix_ + AliveKey(rank.rank),
             absl::StrCat(EncodeRank(rank), "\t", l.node, "\t", absl::ToInt64Seconds(l.ttl)));
  if (!held.ok()) {
    MLOG(WARNING) << "job " << job_id_ << ": rank " << rank.rank
                  << "'s liveness key is not held yet (other nodes would not see this node "
                     "vanish): "
                  << held.message();
  }
}

absl::Status JobCoordinator::MarkGone(const RemoteRank& rank) {
  // The liveness key first: it is released in order (not lost), and a
  // process taking the rank over (after gone/<r> below) holds it anew.
  if (access_.liveness != nullptr) {
    RETURN_IF_ERROR(access_.liveness->release(prefix_ + AliveKey(rank.rank), kReleased));
  }
  ASSIGN_OR_RETURN(auto store, Acquire());
  RETURN_IF_ERROR(store->Set(absl::StrCat(prefix_, "gone/", rank.rank), EncodeRank(rank)));
  Release(std::move(store));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> JobCoordinator::LatestEpoch() {
  ASSIGN_OR_RETURN(auto store, Acquire());
  ASSIGN_OR_RETURN(bool present, store->Check({prefix_ + "epoch"}));
  int64_t epoch = 0;
  if (present) {
    ASSIGN_OR_RETURN(std::string value, store->Get(prefix_ + "epoch", absl::Seconds(5)));
    if (!absl::SimpleAtoi(value, &epoch)) {
      return absl::DataLossError(absl::StrCat("job ", job_id_, ": bad epoch record '", value, "'"));
    }
  }
  Release(std::move(store));
  return epoch;
}

absl::StatusOr<std::vector<int>> JobCoordinator::Members(int64_t epoch) {
  const std::string key = absl::StrCat("epoch/", epoch, "/members");
  ASSIGN_OR_RETURN(auto store, Acquire());
  ASSIGN_OR_RETURN(bool present, store->Check({prefix_ + key}));
  Release(std::move(store));
  if (!present) return std::vector<int>{};
  return Decide(key, {});  // reads what the first proposer fixed
}

absl::Status JobCoordinator::SetLatestEpoch(int64_t epoch) {
  ASSIGN_OR_RETURN(auto store, Acquire());
  RETURN_IF_ERROR(store->Set(prefix_ + "epoch", absl::StrCat(epoch)));
  Release(std::move(store));
  return absl::OkStatus();
}

absl::Status JobCoordinator::PublishGroupSpec(const std::string& path, const std::string& group,
                                              const std::string& spec) {
  ASSIGN_OR_RETURN(auto store, Acquire());
  ASSIGN_OR_RETURN(std::string held,
                   store->CompareSet(absl::StrCat(prefix_, path, "/spec"), "", spec));
  Release(std::move(store));
  if (held != spec) {
    return absl::InvalidArgumentError(absl::StrCat("group '", group, "' is defined as {", held,
                                                   "} by other ranks but {", spec, "} here"));
  }
  return absl::OkStatus();
}

absl::Status JobCoordinator::Arrive(const std::string& key, const std::vector<int>& ranks) {
  if (ranks.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto store, Acquire());
  std::vector<std::string> keys, values;
  for (int r : ranks) {
    keys.push_back(absl::StrCat(prefix_, key, "/", r));
    values.push_back("1");
  }
  RETURN_IF_ERROR(store->MultiSet(keys, values));
  Release(std::move(store));
  return absl::OkStatus();
}

absl::Status JobCoordinator::AwaitArrivals(const std::string& key, const std::vector<int>& ranks,
                                           absl::Time deadline, const std::string& what,
                                           const std::function<std::string()>& abort_reason) {
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(absl::StrCat(prefix_, key, "/", r));
  ASSIGN_OR_RETURN(auto store, Acquire());
  absl::Status s = WaitForKeys(*store, keys, deadline, abort_reason);
  if (s.ok()) {
    Release(std::move(store));
    return s;
  }
  if (s.code() == absl::StatusCode::kAborted) {
    Release(std::move(store));
    return absl::AbortedError(absl::StrCat(what, " aborted: ", s.message()));
  }
  if (s.code() != absl::StatusCode::kDeadlineExceeded) return s;
  std::vector<int> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto present = store->Check({keys[i]});
    if (!present.ok()) return present.status();
    if (!*present) missing.push_back(ranks[i]);
  }
  Release(std::move(store));
  return absl::DeadlineExceededError(
      absl::StrCat(what, " timed out; ranks that never arrived: ", absl::StrJoin(missing, ", ")));
}

absl::StatusOr<std::vector<int>> JobCoordinator::Present(const std::string& key,
                                                         const std::vector<int>& ranks) {
  ASSIGN_OR_RETURN(auto store, Acquire());
  std::vector<int> present;
  for (int r : ranks) {
    ASSIGN_OR_RETURN(bool here, store->Check({absl::StrCat(prefix_, key, "/", r)}));
    if (here) present.push_back(r);
  }
  Release(std::move(store));
  return present;
}

absl::StatusOr<int64_t> JobCoordinator::Count(const std::string& key, int64_t delta) {
  ASSIGN_OR_RETURN(auto store, Acquire());
  ASSIGN_OR_RETURN(int64_t n, store->Add(prefix_ + key, delta));
  Release(std::move(store));
  return n;
}

absl::StatusOr<std::vector<int>> JobCoordinator::Decide(const std::string& key,
                                                        const std::vector<int>& ranks) {
  ASSIGN_OR_RETURN(auto store, Acquire());
  ASSIGN_OR_RETURN(std::string fixed,
                   store->CompareSet(prefix_ + key, "", absl::StrJoin(ranks, ",")));
  Release(std::move(store));
  std::vector<int> decided;
  for (absl::string_view part : absl::StrSplit(fixed, ',', absl::SkipEmpty())) {
    int r;
    if (!absl::SimpleAtoi(part, &r)) {
      return absl::DataLossError(
          absl::StrCat("job ", job_id_, ": bad record ", key, "='", fixed, "'"));
    }
    decided.push_back(r);
  }
  return decided;
}

absl::StatusOr<std::map<int, RemoteRank>> JobCoordinator::FetchRanks(
    const std::vector<int>& ranks) {
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(prefix_ + RankKey(r));
  ASSIGN_OR_RETURN(auto store, Acquire());
  std::map<int, RemoteRank> result;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSIGN_OR_RETURN(bool present, store->Check({keys[i]}));
    if (!present) continue;  // a non-member that never registered
    ASSIGN_OR_RETURN(std::string value, store->Get(keys[i], absl::Seconds(5)));
    result[ranks[i]] = DecodeRank(ranks[i], value);
  }
  Release(std::move(store));
  return result;
}

absl::Status JobCoordinator::ReportFailure(const FailureRecord& f) {
  ASSIGN_OR_RETURN(auto store, Acquire());
  ASSIGN_OR_RETURN(int64_t n, store->Add(prefix_ + "failures", 1));
  RETURN_IF_ERROR(
      store->Set(absl::StrCat(prefix_, "failure/", n),
                 absl::StrCat(f.rank, "\t", f.host, "\t", f.pid, "\t", f.epoch, "\t", f.reason)));
  Release(std::move(store));
  return absl::OkStatus();
}

void JobCoordinator::ReportLost(const std::vector<LostKey>& lost) {
  // One report per node (a lease's keys vanish in one deletion).
  struct Node {
    std::string ttl;
    std::vector<RemoteRank> ranks;
  };
  std::map<std::string, Node> nodes;
  int64_t revision = 0;
  const std::string alive = prefix_ + "alive/";
  for (const LostKey& k : lost) {
    int r = -1;
    if (!absl::StartsWith(k.key, alive) || !absl::SimpleAtoi(k.key.substr(alive.size()), &r)) {
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(k.value, '\t');
    if (f.size() < 6) continue;  // released ("-"): the rank failed or left in order
    Node& n = nodes[f[4]];
    n.ttl = f[5];
    n.ranks.push_back(DecodeRank(r, absl::StrJoin(f.begin(), f.begin() + 4, "\t")));
    revision = k.revision;
  }
  for (auto& [node, n] : nodes) {
    std::sort(n.ranks.begin(), n.ranks.end(),
              [](const RemoteRank& a, const RemoteRank& b) { return a.rank < b.rank; });
    std::vector<int> numbers;
    for (const RemoteRank& r : n.ranks) numbers.push_back(r.rank);
    std::string reason = absl::StrCat("node ", node, " (musterd lease expired after ", n.ttl,
                                      " s): ", numbers.size() == 1 ? "rank " : "ranks ",
                                      absl::StrJoin(numbers, ", "), " lost");
    // Local ranks are told at once; the record reaches every other daemon
    // (and this one again: MarkFailed ignores a repeat) through the store.
    int64_t epoch = 0;
    for (int i = 0; i < 3 && !stopping_; ++i) {
      absl::StatusOr<int64_t> latest = LatestEpoch();
      if (latest.ok()) {
        epoch = *latest;
        break;
      }
    }
    for (const RemoteRank& r : n.ranks) {
      if (!stopping_ && on_failure_) {
        on_failure_(FailureRecord{r.rank, r.host, r.pid, reason, epoch});
      }
    }
    // Retries of idempotent steps only, for 30 s while the store is
    // unreachable.
    auto retry = [this](const std::function<absl::Status()>& step) {
      absl::Time give_up = absl::Now() + absl::Seconds(30);
      absl::Status s;
      while (!(s = step()).ok() && !stopping_ && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(200));
      }
      return s;
    };
    for (const RemoteRank& r : n.ranks) {
      // Exactly one daemon reports it: the one whose claim lands first. A
      // claim whose reply was lost reads back as this daemon's on a retry.
      const std::string claim = absl::StrCat(prefix_, "lost/", r.rank, "/", revision);
      if (reported_.count(claim)) continue;
      bool mine = false;
      absl::Status s = retry([&]() -> absl::Status {
        ASSIGN_OR_RETURN(auto store, Acquire());
        ASSIGN_OR_RETURN(std::string claimed, store->CompareSet(claim, "", claim_id_));
        Release(std::move(store));
        mine = claimed == claim_id_;
        return absl::OkStatus();
      });
      // The record once (a repeated Add could leave a gap in failure/<n>).
      if (s.ok() && mine) s = ReportFailure(FailureRecord{r.rank, r.host, r.pid, reason, epoch});
      // As the rank's own daemon would: a new process may take it over.
      if (s.ok() && mine) {
        s = retry([&]() -> absl::Status {
          ASSIGN_OR_RETURN(auto store, Acquire());
          RETURN_IF_ERROR(store->Set(absl::StrCat(prefix_, "gone/", r.rank), EncodeRank(r)));
          Release(std::move(store));
          return absl::OkStatus();
        });
      }
      if (s.ok() && mine) reported_.insert(claim);
      if (!s.ok()) {
        MLOG(WARNING) << "job " << job_id_ << ": cannot report " << reason << ": " << s.message();
      } else if (mine) {
        MLOG(WARNING) << "job " << job_id_ << ": reported rank " << r.rank << " failed: " << reason;
      }
    }
  }
}

void JobCoordinator::WatchFailures(std::function<void(const FailureRecord&)> on_failure) {
  on_failure_ = on_failure;
  if (access_.liveness != nullptr) {
    lost_watch_ =
        access_.liveness->watch_lost(prefix_ + "alive/", [this](const std::vector<LostKey>& lost) {
          if (!stopping_) ReportLost(lost);
        });
  }
  watcher_ =
      std::thread([this, on_failure = std::move(on_failure)] { RunFailureWatcher(on_failure); });
}

void JobCoordinator::RunFailureWatcher(
    const std::function<void(const FailureRecord&)>& on_failure) {
  int64_t seen = 0;
  int no_value_tries = 0;  // of record seen + 1
  std::unique_ptr<Store> store;
  auto never = [] { return std::string(); };
  while (!stopping_) {
    if (store == nullptr) {
      auto s = Acquire();
      if (!s.ok()) {
        absl::SleepFor(absl::Milliseconds(500));
        continue;
      }
      store = std::move(*s);
    }
    std::string key = absl::StrCat(prefix_, "failure/", seen + 1);
    absl::Status present = WaitForKeys(*store, {key}, absl::InfiniteFuture(), never);
    if (!present.ok()) {
      if (present.code() != absl::StatusCode::kUnavailable || !stopping_) {
        store.reset();  // a broken connection: reconnect
        if (!stopping_) absl::SleepFor(absl::Milliseconds(100));
      }
      continue;
    }
    auto value = store->Get(key, absl::Seconds(5));
    if (absl::IsNotFound(value.status()) && ++no_value_tries < 50) {
      // Present for waits but without a value (a queue pushed there): the
      // record's SET may still come, for 5 s; then it is a malformed record,
      // as a TCP client of the store sees it (an empty value).
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (!value.ok() && !absl::IsNotFound(value.status())) {
      store.reset();
      continue;
    }
    ++seen;
    no_value_tries = 0;
    if (!value.ok()) value = std::string();
    std::vector<std::string> f =
        absl::StrSplit(absl::string_view(*value), absl::MaxSplits('\t', 4));
    FailureRecord record;
    if (f.size() == 5 && absl::SimpleAtoi(f[0], &record.rank) &&
        absl::SimpleAtoi(f[2], &record.pid) && absl::SimpleAtoi(f[3], &record.epoch)) {
      record.host = f[1];
      record.reason = f[4];
      on_failure(record);
    } else {
      MLOG(WARNING) << "job " << job_id_ << ": malformed failure record " << key;
    }
  }
}

}  // namespace muster
