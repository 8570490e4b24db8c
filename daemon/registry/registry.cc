#include "daemon/registry/registry.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/backend.h"
#include "backends/shm/trace.h"
#include "common/cpus.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "common/store_auth.h"
#include "daemon/registry/dump_files.h"
#include "muster/types.h"
#include "proto/state_names.h"
#include "proto/trace_json.h"

namespace muster {
namespace {

constexpr absl::Duration kDefaultGroupTimeout = absl::Minutes(30);

std::string GroupSpec(const std::vector<int>& ranks, const std::string& backend, bool local_sync) {
  return absl::StrCat("ranks=", absl::StrJoin(ranks, ","), ";backend=", backend,
                      ";local_sync=", local_sync ? 1 : 0);
}

// Where a group's keys live in the job's store: epoch 0 as ever, later
// epochs apart (no rank can read an earlier epoch's arrivals).
std::string GroupPath(int64_t epoch, const std::string& name) {
  return epoch == 0 ? absl::StrCat("group/", name) : absl::StrCat("e", epoch, "/group/", name);
}

absl::Duration TimeoutOf(const v1::Timeout& t, absl::Duration fallback) {
  return t.millis() > 0 ? absl::Milliseconds(t.millis()) : fallback;
}

}  // namespace

Registry::Registry(RegistryOptions options)
    : options_(std::move(options)), daemon_id_(options_.daemon_address) {
  if (daemon_id_.empty()) {
    daemon_id_ =
        absl::StrCat(options_.hostname, "/", ::getpid(), "/", absl::ToUnixNanos(absl::Now()));
  }
  pool_ = std::make_unique<WorkerPool>(options_.max_workers, /*reserved_for_short=*/4);
  reaper_ = std::thread([this] { ReapLoop(); });
  sweeper_ = std::thread([this] { SweepLoop(); });
}

Registry::~Registry() { Shutdown(); }

void Registry::EndSessions(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (auto& [id, job] : jobs_) {
    for (auto& [r, rank] : job.ranks) {
      if (rank.local && rank.sink != nullptr) rank.sink->End(reason);
    }
    InterruptWaits(job);
  }
}

void Registry::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, job] : jobs_) {
      if (job.coordinator != nullptr) job.coordinator->Cancel();
    }
  }
  // Cancelled coordinators end their waits at once.
  pool_->Drain();
  std::vector<std::shared_ptr<JobCoordinator>> coordinators;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) {
      if (job.coordinator != nullptr) coordinators.push_back(std::move(job.coordinator));
      // UNAVAILABLE: the segments' members are this daemon's ranks, which
      // lose their sessions too.
      ReleaseSegments(job, absl::StrCat("musterd (pid ", ::getpid(), ") is shutting down"),
                      AbortKind::kUnavailable);
    }
  }
  coordinators.clear();  // joins the failure watchers outside the lock
  if (reaper_.joinable()) reaper_.join();
  if (sweeper_.joinable()) sweeper_.join();
}

void Registry::NoteIfIdle(Job& job) {
  for (const auto& [r, rec] : job.ranks) {
    if (rec.local && (rec.joining || rec.info.state() == v1::RANK_STATE_ALIVE)) return;
  }
  if (job.idle_since == absl::InfiniteFuture()) job.idle_since = absl::Now();
}

void Registry::ReapLoop() {
  absl::Duration period =
      std::clamp(options_.job_grace / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) {
    std::vector<std::shared_ptr<JobCoordinator>> removed;
    absl::Time now = absl::Now();
    // Groups a member broke itself (a collective timed out, a desync): the
    // segment says so; musterd learns it here and keeps the evidence.
    for (auto& [id, job] : jobs_) {
      for (auto& [name, g] : job.groups) {
        if (g.segment != nullptr && !g.truncation_logged && g.segment->truncated()) {
          // mapping_guard kept musterd alive; the group's
          // own ranks cannot go on.
          g.truncation_logged = true;
          MLOG(WARNING) << "job " << id << ": group " << name << "'s shared memory "
                        << g.segment->name()
                        << " was truncated under musterd (by its user); its pages read as zeros "
                           "here";
        }
        DumpIfAborted(job, g);
      }
    }
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& job = it->second;
      if (job.idle_since == absl::InfiniteFuture() || now - job.idle_since < options_.job_grace) {
        ++it;
        continue;
      }
      MLOG(INFO) << "job " << job.id << ": removed, " << absl::FormatDuration(now - job.idle_since)
                 << " after its last rank on this daemon left or failed";
      ReleaseSegments(job, "the job was removed");
      for (const auto& [r, rec] : job.ranks) {
        if (!rec.session_id.empty()) sessions_.erase(rec.session_id);
      }
      if (job.coordinator != nullptr) {
        job.coordinator->Cancel();
        removed.push_back(std::move(job.coordinator));
      }
      it = jobs_.erase(it);
    }
    if (removed.empty()) continue;
    // Destroying a coordinator joins its failure watcher, whose callback
    // takes mu_: never under the lock.
    mu_.Unlock();
    removed.clear();
    mu_.Lock();
  }
}

std::vector<CollectiveMetrics::Source> Registry::SweepSources() {
  std::vector<CollectiveMetrics::Source> sources;
  for (const auto& [id, job] : jobs_) {
    for (const auto& [name, g] : job.groups) {
      if (g.segment != nullptr) sources.push_back({g.segment->name(), g.segment, g.info.backend()});
    }
  }
  return sources;
}

void Registry::SweepLoop() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.collective_sweep_period)) {
    std::vector<CollectiveMetrics::Source> sources = SweepSources();
    mu_.Unlock();
    collective_metrics_.Sweep(sources);
    sources.clear();  // the last references to removed segments go here, outside the lock
    mu_.Lock();
  }
}

CollectiveMetrics::Snapshot Registry::collective_metrics() {
  std::vector<CollectiveMetrics::Source> sources;
  {
    absl::MutexLock lock(&mu_);
    sources = SweepSources();
  }
  collective_metrics_.Sweep(sources);
  return collective_metrics_.snapshot();
}

namespace {

// What a daemon signs: its id and its TCP gRPC address.
std::string PeerAddressProof(const std::string& key, const std::string& daemon,
                             const std::string& address) {
  return absl::BytesToHexString(store_auth::HmacSha256(
      key, absl::StrCat("muster-daemon-address-v1\n", daemon, "\n", address)));
}

}  // namespace

void Registry::SetControlAddress(const std::string& address) {
  control_address_ = address;
  if (!address.empty() && !options_.peer_address_key.empty()) {
    absl::StrAppend(&control_address_, "#",
                    PeerAddressProof(options_.peer_address_key, daemon_id_, address));
  }
}

std::string Registry::TrustedPeerAddress(const std::string& daemon,
                                         const std::string& published) const {
  const size_t hash = published.find('#');
  std::string address = published.substr(0, hash);
  if (options_.peers_verified_by_tls) return address;
  if (hash == std::string::npos || options_.peer_address_key.empty()) return "";
  const std::string proof = published.substr(hash + 1);
  const std::string expected = PeerAddressProof(options_.peer_address_key, daemon, address);
  return store_auth::ProofEquals(proof, expected) ? address : "";
}

absl::Status Registry::TakeWait(const Job& job, const std::string& what) {
  int& running = waits_by_uid_[job.owner_uid];
  if (running >= options_.max_waits_per_user) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " of job '", job.id, "' would be wait ", running + 1,
                     " for other ranks of uid ", job.owner_uid, " on this daemon (at most ",
                     options_.max_waits_per_user, " at once: group formations and barriers)"));
  }
  ++running;
  return absl::OkStatus();
}

void Registry::ReleaseWait(int64_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = waits_by_uid_.find(uid);
  if (it != waits_by_uid_.end() && --it->second <= 0) waits_by_uid_.erase(it);
}

absl::Status Registry::Authorize(const Job& job, const Caller& who) {
  if (who.MayAccess(job.owner_uid)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("job '", job.id, "' belongs to uid ",
                                                  job.owner_uid, ", not to ", who.description));
}

absl::StatusOr<int64_t> Registry::JobOwner(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job->owner_uid;
}

absl::Status Registry::CheckAccess(const std::string& job_id, const Caller& who) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return Authorize(*job, who);
}

void Registry::Spawn(WorkerPool::Kind kind, std::function<void()> fn) {
  pool_->Run(kind, std::move(fn));
}

void Registry::InterruptWaits(Job& job) {
  if (job.coordinator != nullptr) job.coordinator->Interrupt();
}

std::string Registry::DescribeRank(const v1::RankInfo& info) {
  std::string s = absl::StrCat("rank ", info.rank().global_rank());
  if (!info.host().empty()) absl::StrAppend(&s, " (host ", info.host(), ", pid ", info.pid(), ")");
  return s;
}

Registry::Job* Registry::FindJob(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<Registry::Job*> Registry::CallerJob(const v1::RankId& caller, const Caller& who) {
  if (stopping_) return absl::UnavailableError("musterd is shutting down");
  Job* job = FindJob(caller.job_id());
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", caller.job_id(), "' on this daemon"));
  }
  if (absl::Status s = Authorize(*job, who); !s.ok()) return s;
  auto it = job->ranks.find(caller.global_rank());
  if (it == job->ranks.end() || !it->second.local || it->second.joining) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", caller.global_rank(), " of job '",
                                                      caller.job_id(),
                                                      "' is not registered with this daemon"));
  }
  if (it->second.info.state() != v1::RANK_STATE_ALIVE) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", caller.global_rank(), " of job '",
                                                      caller.job_id(), "' is no longer alive"));
  }
  return job;
}

absl::Status ValidateRegisterRequest(const v1::RegisterRequest& req,
                                     const RegistryOptions& options) {
  int rank = req.rank().global_rank();
  RETURN_IF_ERROR(ValidateJobId(req.rank().job_id()));
  if (req.world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be >= 1, got ", req.world_size()));
  }
  if (req.world_size() > options.max_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", req.world_size(),
                     " exceeds this daemon's --max-world-size=", options.max_world_size));
  }
  if (rank < 0 || rank >= req.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside the world of size ",
                                                   req.world_size(), " (ranks 0..",
                                                   req.world_size() - 1, ")"));
  }
  if (req.local_world_size() > 0 &&
      (req.local_rank() < 0 || req.local_rank() >= req.local_world_size())) {
    return absl::InvalidArgumentError(absl::StrCat("local rank ", req.local_rank(),
                                                   " is outside the local world of size ",
                                                   req.local_world_size()));
  }
  if (req.pid() <= 0) return absl::InvalidArgumentError("pid must be positive");
  std::string host;
  int port = 0;
  return SplitHostPort(req.master_store_address(), &host, &port);
}

absl::Status ValidateGroupRanks(const std::vector<int>& ranks, int world_size,
                                const std::string& name) {
  if (ranks.empty()) return absl::InvalidArgumentError("a group needs at least one rank");
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, " in group '", name, "' is outside the world of size ", world_size));
    }
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " appears twice in group '", name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status Registry::ValidateJoin(const Job& job, const v1::RegisterRequest& req,
                                    const Caller& who) {
  const v1::RankId& id = req.rank();
  int rank = id.global_rank();
  if (job.owner_uid != who.uid) {
    return absl::PermissionDeniedError(absl::StrCat("job '", id.job_id(),
                                                    "' on this daemon runs as uid ", job.owner_uid,
                                                    "; rank ", rank, " runs as ", who.description));
  }
  if (job.world_size != req.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " says world size ",
                                                   req.world_size(), " but job '", id.job_id(),
                                                   "' has world size ", job.world_size));
  }
  if (job.master != req.master_store_address()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " uses store ",
                                                   req.master_store_address(), " but job '",
                                                   id.job_id(), "' uses ", job.master));
  }
  auto it = job.ranks.find(rank);
  // A rank whose process failed or left may be taken over by a new one
  // (elastic jobs, a finished job run again).
  if (it != job.ranks.end() &&
      (it->second.joining || it->second.info.state() == v1::RANK_STATE_ALIVE)) {
    const v1::RankInfo& other = it->second.info;
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", rank, " of job '", id.job_id(), "' is already registered (host ",
                     other.host(), ", pid ", other.pid(), ", ",
                     other.state() == v1::RANK_STATE_ALIVE ? "alive" : "still joining",
                     "); a new process may take a rank over once its process failed or left, "
                     "and a restarted job needs a new generation"));
  }
  return absl::OkStatus();
}

void Registry::Register(const v1::RegisterRequest& req, const Caller& who, SessionSink* sink,
                        RegisterDone done) {
  const v1::RankId& id = req.rank();
  int rank = id.global_rank();
  absl::Status bad = ValidateRegisterRequest(req, options_);
  if (!bad.ok()) {
    MLOG(WARNING) << "refused a registration from " << who.description << ": " << bad.message();
    done(bad);
    return;
  }
  // The kernel's word on who the rank is, over the client's.
  int64_t pid = who.pid > 0 ? who.pid : req.pid();

  std::shared_ptr<JobCoordinator> coordinator, retired;
  std::string session_id;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      bad = absl::UnavailableError("musterd is shutting down");
    }
    Job* job = bad.ok() ? FindJob(id.job_id()) : nullptr;
    if (bad.ok() && job != nullptr && job->owner_uid != who.uid) {
      // Checked before anything below acts on the job: while this daemon
      // holds it (running, or in its grace after its last rank left, or
      // aborted) the id is its owner's, and another user neither restarts
      // it (which would drop its record) nor reports its ranks gone.
      bad = absl::PermissionDeniedError(
          absl::StrCat("job '", id.job_id(), "' on this daemon runs as uid ", job->owner_uid,
                       "; rank ", rank, " runs as ", who.description));
    }
    if (bad.ok() && job != nullptr) {
      // A holder of this rank that died a moment ago, before its session's
      // end was noticed: it failed (and may be replaced).
      auto held = job->ranks.find(rank);
      if (held != job->ranks.end() && held->second.local && !held->second.joining &&
          held->second.info.state() == v1::RANK_STATE_ALIVE &&
          ProcessGone(held->second.info.pid())) {
        Rank& old = held->second;
        FailureRecord record{rank, old.info.host(), old.info.pid(),
                             "its process exited without leaving the job",
                             std::max(old.info.epoch(), old.joining_epoch)};
        RemoteRank holder{rank, old.info.host(), old.info.pid(), daemon_id_, control_address_};
        if (!old.session_id.empty()) sessions_.erase(old.session_id);
        old.session_id.clear();
        old.sink = nullptr;
        MarkFailed(*job, rank, record.host, record.pid, record.reason, record.epoch);
        std::shared_ptr<JobCoordinator> c = job->coordinator;
        Spawn(WorkerPool::Kind::kShort,
              [this, c, record, holder] { ReportGone(c, record, holder); });
      }
    }
    if (bad.ok() && job != nullptr) {
      bool live = false;
      for (const auto& [r, rec] : job->ranks) {
        live |= rec.local && (rec.joining || rec.info.state() == v1::RANK_STATE_ALIVE);
      }
      // A new generation, or the same id after an abort once its ranks are
      // gone: start afresh.
      bool restart = job->generation != req.generation() || !job->abort_reason.empty();
      if (!restart) {
        // (same attempt: ValidateJoin below decides)
      } else if (live) {
        bad = absl::FailedPreconditionError(
            job->generation != req.generation()
                ? absl::StrCat("job '", id.job_id(), "' generation ", job->generation,
                               " still has live ranks on this daemon; rank ", rank,
                               " asked for generation ", req.generation())
                : absl::StrCat("job '", id.job_id(), "' was aborted (", job->abort_reason,
                               ") and still has live ranks on this daemon"));
      } else {
        ReleaseSegments(*job, "the job was restarted");
        if (job->coordinator != nullptr) job->coordinator->Cancel();
        retired = std::move(job->coordinator);  // joined outside the lock
        jobs_.erase(id.job_id());               // a restart: start the new attempt afresh
        job = nullptr;
      }
    }
    if (bad.ok() && job == nullptr && static_cast<int>(jobs_.size()) >= options_.max_jobs) {
      bad = absl::ResourceExhaustedError(
          absl::StrCat("musterd holds ", jobs_.size(), " jobs (--max-jobs=", options_.max_jobs,
                       "); a finished job is removed ", absl::FormatDuration(options_.job_grace),
                       " after its last rank left"));
    }
    if (bad.ok() && job != nullptr) bad = ValidateJoin(*job, req, who);
    if (!bad.ok()) {
      // fall through to done() below, outside the lock
    } else {
      if (job == nullptr) {
        Job fresh;
        fresh.id = id.job_id();
        fresh.generation = req.generation();
        fresh.world_size = req.world_size();
        for (int r = 0; r < fresh.world_size; ++r) fresh.members.push_back(r);
        fresh.master = req.master_store_address();
        fresh.owner_uid = who.uid;
        fresh.coordinator = std::make_shared<JobCoordinator>(
            fresh.id, fresh.generation,
            options_.job_store ? options_.job_store(fresh.master)
                               : TcpJobStore(fresh.master, options_.store_token));
        job = &jobs_.emplace(fresh.id, std::move(fresh)).first->second;
        std::string job_id = job->id;
        job->coordinator->WatchFailures([this, job_id](const FailureRecord& f) {
          absl::MutexLock lock(&mu_);
          Job* j = FindJob(job_id);
          if (j == nullptr) return;
          MarkFailed(*j, f.rank, f.host, f.pid, f.reason, f.epoch);
        });
      }
      job->idle_since = absl::InfiniteFuture();
      Rank& r = job->ranks[rank];
      const bool took_over =
          r.info.state() == v1::RANK_STATE_FAILED || r.info.state() == v1::RANK_STATE_LEFT;
      const int restarts = took_over ? r.info.restarts() + 1 : 0;
      if (!r.session_id.empty()) sessions_.erase(r.session_id);
      r = Rank{};
      r.info.set_restarts(restarts);
      r.local = true;
      r.joining = true;
      r.sink = sink;
      r.session_id =
          absl::StrCat(options_.hostname, "/", id.job_id(), "/", rank, "/", next_session_++);
      *r.info.mutable_rank() = id;
      r.info.set_world_size(req.world_size());
      r.info.set_local_rank(req.local_rank());
      r.info.set_pid(pid);
      r.info.set_host(req.host().empty() ? options_.hostname : req.host());
      r.info.set_generation(req.generation());
      r.info.set_state(v1::RANK_STATE_UNSPECIFIED);
      session_id = r.session_id;
      sessions_[session_id] = {id.job_id(), rank};
      coordinator = job->coordinator;
    }
  }
  retired.reset();
  if (!bad.ok()) {
    MLOG(WARNING) << "refused a registration from " << who.description << ": " << bad.message();
    done(bad);
    return;
  }
  RemoteRank me;
  me.rank = rank;
  me.host = req.host().empty() ? options_.hostname : req.host();
  me.pid = pid;
  me.daemon = daemon_id_;
  me.control = control_address_;
  int world = req.world_size();
  std::string job_id = id.job_id();
  Spawn(WorkerPool::Kind::kShort, [this, coordinator, me, world, job_id, rank, session_id,
                                   done = std::move(done)] {
    absl::StatusOr<bool> took_over = coordinator->PublishRank(world, me);
    absl::Status published = took_over.status();
    // A process taking over a rank of a job past its start joins the job's
    // next epoch before it forms groups.
    int64_t latest = 0;
    bool grows = false;
    if (published.ok() && *took_over) {
      absl::StatusOr<int64_t> epoch = coordinator->LatestEpoch();
      published = epoch.status();
      if (epoch.ok()) latest = *epoch;
    }
    if (published.ok() && *took_over && latest > 0) {
      absl::StatusOr<std::vector<int>> members = coordinator->Members(latest);
      published = members.status();
      if (members.ok()) grows = !members->empty() && static_cast<int>(members->size()) < world;
    }
    v1::Registered registered;
    {
      absl::MutexLock lock(&mu_);
      Job* job = FindJob(job_id);
      Rank* rec = nullptr;
      if (job != nullptr) {
        auto found = job->ranks.find(rank);
        if (found != job->ranks.end() && found->second.session_id == session_id) {
          rec = &found->second;
        }
      }
      if (rec == nullptr) {
        published = absl::AbortedError("the session ended during registration");
      } else if (!published.ok()) {
        job->ranks.erase(rank);
        sessions_.erase(session_id);
        NoteIfIdle(*job);
      } else {
        rec->joining = false;
        rec->info.set_state(v1::RANK_STATE_ALIVE);
        if (*took_over) {
          rec->info.set_epoch(latest);
          if (rec->info.restarts() == 0) rec->info.set_restarts(1);
          registered.set_rejoin_epoch(latest + 1);
          registered.set_rejoin_grows(grows);
          job->replaced_since.insert(rank);
          if (job->first_failure == absl::InfiniteFuture()) job->first_failure = absl::Now();
        }
        registered.set_session_id(session_id);
        registered.set_daemon_host(options_.hostname);
        MLOG(INFO) << "job " << job_id << ": rank " << rank << " registered (pid " << me.pid << ")"
                   << (*took_over ? absl::StrCat(", taking over from a process that is gone; it "
                                                 "joins epoch ",
                                                 latest + 1)
                                  : "");
      }
    }
    if (published.ok()) {
      done(registered);
    } else {
      done(published);
    }
  });
}

void Registry::Leave(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(session_id);
  if (s == sessions_.end()) return;
  Job* job = FindJob(s->second.first);
  if (job == nullptr) return;
  auto it = job->ranks.find(s->second.second);
  if (it == job->ranks.end()) return;
  if (it->second.info.state() == v1::RANK_STATE_ALIVE) {
    it->second.info.set_state(v1::RANK_STATE_LEFT);
    MLOG(INFO) << "job " << job->id << ": rank " << it->first << " left";
    std::shared_ptr<JobCoordinator> coordinator = job->coordinator;
    RemoteRank holder{it->first, it->second.info.host(), it->second.info.pid(), daemon_id_,
                      control_address_};
    // (Shutdown took the coordinators: nothing is recorded any more.)
    if (coordinator != nullptr) {
      Spawn(WorkerPool::Kind::kShort, [coordinator, holder] {
        if (absl::Status s = coordinator->MarkGone(holder); !s.ok()) {
          MLOG(WARNING) << "cannot record that rank " << holder.rank << " left: " << s.message();
        }
      });
    }
    if (observer_ != nullptr) observer_->RankGone(job->id, it->first);
    InterruptWaits(*job);
  }
  NoteIfIdle(*job);
}

void Registry::Disconnected(const std::string& session_id, SessionSink* sink) {
  std::shared_ptr<JobCoordinator> coordinator;
  FailureRecord record;
  std::string job_id_of_session;
  {
    absl::MutexLock lock(&mu_);
    auto s = sessions_.find(session_id);
    if (s == sessions_.end()) return;
    Job* job = FindJob(s->second.first);
    int rank = s->second.second;
    job_id_of_session = s->second.first;
    sessions_.erase(s);
    if (job == nullptr) return;
    auto it = job->ranks.find(rank);
    if (it == job->ranks.end() || it->second.session_id != session_id) return;
    Rank& r = it->second;
    if (r.sink == sink) r.sink = nullptr;  // the stream's reactor is going away
    if (stopping_) return;                 // the daemon is going away, not the rank
    if (r.joining) {
      job->ranks.erase(it);
      NoteIfIdle(*job);
      return;
    }
    if (r.info.state() != v1::RANK_STATE_ALIVE) return;  // left in order, or already failed
    record = FailureRecord{rank, r.info.host(), r.info.pid(), "",
                           std::max(r.info.epoch(), r.joining_epoch)};
    coordinator = job->coordinator;
  }
  std::string job_id = job_id_of_session;
  // The stream can close a moment before the kernel marks the process as
  // exited: give it a little time, so the message says what happened.
  Spawn(WorkerPool::Kind::kShort, [this, coordinator, record, job_id]() mutable {
    bool gone = false;
    for (int i = 0; i < 30 && !(gone = ProcessGone(record.pid)); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    record.reason = gone ? "its process exited without leaving the job"
                         : "it closed its session to musterd without leaving the job (the "
                           "process is still running)";
    {
      absl::MutexLock lock(&mu_);
      Job* job = FindJob(job_id);
      if (job == nullptr || stopping_) return;
      MarkFailed(*job, record.rank, record.host, record.pid, record.reason, record.epoch);
    }
    ReportGone(coordinator, record,
               RemoteRank{record.rank, record.host, record.pid, daemon_id_, control_address_});
  });
}

void Registry::ReportGone(std::shared_ptr<JobCoordinator> coordinator, FailureRecord record,
                          RemoteRank holder) {
  absl::Status reported = coordinator->ReportFailure(record);
  if (reported.ok()) reported = coordinator->MarkGone(holder);
  if (!reported.ok()) {
    MLOG(WARNING) << "cannot publish the failure of rank " << record.rank << ": "
                  << reported.message();
  }
}

void Registry::MarkFailed(Job& job, int rank, const std::string& host, int64_t pid,
                          const std::string& reason, int64_t epoch) {
  if (epoch < job.epoch) return;  // an epoch the job has left behind
  auto held = job.ranks.find(rank);
  if (held != job.ranks.end() && held->second.info.pid() != 0 && pid != 0 &&
      held->second.info.pid() != pid &&
      (held->second.joining || held->second.info.state() == v1::RANK_STATE_ALIVE)) {
    return;  // another process holds the rank now
  }
  Rank& r = job.ranks[rank];
  if (r.info.state() == v1::RANK_STATE_FAILED && r.info.pid() == pid) return;
  if (r.info.host().empty()) {
    r.info.mutable_rank()->set_job_id(job.id);
    r.info.mutable_rank()->set_global_rank(rank);
    r.info.set_host(host);
    r.info.set_pid(pid);
    r.info.set_world_size(job.world_size);
    r.info.set_generation(job.generation);
  }
  if (r.info.pid() != pid) {
    r.info.set_host(host);
    r.info.set_pid(pid);
  }
  r.info.set_state(v1::RANK_STATE_FAILED);
  r.info.set_failure(reason);
  std::string what = absl::StrCat(DescribeRank(r.info), " failed: ", reason);
  job.failed_since.push_back(what);
  ++rank_failures_;
  if (job.first_failure == absl::InfiniteFuture()) job.first_failure = absl::Now();
  MLOG(WARNING) << "job " << job.id << ": " << what;
  for (auto& [name, g] : job.groups) {
    if (std::find(g.ranks.begin(), g.ranks.end(), rank) == g.ranks.end()) continue;
    if (g.info.state() == v1::GROUP_STATE_DESTROYED) continue;
    if (g.info.state() != v1::GROUP_STATE_BROKEN) ++group_breaks_["member_failed"];
    g.info.set_state(v1::GROUP_STATE_BROKEN);
    if (g.info.broken_reason().empty()) g.info.set_broken_reason(what);
    if (g.segment != nullptr) g.segment->Abort(what);
    DumpGroup(job, g, what);
    if (observer_ != nullptr) observer_->GroupBroken(job.id, name, what);
  }
  if (observer_ != nullptr && r.local) observer_->RankGone(job.id, rank);
  if (r.local) NoteIfIdle(job);
  InterruptWaits(job);
  v1::SessionServerMessage event;
  *event.mutable_rank_failed()->mutable_rank() = r.info;
  for (auto& [other, rec] : job.ranks) {
    if (other != rank && rec.local && rec.sink != nullptr) rec.sink->Push(event);
  }
}

std::string Registry::AbortReason(const std::string& job_id, const std::string& group,
                                  const std::vector<int>& ranks) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return "musterd is shutting down";
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::StrCat("job '", job_id, "' is gone");
  auto g = job->groups.find(group);
  return AbortReasonLocked(*job, g == job->groups.end() ? nullptr : &g->second, ranks);
}

std::string Registry::AbortReasonLocked(const Job& job, const Group* group,
                                        const std::vector<int>& ranks) {
  if (!job.abort_reason.empty()) return absl::StrCat("job aborted: ", job.abort_reason);
  if (group != nullptr && !group->abort_reason.empty()) {
    return absl::StrCat("group aborted: ", group->abort_reason);
  }
  for (int r : ranks) {
    auto it = job.ranks.find(r);
    if (it == job.ranks.end()) continue;
    const v1::RankInfo& info = it->second.info;
    if (info.state() == v1::RANK_STATE_FAILED) {
      return absl::StrCat(DescribeRank(info), " failed: ", info.failure());
    }
    if (info.state() == v1::RANK_STATE_LEFT) {
      return absl::StrCat(DescribeRank(info), " left the job");
    }
  }
  return "";
}

void Registry::CreateGroup(const v1::CreateGroupRequest& req, const Caller& who, GroupDone done) {
  if (req.ranks_size() > options_.max_group_size) {
    done(absl::InvalidArgumentError(
        absl::StrCat("group '", req.name().substr(0, 256), "' has ", req.ranks_size(),
                     " ranks; this daemon's --max-group-size is ", options_.max_group_size)));
    return;
  }
  std::vector<int> ranks(req.ranks().begin(), req.ranks().end());
  int caller = req.caller().global_rank();
  absl::Status bad;
  std::string backend;
  // The rank resolved names against its own registry (which may hold
  // third-party backends); the daemon checks the syntax.
  auto config = BackendRegistry::ParseSyntax(
      req.options().backend().empty() ? "gloo" : req.options().backend());
  if (!config.ok()) {
    bad = config.status();
  } else {
    backend = FormatBackendConfig(*config);
  }
  if (bad.ok() && (req.name().empty() || req.name().size() > 256)) {
    bad = absl::InvalidArgumentError("group name must be 1-256 characters");
  }
  bool start_waiter = false;
  std::shared_ptr<JobCoordinator> coordinator;
  std::string spec;
  int64_t epoch = 0;
  int64_t owner_uid = -1;                    // of the job, for ReleaseWait
  std::vector<std::function<void()>> later;  // outside the lock
  std::vector<GroupDone> immediate;
  absl::StatusOr<v1::GroupInfo> immediate_result = absl::UnknownError("unset");
  {
    absl::MutexLock lock(&mu_);
    Job* job = nullptr;
    if (bad.ok()) {
      auto j = CallerJob(req.caller(), who);
      if (!j.ok()) {
        bad = j.status();
      } else {
        job = *j;
      }
    }
    if (bad.ok()) bad = ValidateGroupRanks(ranks, job->world_size, req.name());
    for (int r : ranks) {
      if (!bad.ok()) break;
      if (std::find(job->members.begin(), job->members.end(), r) == job->members.end()) {
        bad = absl::InvalidArgumentError(absl::StrCat("rank ", r, " in group '", req.name(),
                                                      "' is not in epoch ", job->epoch, " of job '",
                                                      job->id, "'"));
      }
    }
    bool local_sync = req.options().local_synchronization();
    if (bad.ok() && local_sync && std::find(ranks.begin(), ranks.end(), caller) == ranks.end()) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("rank ", caller, " is not a member of group '", req.name(),
                       "'; with local synchronization only members create it"));
    }
    if (bad.ok()) {
      spec = GroupSpec(ranks, backend, local_sync);
      epoch = job->ranks[caller].info.epoch();
      if (job->groups.count(req.name()) == 0) {
        int live = 0;  // destroyed groups do not count
        for (const auto& [n, other] : job->groups) {
          live += other.info.state() != v1::GROUP_STATE_DESTROYED;
        }
        if (live >= options_.max_groups_per_job) {
          bad = absl::ResourceExhaustedError(
              absl::StrCat("job '", job->id, "' holds ", live, " groups on this daemon (at most ",
                           options_.max_groups_per_job, "); destroy those it no longer uses"));
        }
      }
    }
    if (bad.ok()) {
      auto [it, created] = job->groups.try_emplace(req.name());
      Group& g = it->second;
      if (!created && g.info.epoch() > epoch) {
        bad = absl::FailedPreconditionError(
            absl::StrCat("group '", req.name(), "' was re-formed under epoch ", g.info.epoch(),
                         "; rank ", caller, " is in epoch ", epoch, " (call Reconfigure first)"));
      } else if (!created && g.info.epoch() < epoch) {
        ResetGroup(*job, g, epoch, &later);  // its first creation in this epoch
        g.ranks = ranks;
        g.info.set_backend(backend);
        g.info.set_tag(req.tag());
        g.info.set_local_synchronization(local_sync);
        g.timeout = TimeoutOf(req.options().timeout(), kDefaultGroupTimeout);
        g.info.set_timeout_millis(absl::ToInt64Milliseconds(g.timeout));
        g.required.clear();
        if (local_sync) {
          g.required = ranks;
        } else {
          g.required = job->members;
        }
      }
      if (!bad.ok()) {
        // refused above
      } else if (created) {
        g.ranks = ranks;
        g.timeout = TimeoutOf(req.options().timeout(), kDefaultGroupTimeout);
        if (local_sync) {
          g.required = ranks;
        } else {
          g.required = job->members;
        }
        g.info.set_job_id(job->id);
        g.info.set_generation(job->generation);
        g.info.set_name(req.name());
        g.info.set_tag(req.tag());
        g.info.set_backend(backend);
        g.info.set_state(v1::GROUP_STATE_FORMING);
        g.info.set_local_synchronization(local_sync);
        g.info.set_timeout_millis(absl::ToInt64Milliseconds(g.timeout));
        g.info.set_epoch(epoch);
      } else if (GroupSpec(g.ranks, g.info.backend(), g.info.local_synchronization()) != spec) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("group '", req.name(), "' already exists as {",
                         GroupSpec(g.ranks, g.info.backend(), g.info.local_synchronization()),
                         "}, not {", spec, "}"));
      }
      if (bad.ok() && (g.arrived_local.count(caller) != 0)) {
        bad = absl::AlreadyExistsError(
            absl::StrCat("rank ", caller, " already created group '", req.name(), "'"));
      }
      if (bad.ok() && !g.formed && g.failure.ok() && !g.waiter_started) {
        bad = TakeWait(*job, absl::StrCat("forming group '", req.name(), "'"));
        if (!bad.ok() && created) {
          job->groups.erase(it);  // as if never asked (g is gone: bad stays set)
        }
      }
      if (bad.ok()) {
        g.arrived_local.insert(caller);
        if (g.formed || !g.failure.ok()) {
          immediate.push_back(std::move(done));
          if (g.failure.ok()) {
            immediate_result = g.info;
          } else {
            immediate_result = g.failure;
          }
        } else {
          g.waiting[caller] = std::move(done);
          start_waiter = !g.waiter_started;
          g.waiter_started = true;
        }
        coordinator = job->coordinator;
        owner_uid = job->owner_uid;
      }
    }
  }
  for (auto& f : later) f();
  if (!bad.ok()) {
    done(bad);
    return;
  }
  for (auto& d : immediate) d(immediate_result);
  if (!immediate.empty()) return;
  std::string job_id = req.caller().job_id();
  std::string name = req.name();
  // Every caller publishes its own arrival; the first local caller also
  // waits for the others on behalf of all local ranks (fan-in).
  Spawn(WorkerPool::Kind::kShort,
        [this, coordinator, job_id, name, spec, caller, start_waiter, epoch, owner_uid] {
          const std::string path = GroupPath(epoch, name);
          absl::Status s = coordinator->PublishGroupSpec(path, name, spec);
          if (s.ok()) s = coordinator->Arrive(path + "/arrived", {caller});
          if (!s.ok()) {
            if (start_waiter) ReleaseWait(owner_uid);
            std::vector<GroupDone> failed;
            {
              absl::MutexLock lock(&mu_);
              Job* job = FindJob(job_id);
              if (job != nullptr && job->groups.count(name) != 0 &&
                  job->groups[name].info.epoch() == epoch) {
                Group& g = job->groups[name];
                if (g.failure.ok() && !g.formed) g.failure = s;
                for (auto& [r, d] : g.waiting) failed.push_back(std::move(d));
                g.waiting.clear();
                if (!g.formed) g.info.set_state(v1::GROUP_STATE_BROKEN);
              }
            }
            for (auto& d : failed) d(s);
            return;
          }
          if (start_waiter) {
            Spawn(WorkerPool::Kind::kBlocking, [this, job_id, name, epoch, owner_uid] {
              FormGroup(job_id, name, epoch);
              ReleaseWait(owner_uid);
            });
          }
        });
}

void Registry::FormGroup(std::string job_id, std::string name, int64_t epoch) {
  std::shared_ptr<JobCoordinator> coordinator;
  std::vector<int> required, members;
  absl::Duration timeout;
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr || job->groups.count(name) == 0) return;
    Group& g = job->groups[name];
    if (g.info.epoch() != epoch) return;  // re-formed meanwhile
    coordinator = job->coordinator;
    required = g.required;
    members = g.ranks;
    timeout = g.timeout;
  }
  std::string what = absl::StrCat("formation of group '", name, "'");
  absl::Status s = coordinator->AwaitArrivals(
      GroupPath(epoch, name) + "/arrived", required, absl::Now() + timeout, what,
      [this, &job_id, &name, &required] { return AbortReason(job_id, name, required); });
  std::map<int, RemoteRank> infos;
  if (s.ok()) {
    auto fetched = coordinator->FetchRanks(members);
    if (fetched.ok()) {
      infos = std::move(*fetched);
    } else {
      s = fetched.status();
    }
  }
  std::vector<GroupDone> waiting;
  absl::StatusOr<v1::GroupInfo> result = absl::UnknownError("unset");
  if (!s.ok()) result = s;
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr || job->groups.count(name) == 0) return;
    Group& g = job->groups[name];
    if (g.info.epoch() != epoch) return;  // re-formed meanwhile: its waiters were told
    if (s.ok()) {
      g.formed = true;
      if (g.info.state() == v1::GROUP_STATE_FORMING) g.info.set_state(v1::GROUP_STATE_READY);
      g.info.clear_members();
      for (size_t i = 0; i < members.size(); ++i) {
        v1::GroupMember* m = g.info.add_members();
        m->set_global_rank(members[i]);
        m->set_group_rank(static_cast<int>(i));
        auto it = infos.find(members[i]);
        if (it != infos.end()) {
          m->set_node(it->second.host);
          m->set_pid(it->second.pid);
          m->set_daemon(it->second.daemon);
          // Only an address its daemon signed (the job's user can write
          // the store): Trace(gather) sends it cluster credentials.
          m->set_daemon_grpc(TrustedPeerAddress(it->second.daemon, it->second.control));
        }
      }
      AttachSegment(*job, g);
      result = g.info;
      if (observer_ != nullptr) {
        std::vector<int> local_ranks;
        for (auto& [r, rec] : job->ranks) {
          if (rec.local && rec.info.state() == v1::RANK_STATE_ALIVE) local_ranks.push_back(r);
        }
        observer_->GroupFormed(g.info, local_ranks);
      }
      MLOG(INFO) << "job " << job_id << ": group '" << name << "' ready with " << members.size()
                 << " members";
    } else {
      g.failure = s;
      g.info.set_state(v1::GROUP_STATE_BROKEN);
      if (g.info.broken_reason().empty()) g.info.set_broken_reason(std::string(s.message()));
    }
    for (auto& [r, d] : g.waiting) waiting.push_back(std::move(d));
    g.waiting.clear();
  }
  for (auto& d : waiting) d(result);
}

void Registry::Barrier(const v1::BarrierRequest& req, const Caller& who, StatusDone done) {
  int caller = req.caller().global_rank();
  std::shared_ptr<JobCoordinator> coordinator;
  std::vector<int> members;
  absl::Duration timeout;
  bool start_waiter = false;
  int64_t owner_uid = -1;  // of the job, for ReleaseWait
  std::string path;
  absl::Status bad;
  {
    absl::MutexLock lock(&mu_);
    auto j = CallerJob(req.caller(), who);
    if (!j.ok()) {
      bad = j.status();
    } else {
      Job* job = *j;
      auto it = job->groups.find(req.name());
      if (it == job->groups.end() || it->second.arrived_local.count(caller) == 0) {
        bad = absl::NotFoundError(absl::StrCat("rank ", caller, " has no group '", req.name(),
                                               "' in job '", job->id, "'"));
      } else {
        Group& g = it->second;
        if (!g.formed) {
          bad = absl::FailedPreconditionError(
              absl::StrCat("group '", req.name(), "' is ", GroupStateName(g.info.state())));
        } else if (g.info.state() == v1::GROUP_STATE_DESTROYED || g.destroyed_by.count(caller)) {
          bad =
              absl::FailedPreconditionError(absl::StrCat("group '", req.name(), "' was destroyed"));
        } else if (std::find(g.ranks.begin(), g.ranks.end(), caller) == g.ranks.end()) {
          bad = absl::InvalidArgumentError(
              absl::StrCat("rank ", caller, " is not a member of group '", req.name(), "'"));
        } else if (req.sequence() < 1) {
          bad = absl::InvalidArgumentError("barrier sequence numbers start at 1");
        } else {
          std::string reason = AbortReasonLocked(*job, &g, g.ranks);
          if (!reason.empty()) {
            bad = absl::AbortedError(
                absl::StrCat("barrier on group '", req.name(), "' aborted: ", reason));
          } else {
            auto& b = g.barriers[req.sequence()];
            if (b.waiting.count(caller) != 0 || b.arrived.count(caller) != 0) {
              bad = absl::AlreadyExistsError(
                  absl::StrCat("rank ", caller, " already entered barrier ", req.sequence(),
                               " of group '", req.name(), "'"));
            } else {
              if (!b.waiter_started) {
                bad = TakeWait(
                    *job, absl::StrCat("barrier ", req.sequence(), " on group '", req.name(), "'"));
              }
              if (!bad.ok()) {
                if (b.waiting.empty() && b.arrived.empty()) g.barriers.erase(req.sequence());
              } else {
                b.arrived.insert(caller);
                b.waiting[caller] = std::move(done);
                start_waiter = !b.waiter_started;
                b.waiter_started = true;
                coordinator = job->coordinator;
                owner_uid = job->owner_uid;
                members = g.ranks;
                timeout = TimeoutOf(req.timeout(), g.timeout);
                path = absl::StrCat(GroupPath(g.info.epoch(), req.name()), "/barrier/",
                                    req.sequence());
              }
            }
          }
        }
      }
    }
  }
  if (!bad.ok()) {
    done(bad);
    return;
  }
  std::string job_id = req.caller().job_id();
  std::string name = req.name();
  int64_t seq = req.sequence();
  Spawn(WorkerPool::Kind::kShort, [this, coordinator, job_id, name, seq, caller, members, timeout,
                                   start_waiter, path, owner_uid] {
    absl::Status s = coordinator->Arrive(path, {caller});
    if (s.ok() && !start_waiter) return;
    if (s.ok()) {
      Spawn(WorkerPool::Kind::kBlocking,
            [this, job_id, name, seq, members, timeout, path, owner_uid] {
              RunBarrier(job_id, name, seq, members, timeout, path);
              ReleaseWait(owner_uid);
            });
      return;
    }
    if (start_waiter) ReleaseWait(owner_uid);
    std::vector<StatusDone> failed;
    {
      absl::MutexLock lock(&mu_);
      Job* job = FindJob(job_id);
      if (job == nullptr || job->groups.count(name) == 0) return;
      auto& b = job->groups[name].barriers[seq];
      for (auto& [r, d] : b.waiting) failed.push_back(std::move(d));
      b.waiting.clear();
    }
    for (auto& d : failed) d(s);
  });
}

void Registry::RunBarrier(std::string job_id, std::string name, int64_t sequence,
                          std::vector<int> members, absl::Duration timeout, std::string path) {
  std::shared_ptr<JobCoordinator> coordinator;
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) return;
    coordinator = job->coordinator;
  }
  std::string what = absl::StrCat("barrier ", sequence, " on group '", name, "'");
  absl::Status s = coordinator->AwaitArrivals(
      path, members, absl::Now() + timeout, what,
      [this, &job_id, &name, &members] { return AbortReason(job_id, name, members); });
  std::vector<StatusDone> waiting;
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr || job->groups.count(name) == 0) return;
    Group& g = job->groups[name];
    auto& b = g.barriers[sequence];
    for (auto& [r, d] : b.waiting) waiting.push_back(std::move(d));
    g.barriers.erase(sequence);
  }
  for (auto& d : waiting) d(s);
}

absl::Status Registry::DestroyGroup(const v1::DestroyGroupRequest& req, const Caller& who) {
  absl::MutexLock lock(&mu_);
  auto j = CallerJob(req.caller(), who);
  if (!j.ok()) return j.status();
  Job* job = *j;
  auto it = job->groups.find(req.name());
  int caller = req.caller().global_rank();
  if (it == job->groups.end() || it->second.arrived_local.count(caller) == 0) {
    return absl::NotFoundError(
        absl::StrCat("rank ", caller, " has no group '", req.name(), "' in job '", job->id, "'"));
  }
  Group& g = it->second;
  if (!g.destroyed_by.insert(caller).second) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", req.name(), "' was already destroyed by rank ", caller));
  }
  if (observer_ != nullptr) observer_->GroupDestroyed(job->id, req.name(), caller);
  if (g.destroyed_by.size() == g.arrived_local.size()) {
    // Ranks that exit right after a collective timed out destroy the
    // group before the reaper's next look: its recorder is dumped now.
    DumpIfAborted(*job, g);
    g.info.set_state(v1::GROUP_STATE_DESTROYED);
    if (g.segment != nullptr) GroupSegment::Unlink(g.segment->name());
    g.segment = nullptr;  // its mapping goes once the recorder's last sweep read it
  }
  return absl::OkStatus();
}

absl::Status Registry::AbortGroup(const std::string& job_id, const std::string& name,
                                  const std::string& reason, const Caller& who) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  if (absl::Status s = Authorize(*job, who); !s.ok()) return s;
  auto it = job->groups.find(name);
  if (it == job->groups.end()) {
    return absl::NotFoundError(absl::StrCat("no group '", name, "' in job '", job_id, "'"));
  }
  it->second.abort_reason = reason.empty() ? "aborted by the operator" : reason;
  if (it->second.info.state() != v1::GROUP_STATE_BROKEN) ++group_breaks_["aborted"];
  it->second.info.set_state(v1::GROUP_STATE_BROKEN);
  it->second.info.set_broken_reason(absl::StrCat("aborted: ", it->second.abort_reason));
  if (it->second.segment != nullptr) {
    it->second.segment->Abort(absl::StrCat("group aborted: ", it->second.abort_reason));
  }
  DumpGroup(*job, it->second, absl::StrCat("group aborted: ", it->second.abort_reason));
  if (observer_ != nullptr) {
    observer_->GroupBroken(job_id, name, absl::StrCat("group aborted: ", it->second.abort_reason));
  }
  InterruptWaits(*job);
  return absl::OkStatus();
}

void Registry::ResetGroup(Job& job, Group& g, int64_t epoch,
                          std::vector<std::function<void()>>* later) {
  const std::string name = g.info.name();
  absl::Status gone = absl::AbortedError(absl::StrCat(
      "group '", name, "' is re-formed under epoch ", epoch, " of job '", job.id, "'"));
  for (auto& [r, d] : g.waiting) later->push_back([d = std::move(d), gone] { d(gone); });
  for (auto& [seq, b] : g.barriers) {
    for (auto& [r, d] : b.waiting) later->push_back([d = std::move(d), gone] { d(gone); });
  }
  if (g.segment != nullptr) {
    g.segment->Abort(std::string(gone.message()));
    GroupSegment::Unlink(g.segment->name());
  }
  if (observer_ != nullptr) {
    // The engine's communicators of the old epoch go (they were aborted
    // when the group broke); the new epoch's are made on first use.
    for (int r : g.arrived_local) observer_->GroupDestroyed(job.id, name, r);
  }
  Group fresh;
  fresh.info.set_job_id(job.id);
  fresh.info.set_generation(job.generation);
  fresh.info.set_name(name);
  fresh.info.set_state(v1::GROUP_STATE_FORMING);
  fresh.info.set_epoch(epoch);
  g = std::move(fresh);
}

std::vector<int> Registry::LiveSlots(const Job& job) {
  std::vector<int> live;
  for (int slot = 0; slot < job.world_size; ++slot) {
    auto it = job.ranks.find(slot);
    if (it != job.ranks.end() && !it->second.joining &&
        (it->second.info.state() == v1::RANK_STATE_FAILED ||
         it->second.info.state() == v1::RANK_STATE_LEFT)) {
      continue;  // its process is gone (a new one would have replaced the entry)
    }
    if (it == job.ranks.end() &&
        std::find(job.members.begin(), job.members.end(), slot) == job.members.end()) {
      continue;  // left out of the current epoch, and no process came back for it
    }
    live.push_back(slot);
  }
  return live;
}

void Registry::Reconfigure(const v1::ReconfigureRequest& req, const Caller& who,
                           ReconfigureDone done) {
  const int caller = req.caller().global_rank();
  const int64_t epoch = req.epoch();
  const bool allow_shrink = req.allow_shrink();
  const int start_min = req.start_min_size();
  std::shared_ptr<JobCoordinator> coordinator;
  std::vector<int> everyone;
  absl::Duration timeout;
  absl::Status bad;
  {
    absl::MutexLock lock(&mu_);
    auto j = CallerJob(req.caller(), who);
    if (!j.ok()) {
      bad = j.status();
    } else {
      Job* job = *j;
      Rank& r = job->ranks[caller];
      if (epoch != r.info.epoch() + 1) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("rank ", caller, " is in epoch ", r.info.epoch(), " of job '", job->id,
                         "': it can join epoch ", r.info.epoch() + 1, ", not ", epoch));
      } else if (r.joining_epoch != 0) {
        bad = absl::AlreadyExistsError(
            absl::StrCat("rank ", caller, " is already joining epoch ", r.joining_epoch));
      } else if (!job->abort_reason.empty()) {
        bad = absl::AbortedError(absl::StrCat("job aborted: ", job->abort_reason));
      } else {
        r.joining_epoch = epoch;
        coordinator = job->coordinator;
        for (int i = 0; i < job->world_size; ++i) everyone.push_back(i);
        timeout = TimeoutOf(req.timeout(), kDefaultGroupTimeout);
      }
    }
  }
  if (!bad.ok()) {
    done(bad);
    return;
  }
  const std::string job_id = req.caller().job_id();
  const std::string key = absl::StrCat("epoch/", epoch, "/arrived");
  const absl::Time deadline = absl::Now() + timeout;
  // The rank's arrival is recorded by a short task before its wait takes one
  // of the blocking threads: with more local ranks joining than blocking
  // threads, the arrivals of those still queued reach the ranks that wait.
  Spawn(WorkerPool::Kind::kShort, [this, coordinator, job_id, caller, epoch, everyone, key,
                                   deadline, allow_shrink, start_min, done = std::move(done)] {
    absl::Status arrived = coordinator->Arrive(key, {caller});
    if (arrived.ok()) {
      arrived = coordinator->Count(absl::StrCat("epoch/", epoch, "/count"), 1).status();
    }
    Spawn(WorkerPool::Kind::kBlocking, [this, coordinator, job_id, caller, epoch, everyone, key,
                                        deadline, allow_shrink, start_min, arrived, done] {
      AwaitEpoch(coordinator, job_id, caller, epoch, everyone, key, deadline, allow_shrink,
                 start_min, arrived, done);
    });
  });
}

void Registry::AwaitEpoch(const std::shared_ptr<JobCoordinator>& coordinator,
                          const std::string& job_id, int caller, int64_t epoch,
                          const std::vector<int>& everyone, const std::string& key,
                          absl::Time deadline, bool allow_shrink, int start_min,
                          absl::Status arrived, const ReconfigureDone& done) {
  const std::string what = absl::StrCat("epoch ", epoch, " of job '", job_id, "'");
  // Why the wait should end, other than its arrivals: an abort, shutdown,
  // the caller's own end; with allow_shrink also a change in which ranks
  // are alive (the wait starts over for the new set).
  std::vector<int> expected = everyone;
  bool live_changed = false;
  // An elastic start forms from whoever arrived, so a change in which
  // ranks are alive does not interrupt it (the epoch another rank formed
  // leaves the slots it did not admit out of LiveSlots).
  bool watch_live = allow_shrink;
  auto interrupted = [&]() -> std::string {
    absl::MutexLock lock(&mu_);
    if (stopping_) return "musterd is shutting down";
    Job* job = FindJob(job_id);
    if (job == nullptr) return absl::StrCat("job '", job_id, "' is gone");
    if (!job->abort_reason.empty()) return absl::StrCat("job aborted: ", job->abort_reason);
    auto it = job->ranks.find(caller);
    if (it == job->ranks.end() || it->second.joining_epoch != epoch ||
        it->second.info.state() != v1::RANK_STATE_ALIVE) {
      return absl::StrCat("rank ", caller, " left or failed");
    }
    if (watch_live && LiveSlots(*job) != expected) {
      live_changed = true;
      return "the ranks alive changed";
    }
    return std::string();
  };
  absl::Status s = arrived;
  std::vector<int> candidates = everyone;
  if (s.ok() && start_min > 0 && epoch == 1) {
    // An elastic start: whoever registered, once all of them arrived, at
    // least start_min, and nobody new came for a moment.
    std::vector<int> previous;
    absl::Time changed = absl::Now();
    watch_live = false;
    while (true) {
      // Another rank may have formed the epoch already (its 300 ms of
      // stable arrivals ended before this one's): take its members.
      absl::StatusOr<std::vector<int>> formed = coordinator->Members(epoch);
      if (!formed.ok()) {
        s = formed.status();
        break;
      }
      if (!formed->empty()) {
        candidates = *formed;
        break;
      }
      absl::StatusOr<std::vector<int>> arrived = coordinator->Present(key, everyone);
      absl::StatusOr<std::vector<int>> registered = coordinator->Present("rank", everyone);
      if (!arrived.ok() || !registered.ok()) {
        s = !arrived.ok() ? arrived.status() : registered.status();
        break;
      }
      // A rank that failed or left since it registered is not waited for
      // and not admitted: the others start without it.
      {
        absl::MutexLock lock(&mu_);
        Job* job = FindJob(job_id);
        std::vector<int> live = job != nullptr ? LiveSlots(*job) : std::vector<int>{};
        auto gone = [&live](int r) { return !std::binary_search(live.begin(), live.end(), r); };
        arrived->erase(std::remove_if(arrived->begin(), arrived->end(), gone), arrived->end());
        registered->erase(std::remove_if(registered->begin(), registered->end(), gone),
                          registered->end());
      }
      if (*arrived != previous) {
        previous = *arrived;
        changed = absl::Now();
      }
      bool all_in =
          std::includes(arrived->begin(), arrived->end(), registered->begin(), registered->end());
      if (static_cast<int>(arrived->size()) >= start_min && all_in &&
          absl::Now() - changed >= absl::Milliseconds(300)) {
        candidates = *arrived;
        break;
      }
      if (std::string why = interrupted(); !why.empty()) {
        s = absl::AbortedError(absl::StrCat(what, " aborted: ", why));
        break;
      }
      if (absl::Now() >= deadline) {
        s = absl::DeadlineExceededError(absl::StrCat(what, " timed out with ", arrived->size(),
                                                     " of at least ", start_min, " ranks"));
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  } else if (s.ok() && !allow_shrink) {
    // Every rank of the job comes back (failed ones replaced).
    s = coordinator->AwaitArrivals(key, everyone, deadline, what, interrupted);
  } else if (s.ok()) {
    // Every rank alive arrives; then whoever is there forms the epoch.
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        Job* job = FindJob(job_id);
        expected = job != nullptr ? LiveSlots(*job) : std::vector<int>{};
      }
      live_changed = false;
      s = coordinator->AwaitArrivals(key, expected, deadline, what, interrupted);
      if (!(absl::IsAborted(s) && live_changed)) break;
    }
    if (s.ok()) {
      absl::StatusOr<std::vector<int>> present = coordinator->Present(key, everyone);
      s = present.status();
      if (present.ok()) candidates = *present;
    }
  }
  // The first to decide fixes the epoch's members for every rank.
  std::vector<int> members;
  if (s.ok()) {
    absl::StatusOr<std::vector<int>> decided =
        coordinator->Decide(absl::StrCat("epoch/", epoch, "/members"), candidates);
    s = decided.status();
    if (decided.ok()) members = *decided;
  }
  if (s.ok() && std::find(members.begin(), members.end(), caller) == members.end()) {
    s = absl::FailedPreconditionError(absl::StrCat(what, " formed without rank ", caller,
                                                   " (members ", absl::StrJoin(members, ","),
                                                   "); join epoch ", epoch + 1));
  }
  absl::StatusOr<std::map<int, RemoteRank>> holders = absl::UnknownError("unset");
  if (s.ok()) {
    holders = coordinator->FetchRanks(members);
    s = holders.status();
  }
  if (s.ok()) s = coordinator->SetLatestEpoch(epoch);
  v1::ReconfigureResponse response;
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    auto it = job != nullptr ? job->ranks.find(caller) : decltype(job->ranks.end()){};
    if (job == nullptr || it == job->ranks.end() || it->second.joining_epoch != epoch) {
      if (s.ok()) s = absl::AbortedError(absl::StrCat("rank ", caller, " left during ", what));
    } else {
      it->second.joining_epoch = 0;
      if (absl::IsFailedPrecondition(s)) {
        // Left out: the rank may join the next epoch.
        it->second.info.set_epoch(epoch);
      }
      if (s.ok()) {
        it->second.info.set_epoch(epoch);
        if (epoch > job->epoch) {
          job->epoch = epoch;
          job->members = members;
          ++reconfigurations_;
          v1::Reconfiguration& record = job->reconfigurations.emplace_back();
          record.set_epoch(epoch);
          for (const std::string& f : job->failed_since) record.add_failed(f);
          for (int r : job->replaced_since) record.add_replaced(r);
          if (job->first_failure != absl::InfiniteFuture()) {
            record.set_took_millis(absl::ToInt64Milliseconds(absl::Now() - job->first_failure));
          }
          job->failed_since.clear();
          job->replaced_since.clear();
          job->first_failure = absl::InfiniteFuture();
          MLOG(INFO) << "job " << job_id << ": epoch " << epoch << " formed by " << members.size()
                     << " of " << job->world_size << " ranks (" << absl::StrJoin(members, ",")
                     << "; " << record.took_millis() << " ms after the first failure)";
        }
        // Ranks that failed or left are alive again where another process
        // now holds them.
        for (auto r = job->ranks.begin(); r != job->ranks.end();) {
          const v1::RankInfo& info = r->second.info;
          bool dead = info.state() == v1::RANK_STATE_FAILED || info.state() == v1::RANK_STATE_LEFT;
          auto holder = holders->find(r->first);
          if (dead && !r->second.joining && holder != holders->end() &&
              holder->second.pid != info.pid()) {
            if (!r->second.session_id.empty()) sessions_.erase(r->second.session_id);
            r = job->ranks.erase(r);
          } else {
            ++r;
          }
        }
        response.set_epoch(epoch);
        response.set_world_size(static_cast<int>(members.size()));
        for (int m : members) response.add_members(m);
      }
    }
  }
  if (s.ok()) {
    done(response);
  } else {
    done(s);
  }
}

void Registry::PendingJoins(const v1::PendingJoinsRequest& req, const Caller& who,
                            std::function<void(absl::StatusOr<v1::PendingJoinsResponse>)> done) {
  std::shared_ptr<JobCoordinator> coordinator;
  int64_t next = 0;
  absl::Status bad;
  {
    absl::MutexLock lock(&mu_);
    auto j = CallerJob(req.caller(), who);
    if (j.ok()) {
      coordinator = (*j)->coordinator;
      next = (*j)->ranks[req.caller().global_rank()].info.epoch() + 1;
    } else {
      bad = j.status();
    }
  }
  if (!bad.ok()) {
    done(bad);  // outside mu_: the service's completion asks stopping()
    return;
  }
  Spawn(WorkerPool::Kind::kShort, [coordinator, next, done = std::move(done)] {
    absl::StatusOr<int64_t> n = coordinator->Count(absl::StrCat("epoch/", next, "/count"), 0);
    if (!n.ok()) {
      done(n.status());
      return;
    }
    v1::PendingJoinsResponse response;
    response.set_next_epoch(next);
    response.set_waiting(static_cast<int32_t>(*n));
    done(response);
  });
}

bool Registry::IsLiveLocalRank(const std::string& job_id, int global_rank) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return false;
  auto it = job->ranks.find(global_rank);
  return it != job->ranks.end() && it->second.local &&
         it->second.info.state() == v1::RANK_STATE_ALIVE;
}

absl::StatusOr<std::string> Registry::JobMaster(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job->master;
}

absl::Status Registry::AbortJob(const std::string& job_id, const std::string& reason,
                                const Caller& who) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  if (absl::Status s = Authorize(*job, who); !s.ok()) {
    MLOG(WARNING) << "refused to abort job " << job_id << ": " << s.message();
    return s;
  }
  MLOG(WARNING) << "job " << job_id << ": aborted by " << who.description
                << (reason.empty() ? "" : absl::StrCat(": ", reason));
  job->abort_reason = reason.empty() ? "aborted by the operator" : reason;
  for (auto& [name, g] : job->groups) {
    if (g.info.state() == v1::GROUP_STATE_DESTROYED) continue;
    if (g.info.state() != v1::GROUP_STATE_BROKEN) ++group_breaks_["aborted"];
    g.info.set_state(v1::GROUP_STATE_BROKEN);
    g.info.set_broken_reason(absl::StrCat("job aborted: ", job->abort_reason));
    if (g.segment != nullptr) g.segment->Abort(absl::StrCat("job aborted: ", job->abort_reason));
    DumpGroup(*job, g, absl::StrCat("job aborted: ", job->abort_reason));
    if (observer_ != nullptr) {
      observer_->GroupBroken(job_id, name, absl::StrCat("job aborted: ", job->abort_reason));
    }
  }
  InterruptWaits(*job);
  v1::SessionServerMessage event;
  event.mutable_job_aborted()->set_job_id(job_id);
  event.mutable_job_aborted()->set_reason(job->abort_reason);
  for (auto& [r, rec] : job->ranks) {
    if (rec.local && rec.sink != nullptr) rec.sink->Push(event);
  }
  return absl::OkStatus();
}

std::vector<v1::RankInfo> Registry::ListRanks(const std::string& job_id, const Caller& who) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::RankInfo> out;
  for (const auto& [id, job] : jobs_) {
    if (!job_id.empty() && id != job_id) continue;
    if (!who.MayAccess(job.owner_uid)) continue;
    for (const auto& [r, rec] : job.ranks) {
      if (rec.joining) continue;
      out.push_back(rec.info);
    }
  }
  return out;
}

std::vector<v1::JobInfo> Registry::ListJobs(const Caller& who) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JobInfo> out;
  for (const auto& [id, job] : jobs_) {
    if (!who.MayAccess(job.owner_uid)) continue;
    v1::JobInfo info;
    info.set_job_id(id);
    info.set_world_size(job.world_size);
    info.set_generation(job.generation);
    info.set_uid(job.owner_uid);
    info.set_epoch(job.epoch);
    for (const v1::Reconfiguration& r : job.reconfigurations) *info.add_reconfigurations() = r;
    for (const std::string& d : job.dumps) info.add_dumps(d);
    int local = 0, alive = 0, failed = 0;
    for (const auto& [r, rec] : job.ranks) {
      if (rec.local) ++local;
      if (rec.local && rec.info.state() == v1::RANK_STATE_ALIVE) ++alive;
      if (rec.info.state() == v1::RANK_STATE_FAILED) ++failed;
    }
    info.set_num_local_ranks(local);
    info.set_state(!job.abort_reason.empty() ? "aborted"
                   : failed > 0              ? "failed"
                   : alive > 0               ? "running"
                                             : "finished");
    out.push_back(info);
  }
  return out;
}

std::vector<v1::GroupInfo> Registry::ListGroups(const std::string& job_id, const Caller& who) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::GroupInfo> out;
  for (const auto& [id, job] : jobs_) {
    if (!job_id.empty() && id != job_id) continue;
    if (!who.MayAccess(job.owner_uid)) continue;
    for (const auto& [name, g] : job.groups) {
      v1::GroupInfo info = g.info;
      for (v1::GroupMember& m : *info.mutable_members()) {
        auto index = std::find(g.shm_ranks.begin(), g.shm_ranks.end(), m.group_rank());
        if (g.segment != nullptr && index != g.shm_ranks.end()) {
          RankControl& c = const_cast<GroupSegment&>(*g.segment)
                               .rank(static_cast<int>(index - g.shm_ranks.begin()));
          m.set_last_submitted_seq(static_cast<int64_t>(c.submitted.load()));
          m.set_last_completed_seq(static_cast<int64_t>(c.completed.load()));
        }
        auto it = job.ranks.find(m.global_rank());
        if (it == job.ranks.end()) {
          m.set_state("remote");
          continue;
        }
        m.set_restarts(it->second.info.restarts());
        switch (it->second.info.state()) {
          case v1::RANK_STATE_ALIVE:
            m.set_state(it->second.local ? "alive" : "remote");
            break;
          case v1::RANK_STATE_LEFT:
            m.set_state("left");
            break;
          case v1::RANK_STATE_FAILED:
            m.set_state("failed");
            break;
          default:
            m.set_state("remote");
        }
      }
      out.push_back(std::move(info));
    }
  }
  return out;
}

absl::StatusOr<v1::GroupInfo> Registry::GetGroup(const std::string& job_id, const std::string& name,
                                                 const Caller& who) {
  if (!job_id.empty()) {
    if (absl::Status s = CheckAccess(job_id, who); !s.ok()) return s;
  }
  std::vector<v1::GroupInfo> matches;
  for (v1::GroupInfo& g : ListGroups(job_id, who)) {
    if (g.name() == name) matches.push_back(std::move(g));
  }
  if (matches.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no group '", name, "'", job_id.empty() ? "" : absl::StrCat(" in job '", job_id, "'")));
  }
  if (matches.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("group '", name, "' exists in several jobs; pass --job"));
  }
  return matches[0];
}

void Registry::AttachSegment(Job& job, Group& g) {
  // This node's members (all of them for a node-local group; a spanning
  // group's ranks run hierarchical collectives over theirs).
  std::vector<int> local;
  for (size_t i = 0; i < g.ranks.size(); ++i) {
    auto it = job.ranks.find(g.ranks[i]);
    if (it != job.ranks.end() && it->second.local) local.push_back(static_cast<int>(i));
  }
  if (local.empty()) return;  // only non-members of it run here
  // A name nobody can guess ahead (Create refuses one that exists).
  absl::StatusOr<std::string> nonce = store_auth::RandomNonce();
  std::string name = absl::StrCat("/muster.", ::getpid(), ".", next_segment_++, ".",
                                  nonce.ok() ? absl::BytesToHexString(nonce->substr(0, 8)) : "");
  auto segment = GroupSegment::Create(name, static_cast<int>(local.size()), options_.shm_slot_bytes,
                                      256 << 10, job.owner_uid, options_.trace_records);
  if (!segment.ok()) {
    g.info.set_shm_error(std::string(segment.status().message()));
    MLOG(WARNING) << "job " << job.id << ": group '" << g.info.name()
                  << "' gets no shared memory: " << segment.status().message();
    return;
  }
  g.segment = std::move(*segment);
  unsigned cpus = options_.node_cpus;
  if (cpus == 0) {
    std::vector<int64_t> pids;
    for (int i : local) pids.push_back(job.ranks.at(g.ranks[i]).info.pid());
    cpus = CpusOfProcesses(pids);
    if (cpus == 0) cpus = options_.fallback_cpus;
  }
  g.segment->set_node_cpus(cpus);
  if (cpus != 0 && local.size() > cpus) {
    MLOG(INFO) << "job " << job.id << ": group '" << g.info.name() << "': " << local.size()
               << " local ranks on " << cpus << " CPU(s): they yield rather than spin";
  }
  g.shm_ranks = local;
  g.info.set_shm_name(name);
  for (int r : local) g.info.add_shm_group_ranks(r);
}

Registry::TraceSource Registry::TraceSourceOf(const Job& job, const Group& g) {
  TraceSource source;
  source.segment = g.segment;
  v1::GroupTrace& t = source.group;
  t.set_job_id(job.id);
  t.set_name(g.info.name());
  t.set_backend(g.info.backend());
  t.set_state(g.info.state());
  t.set_broken_reason(g.info.broken_reason());
  t.set_size(static_cast<int>(g.ranks.size()));
  t.set_epoch(g.info.epoch());
  for (int group_rank : g.shm_ranks) {
    v1::RankTrace* r = t.add_ranks();
    r->set_group_rank(group_rank);
    int global = group_rank < static_cast<int>(g.ranks.size()) ? g.ranks[group_rank] : -1;
    r->set_global_rank(global);
    auto it = job.ranks.find(global);
    if (it != job.ranks.end()) {
      r->set_pid(it->second.info.pid());
      r->set_state(RankStateName(it->second.info.state()));
    }
  }
  return source;
}

v1::GroupTrace Registry::ReadRecords(const TraceSource& source, int64_t last,
                                     std::optional<int> only_rank) {
  v1::GroupTrace out = source.group;
  out.clear_ranks();
  for (int i = 0; i < source.group.ranks_size(); ++i) {
    const v1::RankTrace& meta = source.group.ranks(i);
    if (only_rank.has_value() && meta.global_rank() != *only_rank) continue;
    v1::RankTrace* r = out.add_ranks();
    *r = meta;
    if (source.segment == nullptr) continue;
    for (const TraceEntry& e : ReadTrace(*source.segment, i, static_cast<uint64_t>(last))) {
      v1::TraceRecord* t = r->add_records();
      t->set_id(e.id);
      t->set_seq(static_cast<int64_t>(e.seq));
      t->set_op(TraceOpName(e.op));
      t->set_dtype(e.dtype < kNumDTypes ? DTypeName(static_cast<DType>(e.dtype)) : "unknown");
      t->set_device(e.device == 1 ? "cuda" : "cpu");
      t->set_count(static_cast<int64_t>(e.count));
      t->set_root(e.root);
      t->set_tag(e.tag);
      t->set_state(TraceStateName(e.state));
      if (e.state == TraceState::kFailed) {
        t->set_error(absl::StatusCodeToString(static_cast<absl::StatusCode>(e.error)));
      }
      t->set_submitted_unix_nanos(e.submitted_ns);
      t->set_started_unix_nanos(e.started_ns);
      t->set_completed_unix_nanos(e.completed_ns);
    }
  }
  return out;
}

absl::StatusOr<v1::TraceResponse> Registry::Trace(const v1::TraceRequest& request,
                                                  const Caller& who) {
  if (request.last() < 0) return absl::InvalidArgumentError("trace: --last must be >= 0");
  if (!request.job_id().empty()) {
    if (absl::Status s = CheckAccess(request.job_id(), who); !s.ok()) return s;
  }
  std::vector<TraceSource> sources;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (!request.job_id().empty() && id != request.job_id()) continue;
      if (!who.MayAccess(job.owner_uid)) continue;
      for (const auto& [name, g] : job.groups) {
        if (!request.group().empty() && name != request.group()) continue;
        if (g.info.state() == v1::GROUP_STATE_DESTROYED ||
            g.info.state() == v1::GROUP_STATE_FORMING) {
          continue;
        }
        sources.push_back(TraceSourceOf(job, g));
      }
    }
  }
  if (!request.group().empty() && sources.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no formed group '", request.group(), "'",
        request.job_id().empty() ? "" : absl::StrCat(" in job '", request.job_id(), "'")));
  }
  v1::TraceResponse response;
  std::optional<int> rank;
  if (request.has_rank()) rank = request.rank();
  for (const TraceSource& source : sources) {
    *response.add_groups() = ReadRecords(source, request.last(), rank);
  }
  response.set_now_unix_nanos(absl::GetCurrentTimeNanos());
  return response;
}

void Registry::TraceGathered(const v1::TraceRequest& request, const Caller& who, TraceDone done) {
  absl::StatusOr<v1::TraceResponse> local = Trace(request, who);
  if (!local.ok() || !request.gather()) {
    done(std::move(local));
    return;
  }
  // The other daemons of the groups' members, and the jobs the caller may
  // see here (a peer answers a cluster principal for every job: what it
  // says of other jobs is dropped).
  std::set<std::string> allowed;
  std::set<std::pair<std::string, std::string>> peers;  // daemon id, address
  std::set<std::string> no_address;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (!request.job_id().empty() && id != request.job_id()) continue;
      if (!who.MayAccess(job.owner_uid)) continue;
      allowed.insert(id);
      for (const auto& [name, g] : job.groups) {
        if (!request.group().empty() && name != request.group()) continue;
        for (const v1::GroupMember& m : g.info.members()) {
          if (m.daemon().empty() || m.daemon() == daemon_id_) continue;
          if (request.has_rank() && m.global_rank() != request.rank()) continue;
          if (m.daemon_grpc().empty()) {
            no_address.insert(m.daemon());
          } else {
            peers.insert({m.daemon(), m.daemon_grpc()});
          }
        }
      }
    }
  }
  for (const std::string& d : no_address) {
    local->add_unreachable(absl::StrCat(d,
                                        ": serves no TCP gRPC (musterd without --token-file "
                                        "or TLS), or published an address not signed with "
                                        "this daemon's cluster token; its members' records "
                                        "are not here"));
  }
  if (peers.empty()) {
    done(std::move(local));
    return;
  }
  auto ask = options_.peer_trace;
  Spawn(WorkerPool::Kind::kBlocking, [ask, request, peers, allowed, response = std::move(*local),
                                      done = std::move(done)]() mutable {
    v1::TraceRequest peer_request = request;
    peer_request.set_gather(false);  // each answers for its own members only
    const absl::Time deadline = absl::Now() + kPeerTraceTimeout;
    std::vector<std::pair<std::string, std::string>> daemons(peers.begin(), peers.end());
    std::vector<absl::StatusOr<v1::TraceResponse>> answers(daemons.size(),
                                                           absl::UnavailableError("not asked"));
    // One thread per peer, at most 32 at once: every peer gets the same
    // deadline, so the answer takes one peer's time, not their sum.
    constexpr size_t kBatch = 32;
    for (size_t first = 0; first < daemons.size(); first += kBatch) {
      std::vector<std::thread> threads;
      for (size_t i = first; i < std::min(daemons.size(), first + kBatch); ++i) {
        threads.emplace_back([&, i] {
          const auto& [daemon, address] = daemons[i];
          answers[i] = ask ? ask(daemon, address, peer_request, deadline)
                           : absl::UnavailableError("this musterd cannot call peers");
        });
      }
      for (std::thread& t : threads) t.join();
    }
    for (size_t i = 0; i < daemons.size(); ++i) {
      if (!answers[i].ok()) {
        response.add_unreachable(
            absl::StrCat(daemons[i].second, ": ", answers[i].status().ToString()));
        continue;
      }
      for (v1::GroupTrace& theirs : *answers[i]->mutable_groups()) {
        if (allowed.count(theirs.job_id()) == 0) continue;
        v1::GroupTrace* ours = nullptr;
        for (v1::GroupTrace& g : *response.mutable_groups()) {
          if (g.job_id() == theirs.job_id() && g.name() == theirs.name() &&
              g.epoch() == theirs.epoch()) {
            ours = &g;
          }
        }
        if (ours == nullptr) {
          *response.add_groups() = std::move(theirs);
          continue;
        }
        if (ours->broken_reason().empty()) ours->set_broken_reason(theirs.broken_reason());
        for (v1::RankTrace& r : *theirs.mutable_ranks()) *ours->add_ranks() = std::move(r);
      }
    }
    for (v1::GroupTrace& g : *response.mutable_groups()) {
      std::sort(g.mutable_ranks()->begin(), g.mutable_ranks()->end(),
                [](const v1::RankTrace& a, const v1::RankTrace& b) {
                  return a.group_rank() < b.group_rank();
                });
    }
    done(std::move(response));
  });
}

void Registry::DumpGroup(Job& job, Group& g, const std::string& reason) {
  if (options_.dump_dir.empty() || g.segment == nullptr || g.dumped) return;
  g.dumped = true;
  std::string safe;
  for (char c : absl::StrCat(job.id, "-", g.info.name())) {
    safe +=
        std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  }
  const std::string path =
      absl::StrCat(options_.dump_dir, "/trace-", safe, "-e", g.info.epoch(), "-",
                   absl::FormatTime("%Y%m%dT%H%M%E3SZ", absl::Now(), absl::UTCTimeZone()), ".json");
  g.info.set_dump_path(path);
  job.dumps.push_back(path);
  TraceSource source = TraceSourceOf(job, g);
  source.group.set_state(v1::GROUP_STATE_BROKEN);
  source.group.set_broken_reason(reason);
  const std::string dir = options_.dump_dir;
  const int64_t owner = job.owner_uid;
  const uint64_t max_bytes = options_.dump_max_bytes;
  Spawn(WorkerPool::Kind::kBlocking, [source = std::move(source), reason, path, dir, owner,
                                      max_bytes] {
    // The members learn of the break through the segment within
    // microseconds; give them a moment to record how their collective
    // in flight ended.
    absl::SleepFor(absl::Milliseconds(200));
    std::string text =
        TraceDumpJson(ReadRecords(source, 0, std::nullopt), reason, absl::GetCurrentTimeNanos());
    if (absl::Status s = WriteDump(dir, path, text, owner); !s.ok()) {
      MLOG(WARNING) << "group '" << source.group.name() << "' of job " << source.group.job_id()
                    << ": cannot write its flight recorder: " << s.message();
      return;
    }
    MLOG(WARNING) << "group '" << source.group.name() << "' of job " << source.group.job_id()
                  << " broke (" << reason << "): flight recorder of its "
                  << source.group.ranks_size() << " local member(s) written to " << path;
    PruneDumps(dir, max_bytes);
  });
}

void Registry::DumpIfAborted(Job& job, Group& g) {
  if (g.dumped || g.segment == nullptr ||
      g.segment->header().aborted.load(std::memory_order_acquire) !=
          static_cast<uint32_t>(AbortKind::kAborted)) {
    return;
  }
  // No waiting here with the registry's lock held: the word is the group's
  // user's to write (it could hold "being recorded" for good).
  DumpGroup(job, g, g.segment->abort_reason(/*wait=*/false));
}

void Registry::ReleaseSegments(Job& job, const std::string& reason, AbortKind kind) {
  for (auto& [name, g] : job.groups) {
    if (g.segment == nullptr) continue;
    g.segment->Abort(reason, kind);
    GroupSegment::Unlink(g.segment->name());
  }
}

Registry::Metrics Registry::metrics() {
  absl::MutexLock lock(&mu_);
  Metrics m;
  for (const char* state : {"running", "failed", "aborted", "finished"}) m.jobs_by_state[state] = 0;
  for (const char* state : {"alive", "left", "failed", "joining"}) m.ranks_by_state[state] = 0;
  for (const char* state : {"forming", "ready", "broken", "destroyed"}) {
    m.groups_by_state[state] = 0;
  }
  for (const auto& [id, job] : jobs_) {
    int alive = 0, failed = 0;
    for (const auto& [r, rec] : job.ranks) {
      if (rec.info.state() == v1::RANK_STATE_FAILED) ++failed;
      if (!rec.local) continue;
      if (rec.joining) {
        ++m.ranks_by_state["joining"];
        continue;
      }
      switch (rec.info.state()) {
        case v1::RANK_STATE_ALIVE:
          ++alive;
          ++m.ranks_by_state["alive"];
          break;
        case v1::RANK_STATE_LEFT:
          ++m.ranks_by_state["left"];
          break;
        case v1::RANK_STATE_FAILED:
          ++m.ranks_by_state["failed"];
          break;
        default:
          break;
      }
    }
    ++m.jobs_by_state[!job.abort_reason.empty() ? "aborted"
                      : failed > 0              ? "failed"
                      : alive > 0               ? "running"
                                                : "finished"];
    for (const auto& [name, g] : job.groups) {
      ++m.groups_by_state[GroupStateName(g.info.state())];
      if (g.segment == nullptr) continue;
      int64_t& n = m.collectives_by_backend[g.info.backend()];
      for (size_t i = 0; i < g.shm_ranks.size(); ++i) {
        n += static_cast<int64_t>(
            const_cast<GroupSegment&>(*g.segment).rank(static_cast<int>(i)).completed.load());
      }
    }
  }
  m.rank_failures = rank_failures_;
  m.reconfigurations = reconfigurations_;
  m.group_breaks = group_breaks_;
  for (const char* cause : {"member_failed", "aborted"}) m.group_breaks.emplace(cause, 0);
  return m;
}

Registry::Counts Registry::counts() {
  absl::MutexLock lock(&mu_);
  Counts c;
  c.sessions = static_cast<int>(sessions_.size());
  c.jobs = static_cast<int>(jobs_.size());
  for (const auto& [uid, n] : waits_by_uid_) c.waits += n;
  for (const auto& [id, job] : jobs_) {
    for (const auto& [name, g] : job.groups) {
      if (g.info.state() != v1::GROUP_STATE_DESTROYED) ++c.groups;
    }
  }
  return c;
}

}  // namespace muster
