// The communicator conformance suite over the GPU path as musterd runs it:
// NcclEngine on FakeGpuRuntime ("device memory" is host memory), each rank
// a thread holding an EngineCommunicator that sends the engine what the
// SDK's GpuPath sends (one GpuCollectiveRequest per call, buffers as IPC
// handles, the deadline as timeout_millis, as the SDK sends the group
// timeout) and, since a Communicator returns only once the collective is
// done on this rank, waits until the engine reports it finished. The
// engine answers at the deadline if the other members did not issue the
// collective (the wait for that answer has a grace period, as the SDK's
// gRPC deadline is later than the timeout it sends); the deadline then
// bounds the wait for the GPU. Abort fails the wait and later calls, as
// the SDK's broken group does. A member's death is what musterd does: the
// registry breaks the group and the engine drops the rank. Global ranks
// are 100 + group rank.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "backends/communicator_conformance.h"
#include "backends/nccl/nccl_mapping.h"
#include "daemon/gpu/fake_directory.h"
#include "daemon/gpu/fake_gpu_runtime.h"
#include "daemon/gpu/nccl_engine.h"

namespace muster {
namespace {

constexpr char kJob[] = "job";
constexpr int kFirstRank = 100;

// What a rank's calls leave with the engine: "device memory" the buffers
// are staged in, its interprocess events, and what the engine's callbacks
// signal. Owned by the transport and outliving the engine, which may still
// use them after a call gave up at its deadline (or its communicator went).
struct RankState {
  explicit RankState(int rank)
      : ready{absl::StrCat("ready", rank)}, done{absl::StrCat("done", rank)} {}
  std::deque<std::string> device;
  FakeEvent ready, done;
  std::mutex mu;
  std::condition_variable cv;
  absl::Status abort;  // guarded by mu
};

class EngineCommunicator : public Communicator {
 public:
  EngineCommunicator(NcclEngine* engine, RankState* state, std::string group, int rank, int size)
      : engine_(engine), state_(state), group_(std::move(group)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Abort(const absl::Status& reason) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->abort.ok()) state_->abort = reason;
    state_->cv.notify_all();
  }

  absl::Status Barrier(absl::Time deadline) override {
    return Run(Request(v1::GPU_BARRIER, DType::kFloat32, 0), deadline);
  }
  absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, double scale,
                         absl::Time deadline) override {
    auto r = Reduction(v1::GPU_ALL_REDUCE, dtype, count, op, scale);
    *r.add_inputs() = Stage(data, count * DTypeSize(dtype), data);
    return Run(std::move(r), deadline);
  }
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         absl::Time deadline) override {
    auto r = Request(v1::GPU_BROADCAST, dtype, count);
    r.set_root(root);
    *r.add_inputs() = Stage(data, count * DTypeSize(dtype), data);
    return Run(std::move(r), deadline);
  }
  absl::Status Reduce(void* data, size_t count, DType dtype, ReduceOp op, double scale, int root,
                      absl::Time deadline) override {
    auto r = Reduction(v1::GPU_REDUCE, dtype, count, op, scale);
    r.set_root(root);
    *r.add_inputs() = Stage(data, count * DTypeSize(dtype), data);
    return Run(std::move(r), deadline);
  }
  absl::Status AllGather(const void* in, void* out, size_t count, DType dtype,
                         absl::Time deadline) override {
    auto r = Request(v1::GPU_ALL_GATHER, dtype, count);
    *r.add_inputs() = Stage(in, count * DTypeSize(dtype));
    *r.add_outputs() = Stage(nullptr, size_ * count * DTypeSize(dtype), out);
    return Run(std::move(r), deadline);
  }
  absl::Status Gather(const void* in, void* out, size_t count, DType dtype, int root,
                      absl::Time deadline) override {
    auto r = Request(v1::GPU_GATHER, dtype, count);
    r.set_root(root);
    *r.add_inputs() = Stage(in, count * DTypeSize(dtype));
    if (rank_ == root) *r.add_outputs() = Stage(nullptr, size_ * count * DTypeSize(dtype), out);
    return Run(std::move(r), deadline);
  }
  absl::Status Scatter(const void* in, void* out, size_t count, DType dtype, int root,
                       absl::Time deadline) override {
    auto r = Request(v1::GPU_SCATTER, dtype, count);
    r.set_root(root);
    if (rank_ == root) *r.add_inputs() = Stage(in, size_ * count * DTypeSize(dtype));
    *r.add_outputs() = Stage(nullptr, count * DTypeSize(dtype), out);
    return Run(std::move(r), deadline);
  }
  absl::Status ReduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                             double scale, absl::Time deadline) override {
    auto r = Reduction(v1::GPU_REDUCE_SCATTER, dtype, count, op, scale);
    *r.add_inputs() = Stage(in, size_ * count * DTypeSize(dtype));
    *r.add_outputs() = Stage(nullptr, count * DTypeSize(dtype), out);
    return Run(std::move(r), deadline);
  }
  absl::Status AllToAll(const void* in, const std::vector<size_t>& send_counts, void* out,
                        const std::vector<size_t>& recv_counts, DType dtype,
                        absl::Time deadline) override {
    auto r = Request(v1::GPU_ALL_TO_ALL, dtype, 0);
    size_t sent = 0, received = 0;
    for (size_t c : send_counts) {
      r.add_send_counts(c);
      sent += c;
    }
    for (size_t c : recv_counts) {
      r.add_recv_counts(c);
      received += c;
    }
    *r.add_inputs() = Stage(in, sent * DTypeSize(dtype));
    *r.add_outputs() = Stage(nullptr, received * DTypeSize(dtype), out);
    return Run(std::move(r), deadline);
  }

 private:
  // A "device" buffer of `bytes` holding `from` (if not null), copied to
  // `to` (if not null) once the collective finished here.
  v1::GpuBuffer Stage(const void* from, size_t bytes, void* to = nullptr) {
    std::string& staged = state_->device.emplace_back(bytes, '\0');
    if (from != nullptr && bytes > 0) std::memcpy(staged.data(), from, bytes);
    if (to != nullptr) copy_back_.push_back({to, &staged});
    v1::GpuBuffer b;
    b.set_ipc_handle(FakeIpcHandle(staged.data()));
    b.set_bytes(bytes);
    return b;
  }
  v1::GpuCollectiveRequest Request(v1::GpuOp op, DType dtype, uint64_t count) {
    v1::GpuCollectiveRequest r;
    r.mutable_caller()->set_job_id(kJob);
    r.mutable_caller()->set_global_rank(kFirstRank + rank_);
    r.set_group(group_);
    r.set_op(op);
    r.set_dtype(static_cast<int>(dtype));
    r.set_count(count);
    r.set_pci_bus_id("fake:0");
    r.set_ready_event(FakeIpcHandle(&state_->ready));
    r.set_done_event(FakeIpcHandle(&state_->done));
    return r;
  }
  v1::GpuCollectiveRequest Reduction(v1::GpuOp op, DType dtype, uint64_t count, ReduceOp reduce,
                                     double scale) {
    auto r = Request(op, dtype, count);
    r.set_reduce_op(static_cast<int>(reduce));
    r.set_scale(scale);
    return r;
  }
  // Sends the request and waits until the engine says this rank's part is
  // done, the deadline passes or Abort is called.
  absl::Status Run(v1::GpuCollectiveRequest request, absl::Time deadline) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->abort.ok()) return state_->abort;
    }
    uint64_t sequence = ++sequence_;
    request.set_sequence(sequence);
    request.set_timeout_millis(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
    // Staged for this request only (Run's caller filled it).
    struct Clear {
      std::vector<std::pair<void*, std::string*>>* v;
      ~Clear() { v->clear(); }
    } clear{&copy_back_};
    // Shared with the engine's callback, which may outlive this call.
    struct Answer {
      bool done = false;
      absl::Status status;
    };
    auto answer = std::make_shared<Answer>();
    RankState* state = state_;
    engine_->Collective(std::move(request),
                        [state, answer](absl::StatusOr<uint64_t> launched) mutable {
                          std::lock_guard<std::mutex> lock(state->mu);
                          answer->done = true;
                          answer->status = std::move(launched).status();
                          state->cv.notify_all();
                          // Released under the lock: this rank's thread frees
                          // it, not the engine's worker when it drops `done`.
                          answer.reset();
                        });
    std::unique_lock<std::mutex> lock(state_->mu);
    while (true) {
      if (!state_->abort.ok()) return state_->abort;
      if (answer->done) {
        if (!answer->status.ok()) return answer->status;
        bool finished = false;
        lock.unlock();
        absl::Status s =
            engine_->CollectiveStatus(kJob, group_, kFirstRank + rank_, sequence, &finished);
        lock.lock();
        if (!s.ok()) return s;
        if (finished) {
          for (const auto& [to, staged] : copy_back_) {
            if (!staged->empty()) std::memcpy(to, staged->data(), staged->size());
          }
          return absl::OkStatus();
        }
      }
      // Unanswered: the engine answers at the deadline (this is its grace).
      const absl::Time give_up = answer->done ? deadline : deadline + absl::Seconds(2);
      if (absl::Now() >= give_up) {
        return absl::DeadlineExceededError(
            absl::StrCat("GPU collective #", sequence, " on group '", group_, "' timed out"));
      }
      state_->cv.wait_for(lock, std::chrono::microseconds(200));
    }
  }

  NcclEngine* const engine_;
  RankState* const state_;  // the transport's
  // Where each output buffer of the call in progress goes.
  std::vector<std::pair<void*, std::string*>> copy_back_;
  const std::string group_;
  const int rank_, size_;
  uint64_t sequence_ = 0;
};

class GpuTransport : public ConformanceTransport {
 public:
  ~GpuTransport() override { Drop(); }
  Traits traits() const override {
    Traits t;
    t.timeout_names_ranks = true;
    t.abort_wakes_own_wait = true;
    t.death_names_reason = true;
    // NCCL has no bitwise reductions (as PyTorch's NCCL backend).
    t.check_reduce = [](DType dtype, ReduceOp op) {
      return MapReduction(dtype, op, 1, 1.0).status();
    };
    return t;
  }
  absl::Status NewGroup(int world, int variant) override {
    Drop();
    runtime_ = std::make_unique<FakeGpuRuntime>();
    directory_ = std::make_unique<FakeDirectory>();
    std::vector<int> ranks(world);
    for (int r = 0; r < world; ++r) ranks[r] = kFirstRank + r;
    directory_->AddGroup(group_, ranks, absl::Seconds(3));
    NcclEngineOptions options;
    options.watchdog_interval = absl::Milliseconds(1);
    engine_ = std::make_unique<NcclEngine>(runtime_.get(), directory_.get(), options);
    world_ = world;
    for (int r = 0; r < world; ++r) ranks_.push_back(std::make_unique<RankState>(r));
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Connect(int rank) override {
    return std::unique_ptr<Communicator>(
        new EngineCommunicator(engine_.get(), ranks_[rank].get(), group_, rank, world_));
  }
  void MemberDied(int rank, const std::string& reason) override {
    directory_->BreakGroup(kJob, group_, reason);
    engine_->GroupBroken(kJob, group_, reason);
    engine_->RankGone(kJob, kFirstRank + rank);
  }

 private:
  void Drop() {
    engine_.reset();  // its threads end: nothing uses ranks_ any more
    directory_.reset();
    runtime_.reset();
    ranks_.clear();
  }
  const std::string group_ = "world";
  int world_ = 0;
  std::unique_ptr<FakeGpuRuntime> runtime_;
  std::unique_ptr<FakeDirectory> directory_;
  std::unique_ptr<NcclEngine> engine_;
  std::vector<std::unique_ptr<RankState>> ranks_;
};

}  // namespace

std::unique_ptr<ConformanceTransport> MakeConformanceTransport() {
  return std::make_unique<GpuTransport>();
}

}  // namespace muster
