// Registry: who is in each job served by this daemon, which process groups
// exist, who is alive, and what is pending — the daemon's source of truth
// for the Session and Groups services and for musterctl.
//
// A job attempt is (job id, generation). Local ranks register through their
// session stream; the registry publishes them in the job's authoritative
// store (JobCoordinator) and learns about remote ranks and remote failures
// from it. Group formation and barriers follow c10d: every world rank calls
// new_group (or only members, with local synchronization), and the call
// returns once all of them arrived. A rank whose session ends without a
// Leave has failed: every group containing it turns BROKEN, and pending and
// later operations that need it fail with ABORTED naming the rank, host and
// pid — on every node within about a second (the failure is published in
// the store and watched by every daemon).
//
// Access: a job belongs to the user its ranks run as (the first rank's
// kernel credentials); every rank of a job must run as that user. Callers
// see and act on their own jobs only, unless privileged (Caller::MayAccess);
// others get PERMISSION_DENIED. Jobs whose every local rank left or failed
// are removed `job_grace` later, with their store connections and threads.
//
// The job's store is reached through RegistryOptions::job_store (musterd
// reaches its own node's store in process, with notified waits; a unit test
// gives an in-memory store). Whatever changes why a wait should give up (a
// failure, an abort, shutdown) interrupts the job's waits at once.
//
// Thread-safety: all methods are thread-safe and never block on the network;
// work that talks to the store runs on a bounded pool of worker threads
// owned by the registry (WorkerPool), and results are delivered through
// callbacks.
//
// The lock rule: no callback, RPC completion or observer that may take mu_
// (the services' completions call stopping(); a JobCoordinator's watcher
// takes mu_) runs while mu_ is held. Methods decide under the lock, keep
// the answer (a Status, or closures in a vector declared before the lock),
// and call out after it; every `done(` here sits outside a MutexLock scope
// (registry_test's refusal case drives each entry point with a callback
// that takes mu_). Exceptions, each safe because its callee never takes
// mu_ or calls back: SessionSink::Push/End (the session reactor's own
// lock only) and RegistryObserver (the GPU engine's locks only).
#ifndef MUSTER_DAEMON_REGISTRY_REGISTRY_H_
#define MUSTER_DAEMON_REGISTRY_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/shm/segment.h"
#include "common/job_id.h"
#include "daemon/access/caller.h"
#include "daemon/registry/collective_metrics.h"
#include "daemon/registry/job_coordinator.h"
#include "daemon/registry/worker_pool.h"
#include "proto/groups.pb.h"
#include "proto/session.pb.h"

namespace muster {

// Where the registry pushes events for one rank (its session stream).
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void Push(const v1::SessionServerMessage& message) = 0;
  // Ends the session stream with UNAVAILABLE `reason` (the daemon is going
  // away; the rank sees its musterd gone).
  virtual void End(const std::string& reason) = 0;
};

// Told about group and rank lifecycle events (musterd's GPU engine, which
// owns communicators per group). Called with the registry's lock held:
// implementations must not block or call back into the registry.
class RegistryObserver {
 public:
  virtual ~RegistryObserver() = default;
  // A group finished forming on this daemon; `local_ranks` are the job's
  // live ranks registered here.
  virtual void GroupFormed(const v1::GroupInfo& group, const std::vector<int>& local_ranks) = 0;
  virtual void GroupBroken(const std::string& job_id, const std::string& group,
                           const std::string& reason) = 0;
  virtual void GroupDestroyed(const std::string& job_id, const std::string& group,
                              int global_rank) = 0;
  // A local rank left or failed.
  virtual void RankGone(const std::string& job_id, int global_rank) = 0;
};

struct RegistryOptions {
  std::string hostname;
  // This daemon's identity, recorded with each rank (ranks with the same
  // one share a node). Default: "<hostname>/<pid>/<start time>".
  std::string daemon_address;
  // Token for the job stores this daemon talks to.
  std::string store_token;
  // Bytes per rank of each node-local group's shared-memory segment (the
  // largest piece one collective round moves per rank).
  uint64_t shm_slot_bytes = 4 << 20;
  // CPUs a group's local ranks share (GroupSegment::node_cpus): this count
  // if not 0 (musterd --node-cpus); else the CPUs in the union of the
  // ranks' affinity masks; else, none readable, `fallback_cpus` (musterd's
  // own; 0: unknown, each rank then counts the machine's).
  unsigned node_cpus = 0;
  unsigned fallback_cpus = 0;
  // Flight-recorder records per rank in each segment (backends/shm/trace.h).
  uint64_t trace_records = 2048;
  // Where a broken group's recorder is written (one JSON file per break,
  // proto/trace_json.h); "": not written.
  std::string dump_dir;
  // After each dump, the oldest dumps are removed until those left take at
  // most this many bytes (every user can make dumps: abort its own groups).
  uint64_t dump_max_bytes = uint64_t{1} << 30;
  // Largest world and group accepted (checked before anything is allocated).
  int max_world_size = 1 << 20;
  int max_group_size = 1 << 20;
  // Most jobs this daemon holds at once (finished ones count until removed).
  int max_jobs = 1024;
  // How long a job stays listed after its last local rank left or failed.
  absl::Duration job_grace = absl::Seconds(60);
  // How the registry reaches the job store at `master` ("host:port");
  // unset: over TCP with store_token (TcpJobStore).
  std::function<JobStoreAccess(const std::string& master)> job_store;
  // How Trace(gather) asks the daemon with id `daemon` at `address`
  // ("host:port", its TCP gRPC server) for its members' records, giving up
  // at `deadline`; unset: it asks none (the answer lists them unreachable).
  std::function<absl::StatusOr<v1::TraceResponse>(
      const std::string& daemon, const std::string& address, const v1::TraceRequest& request,
      absl::Time deadline)>
      peer_trace;
  // Trace(gather) sends this daemon's cluster credentials to the addresses
  // the other daemons published in the job's store, which the job's user can
  // write. So each daemon signs its address with the cluster token (this
  // key; HMAC-SHA256), and an address is asked only if its signature holds,
  // or if `peers_verified_by_tls` (peer_trace checks the server's
  // certificate against the CA before it sends anything).
  std::string peer_address_key;
  bool peers_verified_by_tls = false;
  // Worker threads for store traffic and waits (a few are kept for short
  // tasks, so that waits never starve the arrivals they wait for).
  int max_workers = 64;
  // Waits for other ranks (a group's formation, a barrier) that one user's
  // jobs may have running at once on this daemon: each holds one of the
  // max_workers - 4 threads for blocking work until it ends, so one user
  // cannot take them all from the others. Beyond it: RESOURCE_EXHAUSTED.
  int max_waits_per_user = 24;
  // Groups one job may hold on this daemon.
  int max_groups_per_job = 4096;
  // How often the flight recorders are swept into the per-op collective
  // metrics (collective_metrics.h; also on every metrics scrape).
  absl::Duration collective_sweep_period = absl::Milliseconds(100);
};

// Checks a rank's registration on its own (ids, sizes, the store address);
// InvalidArgument naming what is wrong.
absl::Status ValidateRegisterRequest(const v1::RegisterRequest& request,
                                     const RegistryOptions& options);
// The ranks of group `name` in a world of `world_size`: not empty, in range,
// no duplicates.
absl::Status ValidateGroupRanks(const std::vector<int>& ranks, int world_size,
                                const std::string& name);

class Registry {
 public:
  using RegisterDone = std::function<void(absl::StatusOr<v1::Registered>)>;
  using GroupDone = std::function<void(absl::StatusOr<v1::GroupInfo>)>;
  using StatusDone = std::function<void(absl::Status)>;

  explicit Registry(RegistryOptions options);
  // Calls Shutdown().
  ~Registry();
  // The first step of a shutdown: ends every session stream with
  // UNAVAILABLE `reason`, so each rank learns at once that its musterd is
  // going away (its calls fail UNAVAILABLE), and stops the registry from
  // treating those ends as rank failures. Idempotent.
  void EndSessions(const std::string& reason);
  // Fails everything pending (UNAVAILABLE: musterd is shutting down, see
  // stopping()), aborts the segments as UNAVAILABLE, stops the store
  // watchers and waits for the workers. Idempotent.
  void Shutdown();
  // Whether the daemon is shutting down (what fails now fails because of
  // that: the services report it as UNAVAILABLE).
  bool stopping() {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // A new session's Register message from `caller` (the rank's process, over
  // the unix socket). `sink` stays valid until Disconnected.
  void Register(const v1::RegisterRequest& request, const Caller& caller, SessionSink* sink,
                RegisterDone done);
  // The session said goodbye (orderly exit).
  void Leave(const std::string& session_id);
  // The session's stream ended; without a Leave first, the rank failed.
  void Disconnected(const std::string& session_id, SessionSink* sink);

  // Must be set before the first session; `observer` outlives the registry.
  void SetObserver(RegistryObserver* observer) {
    absl::MutexLock lock(&mu_);
    observer_ = observer;
  }
  // Whether `global_rank` of `job_id` is a live rank registered at this
  // daemon.
  bool IsLiveLocalRank(const std::string& job_id, int global_rank);
  // "host:port" of the job's authoritative store; NotFound for no such job.
  absl::StatusOr<std::string> JobMaster(const std::string& job_id);
  // The uid the job's ranks run as; NotFound for no such job.
  absl::StatusOr<int64_t> JobOwner(const std::string& job_id);
  // OK if `caller` may act on `job_id`; NotFound or PermissionDenied.
  absl::Status CheckAccess(const std::string& job_id, const Caller& caller);

  void CreateGroup(const v1::CreateGroupRequest& request, const Caller& caller, GroupDone done);
  using ReconfigureDone = std::function<void(absl::StatusOr<v1::ReconfigureResponse>)>;
  // Elastic jobs: the caller joins the job's next epoch (see
  // Groups.Reconfigure); `done` runs once every world rank joined it.
  // Groups are then re-created under it by the same CreateGroup calls.
  void Reconfigure(const v1::ReconfigureRequest& request, const Caller& caller,
                   ReconfigureDone done);
  // How many processes wait to join the caller's next epoch.
  void PendingJoins(const v1::PendingJoinsRequest& request, const Caller& caller,
                    std::function<void(absl::StatusOr<v1::PendingJoinsResponse>)> done);
  absl::Status DestroyGroup(const v1::DestroyGroupRequest& request, const Caller& caller);
  void Barrier(const v1::BarrierRequest& request, const Caller& caller, StatusDone done);
  absl::Status AbortGroup(const std::string& job_id, const std::string& name,
                          const std::string& reason, const Caller& caller);
  absl::Status AbortJob(const std::string& job_id, const std::string& reason, const Caller& caller);

  // What `caller` may see (its own jobs, or all when privileged).
  std::vector<v1::RankInfo> ListRanks(const std::string& job_id, const Caller& caller);
  std::vector<v1::JobInfo> ListJobs(const Caller& caller);
  std::vector<v1::GroupInfo> ListGroups(const std::string& job_id, const Caller& caller);
  absl::StatusOr<v1::GroupInfo> GetGroup(const std::string& job_id, const std::string& name,
                                         const Caller& caller);
  // The flight recorder of this daemon's members of the groups `request`
  // names (read from the segments outside the registry's lock).
  absl::StatusOr<v1::TraceResponse> Trace(const v1::TraceRequest& request, const Caller& caller);
  // Trace, and with request.gather() also the records of the groups'
  // members on other nodes, from their daemons (options.peer_trace, in
  // parallel, each given kPeerTraceTimeout), merged per group; `done` runs
  // on a worker thread (or at once without gather).
  using TraceDone = std::function<void(absl::StatusOr<v1::TraceResponse>)>;
  void TraceGathered(const v1::TraceRequest& request, const Caller& caller, TraceDone done);
  static constexpr absl::Duration kPeerTraceTimeout = absl::Milliseconds(800);
  // This daemon's TCP gRPC address, published with its ranks for peers'
  // Trace(gather), signed with options.peer_address_key. Set before the
  // first session (never changes after).
  void SetControlAddress(const std::string& address);
  // This daemon's id, as its members name it (GroupMember.daemon).
  const std::string& daemon_id() const { return daemon_id_; }
  // Whether Trace(gather) may send credentials to `published`, a peer's
  // RemoteRank::control: its address, or "" if it may not.
  std::string TrustedPeerAddress(const std::string& daemon, const std::string& published) const;

  struct Counts {
    int sessions = 0;
    int jobs = 0;
    int groups = 0;
    int waits = 0;  // formations and barriers waiting for other ranks, all users
  };
  Counts counts();

  // What /metrics shows of the registry (bounded label values only).
  struct Metrics {
    std::map<std::string, int> jobs_by_state;   // running, failed, aborted, finished
    std::map<std::string, int> ranks_by_state;  // this daemon's ranks: alive, left, failed, joining
    std::map<std::string, int> groups_by_state;  // forming, ready, broken, destroyed
    // Collectives this daemon's ranks completed in the node-local segments
    // of the groups that exist now (a gauge: a removed group's go with it).
    std::map<std::string, int64_t> collectives_by_backend;
    uint64_t rank_failures = 0;                    // ranks of jobs here that failed (any daemon's)
    uint64_t reconfigurations = 0;                 // epochs formed (elastic jobs)
    std::map<std::string, uint64_t> group_breaks;  // by cause: member_failed, aborted
  };
  Metrics metrics();
  // Per-op collective counters of this daemon's ranks, swept from the
  // recorders now (outside the registry's lock).
  CollectiveMetrics::Snapshot collective_metrics();

 private:
  struct Rank {
    v1::RankInfo info;
    bool local = false;
    bool joining = false;  // registration in flight
    std::string session_id;
    SessionSink* sink = nullptr;
    int64_t joining_epoch = 0;  // the epoch a Reconfigure of it is joining (0: none)
  };
  struct BarrierState {
    bool waiter_started = false;
    std::map<int, StatusDone> waiting;
    std::set<int> arrived;
  };
  struct Group {
    v1::GroupInfo info;  // members filled once formed
    std::vector<int> ranks;
    std::vector<int> required;  // who must arrive for formation
    absl::Duration timeout;
    bool waiter_started = false;
    bool formed = false;
    absl::Status failure;  // formation failure, once known
    std::set<int> arrived_local;
    std::map<int, GroupDone> waiting;
    std::string abort_reason;  // AbortGroup
    std::set<int> destroyed_by;
    std::map<int64_t, BarrierState> barriers;
    // The segment this node's members run collectives on (all members of a
    // node-local group; this node's members of a spanning group).
    std::shared_ptr<GroupSegment> segment;
    std::vector<int> shm_ranks;      // group rank of each segment rank
    bool dumped = false;             // its recorder was written since it (re)formed
    bool truncation_logged = false;  // its user truncated its segment: said once
  };
  struct Job {
    std::string id;
    int64_t generation = 0;
    int world_size = 0;
    std::string master;
    std::map<int, Rank> ranks;
    std::map<std::string, Group> groups;
    std::shared_ptr<JobCoordinator> coordinator;
    std::string abort_reason;
    int64_t owner_uid = -1;  // the user the job's ranks run as
    // Since when no local rank is alive or joining (InfiniteFuture: some is).
    absl::Time idle_since = absl::InfiniteFuture();
    // Elastic jobs: the latest epoch a local rank joined, how each came
    // about, and what happened since the last one.
    int64_t epoch = 0;
    // The ranks (registration ranks: "slots") in the current epoch, in the
    // order of their dense ranks: all of them until a shrink.
    std::vector<int> members;
    std::vector<v1::Reconfiguration> reconfigurations;
    absl::Time first_failure = absl::InfiniteFuture();
    std::vector<std::string> failed_since;
    std::set<int> replaced_since;
    std::vector<std::string> dumps;  // recorder dumps of its broken groups
  };
  // What reading a group's recorder needs, copied under the lock.
  struct TraceSource {
    v1::GroupTrace group;  // with one RankTrace per segment rank, no records yet
    std::shared_ptr<GroupSegment> segment;
  };
  TraceSource TraceSourceOf(const Job& job, const Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills in the records (the last `last` per rank; 0: all). No lock.
  static v1::GroupTrace ReadRecords(const TraceSource& source, int64_t last,
                                    std::optional<int> only_rank);
  // Writes group `g`'s recorder to a file under dump_dir (once per
  // formation; on a worker, shortly after, so that the members' own records
  // of the failure are in it), records the path.
  void DumpGroup(Job& job, Group& g, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DumpGroup if a member marked the group's segment aborted (a collective
  // of its own timed out or mismatched) and it was not dumped yet.
  void DumpIfAborted(Job& job, Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Runs `fn` on the registry's worker pool.
  void Spawn(WorkerPool::Kind kind, std::function<void()> fn);
  // Reconfigure's wait, on a blocking thread, for rank `caller` of job
  // `job_id` whose arrival at `key` (epoch `epoch`) was recorded with
  // status `arrived`: until the epoch forms (its members decided), then
  // `done` with the rank's new epoch, or the error. No lock held.
  void AwaitEpoch(const std::shared_ptr<JobCoordinator>& coordinator, const std::string& job_id,
                  int caller, int64_t epoch, const std::vector<int>& everyone,
                  const std::string& key, absl::Time deadline, bool allow_shrink, int start_min,
                  absl::Status arrived, const ReconfigureDone& done);
  // Counts a wait for `job`'s owner, or RESOURCE_EXHAUSTED naming the limit.
  absl::Status TakeWait(const Job& job, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The wait TakeWait counted for `uid` ended.
  void ReleaseWait(int64_t uid);
  // Whether `rank` of `job` may join it as described by `request` from
  // `who` (generation, owner, world size, store, a rank already held).
  static absl::Status ValidateJoin(const Job& job, const v1::RegisterRequest& request,
                                   const Caller& who);
  // Makes waits of `job` re-check why they might give up.
  static void InterruptWaits(Job& job);
  Job* FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job of a rank calling through `who`: it must be a live local rank
  // of a job `who` may access.
  absl::StatusOr<Job*> CallerJob(const v1::RankId& caller, const Caller& who)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PermissionDenied unless `who` may act on `job`.
  static absl::Status Authorize(const Job& job, const Caller& who);
  // Starts the job's grace period if no local rank is alive or joining.
  void NoteIfIdle(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes jobs idle for longer than job_grace, until Shutdown.
  void ReapLoop();
  // Sweeps the recorders into collective_metrics_ every
  // collective_sweep_period, until Shutdown.
  void SweepLoop();
  // The segments of every group, for a sweep.
  std::vector<CollectiveMetrics::Source> SweepSources() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why an operation needing `ranks` of `group` (may be null) cannot go on;
  // empty if it can.
  std::string AbortReason(const std::string& job_id, const std::string& group,
                          const std::vector<int>& ranks) ABSL_LOCKS_EXCLUDED(mu_);
  std::string AbortReasonLocked(const Job& job, const Group* group, const std::vector<int>& ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks a rank failed and breaks its groups; pushes RankFailed to the
  // job's other local ranks.
  // `epoch`: the epoch the failed process was in; failures of an epoch the
  // job left behind, or of a process that no longer holds the rank, are
  // ignored.
  void MarkFailed(Job& job, int rank, const std::string& host, int64_t pid,
                  const std::string& reason, int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the failure of local rank `rank` (its record) in the job's
  // store, and that its process is gone (a new one may take the rank over).
  void ReportGone(std::shared_ptr<JobCoordinator> coordinator, FailureRecord record,
                  RemoteRank holder);
  // The job's slots whose processes may still take part: not known failed
  // or left, and in the current epoch or held by a process again.
  static std::vector<int> LiveSlots(const Job& job);
  // Starts group `g` afresh under `epoch` (a rank re-creates it after a
  // reconfiguration): its waiters fail, its segment and communicators go.
  // Callbacks to run outside the lock go to `later`.
  void ResetGroup(Job& job, Group& g, int64_t epoch, std::vector<std::function<void()>>* later)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FormGroup(std::string job_id, std::string name, int64_t epoch);
  // Creates the shared-memory segment of a formed group if all its members
  // are local ranks; records why not otherwise.
  void AttachSegment(Job& job, Group& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Aborts (with `reason`) and unlinks every segment of `job`.
  static void ReleaseSegments(Job& job, const std::string& reason,
                              AbortKind kind = AbortKind::kAborted);
  // `path`: the barrier's keys in the job's store.
  void RunBarrier(std::string job_id, std::string name, int64_t sequence, std::vector<int> members,
                  absl::Duration timeout, std::string path);
  static std::string DescribeRank(const v1::RankInfo& info);

  const RegistryOptions options_;
  RegistryObserver* observer_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string daemon_id_;        // options_.daemon_address or a generated one
  std::string control_address_;  // SetControlAddress, before any session: as published
  absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  // Waits (formations, barriers) running per job owner's uid
  // (options_.max_waits_per_user).
  std::map<int64_t, int> waits_by_uid_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<std::string, int>> sessions_
      ABSL_GUARDED_BY(mu_);  // id -> job, rank
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_segment_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<WorkerPool> pool_;
  std::thread reaper_;
  CollectiveMetrics collective_metrics_;
  std::thread sweeper_;  // SweepLoop
  // For metrics(); guarded by mu_.
  uint64_t rank_failures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reconfigurations_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> group_breaks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_DAEMON_REGISTRY_REGISTRY_H_
