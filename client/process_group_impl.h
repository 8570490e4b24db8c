// The implementation behind the public ProcessGroup and Work handles of
// muster/world.h. Internal to the SDK.
//
// ProcessGroup::Impl is one group as this rank sees it: its identity (name,
// members, timeout), its backends (one per device its config names, created
// at formation through the BackendRegistry, see backends/backend.h), the
// executor that runs its collectives in submission order, and the path to
// musterd's NCCL communicators for CUDA tensors. It lives exactly as long as
// its ProcessGroup handle. It shares the World's session (a group may
// outlive its World) and keeps a copy of the World's options, not a pointer
// to the World.
//
// Work::Impl is one collective's result, recorded exactly once. While its
// collective is queued it points at the group's Impl (a Wait without a
// deadline runs the queue); a completed Work never touches its group again,
// so it may outlive it (the group's destructor completes every Work it
// still holds).
//
// The flight recorder: where musterd gave the group a segment and this rank
// maps it, the group keeps this rank's ring of its last collectives there
// (backends/shm/trace.h): a record per call at Submit, its start when the
// executor (or a waiting caller) runs it, its end; point to point and CUDA
// calls too.
//
// Threads: one executor thread per group (started by the first Submit,
// joined by the destructor) runs the collectives nobody waits for.
// Thread-safety: both classes are thread-safe.
#ifndef MUSTER_CLIENT_PROCESS_GROUP_IMPL_H_
#define MUSTER_CLIENT_PROCESS_GROUP_IMPL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/communicator.h"
#include "backends/shm/segment.h"
#include "backends/shm/trace.h"
#include "client/gpu_path.h"
#include "common/block_cache.h"
#include "common/small_function.h"
#include "muster/world.h"
#include "proto/groups.pb.h"

namespace muster {

class WorldSession;
class StreamFence;

// Where one call runs, as Route decided: the device of its tensors and, for
// CUDA tensors handed to a backend that runs in this process (a third
// party's "cuda" backend), the fence its Communicator waits for first: the
// work queued on the tensors' streams before the call (see
// backends/communicator.h).
struct Routed {
  Device device = Device::kCpu;
  std::shared_ptr<StreamFence> fence;
  operator Device() const { return device; }  // NOLINT: a Routed is its device
};

class Work::Impl {
 public:
  // A pending Work (no sequence number, no group yet).
  static std::shared_ptr<Work> Create();
  // Allocates a Work and its shared_ptr's count in one block (make_shared
  // cannot reach Work's private constructor; a member of Impl can).
  template <typename T>
  struct Allocator {
    using value_type = T;
    Allocator() = default;
    template <typename U>
    Allocator(const Allocator<U>&) {}  // NOLINT: rebinding converts implicitly
    // One block at a time (the shared_ptr's), from the thread's cache.
    T* allocate(size_t n) {
      if (n != 1) return std::allocator<T>().allocate(n);
      return static_cast<T*>(BlockCache<sizeof(T), alignof(T)>::Allocate());
    }
    void deallocate(T* p, size_t n) {
      if (n != 1) return std::allocator<T>().deallocate(p, n);
      BlockCache<sizeof(T), alignof(T)>::Free(p);
    }
    template <typename U>
    void construct(U* p) {
      ::new (static_cast<void*>(p)) U();
    }
    template <typename U>
    void destroy(U* p) {
      p->~U();
    }
    template <typename U>
    bool operator==(const Allocator<U>&) const {
      return true;
    }
    template <typename U>
    bool operator!=(const Allocator<U>&) const {
      return false;
    }
  };
  // Each collective makes one and drops it: from the thread's cache.
  static void* operator new(size_t bytes) {
    return bytes == sizeof(Impl) ? BlockCache<sizeof(Impl), alignof(Impl)>::Allocate()
                                 : ::operator new(bytes);
  }
  static void operator delete(void* p, size_t bytes) {
    if (bytes == sizeof(Impl)) return BlockCache<sizeof(Impl), alignof(Impl)>::Free(p);
    ::operator delete(p);
  }
  // A Work that already failed with `status`.
  static std::shared_ptr<Work> Failed(absl::Status status);
  static Impl& Of(Work& work) { return *work.impl_; }

  // Work's public methods (see muster/world.h).
  bool IsCompleted() const;
  absl::Status Wait(absl::Duration timeout);
  absl::Status Synchronize(absl::Duration timeout);
  absl::Status status() const;
  uint64_t sequence() const { return sequence_; }
  void OnComplete(std::function<void(const absl::Status&)> callback);
  void Retain(std::shared_ptr<const void> data);
  int source_rank() const;

  // Records the result (the first call only) and runs the callbacks.
  // `source`: a receive's sender (global rank).
  void Complete(absl::Status status, int source = -1);

  // Set before the Work is handed out.
  void set_sequence(uint64_t sequence) { sequence_ = sequence; }
  // CUDA collectives: blocks until the GPU passed the collective.
  void set_synchronize(std::function<absl::Status(absl::Time deadline)> synchronize) {
    synchronize_ = std::move(synchronize);
  }
  // The group whose executor queue holds this work (Wait() may run it).
  void set_group(ProcessGroup::Impl* group) { group_.store(group, std::memory_order_release); }

 private:
  uint64_t sequence_ = 0;
  std::function<absl::Status(absl::Time deadline)> synchronize_;
  // Marks the Work watched (a waiter on mu_, or a callback), unless it is
  // done: Complete then finishes under mu_. Called with mu_ held.
  void Watch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::atomic<ProcessGroup::Impl*> group_{nullptr};
  // The first Complete call records the result; later ones do nothing.
  // kUnwatched -> kCompleting -> kDone: Complete, without the lock (nothing
  // to wake); kUnwatched -> kWatched: Watch, under mu_ (it waits out a
  // kCompleting); kWatched -> kDone: Complete, under mu_. kDone is stored
  // after status_ and source_ (release) and read without the lock
  // (acquire): a completed Work's status costs no lock.
  static constexpr uint8_t kUnwatched = 0, kWatched = 1, kCompleting = 2, kDone = 3;
  std::atomic<uint8_t> state_{kUnwatched};
  absl::Status status_;  // written once, before kDone
  int source_ = -1;      // written once, before kDone
  std::vector<std::function<void(const absl::Status&)>> on_complete_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const void>> retained_ ABSL_GUARDED_BY(mu_);
};

class ProcessGroup::Impl {
 public:
  // A collective to run (move-only; its lambda is kept inline, no malloc).
  using Op = SmallFunction<absl::Status(Communicator&, absl::Time deadline)>;

  // Registers the SDK's built-in backends (once), like a third party's:
  // before a backend config is parsed.
  static void RegisterSdkBackends();
  // The group musterd formed (`info`, its reply to CreateGroup) of the
  // global `ranks`, as this rank of the World with `world` options sees it
  // (world.rank and world.world_size: this epoch's), with a backend for
  // each device of `config` (the parsed backend config). `slot`: the rank
  // musterd knows this process by (its registration's; the same as
  // world.rank unless an elastic job shrank).
  static std::shared_ptr<ProcessGroup> Create(std::shared_ptr<WorldSession> session,
                                              const InitOptions& world, int slot,
                                              const std::vector<int>& ranks,
                                              const std::map<std::string, std::string>& config,
                                              const v1::GroupInfo& info);
  static Impl& Of(ProcessGroup& group) { return *group.impl_; }
  // Exchanges what two handles run (World::Reconfigure: a handle takes
  // over the group formed again under the next epoch).
  static void Swap(ProcessGroup& a, ProcessGroup& b) { std::swap(a.impl_, b.impl_); }

  Impl(std::shared_ptr<WorldSession> session, const InitOptions& world, int slot,
       const std::vector<int>& ranks, const v1::GroupInfo& info);
  // Stops the executor, ends the backends (pending point to point fails
  // CANCELLED) and fails the queued collectives with CANCELLED.
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  const std::string& name() const { return name_; }
  const std::string& tag() const { return tag_; }
  const std::string& backend() const { return backend_; }
  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  int rank() const { return rank_; }
  bool is_member() const { return rank_ >= 0; }
  absl::StatusOr<int> GroupRank(int global_rank) const;
  absl::StatusOr<int> GlobalRank(int group_rank) const;
  absl::Status Barrier(absl::Duration timeout);

  // Queues `op` for the communicator of the backend serving `device`;
  // `call` is what the flight recorder records of it.
  std::shared_ptr<Work> Submit(Device device, const TraceCall& call, Op op);
  // The same; `op` runs once the call's streams passed the fence (if any).
  std::shared_ptr<Work> Submit(const Routed& routed, const TraceCall& call, Op op);
  std::shared_ptr<Work> Submit(const TraceCall& call, Op op) {
    return Submit(Device::kCpu, call, std::move(op));
  }
  // This rank's flight recorder on the group (null: none; see above).
  TraceWriter* trace() const { return trace_.get(); }
  // Point to point through the backend's PointToPoint. `peer`: a global
  // rank, or -1 for a receive from any source.
  std::shared_ptr<Work> SubmitP2P(bool send, Tensor tensor, int peer, uint64_t tag);
  // Collectives on CUDA tensors: through musterd's NCCL communicators.
  std::shared_ptr<Work> SubmitGpu(const GpuCall& call);
  // The one dispatch decision of a call: the device of its tensors, and
  // whether the group has a backend for it (INVALID_ARGUMENT naming the
  // device and the group's config if not, or for mixed devices). Returns a
  // Work when the call is done with here (failed, or musterd's NCCL took
  // it: SubmitGpu(make_call())); else nullptr with *routed set, and the
  // caller submits to that device's communicator (Submit(*routed, op)).
  std::shared_ptr<Work> Route(Routed* routed, const char* what,
                              absl::Span<const Tensor* const> tensors,
                              absl::FunctionRef<GpuCall()> make_call);
  // For CUDA `tensors` on an in-process "cuda" backend: events recorded
  // now on their streams (null otherwise).
  absl::StatusOr<std::shared_ptr<StreamFence>> FenceFor(
      Device device, absl::Span<const Tensor* const> tensors) const;
  // OK if the group has a backend for `device`, else why not.
  absl::Status DeviceStatus(Device device, const char* what) const;
  // The group's "cuda" backend is musterd's NCCL (calls go through SubmitGpu).
  bool daemon_gpu() const { return daemon_gpu_; }

  // The rank's musterd is gone (any thread): wakes whatever waits in this
  // group's communicator or segment and makes it fail with `gone`.
  void BreakForDaemon(const absl::Status& gone);

  // Makes the executor run queued collectives at once (see expedite_).
  void Expedite();
  // Runs queued collectives on the calling thread, in order, until `work`
  // completed (a waiting caller runs its own collective instead of handing
  // it to the executor thread: two fewer thread wake-ups per collective).
  void RunUntil(const Work::Impl* work, absl::Time deadline);

 private:
  // Creates the group's backend for each device of `config`.
  void CreateBackends(const std::map<std::string, std::string>& config, const v1::GroupInfo& info);
  // Maps the group's segment for the flight recorder, if this rank has a
  // ring in it and recording is on.
  void OpenTrace(const v1::GroupInfo& info);
  // Through the session this group shares with its World (a group may
  // outlive it): World::session_status(), and a failed call's status as
  // the caller should see it (UNAVAILABLE naming the daemon once it is
  // gone; may wait up to 1 s to learn that).
  absl::Status SessionStatus() const;
  absl::Status Explain(absl::Status status) const;
  // Whether the destructor has begun (pending operations are then being
  // cancelled).
  bool Destroying() const;
  Backend* backend_for(Device device) const {
    return device == Device::kCpu ? cpu_backend_.get() : cuda_backend_.get();
  }
  void RunExecutor();
  // Whether the head of the queue may run now (nothing else runs).
  bool HeadRunnable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  // Pops and runs the head of the queue (HeadRunnable() held). Called with
  // exec_mu_ held; returns with it released.
  void RunHead() ABSL_UNLOCK_FUNCTION(exec_mu_);

  const std::shared_ptr<WorldSession> session_;
  const InitOptions world_;  // the World's options (job, rank, store, timeout)
  const int slot_;           // the caller id in requests to musterd
  std::string name_, tag_, backend_;
  std::vector<int> ranks_;
  int rank_ = -1;
  absl::Mutex barrier_mu_;
  int64_t barrier_sequence_ ABSL_GUARDED_BY(barrier_mu_) = 0;
  absl::Duration timeout_ = absl::Minutes(30);
  // The group's backends, one per device its config names. A device's
  // status says why it has none (not named, not a member, its creation
  // failed). The built-in "nccl" runs in musterd: its CUDA calls go through
  // gpu_.
  std::unique_ptr<Backend> cpu_backend_, cuda_backend_;
  absl::Status cpu_status_, cuda_status_;
  bool daemon_gpu_ = false;
  absl::Mutex gpu_mu_;
  std::shared_ptr<GpuPath> gpu_ ABSL_GUARDED_BY(gpu_mu_);  // created on first use

  // The executor: one thread running this group's collectives in order.
  mutable absl::Mutex exec_mu_;
  // What waits on exec_mu_'s state waits here, not in Mutex::Await: a
  // condition waiter on the mutex made every unlock take absl's slow path
  // (evaluating it), three times per collective. Signalled when a
  // collective ends and someone waits for that (progress_waiters_, an
  // expedited executor), and by what wakes the executor (kick_, expedite_,
  // stopping_).
  absl::CondVar exec_cv_;
  // Those waiting for running_ to clear (RunUntil; the stopping executor).
  // Changed under exec_mu_; RunHead reads it without (see there).
  std::atomic<int> progress_waiters_{0};
  struct Queued {
    Device device;
    Op op;
    std::shared_ptr<Work> work;
    // When it was submitted (TraceClockNanos), or to the kernel's tick
    // (TraceCoarseClockNanos, `coarse`) where nothing needs it closer: a
    // call recorded when it starts while the executor is idle.
    int64_t submitted_ns;
    bool coarse;
    uint64_t trace_id;  // its flight-recorder record (0: none, or not begun yet)
    // A call submitted to an idle group is recorded when it starts, in one
    // write (TraceWriter::BeginStarted): `deferred` until then, with what
    // the record needs. Submit begins the records of deferred calls before
    // a later call queues behind them (so a queued call shows as submitted).
    bool deferred = false;
    uint64_t seq = 0;
    TraceCall call;
  };
  // Whether `q` has been queued for at least `age` (the executor's grace:
  // a coarse stamp counts from a tick later).
  static bool QueuedFor(const Queued& q, absl::Duration age);
  // The submit time for `q`'s record, started at `start_ns`: a coarse
  // stamp within a tick of the start reads as the start (which of the two
  // is closer cannot be told).
  static int64_t SubmittedNanos(const Queued& q, int64_t start_ns);
  // Begins the records of the deferred calls in the queue.
  void BeginDeferred() ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  std::deque<Queued> queue_ ABSL_GUARDED_BY(exec_mu_);
  bool stopping_ ABSL_GUARDED_BY(exec_mu_) = false;
  // Someone runs a collective: set under exec_mu_, cleared without it
  // (RunHead).
  std::atomic<bool> running_{false};
  // From running_'s set until RunHead's last touch of the group, after it
  // cleared running_ (the destructor waits for it: a caller may run its
  // own collective while the group goes).
  std::atomic<bool> in_tail_{false};
  // The executor polls lazily (a waiting caller runs its own collective);
  // after a while without work it sleeps until Submit kicks it.
  bool executor_sleeping_ ABSL_GUARDED_BY(exec_mu_) = false;
  bool kick_ ABSL_GUARDED_BY(exec_mu_) = false;
  // Someone waits for a queued collective through its callback
  // (Work::OnComplete), not in Wait(): run the queue without the polling
  // delay until it is empty.
  // Set and cleared under exec_mu_; RunHead reads it without.
  std::atomic<bool> expedite_{false};
  uint64_t submitted_ ABSL_GUARDED_BY(exec_mu_) = 0;
  // The executor ran a collective lately (asynchronous use): it judges
  // queued calls' ages within its 1 ms poll, so Submit stamps them exactly.
  bool executor_busy_ ABSL_GUARDED_BY(exec_mu_) = false;
  std::thread executor_;
  // This process's own mapping of the group's segment, for the recorder
  // (the backend's communicator has its own).
  std::shared_ptr<GroupSegment> trace_segment_;
  std::shared_ptr<TraceWriter> trace_;
};

}  // namespace muster

#endif  // MUSTER_CLIENT_PROCESS_GROUP_IMPL_H_
