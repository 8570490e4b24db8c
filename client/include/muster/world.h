// The rank side of muster: joining a job (c10d's init_process_group) and
// creating process groups (new_group, new_subgroups, …).
//
// A World is this process's membership in one job attempt. Init() connects
// to the node's musterd over its unix socket, registers the rank on a
// session stream that lives as long as the World (the daemon learns at once
// when the process dies), and forms the world group. Every group call goes
// to the daemon, which rendezvouses with the other ranks through the job's
// store (the musterd at MASTER_ADDR:MASTER_PORT).
//
// Failures are errors, not hangs: when a rank of the job dies, groups that
// contain it are broken and pending and later calls on them fail with
// ABORTED naming the rank, its host and pid; formation that does not
// complete within its timeout fails with DEADLINE_EXCEEDED naming the ranks
// that never arrived. When this rank's own musterd goes away (killed,
// crashed or shut down: the session stream ends without the rank leaving),
// every pending and later call of the rank — collectives and point to
// point on every group, barriers, group creation and destruction, GPU
// collectives — fails with UNAVAILABLE naming the daemon's pid and socket,
// within a second (a collective waiting in shared memory is woken). The
// World never reattaches to a restarted musterd: the job's ranks must be
// restarted.
//
// World, ProcessGroup and Work are handles; their implementation is
// private to the SDK. A ProcessGroup may outlive its World, and a Work its
// ProcessGroup (a group's destructor fails the Works still queued on it).
//
// Thread-safety: World and ProcessGroup methods are thread-safe. Group
// creation must happen in the same order on every rank (as in c10d). Do
// not let a group's last handle go (destroying it) while another thread
// is still inside Wait() on one of its Works that has not completed: that
// waiter may run the group's queue and would touch a destroyed group. (The
// C API keeps the group alive while any of its Works is held.)
#ifndef MUSTER_CLIENT_INCLUDE_MUSTER_WORLD_H_
#define MUSTER_CLIENT_INCLUDE_MUSTER_WORLD_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "muster/store.h"
#include "muster/types.h"

namespace muster {

struct InitOptions {
  std::string job_id;         // MUSTER_JOB_ID; default "default"
  int rank = -1;              // RANK
  int world_size = -1;        // WORLD_SIZE
  int local_rank = -1;        // LOCAL_RANK; default: rank
  int local_world_size = -1;  // LOCAL_WORLD_SIZE; default: world_size
  std::string master_addr;    // MASTER_ADDR
  int master_port = 0;        // MASTER_PORT: the job store (a musterd's --store-port)
  std::string socket;         // MUSTER_SOCKET; default: musterd's default socket
  // MUSTER_GENERATION, else TORCHELASTIC_RESTART_COUNT, else 0. A restarted
  // job uses a new generation so it never reads an earlier attempt's keys.
  int64_t generation = -1;
  std::string backend = "gloo";  // backend config of the world group
  absl::Duration timeout = absl::Minutes(30);
  std::string store_token;  // MUSTER_STORE_TOKEN
  // The world group's name in musterd (musterctl shows it); the torch
  // backend passes torch's name of the default group.
  std::string world_group_name = "world";
  // MUSTER_MIN_WORLD_SIZE: an elastic job may start with fewer processes
  // than world_size (at least this many; -1: all of them). The ranks that
  // registered form epoch 1 once they all arrived and none came for a
  // moment; the job's other ranks join later (the world grows: the others
  // see them in PendingJoins and call Reconfigure with allow_shrink).
  int min_world_size = -1;
  // Flight recorder: how many of its last collectives this rank keeps per
  // group where musterd reads them (`musterctl trace`), at most musterd's
  // --trace-records. -1: MUSTER_TRACE_RECORDS, else 2048; 0: record nothing.
  int64_t trace_records = -1;
};

// Fills every unset field of `options` from the environment, the way
// c10d's env:// does. InvalidArgument names a missing or malformed variable.
absl::StatusOr<InitOptions> InitOptionsFromEnv(InitOptions options = {});

struct GroupOptions {
  std::string backend;     // default: the world's
  absl::Duration timeout;  // default (zero): the world's
  // c10d's use_local_synchronization: only members call and rendezvous.
  bool local_synchronization = false;
  std::string name;  // default: "group_<n>", n counting this rank's groups
  std::string tag;
  int64_t trace_records = -1;  // flight recorder (InitOptions); -1: the world's
};

// A CPU buffer: `count` elements of `dtype` at `data` (not owned).
// Where a tensor's memory is.
enum class Device : uint8_t { kCpu = 0, kCuda = 1 };

// A buffer: `count` elements of `dtype` at `data` (not owned). CUDA tensors
// run on the group's "cuda:" backend (NCCL, in musterd): `data` must be in
// memory from cudaMalloc (or the caching allocators built on it), and the
// collective is ordered on `stream` like a kernel launched there.
struct Tensor {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
  // CUDA tensors: the stream (a cudaStream_t / CUstream) the collective is
  // ordered on; null is the legacy default stream. On "nccl" the collective
  // is queued on it; a third party's "cuda" backend gets the tensors once
  // the work queued on it before the call finished (backends/communicator.h).
  void* stream = nullptr;
  size_t bytes() const { return count * DTypeSize(dtype); }
};

// The handle of an asynchronous collective. Collectives of one group run in
// submission order on the group's executor; the result is recorded once.
// Thread-safe.
class Work {
 public:
  // Non-blocking.
  bool IsCompleted() const;
  // Blocks until the collective completed or `timeout` passed
  // (DEADLINE_EXCEEDED; the collective itself goes on). Returns its status.
  // Without a timeout the caller runs the group's queued collectives itself
  // (two thread hand-offs fewer); with one, the group's executor runs them,
  // so the wait can give up at its deadline.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration());
  // The result once completed; FAILED_PRECONDITION before.
  absl::Status status() const;
  // The collective's sequence number in its group (from 1).
  uint64_t sequence() const;
  // CPU collectives: Wait(). Collectives on CUDA tensors complete (for
  // Wait and IsCompleted) once enqueued on the tensors' stream, as in
  // PyTorch's NCCL backend; Synchronize additionally blocks the CPU until
  // the GPU finished them (DEADLINE_EXCEEDED after `timeout`).
  absl::Status Synchronize(absl::Duration timeout = absl::InfiniteDuration());
  // Runs `callback` once with the result: at once on this thread if the
  // work already completed, else on the thread that completes it (the
  // group's executor or a waiter), outside every lock. The callback must
  // not wait for a later collective of the same group. Callbacks run in
  // the order they were added.
  void OnComplete(std::function<void(const absl::Status&)> callback);
  // Keeps `data` alive as long as this Work (for bindings whose buffers
  // must outlive a collective their caller may stop waiting for).
  void Retain(std::shared_ptr<const void> data);
  // A completed receive: the global rank of the sender (what c10d's
  // recv(src=None) returns); -1 for other works and before completion.
  int source_rank() const;

  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // The implementation (client/process_group_impl.h), opaque here.
  class Impl;

 private:
  Work();
  std::unique_ptr<Impl> impl_;
};

// One process group as this rank sees it.
class ProcessGroup {
 public:
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  const std::string& name() const;
  const std::string& tag() const;
  // Canonical backend config, e.g. "cpu:gloo" or "cpu:gloo,cuda:nccl".
  const std::string& backend() const;
  // Global ranks of the members, in group-rank order.
  const std::vector<int>& ranks() const;
  int size() const { return static_cast<int>(ranks().size()); }
  // This process's rank in the group; -1 if it is not a member.
  int rank() const;
  bool is_member() const { return rank() >= 0; }
  // c10d's get_group_rank / get_global_rank.
  absl::StatusOr<int> GroupRank(int global_rank) const;
  absl::StatusOr<int> GlobalRank(int group_rank) const;
  // Blocks until every member called Barrier (zero timeout: the group's).
  // Goes through musterd and the job's store (works across nodes).
  absl::Status Barrier(absl::Duration timeout = absl::ZeroDuration());

  // Collectives on CPU buffers (c10d semantics), asynchronous. Members of a
  // node-local group run them in shared memory; each gets the group's
  // timeout. Errors: INVALID_ARGUMENT (bad buffers, root, dtype/op),
  // FAILED_PRECONDITION (ranks called different collectives: desync),
  // ABORTED (a member died, the group was aborted), DEADLINE_EXCEEDED
  // (naming the members that did not join), UNAVAILABLE (this rank's
  // musterd is gone, see World). Groups spanning nodes run them
  // hierarchically: shared memory within each node, Gloo (TCP) among one
  // leader rank per node (see backends/hier); gather, scatter and
  // all_to_all go over a Gloo mesh of all members.
  std::shared_ptr<Work> AllReduce(Tensor tensor, ReduceOp op = ReduceOp::kSum,
                                  double premul_scale = 1.0);
  std::shared_ptr<Work> AllReduceCoalesced(std::vector<Tensor> tensors,
                                           ReduceOp op = ReduceOp::kSum);
  std::shared_ptr<Work> Broadcast(Tensor tensor, int root);
  std::shared_ptr<Work> Reduce(Tensor tensor, int root, ReduceOp op = ReduceOp::kSum);
  // outputs[i] receives rank i's input.
  std::shared_ptr<Work> AllGather(std::vector<Tensor> outputs, Tensor input);
  // `output` holds size() * input.count elements. `input` is apart from
  // `output` or is exactly this rank's part of it (in place); any other
  // overlap fails with INVALID_ARGUMENT.
  std::shared_ptr<Work> AllGatherIntoTensor(Tensor output, Tensor input);
  // c10d's all_gather_coalesced: output_lists[i][j] receives rank j's
  // inputs[i]; one collective for all the tensors (dtypes may differ).
  // Every rank passes the same counts and dtypes.
  std::shared_ptr<Work> AllGatherCoalesced(std::vector<std::vector<Tensor>> output_lists,
                                           std::vector<Tensor> inputs);
  // `outputs` matter at the root only.
  std::shared_ptr<Work> Gather(std::vector<Tensor> outputs, Tensor input, int root);
  // `inputs` matter at the root only.
  std::shared_ptr<Work> Scatter(Tensor output, std::vector<Tensor> inputs, int root);
  // inputs[i] is reduced into rank i's output.
  std::shared_ptr<Work> ReduceScatter(Tensor output, std::vector<Tensor> inputs,
                                      ReduceOp op = ReduceOp::kSum);
  // `input` holds size() * output.count elements.
  std::shared_ptr<Work> ReduceScatterTensor(Tensor output, Tensor input,
                                            ReduceOp op = ReduceOp::kSum);
  // outputs[i] receives inputs[this rank] of rank i.
  std::shared_ptr<Work> AllToAll(std::vector<Tensor> outputs, std::vector<Tensor> inputs);
  // Split sizes in elements; empty means equal splits.
  std::shared_ptr<Work> AllToAllSingle(Tensor output, Tensor input,
                                       std::vector<size_t> output_splits = {},
                                       std::vector<size_t> input_splits = {});
  // A barrier run by the ranks themselves (shared memory within a node,
  // the leaders' Gloo mesh across nodes), not through musterd.
  std::shared_ptr<Work> CollectiveBarrier();
  // c10d's monitored_barrier: a barrier that gives up after `timeout`
  // with DEADLINE_EXCEEDED naming every member that did not arrive (the
  // group is then aborted, as for any collective that timed out). Members
  // also check in with musterd, so a rank whose earlier collective is stuck
  // still fails at `timeout`, naming the members musterd never saw.
  absl::Status MonitoredBarrier(absl::Duration timeout);
  // Byte blobs of different sizes per rank ("object" collectives).
  std::shared_ptr<Work> BroadcastBytes(std::string* blob, int root);
  std::shared_ptr<Work> AllGatherBytes(const std::string& blob, std::vector<std::string>* out);
  // gather_object: the root's `out` receives every rank's blob (in group
  // rank order); `out` is unused elsewhere and may be null there.
  std::shared_ptr<Work> GatherBytes(const std::string& blob, std::vector<std::string>* out,
                                    int root);
  // scatter_object_list: rank i's `out` receives the root's blobs[i];
  // `blobs` (size() of them) matter at the root only.
  std::shared_ptr<Work> ScatterBytes(std::vector<std::string> blobs, std::string* out, int root);

  // Point to point (peers are global ranks, as in c10d). A receive matches
  // a message by (peer, tag): messages from one rank with the same tag are
  // received in the order they were sent, messages with different tags in
  // any order; a receive must have the size of the message it matches
  // (else INVALID_ARGUMENT naming both). Sends and receives progress
  // concurrently in the group's backend, so exchanging large messages never
  // deadlocks. With the built-in "gloo": node-local groups go through the
  // segment's mailboxes (a send completes once its bytes are in the
  // receiver's ring or memory, see backends/shm/p2p.h); groups spanning
  // nodes over their Gloo mesh (GlooP2P: a send completes once the peer
  // received it).
  std::shared_ptr<Work> ISend(Tensor tensor, int dst, uint64_t tag = 0);
  std::shared_ptr<Work> IRecv(Tensor tensor, int src, uint64_t tag = 0);
  // c10d's recv(src=None) / irecv_anysource: receives the first message
  // with `tag` from any member; Work::source_rank() names the sender. CPU
  // tensors only (UNIMPLEMENTED for CUDA: NCCL matches by peer).
  std::shared_ptr<Work> IRecvAnySource(Tensor tensor, uint64_t tag = 0);
  absl::Status Send(Tensor tensor, int dst, uint64_t tag = 0) {
    return ISend(tensor, dst, tag)->Wait();
  }
  absl::Status Recv(Tensor tensor, int src, uint64_t tag = 0) {
    return IRecv(tensor, src, tag)->Wait();
  }
  struct P2PRequest {
    bool send = true;
    Tensor tensor;
    int peer = -1;  // global rank
    uint64_t tag = 0;
  };
  std::vector<std::shared_ptr<Work>> BatchISendIRecv(const std::vector<P2PRequest>& requests);

  // The implementation (client/process_group_impl.h), opaque here.
  class Impl;

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class World {
 public:
  static absl::StatusOr<std::unique_ptr<World>> Init(InitOptions options);
  // Leaves the job (an orderly exit, not a failure).
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  const std::string& job_id() const;
  int64_t generation() const;
  // The job epoch this rank is in: 0 at start, one more after each
  // Reconfigure.
  int64_t epoch() const;
  int rank() const;
  int world_size() const;
  int local_rank() const;
  int local_world_size() const;
  ProcessGroup& world_group();

  // c10d's new_group(ranks): every world rank calls it (even non-members,
  // who get a handle with rank() == -1), unless local_synchronization.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewGroup(std::vector<int> ranks,
                                                         GroupOptions options = {});
  // c10d's new_subgroups: consecutive groups of `group_size` ranks; returns
  // this rank's subgroup and all of them.
  absl::StatusOr<
      std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
  NewSubgroups(int group_size, GroupOptions options = {});
  absl::StatusOr<
      std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
  NewSubgroupsByEnumeration(const std::vector<std::vector<int>>& rank_lists,
                            GroupOptions options = {});
  absl::Status DestroyProcessGroup(ProcessGroup& group);

  // Elastic jobs. After a member of the job died (its groups broke with
  // ABORTED), the survivors call Reconfigure, and so does World::Init in
  // the process that replaces it (same RANK, e.g. `muster-run
  // --restart-policy rank`): every world rank joins the job's next epoch,
  // then every group this rank holds is formed again under it with the
  // same name, ranks and options (world group first, then the others in
  // creation order), so the ProcessGroup handles stay valid. A replacement
  // must create the same groups in the same order before its first
  // collective on them. Call it when no other thread uses this World's
  // groups and no collective is pending; collectives pending on the old
  // epoch fail. Returns the new epoch; DEADLINE_EXCEEDED (naming the ranks
  // that did not join within `timeout`, zero: the World's timeout).
  absl::StatusOr<int64_t> Reconfigure(absl::Duration timeout = absl::ZeroDuration());
  // With allow_shrink, the epoch forms with the ranks alive (and any new
  // process that joined by then: the world grows back) instead of waiting
  // for every rank: world_size() changes and ranks are dense again (rank()
  // is this process's place among members()); groups keep their surviving
  // members, renumbered. A process that takes over a rank left out of the
  // world joins at the next epoch: the others see it in PendingJoins() and
  // call Reconfigure to admit it.
  struct ReconfigureOptions {
    absl::Duration timeout = absl::ZeroDuration();
    bool allow_shrink = false;
  };
  absl::StatusOr<int64_t> Reconfigure(ReconfigureOptions options);
  // How many processes wait to join this job's next epoch.
  absl::StatusOr<int> PendingJoins();
  // The registration rank (RANK) of each member of this epoch, in the
  // order of their ranks (0..world_size()-1 until a shrink).
  std::vector<int> members() const;

  // The job's store (the musterd at MASTER_ADDR:MASTER_PORT), namespaced
  // to this job attempt.
  absl::StatusOr<std::shared_ptr<Store>> store();

  // Failures of other ranks this rank was told about, as messages (and
  // the end of this rank's session, if its musterd is gone). They come on
  // the session stream, which may lag a moment behind the reply of a call
  // that failed because of them.
  std::vector<std::string> failures() const;

  // OK while this rank's session with its musterd lives; once the daemon
  // is gone, the UNAVAILABLE error every call now fails with.
  absl::Status session_status() const;

  // The implementation (client/world_impl.h), opaque here.
  class Impl;

 private:
  explicit World(InitOptions options);
  std::unique_ptr<Impl> impl_;
};

// c10d-style process-wide API around one World.
//
// InitProcessGroup joins the job (options unset are read from the
// environment, like env://); FailedPrecondition if already joined.
absl::Status InitProcessGroup(InitOptions options = {});
// The World joined by InitProcessGroup, or nullptr.
World* DefaultWorld();
bool IsInitialized();
// Leaves the job and forgets the World (c10d's destroy_process_group()).
absl::Status DestroyProcessGroup();

}  // namespace muster

#endif  // MUSTER_CLIENT_INCLUDE_MUSTER_WORLD_H_
