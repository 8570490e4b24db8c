// NcclEngine: musterd's GPU collectives. The daemon owns one NCCL
// communicator per (job, group, local rank), so a communicator outlives a
// rank's mistakes, can be aborted without killing the trainer, and shows in
// `musterctl gpu`.
//
// Life of a communicator ("slot"):
//  - created on the rank's first GPU collective in the group, on the GPU
//    holding its buffers (matched by PCI bus id). Its unique id goes through
//    the job's store under the group's name and the attempt's generation;
//    init is non-blocking and bounded by the group timeout. When a group is
//    formed by every world rank and this rank's "world" communicator is
//    healthy, the group's communicator is split from it instead
//    (ncclCommSplit, ordered after the world's earlier collectives).
//  - each slot has a worker thread that runs its requests in order: open
//    the rank's IPC buffers and events (cached per rank) and check the
//    request, agree with the other members on the node (below), make the
//    daemon's stream wait on the rank's ready event, launch NCCL, record
//    the rank's done event and a watchdog event. The caller is answered
//    once enqueued.
//  - agreement before launch: a worker about to launch collective #n of
//    the group (point to point is not counted) publishes its signature
//    (core/signature.h: op, dtype, count, root, reduce op; all_to_all's
//    splits; whether its own checks passed) in the group's table and waits
//    until every member registered at this musterd published #n, bounded by
//    the earlier of the request's timeout_millis and the group timeout.
//    Then each member compares: different collectives fail #n
//    FAILED_PRECONDITION on every one of them (SignatureMismatch, as shm,
//    gloo and hier say it), a member's failed check or all_to_all splits
//    that do not match INVALID_ARGUMENT; nothing is launched and the group
//    stays usable (every member consumed #n). A wait that passes its
//    deadline decides #n failed once for all: the waiters get
//    DEADLINE_EXCEEDED naming the global ranks that did not issue it, the
//    group breaks through the directory with that reason (as the
//    watchdog's), so a member that issues #n later gets ABORTED and no
//    member gets OK for it. A break from the registry, a failed slot, a
//    member that destroys the group or leaves also fail the group's
//    waiting and later agreements (ABORTED, with the reason); the table is
//    forgotten once every member here destroyed the group or left. The
//    communicator is created lazily, after the first agreement; the wait
//    yields the CPU for up to 100 µs before it sleeps (members usually
//    issue a collective together). Only node-local members are compared:
//    members on other nodes are not (an exchange through the job store
//    would cost a store round trip per collective); a mismatch with them
//    reaches NCCL, which hangs or fails, and the watchdog's group timeout
//    breaks the group. Cost: a rank's GPU call now returns once every
//    member on its node issued that collective (before, once its own
//    launch was enqueued), so a rank can no longer run ahead of its node's
//    slowest member by more than the one call (docs/benchmarks.md).
//  - a watchdog thread polls asynchronous NCCL errors and the watchdog
//    events; an error, or a collective not finished within the group
//    timeout, aborts the communicator (ncclCommAbort) and breaks the group
//    through the directory, so every member's later calls fail with ABORTED
//    naming why. A member's death, an abort or a destroy from the registry
//    aborts or destroys the group's slots the same way.
//
// Thread-safety: every public method is thread-safe and never blocks on the
// GPU or the network (the registry calls them with its lock held); the
// `done` callback of Collective runs on a worker thread.
#ifndef MUSTER_DAEMON_GPU_NCCL_ENGINE_H_
#define MUSTER_DAEMON_GPU_NCCL_ENGINE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/nccl/gpu_runtime.h"
#include "common/gpu_channel.h"
#include "daemon/gpu/ipc_cache.h"
#include "muster/store.h"
#include "proto/gpu.pb.h"

namespace muster {

// A group as the engine needs it.
struct GpuGroupView {
  int64_t generation = 0;
  // The job epoch the group was formed in (elastic jobs re-form groups).
  int64_t job_epoch = 0;
  std::vector<int> ranks;  // global ranks, in group-rank order
  // The members registered at this musterd (global ranks, ascending): the
  // ones a collective's signature is compared among before launch.
  std::vector<int> local_ranks;
  absl::Duration timeout = absl::Minutes(30);
  std::string backend;  // canonical config, e.g. "cpu:gloo,cuda:nccl"
  bool local_synchronization = false;
  // The uid the job's ranks run as (-1: musterd's): shared memory the ranks
  // map is given to it.
  int64_t owner_uid = -1;
};

// What the engine asks of the daemon's registry.
class GpuGroupDirectory {
 public:
  virtual ~GpuGroupDirectory() = default;
  // The group, for a caller that must be a live rank of the job registered
  // at this daemon and a member of the group. NotFound, FailedPrecondition
  // or Aborted (the group is broken: the reason) otherwise.
  virtual absl::StatusOr<GpuGroupView> Lookup(const std::string& job_id, const std::string& group,
                                              int global_rank) = 0;
  // Why the group can no longer run collectives ("" while it can).
  virtual std::string BrokenReason(const std::string& job_id, const std::string& group) = 0;
  // Breaks the group on every node (its members' calls fail with `reason`).
  virtual void BreakGroup(const std::string& job_id, const std::string& group,
                          const std::string& reason) = 0;
  // A client of the job's store (muster/<job>/<generation>/... keys).
  virtual absl::StatusOr<std::shared_ptr<Store>> JobStore(const std::string& job_id) = 0;
};

struct NcclEngineOptions {
  absl::Duration watchdog_interval = absl::Milliseconds(50);
};

class NcclEngine {
 public:
  // `runtime` and `directory` must outlive the engine.
  NcclEngine(GpuRuntime* runtime, GpuGroupDirectory* directory, NcclEngineOptions options = {});
  // Calls Shutdown().
  ~NcclEngine();
  // Aborts every communicator, answers queued requests (ABORTED) and joins
  // every thread; later requests fail at once. Idempotent.
  void Shutdown();
  NcclEngine(const NcclEngine&) = delete;
  NcclEngine& operator=(const NcclEngine&) = delete;

  using Done = std::function<void(absl::StatusOr<uint64_t> launched)>;
  // Enqueues one collective for the caller's slot; `done` runs once it is
  // launched on the GPU (after the members on this node agreed on it) or
  // failed.
  void Collective(v1::GpuCollectiveRequest request, Done done);

  // Whether collective `sequence` of (job, group, rank) finished without
  // error; see Gpu.CollectiveStatus. `finished` tells whether the GPU is
  // known to have passed it.
  absl::Status CollectiveStatus(const std::string& job_id, const std::string& group,
                                int global_rank, uint64_t sequence, bool* finished);

  // The shared-memory channel of (job, group, rank)'s communicator ("" if
  // none); see GpuChannel.
  std::string ChannelName(const std::string& job_id, const std::string& group, int global_rank);

  v1::ListCommunicatorsResponse List(const std::string& job_id);

  // Registry events.
  // A group formed: when every world rank formed it, local ranks whose
  // "world" communicator is healthy split it.
  void GroupFormed(const std::string& job_id, const std::string& group,
                   const std::vector<int>& members, bool local_synchronization,
                   const std::string& backend, const std::vector<int>& local_ranks);
  void GroupBroken(const std::string& job_id, const std::string& group, const std::string& reason);
  // `global_rank` destroyed its handle of the group: its communicator goes.
  void GroupDestroyed(const std::string& job_id, const std::string& group, int global_rank);
  // The rank left or died: its communicators go and its IPC handles close.
  void RankGone(const std::string& job_id, int global_rank);

 private:
  struct Slot;
  using SlotKey = std::tuple<std::string, std::string, int>;  // job, group, global rank

  std::shared_ptr<Slot> FindOrCreateSlot(const v1::GpuCollectiveRequest& request,
                                         const GpuGroupView& view, int group_rank, bool* created);
  void StartWorker(const std::shared_ptr<Slot>& slot);
  // Gives a new slot its shared-memory channel (best effort).
  void AttachChannel(Slot& slot);
  // A request that arrived on the slot's channel.
  void ServeChannelRequest(Slot& slot, const std::string& bytes);
  // Queues `task` for the slot's worker; false (the task dropped) once the
  // worker has drained its queue for good.
  [[nodiscard]] static bool Post(Slot& slot, std::function<void()> task);
  // Worker tasks.
  void InitComm(Slot& slot, const std::string& bus_id);
  // `deadline`: when the caller stops waiting for the node's other members
  // (see Deadline).
  void RunCollective(Slot& slot, const v1::GpuCollectiveRequest& request, absl::Time deadline,
                     const Done& done);
  // The pre-launch agreement deadline of a request received now.
  static absl::Time Deadline(const v1::GpuCollectiveRequest& request, absl::Duration timeout);

  // Agreement before launch (see the header comment): publishes the slot's
  // collective (its own checks' `verdict`) and waits for the node's other
  // members; OK when every one issued the same and passed its checks.
  struct SignatureTable;
  absl::Status Agree(Slot& slot, const v1::GpuCollectiveRequest& request,
                     const absl::Status& verdict, absl::Time deadline);
  // Fails the group's tables' current and later collectives with ABORTED
  // and `reason` (waiters wake). `drop`: forget them (the group or a
  // member goes; the next use starts at #1).
  // `group` names a group in every job epoch ("world" also matches
  // "e2/world"), unless `exact` (one epoch's tables: a slot's uid_group).
  void BreakTables(const std::string& job_id, const std::string& group, int global_rank,
                   const std::string& reason, bool drop, bool exact = false);
  // Waits until the slot's comm finished its pending operation; the error
  // otherwise (the comm is then aborted and the group broken).
  absl::Status AwaitComm(Slot& slot, void* comm, absl::Time deadline, const std::string& what);
  // Aborts the slot's communicator once, recording `reason`; breaks the
  // group unless the break came from the registry.
  void Fail(Slot& slot, const std::string& reason, bool break_group);
  void Watchdog();
  std::string Owner(const std::string& job_id, int global_rank) const;

  GpuRuntime* const runtime_;
  GpuGroupDirectory* const directory_;
  const NcclEngineOptions options_;

  class MemOpener;
  class EventOpener;
  std::unique_ptr<MemOpener> mem_opener_;
  std::unique_ptr<EventOpener> event_opener_;
  std::unique_ptr<IpcCache> mem_cache_;
  std::unique_ptr<IpcCache> event_cache_;

  std::mutex mu_;
  std::condition_variable watchdog_cv_;
  bool stopping_ = false;
  std::map<SlotKey, std::shared_ptr<Slot>> slots_;
  std::map<SlotKey, int64_t> epochs_;  // communicators created per slot key
  uint64_t next_channel_ = 1;
  // Slots removed from slots_ whose workers still run until drained.
  std::vector<std::shared_ptr<Slot>> retired_;
  // Breaks requested by the registry, applied by the watchdog thread.
  std::vector<std::tuple<std::string, std::string, std::string>> pending_breaks_;
  // Ranks that left or died whose IPC handles close once their slots exit.
  std::vector<std::string> pending_releases_;
  std::thread watchdog_;

  // Agreement tables by (job, group, generation, lowest local member):
  // the last part keeps apart the members of one group that a test's
  // engine serves as if they were on different nodes.
  using TableKey = std::tuple<std::string, std::string, int64_t, int>;
  // Lock order: table_mu_ before a slot's mu; never held with mu_, nor
  // while calling the directory.
  std::mutex table_mu_;
  std::condition_variable table_cv_;  // a table changed, a slot failed
  std::map<TableKey, std::shared_ptr<SignatureTable>> tables_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_GPU_NCCL_ENGINE_H_
