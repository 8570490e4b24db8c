// JobCoordinator: what one daemon does in the job's authoritative store (the
// musterd at MASTER_ADDR:MASTER_PORT) on behalf of all its local ranks of
// one job attempt. Keys live under "muster/<job>/<generation>/", so a
// restarted job (new generation) never reads an earlier attempt's keys:
//   world_size               the world size (first writer wins; others compare)
//   rank/<r>                 "host \t pid \t daemon \t grpc address" of rank r
//   group/<name>/spec        canonical definition of a group (compared)
//   group/<name>/arrived/<r> rank r called new_group
//   group/<name>/barrier/<seq>/<r>
//   failures, failure/<n>    a counter and one record per failed rank
//   gone/<r>                 the rank/<r> record of a process that failed or
//                            left: a new process may take the rank over
//   epoch                    the latest epoch every world rank joined
//   epoch/<e>/arrived/<r>    rank r joined epoch e (elastic jobs)
//   e<e>/group/<name>/...    a group's keys in epoch e > 0 (epoch 0: group/)
//   alive/<r>                with a liveness (etcd backend): rank r's record,
//                            its node and the lease TTL, held by the node's
//                            lease ("-", no lease, once it failed or left)
//   lost/<r>/<revision>      which daemon reports alive/<r>'s loss (one does)
// Traffic leaves the node once per operation, not once per rank: the daemon
// aggregates its ranks (fan-in). How the store is reached is injected
// (JobStoreAccess): musterd reaches its own node's store in process, where
// the store wakes waits when keys appear and Interrupt() wakes them when
// something else changed (an abort, a failure); a store on another node is
// reached over TCP and its waits are re-checked every 200 ms.
//
// Thread-safe: each call borrows a connection from a small pool.
#ifndef MUSTER_DAEMON_REGISTRY_JOB_COORDINATOR_H_
#define MUSTER_DAEMON_REGISTRY_JOB_COORDINATOR_H_

#include <atomic>
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
#include "muster/store.h"

namespace muster {

struct RemoteRank {
  int rank = -1;
  std::string host;
  int64_t pid = 0;
  std::string daemon;
  // The daemon's TCP gRPC address ("host:port"; "": none), for Trace(gather),
  // as published: "host:port#proof" where the daemon signs it
  // (Registry::SetControlAddress).
  std::string control;
};

struct FailureRecord {
  int rank = -1;
  std::string host;
  int64_t pid = 0;
  std::string reason;
  // The epoch the failed process was in (or joining): a failure of an
  // epoch the job has left behind breaks nothing.
  int64_t epoch = 0;
};

// "host:port" or "[v6]:port" -> host, port.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

// A key that vanished with its node's liveness (an etcd lease that expired):
// `key` as the store names it, `value` what it held, `revision` the store's
// revision of the deletion (the same for every key of one lease).
struct LostKey {
  std::string key;
  std::string value;
  int64_t revision = 0;
};

// Optional part of JobStoreAccess (the etcd backend): keys tied to this
// node's liveness, so that other nodes learn when the node vanishes. The
// functions are thread-safe (they run on coordinator and worker threads).
struct NodeLiveness {
  using Cancel = std::function<void()>;
  // Puts `key` = `value` so that it vanishes when this node does (its lease
  // expires); kept (put again) across a lost and regained lease.
  std::function<absl::Status(const std::string& key, const std::string& value)> hold;
  // Puts `key` = `value` no longer tied to the node, and stops keeping it.
  std::function<absl::Status(const std::string& key, const std::string& value)> release;
  // Calls `lost` (on its own thread) with the keys under `prefix` that
  // vanished with their node, one call per deletion revision, until the
  // returned function (which waits for a running call) is called.
  std::function<Cancel(const std::string& prefix,
                       std::function<void(const std::vector<LostKey>&)> lost)>
      watch_lost;
  // This node as other nodes' failure reasons name it, e.g. "host-b 10.0.0.2
  // (musterd pid 812)", and the time after which it is declared lost.
  std::string node;
  absl::Duration ttl = absl::Seconds(5);
};

// How a coordinator reaches the job's store.
struct JobStoreAccess {
  // A new connection; UNAVAILABLE while the store cannot be reached yet
  // (retried for a while).
  std::function<absl::StatusOr<std::unique_ptr<Store>>()> connect;
  // Optional (in-process stores): calls `ready` once every key exists, or
  // with an error if the store goes away; returns a function that cancels
  // it (never called from within `ready`). Without it, waits are re-checked
  // in slices.
  using Cancel = std::function<void()>;
  std::function<Cancel(std::vector<std::string> keys, std::function<void(absl::Status)> ready)>
      watch;
  // Optional (etcd backend): each local rank's alive/<r> key is held by the
  // node's lease, and the coordinator turns another node's lost keys into
  // failure records (one writer per loss), as that node's daemon would.
  std::shared_ptr<NodeLiveness> liveness;
};

// The job store at `master` ("host:port") over TCP, with `token`.
JobStoreAccess TcpJobStore(const std::string& master, const std::string& token);

class JobCoordinator {
 public:
  JobCoordinator(std::string job_id, int64_t generation, JobStoreAccess access);
  ~JobCoordinator();

  const std::string& prefix() const { return prefix_; }
  // Makes pending and later calls give up (the daemon is stopping).
  void Cancel();
  // Makes pending waits re-check their abort reason now (call after
  // anything that may change one).
  void Interrupt();

  // Publishes a rank; true if it took the rank over from a process that
  // failed or left (gone/<r>; a holder that is about to be reported gone is
  // waited for up to `takeover_wait`). AlreadyExists if another live
  // process holds that rank; InvalidArgument if the world size differs
  // from what other ranks said.
  absl::StatusOr<bool> PublishRank(int world_size, const RemoteRank& rank,
                                   absl::Duration takeover_wait = absl::Seconds(5));
  // Records that the process holding `rank` failed or left, so that a new
  // process may take the rank over.
  absl::Status MarkGone(const RemoteRank& rank);
  // The latest epoch every world rank joined (0 before any reconfiguration).
  absl::StatusOr<int64_t> LatestEpoch();
  // The members fixed for `epoch` (empty if none were: epoch 0).
  absl::StatusOr<std::vector<int>> Members(int64_t epoch);
  // Records `epoch` as joined by every world rank.
  absl::Status SetLatestEpoch(int64_t epoch);
  // Compares a group's definition with what other daemons published under
  // `path` (e.g. "group/g" or "e2/group/g").
  absl::Status PublishGroupSpec(const std::string& path, const std::string& group,
                                const std::string& spec);
  // Marks `ranks` as arrived under `key` (e.g. "group/g/arrived").
  absl::Status Arrive(const std::string& key, const std::vector<int>& ranks);
  // Waits until every rank in `ranks` arrived under `key`, until `deadline`,
  // checking `abort_reason` between slices (non-empty: give up, Aborted).
  // DeadlineExceeded names the ranks that never arrived.
  absl::Status AwaitArrivals(const std::string& key, const std::vector<int>& ranks,
                             absl::Time deadline, const std::string& what,
                             const std::function<std::string()>& abort_reason);
  // Which of `ranks` arrived under `key` now.
  absl::StatusOr<std::vector<int>> Present(const std::string& key, const std::vector<int>& ranks);
  // Adds `delta` to the counter `key` and returns it (0: reads it).
  absl::StatusOr<int64_t> Count(const std::string& key, int64_t delta);
  // Proposes `ranks` as the value of `key`; returns what the first
  // proposer fixed there.
  absl::StatusOr<std::vector<int>> Decide(const std::string& key, const std::vector<int>& ranks);
  // Host/pid of the given ranks, as published.
  absl::StatusOr<std::map<int, RemoteRank>> FetchRanks(const std::vector<int>& ranks);
  absl::Status ReportFailure(const FailureRecord& failure);

  // Runs `on_failure` (on a coordinator thread) for every failure record of
  // the job, including ones this daemon reported. Stopped by the destructor.
  // With a liveness, also watches the job's alive/ keys: a rank whose key
  // vanished with its node (lease expired) gets a failure record naming the
  // node, written by exactly one of the daemons that saw it go; each of
  // them also runs `on_failure` with it at once (not only when the record
  // comes back through the failure watcher).
  void WatchFailures(std::function<void(const FailureRecord&)> on_failure);

 private:
  absl::StatusOr<std::unique_ptr<Store>> Acquire();
  void Release(std::unique_ptr<Store> store);
  // Waits until every key exists (OK), `deadline` (DeadlineExceeded),
  // Cancel or `interrupted()` turning true (Aborted, its reason).
  absl::Status WaitForKeys(Store& store, const std::vector<std::string>& keys, absl::Time deadline,
                           const std::function<std::string()>& interrupted);
  void RunFailureWatcher(const std::function<void(const FailureRecord&)>& on_failure);
  // Ties rank's alive/<r> key to the node's liveness (if any).
  void HoldLiveness(const RemoteRank& rank);
  // Reports the ranks whose alive/ keys vanished in one deletion.
  void ReportLost(const std::vector<LostKey>& lost);

  const std::string job_id_;
  const std::string prefix_;
  const JobStoreAccess access_;

  absl::Mutex mu_;
  std::vector<std::unique_ptr<Store>> idle_ ABSL_GUARDED_BY(mu_);

  // Counts Interrupt() calls and watch notifications: waiters sleep until
  // it changes.
  absl::Mutex wake_mu_;
  uint64_t wakes_ ABSL_GUARDED_BY(wake_mu_) = 0;

  std::atomic<bool> stopping_{false};
  std::thread watcher_;  // owned; polls failure records until stopping_
  // Ends the watch of other nodes' alive/ keys (set by WatchFailures).
  NodeLiveness::Cancel lost_watch_;
  // WatchFailures' callback (set before the watches start).
  std::function<void(const FailureRecord&)> on_failure_;
  const std::string claim_id_;  // this coordinator, in lost/<r>/<revision>
  // lost/<r>/<revision> keys this coordinator reported (a watch that
  // delivers a deletion again must not write a second record). Only the
  // lost-key watch's thread uses it.
  std::set<std::string> reported_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_REGISTRY_JOB_COORDINATOR_H_
