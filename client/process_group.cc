// ProcessGroup and Work: the public handles, ProcessGroup::Impl (backends,
// dispatch, the per-group executor, point to point, the GPU path) and
// Work::Impl, and the list/bytes variants of the collectives built on the
// contiguous Communicator ones.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "backends/builtin/cpu_backends.h"
#include "backends/communicator.h"
#include "backends/gloo/gloo_communicator.h"
#include "client/cuda_driver.h"
#include "client/gpu_path.h"
#include "client/process_group_impl.h"
#include "client/world_impl.h"
#include "common/status_macros.h"
#include "muster/prefix_store.h"
#include "muster/tcp_store.h"
#include "muster/world.h"
#include "proto/gpu.grpc.pb.h"
#include "proto/groups.grpc.pb.h"

namespace muster {
namespace {

absl::Status CheckTensor(const Tensor& t, const char* what) {
  if (t.data == nullptr && t.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": null buffer with ", t.count, " elements"));
  }
  if (static_cast<int>(t.dtype) >= kNumDTypes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown dtype"));
  }
  // Its bytes, and those of a group's worth of it, must not wrap.
  if (t.count > static_cast<size_t>(PTRDIFF_MAX) / DTypeSize(t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", t.count, " elements of ",
                                                   DTypeName(t.dtype), " are more than memory"));
  }
  return absl::OkStatus();
}

// count * n, or false if that wraps.
bool TimesGroup(size_t count, size_t n, size_t* product) {
  return !__builtin_mul_overflow(count, n, product);
}

absl::Status CheckList(const std::vector<Tensor>& list, size_t expected, size_t count, DType dtype,
                       const char* what) {
  if (list.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected ", expected, " tensors, got ", list.size()));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    if (absl::Status s = CheckTensor(list[i], what); !s.ok()) return s;
    if (list[i].count != count || list[i].dtype != dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor ", i, " has ", list[i].count, " ", DTypeName(list[i].dtype),
                       " elements, expected ", count, " ", DTypeName(dtype)));
    }
  }
  return absl::OkStatus();
}

// The tensors of one call, for TensorsDevice.
std::vector<const Tensor*> TensorPointers(std::initializer_list<const Tensor*> singles,
                                          const std::vector<Tensor>& list = {},
                                          const std::vector<Tensor>& more = {}) {
  std::vector<const Tensor*> all(singles);
  for (const Tensor& t : list) all.push_back(&t);
  for (const Tensor& t : more) all.push_back(&t);
  return all;
}

std::shared_ptr<Work> Failed(absl::Status status) { return Work::Impl::Failed(std::move(status)); }

// musterd's NCCL communicators as the group's "nccl" (cuda) backend: its
// calls go through the group's GpuPath (stream-ordered requests to
// musterd), not through a Communicator in this process.
class DaemonGpuBackend final : public Backend {
 public:
  explicit DaemonGpuBackend(BackendOptions options) : options_(std::move(options)) {}
  const std::string& name() const override { return name_; }
  const BackendOptions& options() const override { return options_; }

 private:
  const std::string name_ = "nccl";
  const BackendOptions options_;
};

void RegisterSdkBackendsOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    RegisterBuiltinCpuBackends();
    (void)BackendRegistry::Global().Register(
        "nccl",
        [](const BackendOptions& o) -> absl::StatusOr<std::unique_ptr<Backend>> {
          return std::make_unique<DaemonGpuBackend>(o);
        },
        {"cuda"});
  });
}

const char* DeviceName(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

// What the flight recorder keeps of a call on `t` (its input).
TraceCall Traced(TraceOp op, const Tensor& t, int root = -1) {
  TraceCall c;
  c.op = op;
  c.dtype = static_cast<uint8_t>(t.dtype);
  c.device = static_cast<uint8_t>(t.device);
  c.count = t.count;
  c.root = root;
  return c;
}
TraceCall Traced(TraceOp op, DType dtype, uint64_t count, int root = -1) {
  TraceCall c;
  c.op = op;
  c.dtype = static_cast<uint8_t>(dtype);
  c.count = count;
  c.root = root;
  return c;
}

TraceCall GpuTraceCall(const GpuCall& g) {
  TraceOp op = TraceOp::kUnknown;
  switch (g.op) {
    case v1::GPU_ALL_REDUCE:
      op = TraceOp::kAllReduce;
      break;
    case v1::GPU_BROADCAST:
      op = TraceOp::kBroadcast;
      break;
    case v1::GPU_REDUCE:
      op = TraceOp::kReduce;
      break;
    case v1::GPU_ALL_GATHER:
      op = TraceOp::kAllGather;
      break;
    case v1::GPU_REDUCE_SCATTER:
      op = TraceOp::kReduceScatter;
      break;
    case v1::GPU_ALL_TO_ALL:
      op = TraceOp::kAllToAll;
      break;
    case v1::GPU_GATHER:
      op = TraceOp::kGather;
      break;
    case v1::GPU_SCATTER:
      op = TraceOp::kScatter;
      break;
    case v1::GPU_BARRIER:
      op = TraceOp::kBarrier;
      break;
    case v1::GPU_SEND_RECV:
      op = g.p2p.size() == 1 ? (g.p2p[0].send ? TraceOp::kSend : TraceOp::kRecv)
                             : TraceOp::kBatchP2P;
      break;
    default:
      break;
  }
  bool has_root = op == TraceOp::kBroadcast || op == TraceOp::kReduce || op == TraceOp::kGather ||
                  op == TraceOp::kScatter;
  uint64_t count = g.count;
  if (op == TraceOp::kAllToAll) {
    count = 0;
    for (size_t v : g.send_counts) count += v;
  }
  int root = has_root ? g.root : -1;
  if (g.p2p.size() == 1) {
    count = g.p2p[0].tensor.count;
    root = g.p2p[0].peer;
  }
  TraceCall c = Traced(op, g.dtype, count, root);
  c.device = static_cast<uint8_t>(Device::kCuda);
  return c;
}

}  // namespace

// The work queued on some CUDA streams up to one call: an event recorded
// on each, waited for before an in-process backend's Communicator gets
// the tensors (backends/communicator.h). Thread-compatible.
class StreamFence {
 public:
  static absl::StatusOr<std::shared_ptr<StreamFence>> Record(
      absl::Span<const Tensor* const> tensors) {
    absl::StatusOr<CudaDriver*> driver = SystemCudaDriver();
    if (!driver.ok()) return driver.status();
    auto fence = std::make_shared<StreamFence>(*driver);
    std::vector<void*> streams;
    for (const Tensor* t : tensors) {
      // (An empty tensor is not touched: nothing to wait for.)
      if (t == nullptr || t->device != Device::kCuda || t->bytes() == 0) continue;
      if (std::find(streams.begin(), streams.end(), t->stream) != streams.end()) continue;
      // The event belongs to the context of the tensor's memory.
      absl::StatusOr<CudaDriver::Allocation> a = (*driver)->FindAllocation(t->data);
      if (!a.ok()) return a.status();
      absl::StatusOr<void*> event = (*driver)->CreateEvent(a->context);
      if (!event.ok()) return event.status();
      fence->events_.push_back(*event);
      if (absl::Status s = (*driver)->RecordEvent(*event, t->stream, a->context); !s.ok()) {
        return s;
      }
      streams.push_back(t->stream);
    }
    return fence;
  }
  explicit StreamFence(CudaDriver* driver) : driver_(driver) {}
  ~StreamFence() {
    for (void* e : events_) driver_->DestroyEvent(e);
  }
  StreamFence(const StreamFence&) = delete;
  StreamFence& operator=(const StreamFence&) = delete;

  // Blocks until the GPU passed every event (DEADLINE_EXCEEDED at
  // `deadline`).
  absl::Status Wait(absl::Time deadline) {
    int spins = 0;
    for (void* e : events_) {
      while (true) {
        absl::StatusOr<bool> done = driver_->EventDone(e);
        if (!done.ok()) return done.status();
        if (*done) break;
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(
              "the work queued on the CUDA tensors' stream before the collective did not finish "
              "in time");
        }
        if (++spins > 1000) absl::SleepFor(absl::Microseconds(50));
      }
    }
    return absl::OkStatus();
  }

 private:
  CudaDriver* const driver_;
  std::vector<void*> events_;
};

// Work: a handle over Work::Impl.

// `new Impl`, not make_unique's `new Impl()`: value-initialization zeroed
// the whole Impl (rep stos, ~5 ns a collective) before its member
// initializers ran; every member has one.
Work::Work() : impl_(new Impl) {}
Work::~Work() = default;
bool Work::IsCompleted() const { return impl_->IsCompleted(); }
absl::Status Work::Wait(absl::Duration timeout) { return impl_->Wait(timeout); }
absl::Status Work::status() const { return impl_->status(); }
uint64_t Work::sequence() const { return impl_->sequence(); }
absl::Status Work::Synchronize(absl::Duration timeout) { return impl_->Synchronize(timeout); }
void Work::OnComplete(std::function<void(const absl::Status&)> callback) {
  impl_->OnComplete(std::move(callback));
}
void Work::Retain(std::shared_ptr<const void> data) { impl_->Retain(std::move(data)); }
int Work::source_rank() const { return impl_->source_rank(); }

// Work::Impl.

std::shared_ptr<Work> Work::Impl::Create() { return std::allocate_shared<Work>(Allocator<Work>()); }

std::shared_ptr<Work> Work::Impl::Failed(absl::Status status) {
  std::shared_ptr<Work> work = Create();
  Of(*work).Complete(std::move(status));
  return work;
}

bool Work::Impl::IsCompleted() const { return state_.load(std::memory_order_acquire) == kDone; }

absl::Status Work::Impl::Wait(absl::Duration timeout) {
  if (IsCompleted()) return status_;
  absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  // A completed Work never touches its group again: it may outlive it (the
  // group's destructor completes every Work it still holds). Only a wait
  // without a deadline runs queued collectives itself: one it ran could not
  // be left at the deadline (the group's executor runs them otherwise).
  ProcessGroup::Impl* group =
      timeout == absl::InfiniteDuration() ? group_.load(std::memory_order_acquire) : nullptr;
  if (group != nullptr) group->RunUntil(this, deadline);
  if (IsCompleted()) return status_;
  absl::MutexLock lock(&mu_);
  Watch();
  if (!mu_.AwaitWithDeadline(absl::Condition(this, &Impl::IsCompleted), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "collective #", sequence_, " not completed after ", absl::FormatDuration(timeout)));
  }
  return status_;
}

absl::Status Work::Impl::Synchronize(absl::Duration timeout) {
  absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  if (absl::Status s = Wait(timeout); !s.ok() || !synchronize_) return s;
  return synchronize_(deadline);
}

absl::Status Work::Impl::status() const {
  if (!IsCompleted()) return absl::FailedPreconditionError("the collective has not completed yet");
  return status_;
}

int Work::Impl::source_rank() const { return IsCompleted() ? source_ : -1; }

void Work::Impl::Watch() {
  uint8_t seen = kUnwatched;
  if (state_.compare_exchange_strong(seen, kWatched, std::memory_order_acq_rel)) return;
  // Watched before, or done; or being completed without the lock (between
  // two stores of Complete's): wait for that, briefly.
  while (seen == kCompleting) {
    std::this_thread::yield();
    seen = state_.load(std::memory_order_acquire);
  }
}

void Work::Impl::Complete(absl::Status status, int source) {
  // Nobody waits on mu_ and no callback is registered: done without the
  // lock, one atomic instruction (a synchronous collective's Work).
  uint8_t seen = kUnwatched;
  if (state_.compare_exchange_strong(seen, kCompleting, std::memory_order_acq_rel)) {
    status_ = std::move(status);
    source_ = source;
    state_.store(kDone, std::memory_order_release);
    return;
  }
  if (seen != kWatched) return;  // completed by an earlier call: the first one counts
  // Whoever watches saw kWatched first, under mu_: finish under it, so its
  // waiters wake.
  std::vector<std::function<void(const absl::Status&)>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (state_.load(std::memory_order_relaxed) != kWatched) return;  // another call came first
    status_ = std::move(status);
    source_ = source;
    state_.store(kDone, std::memory_order_release);
    callbacks.swap(on_complete_);
  }
  // status_ no longer changes once the state is kDone: read it without the lock.
  for (auto& callback : callbacks) callback(status_);
}

void Work::Impl::OnComplete(std::function<void(const absl::Status&)> callback) {
  ProcessGroup::Impl* group = nullptr;
  {
    absl::MutexLock lock(&mu_);
    Watch();
    if (state_.load(std::memory_order_acquire) != kDone) {
      on_complete_.push_back(std::move(callback));
      group = group_.load(std::memory_order_acquire);
      callback = nullptr;
    }
  }
  if (callback) {
    callback(status_);  // already completed
    return;
  }
  // Whoever waits for this work waits for the callback, not in Wait(): the
  // group's executor must run it now, not after its polling delay. (A GPU
  // work has no group: its path completes it.)
  if (group != nullptr) group->Expedite();
}

void Work::Impl::Retain(std::shared_ptr<const void> data) {
  absl::MutexLock lock(&mu_);
  retained_.push_back(std::move(data));
}

// ProcessGroup: a handle over ProcessGroup::Impl.

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;
const std::string& ProcessGroup::name() const { return impl_->name(); }
const std::string& ProcessGroup::tag() const { return impl_->tag(); }
const std::string& ProcessGroup::backend() const { return impl_->backend(); }
const std::vector<int>& ProcessGroup::ranks() const { return impl_->ranks(); }
int ProcessGroup::rank() const { return impl_->rank(); }
absl::StatusOr<int> ProcessGroup::GroupRank(int global_rank) const {
  return impl_->GroupRank(global_rank);
}
absl::StatusOr<int> ProcessGroup::GlobalRank(int group_rank) const {
  return impl_->GlobalRank(group_rank);
}
absl::Status ProcessGroup::Barrier(absl::Duration timeout) { return impl_->Barrier(timeout); }

std::shared_ptr<Work> ProcessGroup::AllReduce(Tensor t, ReduceOp op, double scale) {
  if (absl::Status s = CheckTensor(t, "all_reduce"); !s.ok()) return Failed(s);
  Routed on;
  if (auto gpu = impl_->Route(&on, "all_reduce", {&t}, [&] {
        GpuCall g;
        g.op = v1::GPU_ALL_REDUCE;
        g.dtype = t.dtype;
        g.count = t.count;
        g.reduce_op = op;
        g.scale = scale;
        g.inputs = {t};
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(on, Traced(TraceOp::kAllReduce, t),
                       [t, op, scale](Communicator& c, absl::Time d) {
                         return c.AllReduce(t.data, t.count, t.dtype, op, scale, d);
                       });
}

std::shared_ptr<Work> ProcessGroup::AllReduceCoalesced(std::vector<Tensor> tensors, ReduceOp op) {
  for (const Tensor& t : tensors) {
    if (absl::Status s = CheckTensor(t, "all_reduce_coalesced"); !s.ok()) return Failed(s);
  }
  absl::StatusOr<Device> device =
      TensorsDevice(TensorPointers({}, tensors), "all_reduce_coalesced");
  if (!device.ok()) return Failed(device.status());
  if (absl::Status s = impl_->DeviceStatus(*device, "all_reduce_coalesced"); !s.ok())
    return Failed(s);
  if (*device == Device::kCuda && impl_->daemon_gpu()) {
    // One enqueue per tensor, in order, on their stream.
    std::shared_ptr<Work> last;
    for (const Tensor& t : tensors) {
      GpuCall g;
      g.op = v1::GPU_ALL_REDUCE;
      g.dtype = t.dtype;
      g.count = t.count;
      g.reduce_op = op;
      g.inputs = {t};
      last = impl_->SubmitGpu(g);
      if (absl::Status s = last->status(); !s.ok()) return last;
    }
    return last;
  }
  absl::StatusOr<std::shared_ptr<StreamFence>> fence =
      impl_->FenceFor(*device, TensorPointers({}, tensors));
  if (!fence.ok()) return Failed(fence.status());
  uint64_t elements = 0;
  for (const Tensor& t : tensors) elements += t.count;
  TraceCall call = Traced(TraceOp::kAllReduceCoalesced,
                          tensors.empty() ? DType::kFloat32 : tensors[0].dtype, elements);
  call.device = static_cast<uint8_t>(*device);
  return impl_->Submit(Routed{*device, *fence}, call, [tensors, op](Communicator& c, absl::Time d) {
    for (const Tensor& t : tensors) {
      if (absl::Status s = c.AllReduce(t.data, t.count, t.dtype, op, 1.0, d); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

std::shared_ptr<Work> ProcessGroup::Broadcast(Tensor t, int root) {
  if (absl::Status s = CheckTensor(t, "broadcast"); !s.ok()) return Failed(s);
  Routed on;
  if (auto gpu = impl_->Route(&on, "broadcast", {&t}, [&] {
        GpuCall g;
        g.op = v1::GPU_BROADCAST;
        g.dtype = t.dtype;
        g.count = t.count;
        g.root = root;
        g.inputs = {t};
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(on, Traced(TraceOp::kBroadcast, t, root),
                       [t, root](Communicator& c, absl::Time d) {
                         return c.Broadcast(t.data, t.count, t.dtype, root, d);
                       });
}

std::shared_ptr<Work> ProcessGroup::Reduce(Tensor t, int root, ReduceOp op) {
  if (absl::Status s = CheckTensor(t, "reduce"); !s.ok()) return Failed(s);
  Routed on;
  if (auto gpu = impl_->Route(&on, "reduce", {&t}, [&] {
        GpuCall g;
        g.op = v1::GPU_REDUCE;
        g.dtype = t.dtype;
        g.count = t.count;
        g.root = root;
        g.reduce_op = op;
        g.inputs = {t};
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(on, Traced(TraceOp::kReduce, t, root),
                       [t, root, op](Communicator& c, absl::Time d) {
                         return c.Reduce(t.data, t.count, t.dtype, op, 1.0, root, d);
                       });
}

std::shared_ptr<Work> ProcessGroup::AllGatherIntoTensor(Tensor out, Tensor in) {
  if (absl::Status s = CheckTensor(in, "all_gather_into_tensor"); !s.ok()) return Failed(s);
  if (absl::Status s = CheckTensor(out, "all_gather_into_tensor"); !s.ok()) return Failed(s);
  size_t needed = 0;
  if (!TimesGroup(in.count, size(), &needed) || out.count != needed || out.dtype != in.dtype) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
        "all_gather_into_tensor: output needs ", in.count, " x ", size(), " ", DTypeName(in.dtype),
        " elements, has ", out.count, " ", DTypeName(out.dtype))));
  }
  // The input is apart from the output or is exactly this rank's part of it
  // (in place). Any other overlap would have this rank overwrite input that
  // its peers may still be reading (as MPI_Allgather, only in place aliases).
  // (A non-member has no part; its call is refused further on.)
  const char* in_begin = static_cast<const char*>(in.data);
  const char* out_begin = static_cast<const char*>(out.data);
  const char* own_part =
      rank() >= 0 ? out_begin + static_cast<size_t>(rank()) * in.bytes() : nullptr;
  if (own_part != nullptr && in.bytes() > 0 && in_begin != own_part &&
      in_begin < out_begin + out.bytes() && out_begin < in_begin + in.bytes()) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
        "all_gather_into_tensor: the input overlaps the output but is not this rank's part of "
        "it (rank ",
        rank(), ": elements [", rank() * in.count, ", ", (rank() + 1) * in.count,
        ") of the output, for in place); use separate buffers or that part")));
  }
  Routed on;
  if (auto gpu = impl_->Route(&on, "all_gather_into_tensor", {&in, &out}, [&] {
        GpuCall g;
        g.op = v1::GPU_ALL_GATHER;
        g.dtype = in.dtype;
        g.count = in.count;
        g.inputs = {in};
        g.outputs = {out};
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(on, Traced(TraceOp::kAllGather, in),
                       [in, out](Communicator& c, absl::Time d) {
                         return c.AllGather(in.data, out.data, in.count, in.dtype, d);
                       });
}

std::shared_ptr<Work> ProcessGroup::AllGather(std::vector<Tensor> outs, Tensor in) {
  if (absl::Status s = CheckTensor(in, "all_gather"); !s.ok()) return Failed(s);
  if (absl::Status s = CheckList(outs, size(), in.count, in.dtype, "all_gather"); !s.ok()) {
    return Failed(s);
  }
  Routed on;
  if (auto gpu = impl_->Route(&on, "all_gather", TensorPointers({&in}, outs), [&] {
        GpuCall g;
        g.op = v1::GPU_ALL_GATHER;
        g.dtype = in.dtype;
        g.count = in.count;
        g.inputs = {in};
        g.outputs = outs;
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(on, Traced(TraceOp::kAllGather, in),
                       [in, outs](Communicator& c, absl::Time d) {
                         std::string flat(in.bytes() * outs.size(), '\0');
                         absl::Status s = c.AllGather(in.data, flat.data(), in.count, in.dtype, d);
                         if (!s.ok()) return s;
                         for (size_t i = 0; i < outs.size(); ++i) {
                           std::memcpy(outs[i].data, flat.data() + i * in.bytes(), in.bytes());
                         }
                         return absl::OkStatus();
                       });
}

std::shared_ptr<Work> ProcessGroup::AllGatherCoalesced(std::vector<std::vector<Tensor>> outs,
                                                       std::vector<Tensor> ins) {
  if (outs.size() != ins.size()) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
        "all_gather_coalesced: ", ins.size(), " inputs but ", outs.size(), " output lists")));
  }
  size_t total = 0;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (absl::Status s = CheckTensor(ins[i], "all_gather_coalesced"); !s.ok()) return Failed(s);
    if (absl::Status s =
            CheckList(outs[i], size(), ins[i].count, ins[i].dtype, "all_gather_coalesced");
        !s.ok()) {
      return Failed(absl::InvalidArgumentError(absl::StrCat("output list ", i, ": ", s.message())));
    }
    total += ins[i].bytes();
  }
  std::vector<const Tensor*> all = TensorPointers({}, ins);
  for (const auto& list : outs) {
    for (const Tensor& t : list) all.push_back(&t);
  }
  absl::StatusOr<Device> device = TensorsDevice(all, "all_gather_coalesced");
  if (!device.ok()) return Failed(device.status());
  if (absl::Status s = impl_->DeviceStatus(*device, "all_gather_coalesced"); !s.ok())
    return Failed(s);
  if (*device == Device::kCuda) {
    return Failed(absl::UnimplementedError("all_gather_coalesced: CPU tensors only"));
  }
  // One all_gather of every input packed as bytes; the signature's count
  // (total bytes) catches ranks that pass different inputs.
  return impl_->Submit(Traced(TraceOp::kAllGatherCoalesced, DType::kUInt8, total),
                       [outs, ins, total](Communicator& c, absl::Time d) {
                         std::string packed;
                         packed.reserve(total);
                         for (const Tensor& t : ins)
                           packed.append(static_cast<const char*>(t.data), t.bytes());
                         std::string flat(total * c.size(), '\0');
                         absl::Status s =
                             c.AllGather(packed.data(), flat.data(), total, DType::kUInt8, d);
                         if (!s.ok()) return s;
                         for (int j = 0; j < c.size(); ++j) {
                           size_t off = j * total;
                           for (size_t i = 0; i < ins.size(); ++i) {
                             std::memcpy(outs[i][j].data, flat.data() + off, ins[i].bytes());
                             off += ins[i].bytes();
                           }
                         }
                         return absl::OkStatus();
                       });
}

std::shared_ptr<Work> ProcessGroup::Gather(std::vector<Tensor> outs, Tensor in, int root) {
  if (absl::Status s = CheckTensor(in, "gather"); !s.ok()) return Failed(s);
  if (rank() == root) {
    if (absl::Status s = CheckList(outs, size(), in.count, in.dtype, "gather"); !s.ok()) {
      return Failed(s);
    }
  }
  bool is_root = rank() == root;
  Routed on;
  if (auto gpu = impl_->Route(&on, "gather", TensorPointers({&in}, outs), [&] {
        GpuCall g;
        g.op = v1::GPU_GATHER;
        g.dtype = in.dtype;
        g.count = in.count;
        g.root = root;
        g.inputs = {in};
        if (is_root) g.outputs = outs;
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(on, Traced(TraceOp::kGather, in, root),
                       [in, outs, root, is_root](Communicator& c, absl::Time d) {
                         std::string flat(is_root ? in.bytes() * outs.size() : 0, '\0');
                         absl::Status s =
                             c.Gather(in.data, flat.data(), in.count, in.dtype, root, d);
                         if (!s.ok() || !is_root) return s;
                         for (size_t i = 0; i < outs.size(); ++i) {
                           std::memcpy(outs[i].data, flat.data() + i * in.bytes(), in.bytes());
                         }
                         return absl::OkStatus();
                       });
}

std::shared_ptr<Work> ProcessGroup::Scatter(Tensor out, std::vector<Tensor> ins, int root) {
  if (absl::Status s = CheckTensor(out, "scatter"); !s.ok()) return Failed(s);
  bool is_root = rank() == root;
  if (is_root) {
    if (absl::Status s = CheckList(ins, size(), out.count, out.dtype, "scatter"); !s.ok()) {
      return Failed(s);
    }
  }
  Routed on;
  if (auto gpu = impl_->Route(&on, "scatter", TensorPointers({&out}, ins), [&] {
        GpuCall g;
        g.op = v1::GPU_SCATTER;
        g.dtype = out.dtype;
        g.count = out.count;
        g.root = root;
        g.outputs = {out};
        if (is_root) g.inputs = ins;
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(on, Traced(TraceOp::kScatter, out, root),
                       [out, ins, root, is_root](Communicator& c, absl::Time d) {
                         std::string flat;
                         if (is_root) {
                           flat.resize(out.bytes() * ins.size());
                           for (size_t i = 0; i < ins.size(); ++i) {
                             std::memcpy(flat.data() + i * out.bytes(), ins[i].data, out.bytes());
                           }
                         }
                         return c.Scatter(flat.data(), out.data, out.count, out.dtype, root, d);
                       });
}

std::shared_ptr<Work> ProcessGroup::ReduceScatterTensor(Tensor out, Tensor in, ReduceOp op) {
  if (absl::Status s = CheckTensor(in, "reduce_scatter_tensor"); !s.ok()) return Failed(s);
  if (absl::Status s = CheckTensor(out, "reduce_scatter_tensor"); !s.ok()) return Failed(s);
  size_t needed = 0;
  if (!TimesGroup(out.count, size(), &needed) || in.count != needed || out.dtype != in.dtype) {
    return Failed(absl::InvalidArgumentError(
        absl::StrCat("reduce_scatter_tensor: input needs ", out.count, " x ", size(), " ",
                     DTypeName(out.dtype), " elements, has ", in.count, " ", DTypeName(in.dtype))));
  }
  Routed on;
  if (auto gpu = impl_->Route(&on, "reduce_scatter_tensor", {&in, &out}, [&] {
        GpuCall g;
        g.op = v1::GPU_REDUCE_SCATTER;
        g.dtype = out.dtype;
        g.count = out.count;
        g.reduce_op = op;
        g.inputs = {in};
        g.outputs = {out};
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(
      on, Traced(TraceOp::kReduceScatter, out), [in, out, op](Communicator& c, absl::Time d) {
        return c.ReduceScatter(in.data, out.data, out.count, out.dtype, op, 1.0, d);
      });
}

std::shared_ptr<Work> ProcessGroup::ReduceScatter(Tensor out, std::vector<Tensor> ins,
                                                  ReduceOp op) {
  if (absl::Status s = CheckTensor(out, "reduce_scatter"); !s.ok()) return Failed(s);
  if (absl::Status s = CheckList(ins, size(), out.count, out.dtype, "reduce_scatter"); !s.ok()) {
    return Failed(s);
  }
  Routed on;
  if (auto gpu = impl_->Route(&on, "reduce_scatter", TensorPointers({&out}, ins), [&] {
        GpuCall g;
        g.op = v1::GPU_REDUCE_SCATTER;
        g.dtype = out.dtype;
        g.count = out.count;
        g.reduce_op = op;
        g.inputs = ins;
        g.outputs = {out};
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(
      on, Traced(TraceOp::kReduceScatter, out), [out, ins, op](Communicator& c, absl::Time d) {
        std::string flat(out.bytes() * ins.size(), '\0');
        for (size_t i = 0; i < ins.size(); ++i) {
          std::memcpy(flat.data() + i * out.bytes(), ins[i].data, out.bytes());
        }
        return c.ReduceScatter(flat.data(), out.data, out.count, out.dtype, op, 1.0, d);
      });
}

std::shared_ptr<Work> ProcessGroup::AllToAllSingle(Tensor out, Tensor in,
                                                   std::vector<size_t> out_splits,
                                                   std::vector<size_t> in_splits) {
  if (absl::Status s = CheckTensor(in, "all_to_all_single"); !s.ok()) return Failed(s);
  if (absl::Status s = CheckTensor(out, "all_to_all_single"); !s.ok()) return Failed(s);
  if (in.dtype != out.dtype) {
    return Failed(absl::InvalidArgumentError("all_to_all_single: input and output dtypes differ"));
  }
  size_t n = size();
  auto fill = [n](std::vector<size_t>& splits, size_t total, const char* which) -> absl::Status {
    if (splits.empty()) {
      if (total % n != 0) {
        return absl::InvalidArgumentError(absl::StrCat("all_to_all_single: ", which, " of ", total,
                                                       " elements does not split evenly into ", n,
                                                       " ranks; pass split sizes"));
      }
      splits.assign(n, total / n);
    }
    size_t sum = 0;
    bool wraps = false;  // a sum past `total` could wrap and come back equal to it
    for (size_t v : splits) {
      wraps |= v > total - sum;
      if (!wraps) sum += v;
    }
    if (splits.size() != n || wraps || sum != total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all_to_all_single: ", which, " splits must be ", n, " sizes summing to ", total));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = fill(in_splits, in.count, "input"); !s.ok()) return Failed(s);
  if (absl::Status s = fill(out_splits, out.count, "output"); !s.ok()) return Failed(s);
  Routed on;
  if (auto gpu = impl_->Route(&on, "all_to_all_single", {&in, &out}, [&] {
        GpuCall g;
        g.op = v1::GPU_ALL_TO_ALL;
        g.dtype = in.dtype;
        g.inputs = {in};
        g.outputs = {out};
        g.send_counts = in_splits;
        g.recv_counts = out_splits;
        return g;
      })) {
    return gpu;
  }
  return impl_->Submit(on, Traced(TraceOp::kAllToAll, in),
                       [in, out, in_splits, out_splits](Communicator& c, absl::Time d) {
                         return c.AllToAll(in.data, in_splits, out.data, out_splits, in.dtype, d);
                       });
}

std::shared_ptr<Work> ProcessGroup::AllToAll(std::vector<Tensor> outs, std::vector<Tensor> ins) {
  size_t n = size();
  if (outs.size() != n || ins.size() != n) {
    return Failed(absl::InvalidArgumentError(
        absl::StrCat("all_to_all: expected ", n, " input and output tensors")));
  }
  std::vector<size_t> send(n), recv(n);
  for (size_t i = 0; i < n; ++i) {
    if (absl::Status s = CheckTensor(ins[i], "all_to_all"); !s.ok()) return Failed(s);
    if (absl::Status s = CheckTensor(outs[i], "all_to_all"); !s.ok()) return Failed(s);
    if (ins[i].dtype != ins[0].dtype || outs[i].dtype != ins[0].dtype) {
      return Failed(absl::InvalidArgumentError("all_to_all: tensors must share one dtype"));
    }
    send[i] = ins[i].count;
    recv[i] = outs[i].count;
  }
  Routed on;
  if (auto gpu = impl_->Route(&on, "all_to_all", TensorPointers({}, ins, outs), [&] {
        GpuCall g;
        g.op = v1::GPU_ALL_TO_ALL;
        g.dtype = ins[0].dtype;
        g.inputs = ins;
        g.outputs = outs;
        g.send_counts = send;
        g.recv_counts = recv;
        return g;
      })) {
    return gpu;
  }
  uint64_t elements = 0;
  for (size_t v : send) elements += v;
  TraceCall call = Traced(TraceOp::kAllToAll, ins[0].dtype, elements);
  call.device = static_cast<uint8_t>(on.device);
  return impl_->Submit(on, call, [outs, ins, send, recv](Communicator& c, absl::Time d) {
    size_t es = DTypeSize(ins[0].dtype);
    std::string in_flat, out_flat;
    for (const Tensor& t : ins) in_flat.append(static_cast<const char*>(t.data), t.bytes());
    size_t total = 0;
    for (size_t v : recv) total += v;
    out_flat.resize(total * es);
    absl::Status s = c.AllToAll(in_flat.data(), send, out_flat.data(), recv, ins[0].dtype, d);
    if (!s.ok()) return s;
    size_t off = 0;
    for (const Tensor& t : outs) {
      std::memcpy(t.data, out_flat.data() + off, t.bytes());
      off += t.bytes();
    }
    return absl::OkStatus();
  });
}

std::shared_ptr<Work> ProcessGroup::CollectiveBarrier() {
  return impl_->Submit(Traced(TraceOp::kBarrier, DType::kUInt8, 0),
                       [](Communicator& c, absl::Time d) { return c.Barrier(d); });
}

absl::Status ProcessGroup::MonitoredBarrier(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("monitored_barrier needs a positive timeout");
  }
  const absl::Time deadline = absl::Now() + timeout;
  // The barrier runs on the group's communicator, after this rank's earlier
  // collectives: a member that does not come in time fails it on every
  // member, naming who (and breaks the group, as any collective that timed
  // out). Meanwhile every member also checks in with musterd, which records
  // arrivals out of band: when this rank's own earlier collective is stuck
  // the barrier cannot even start here, and musterd's record names the
  // members that never came, at the barrier's timeout.
  auto started = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<Work> work = impl_->Submit(Traced(TraceOp::kMonitoredBarrier, DType::kUInt8, 0),
                                             [deadline, started](Communicator& c, absl::Time) {
                                               started->store(true);
                                               return c.Barrier(deadline);
                                             });
  impl_->Expedite();
  absl::Status arrived = impl_->Barrier(timeout);
  if (started->load() || (arrived.ok() && work->IsCompleted())) {
    // It ran with the deadline: it ends soon after it, saying why.
    return work->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()) + absl::Seconds(2));
  }
  if (!arrived.ok()) {
    return absl::Status(arrived.code(), absl::StrCat("monitored_barrier on group '", name(),
                                                     "': ", arrived.message()));
  }
  absl::Status s = work->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
  if (work->IsCompleted()) return s;
  return absl::DeadlineExceededError(
      absl::StrCat("monitored_barrier on group '", name(),
                   "': every member arrived, but this rank's "
                   "collectives queued before the barrier did not complete within ",
                   absl::FormatDuration(timeout)));
}

std::shared_ptr<Work> ProcessGroup::BroadcastBytes(std::string* blob, int root) {
  if (blob == nullptr) return Failed(absl::InvalidArgumentError("broadcast_object: null blob"));
  return impl_->Submit(Traced(TraceOp::kBroadcastObject, DType::kUInt8, blob->size(), root),
                       [blob, root](Communicator& c, absl::Time d) {
                         int64_t size = static_cast<int64_t>(blob->size());
                         absl::Status s = c.Broadcast(&size, 1, DType::kInt64, root, d);
                         if (!s.ok()) return s;
                         blob->resize(size);
                         return c.Broadcast(blob->data(), blob->size(), DType::kUInt8, root, d);
                       });
}

std::shared_ptr<Work> ProcessGroup::AllGatherBytes(const std::string& blob,
                                                   std::vector<std::string>* out) {
  if (out == nullptr) return Failed(absl::InvalidArgumentError("all_gather_object: null output"));
  std::string mine = blob;
  return impl_->Submit(Traced(TraceOp::kAllGatherObject, DType::kUInt8, mine.size()),
                       [mine, out](Communicator& c, absl::Time d) {
                         int64_t size = static_cast<int64_t>(mine.size());
                         std::vector<int64_t> sizes(c.size());
                         absl::Status s = c.AllGather(&size, sizes.data(), 1, DType::kInt64, d);
                         if (!s.ok()) return s;
                         int64_t largest = *std::max_element(sizes.begin(), sizes.end());
                         std::string padded = mine;
                         padded.resize(largest);
                         std::string all(largest * c.size(), '\0');
                         s = c.AllGather(padded.data(), all.data(), largest, DType::kUInt8, d);
                         if (!s.ok()) return s;
                         out->clear();
                         for (int i = 0; i < c.size(); ++i)
                           out->push_back(all.substr(i * largest, sizes[i]));
                         return absl::OkStatus();
                       });
}

std::shared_ptr<Work> ProcessGroup::GatherBytes(const std::string& blob,
                                                std::vector<std::string>* out, int root) {
  if (root < 0 || root >= size()) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
        "gather_object: root ", root, " is outside group '", name(), "' of size ", size())));
  }
  bool is_root = rank() == root;
  if (is_root && out == nullptr) {
    return Failed(absl::InvalidArgumentError("gather_object: null output at the root"));
  }
  std::string mine = blob;
  return impl_->Submit(Traced(TraceOp::kGatherObject, DType::kUInt8, mine.size(), root),
                       [mine, out, root, is_root](Communicator& c, absl::Time d) {
                         // Every rank learns every size (so all agree on the padded length).
                         int64_t size = static_cast<int64_t>(mine.size());
                         std::vector<int64_t> sizes(c.size());
                         absl::Status s = c.AllGather(&size, sizes.data(), 1, DType::kInt64, d);
                         if (!s.ok()) return s;
                         int64_t largest = *std::max_element(sizes.begin(), sizes.end());
                         std::string padded = mine;
                         padded.resize(largest);
                         std::string all(is_root ? largest * c.size() : 0, '\0');
                         s = c.Gather(padded.data(), all.data(), largest, DType::kUInt8, root, d);
                         if (!s.ok() || !is_root) return s;
                         out->clear();
                         for (int i = 0; i < c.size(); ++i)
                           out->push_back(all.substr(i * largest, sizes[i]));
                         return absl::OkStatus();
                       });
}

std::shared_ptr<Work> ProcessGroup::ScatterBytes(std::vector<std::string> blobs, std::string* out,
                                                 int root) {
  if (out == nullptr) return Failed(absl::InvalidArgumentError("scatter_object: null output"));
  if (root < 0 || root >= size()) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
        "scatter_object: root ", root, " is outside group '", name(), "' of size ", size())));
  }
  bool is_root = rank() == root;
  if (is_root && blobs.size() != static_cast<size_t>(size())) {
    return Failed(absl::InvalidArgumentError(
        absl::StrCat("scatter_object: the root needs ", size(), " blobs, got ", blobs.size())));
  }
  if (!is_root) blobs.clear();
  uint64_t blob_bytes = 0;
  for (const std::string& b : blobs) blob_bytes += b.size();
  return impl_->Submit(
      Traced(TraceOp::kScatterObject, DType::kUInt8, blob_bytes, root),
      [blobs, out, root, is_root](Communicator& c, absl::Time d) {
        // The root tells every rank every size, then scatters padded blobs.
        std::vector<int64_t> sizes(c.size(), 0);
        for (size_t i = 0; is_root && i < blobs.size(); ++i) {
          sizes[i] = static_cast<int64_t>(blobs[i].size());
        }
        absl::Status s = c.Broadcast(sizes.data(), sizes.size(), DType::kInt64, root, d);
        if (!s.ok()) return s;
        int64_t largest = *std::max_element(sizes.begin(), sizes.end());
        std::string flat;
        if (is_root) {
          flat.resize(largest * c.size());
          for (size_t i = 0; i < blobs.size(); ++i) {
            std::memcpy(flat.data() + i * largest, blobs[i].data(), blobs[i].size());
          }
        }
        std::string mine(largest, '\0');
        s = c.Scatter(flat.data(), mine.data(), largest, DType::kUInt8, root, d);
        if (!s.ok()) return s;
        mine.resize(sizes[c.rank()]);
        *out = std::move(mine);
        return absl::OkStatus();
      });
}

std::shared_ptr<Work> ProcessGroup::ISend(Tensor t, int dst, uint64_t tag) {
  return impl_->SubmitP2P(true, t, dst, tag);
}

std::shared_ptr<Work> ProcessGroup::IRecv(Tensor t, int src, uint64_t tag) {
  // (-1 is SubmitP2P's "any source": only IRecvAnySource means it.)
  if (src < 0) return Failed(GroupRank(src).status());
  return impl_->SubmitP2P(false, t, src, tag);
}

std::shared_ptr<Work> ProcessGroup::IRecvAnySource(Tensor t, uint64_t tag) {
  return impl_->SubmitP2P(false, t, -1, tag);
}

std::vector<std::shared_ptr<Work>> ProcessGroup::BatchISendIRecv(
    const std::vector<P2PRequest>& requests) {
  std::vector<std::shared_ptr<Work>> works;
  std::vector<const Tensor*> all;
  for (const P2PRequest& r : requests) all.push_back(&r.tensor);
  absl::StatusOr<Device> device = TensorsDevice(all, "batch_isend_irecv");
  if (device.ok()) {
    if (absl::Status s = impl_->DeviceStatus(*device, "batch_isend_irecv"); !s.ok()) device = s;
  }
  if (device.ok() && *device == Device::kCuda && impl_->daemon_gpu() && !requests.empty()) {
    // One grouped launch, like ncclGroupStart/End around the batch.
    GpuCall g;
    g.op = v1::GPU_SEND_RECV;
    g.dtype = requests[0].tensor.dtype;
    std::shared_ptr<Work> work;
    for (const P2PRequest& r : requests) {
      auto group_rank = GroupRank(r.peer);
      if (!group_rank.ok()) {
        work = Failed(group_rank.status());
        break;
      }
      g.p2p.push_back({r.send, *group_rank, r.tensor});
    }
    if (work == nullptr) work = impl_->SubmitGpu(g);
    works.assign(requests.size(), work);
    return works;
  }
  if (!device.ok()) {
    works.assign(requests.size(), Failed(device.status()));
    return works;
  }
  for (const P2PRequest& r : requests) {
    works.push_back(r.peer < 0 ? Failed(GroupRank(r.peer).status())
                               : impl_->SubmitP2P(r.send, r.tensor, r.peer, r.tag));
  }
  return works;
}

// ProcessGroup::Impl.

// The SDK's built-in backends, registered once like a third party's.
void ProcessGroup::Impl::RegisterSdkBackends() { RegisterSdkBackendsOnce(); }

std::shared_ptr<ProcessGroup> ProcessGroup::Impl::Create(
    std::shared_ptr<WorldSession> session, const InitOptions& world, int slot,
    const std::vector<int>& ranks, const std::map<std::string, std::string>& config,
    const v1::GroupInfo& info) {
  auto impl = std::make_unique<Impl>(std::move(session), world, slot, ranks, info);
  impl->CreateBackends(config, info);
  impl->OpenTrace(info);
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

ProcessGroup::Impl::Impl(std::shared_ptr<WorldSession> session, const InitOptions& world, int slot,
                         const std::vector<int>& ranks, const v1::GroupInfo& info)
    : session_(std::move(session)),
      world_(world),
      slot_(slot),
      name_(info.name()),
      tag_(info.tag()),
      backend_(info.backend()),
      ranks_(ranks) {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == world_.rank) rank_ = static_cast<int>(i);
  }
  if (info.timeout_millis() > 0) timeout_ = absl::Milliseconds(info.timeout_millis());
}

void ProcessGroup::Impl::OpenTrace(const v1::GroupInfo& info) {
  if (!is_member() || world_.trace_records <= 0 || info.shm_name().empty()) return;
  int index = -1;
  for (int i = 0; i < info.shm_group_ranks_size(); ++i) {
    if (info.shm_group_ranks(i) == rank_) index = i;
  }
  if (index < 0) return;
  absl::StatusOr<std::unique_ptr<GroupSegment>> segment =
      GroupSegment::Open(info.shm_name(), info.shm_group_ranks_size());
  if (!segment.ok()) return;  // the backend reports what is wrong with it
  trace_segment_ = std::shared_ptr<GroupSegment>(std::move(*segment));
  auto writer = std::make_shared<TraceWriter>(trace_segment_.get(), index,
                                              static_cast<uint64_t>(world_.trace_records));
  if (writer->enabled()) trace_ = std::move(writer);
}

void ProcessGroup::Impl::CreateBackends(const std::map<std::string, std::string>& config,
                                        const v1::GroupInfo& info) {
  for (Device device : {Device::kCpu, Device::kCuda}) {
    absl::Status& status = device == Device::kCpu ? cpu_status_ : cuda_status_;
    auto it = config.find(DeviceName(device));
    if (it == config.end()) {
      status = absl::InvalidArgumentError(
          absl::StrCat(device == Device::kCpu ? "CPU" : "CUDA", " tensors on a group without a ",
                       DeviceName(device), " backend (group '", name_, "', backend '", backend_,
                       "'; create it with e.g. \"cpu:gloo,cuda:nccl\")"));
      continue;
    }
    if (!is_member()) {
      status = absl::InvalidArgumentError(
          absl::StrCat("rank ", world_.rank, " is not a member of group '", name_, "'"));
      continue;
    }
    const std::string& backend = it->second;
    BackendOptions o;
    o.group_name = name_;
    o.group_rank = rank_;
    o.group_size = size();
    o.global_ranks = ranks_;
    o.device = DeviceName(device);
    o.timeout = timeout_;
    for (const auto& m : info.members()) o.member_nodes.push_back(m.daemon());
    o.shm_name = info.shm_name();
    o.shm_group_ranks.assign(info.shm_group_ranks().begin(), info.shm_group_ranks().end());
    if (auto address = LocalAddressToward(world_.master_addr, world_.master_port); address.ok()) {
      o.local_address = *address;
    }
    // Gloo's keys keep their historical prefix; other backends get their own.
    // A group formed again under a later job epoch connects afresh (no
    // member may read the addresses of an earlier epoch).
    std::string prefix =
        absl::StrCat(backend == "gloo" || backend == "shm" ? "muster-gloo" : "muster-" + backend,
                     "/", world_.job_id, "/", world_.generation, "/",
                     info.epoch() > 0 ? absl::StrCat("e", info.epoch(), "/") : "", name_);
    InitOptions w = world_;
    absl::Duration timeout = timeout_;
    o.connect_store = [w, timeout, prefix]() -> absl::StatusOr<std::shared_ptr<Store>> {
      TcpStoreOptions t;
      t.host = w.master_addr;
      t.port = w.master_port;
      t.token = w.store_token;
      t.timeout = timeout;
      ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> tcp, TcpStore::Connect(t));
      return std::shared_ptr<Store>(
          std::make_shared<PrefixStore>(prefix, std::shared_ptr<Store>(std::move(tcp))));
    };
    absl::StatusOr<std::unique_ptr<Backend>> created = BackendRegistry::Global().Create(backend, o);
    if (!created.ok()) {
      status = Annotate(created.status(), absl::StrCat("backend '", backend, "'"));
      continue;
    }
    if (device == Device::kCpu) {
      cpu_backend_ = std::move(*created);
    } else {
      daemon_gpu_ = dynamic_cast<DaemonGpuBackend*>(created->get()) != nullptr;
      cuda_backend_ = std::move(*created);
    }
  }
}

ProcessGroup::Impl::~Impl() {
  {
    absl::MutexLock lock(&exec_mu_);
    stopping_ = true;
    exec_cv_.SignalAll();
  }
  if (executor_.joinable()) executor_.join();
  // The executor saw running_ clear; a caller that ran its own collective
  // may still be reading progress_waiters_ or signalling: wait for that.
  while (in_tail_.load(std::memory_order_acquire)) std::this_thread::yield();
  // Pending point to point fails CANCELLED (through Works that use this
  // group's session and ranks: before those go).
  cpu_backend_.reset();
  cuda_backend_.reset();
  if (trace_ != nullptr) BeginDeferred();
  for (Queued& q : queue_) {
    if (trace_ != nullptr) {
      trace_->Finished(q.trace_id, static_cast<int>(absl::StatusCode::kCancelled),
                       TraceClockNanos());
    }
    Work::Impl::Of(*q.work).Complete(
        absl::CancelledError(absl::StrCat("group '", name_, "' was destroyed")));
  }
}

std::shared_ptr<Work> ProcessGroup::Impl::Submit(Device device, const TraceCall& call, Op op) {
  std::shared_ptr<Work> work = Work::Impl::Create();
  Work::Impl& w = Work::Impl::Of(*work);
  absl::Status gone = SessionStatus();
  absl::MutexLock lock(&exec_mu_);
  w.set_sequence(++submitted_);
  // A call that will start at once (nothing queued or running before it:
  // the caller's own Wait, or the executor within its poll period) is
  // recorded when it starts, in one write; one queued behind others is
  // recorded now, as submitted, and so are those ahead of it.
  const bool defer = trace_ != nullptr && queue_.empty() && !running_ && !stopping_ && gone.ok();
  // The exact clock only where its precision is used: a record begun now,
  // or the executor's 1 ms grace while it runs collectives (asynchronous
  // use). A synchronous loop (every caller runs its own; the executor
  // idle) reads the kernel's tick instead: each exact read cost ~60 ns of
  // a 1.2 us world-2 all_reduce (docs/benchmarks.md).
  const bool coarse = !executor_busy_ && (trace_ == nullptr || defer);
  const int64_t now_ns = coarse ? TraceCoarseClockNanos() : TraceClockNanos();
  if (trace_ != nullptr && !defer) BeginDeferred();
  const uint64_t trace_id =
      trace_ != nullptr && !defer ? trace_->Begin(submitted_, call, now_ns) : 0;
  if (stopping_ || !gone.ok()) {
    absl::Status failed =
        stopping_ ? absl::CancelledError(absl::StrCat("group '", name_, "' was destroyed"))
                  : std::move(gone);
    if (trace_ != nullptr) {
      trace_->Finished(trace_id, static_cast<int>(failed.code()), now_ns);
    }
    w.Complete(std::move(failed));
    return work;
  }
  w.set_group(this);
  queue_.push_back(
      Queued{device, std::move(op), work, now_ns, coarse, trace_id, defer, submitted_, call});
  if (executor_sleeping_) {
    kick_ = true;
    exec_cv_.Signal();
  }
  if (!executor_.joinable()) executor_ = std::thread([this] { RunExecutor(); });
  return work;
}

bool ProcessGroup::Impl::HeadRunnable() const { return !running_ && !queue_.empty(); }

void ProcessGroup::Impl::RunHead() {
  running_.store(true, std::memory_order_relaxed);  // under exec_mu_
  in_tail_.store(true, std::memory_order_relaxed);
  Queued item = std::move(queue_.front());
  queue_.pop_front();
  exec_mu_.Unlock();
  absl::Status status = item.device == Device::kCpu ? cpu_status_ : cuda_status_;
  Backend* backend = backend_for(item.device);
  Communicator* comm = backend != nullptr ? backend->communicator() : nullptr;
  if (status.ok() && comm == nullptr) {
    status = absl::UnimplementedError(
        absl::StrCat("backend '", backend->name(), "' of group '", name_, "' runs no collectives"));
  }
  if (status.ok()) status = SessionStatus();
  if (status.ok()) {
    // The deadline needs no exact start: without a recorder it counts from
    // a tick later (never earlier than timeout_ after the start).
    const int64_t start_ns = trace_ != nullptr
                                 ? TraceClockNanos()
                                 : TraceCoarseClockNanos() + TraceCoarseResolutionNanos();
    if (trace_ != nullptr) {
      if (item.deferred) {
        item.trace_id =
            trace_->BeginStarted(item.seq, item.call, SubmittedNanos(item, start_ns), start_ns);
      } else {
        trace_->Started(item.trace_id, start_ns);
      }
    }
    status = item.op(*comm, absl::FromUnixNanos(start_ns) + timeout_);
  } else if (trace_ != nullptr && item.deferred) {
    item.trace_id = trace_->Begin(item.seq, item.call, item.submitted_ns);
  }
  if (!status.ok()) status = Explain(std::move(status));
  if (trace_ != nullptr) {
    trace_->Finished(item.trace_id, static_cast<int>(status.code()), TraceClockNanos());
  }
  Work::Impl::Of(*item.work).Complete(std::move(status));
  // Without exec_mu_ (a synchronous collective takes it once less): whoever
  // waits for running_ to clear counted itself in progress_waiters_ (or set
  // expedite_) before it looked at running_, all sequentially consistent,
  // so either it sees running_ clear or this sees it waiting and wakes it
  // under the lock. Only those: the polling executor is not woken per
  // collective (that cost a context switch each on the other core).
  running_.store(false, std::memory_order_seq_cst);
  if (progress_waiters_.load(std::memory_order_seq_cst) > 0 ||
      expedite_.load(std::memory_order_seq_cst)) {
    absl::MutexLock lock(&exec_mu_);
    exec_cv_.SignalAll();
  }
  // The last touch of this group by the runner (see ~Impl).
  in_tail_.store(false, std::memory_order_release);
}

void ProcessGroup::Impl::BeginDeferred() {
  for (Queued& q : queue_) {
    if (!q.deferred) continue;
    q.deferred = false;
    q.trace_id = trace_->Begin(q.seq, q.call, q.submitted_ns);
  }
}

bool ProcessGroup::Impl::QueuedFor(const Queued& q, absl::Duration age) {
  if (!q.coarse) return TraceClockNanos() - q.submitted_ns >= absl::ToInt64Nanoseconds(age);
  return TraceCoarseClockNanos() - q.submitted_ns >=
         absl::ToInt64Nanoseconds(age) + TraceCoarseResolutionNanos();
}

int64_t ProcessGroup::Impl::SubmittedNanos(const Queued& q, int64_t start_ns) {
  if (q.coarse && start_ns - q.submitted_ns < TraceCoarseResolutionNanos()) return start_ns;
  return std::min(q.submitted_ns, start_ns);
}

void ProcessGroup::Impl::Expedite() {
  absl::MutexLock lock(&exec_mu_);
  expedite_ = true;
  if (executor_sleeping_) kick_ = true;
  exec_cv_.SignalAll();
}

void ProcessGroup::Impl::RunExecutor() {
  // Runs collectives nobody waits for (asynchronous use), in order. It does
  // not wake on every Submit: a caller that waits runs its own collective
  // (RunUntil), so the executor polls and takes only collectives that have
  // been queued for kPoll; after 100 ms without work it sleeps until Submit
  // kicks it. Waking it on every Submit cost a context switch per
  // collective on a 2-core machine. It polls every kPoll only while it has
  // run a collective in the last kBusyWindow (asynchronous use, such as
  // DDP's buckets every step); while every caller runs its own (a
  // synchronous loop: the queue is never empty for 100 ms, so it never
  // sleeps) it polls every kSlowPoll: each poll preempts the rank on its
  // core, and at 1 ms those preemptions set the p99 of a 4-byte all_reduce
  // (docs/benchmarks.md). The first asynchronous collective after such a
  // stretch waits up to kSlowPoll for the executor (or its caller's Wait).
  constexpr absl::Duration kPoll = absl::Milliseconds(1);
  constexpr absl::Duration kSlowPoll = absl::Milliseconds(20);
  constexpr absl::Duration kBusyWindow = absl::Seconds(2);
  absl::MutexLock lock(&exec_mu_);
  absl::Time idle_since = absl::Now();
  absl::Time ran_at = absl::InfinitePast();  // the last collective this thread ran
  while (true) {
    if (stopping_) {
      ++progress_waiters_;
      while (running_) exec_cv_.Wait(&exec_mu_);
      --progress_waiters_;
      return;
    }
    if (queue_.empty() && absl::Now() - idle_since > absl::Milliseconds(100)) {
      executor_sleeping_ = true;
      while (!stopping_ && !kick_) exec_cv_.Wait(&exec_mu_);
      executor_sleeping_ = false;
      kick_ = false;
      idle_since = absl::Now();
      continue;
    }
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_) {
      return stopping_ || (expedite_ && !queue_.empty() && !running_);
    };
    const absl::Time now = absl::Now();
    executor_busy_ = now - ran_at < kBusyWindow;
    const absl::Time poll_until = now + (executor_busy_ ? kPoll : kSlowPoll);
    while (!woken() && !exec_cv_.WaitWithDeadline(&exec_mu_, poll_until)) {
    }
    if (stopping_) continue;
    if (queue_.empty()) {
      expedite_ = false;
      continue;
    }
    idle_since = absl::Now();
    if (HeadRunnable() && (expedite_ || QueuedFor(queue_.front(), kPoll))) {
      RunHead();
      ran_at = absl::Now();
      exec_mu_.Lock();
    }
  }
}

void ProcessGroup::Impl::RunUntil(const Work::Impl* work, absl::Time deadline) {
  exec_mu_.Lock();
  while (!work->IsCompleted()) {
    if (HeadRunnable()) {
      RunHead();
      if (work->IsCompleted()) return;  // the usual case: it ran our own
      exec_mu_.Lock();
      continue;
    }
    // Someone else runs a collective (maybe ours): wait for it to finish.
    auto progress = [this, work]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_) {
      return !running_ || work->IsCompleted();
    };
    ++progress_waiters_;
    bool timed_out = false;
    while (!progress() && !timed_out) timed_out = exec_cv_.WaitWithDeadline(&exec_mu_, deadline);
    --progress_waiters_;
    if (!progress()) break;                                          // the deadline passed
    if (queue_.empty() && !running_ && !work->IsCompleted()) break;  // not ours to run
  }
  exec_mu_.Unlock();
}

absl::Status ProcessGroup::Impl::DeviceStatus(Device device, const char* what) const {
  const absl::Status& status = device == Device::kCpu ? cpu_status_ : cuda_status_;
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

std::shared_ptr<Work> ProcessGroup::Impl::Route(Routed* routed, const char* what,
                                                absl::Span<const Tensor* const> tensors,
                                                absl::FunctionRef<GpuCall()> make_call) {
  absl::StatusOr<Device> on = TensorsDevice(tensors, what);
  if (!on.ok()) return Failed(on.status());
  if (absl::Status s = DeviceStatus(*on, what); !s.ok()) return Failed(s);
  routed->device = *on;
  if (*on == Device::kCuda && daemon_gpu_) return SubmitGpu(make_call());
  absl::StatusOr<std::shared_ptr<StreamFence>> fence = FenceFor(*on, tensors);
  if (!fence.ok()) return Failed(Annotate(fence.status(), what));
  routed->fence = std::move(*fence);
  return nullptr;
}

absl::StatusOr<std::shared_ptr<StreamFence>> ProcessGroup::Impl::FenceFor(
    Device device, absl::Span<const Tensor* const> tensors) const {
  if (device != Device::kCuda || daemon_gpu_) return nullptr;
  return StreamFence::Record(tensors);
}

std::shared_ptr<Work> ProcessGroup::Impl::Submit(const Routed& routed, const TraceCall& call,
                                                 Op op) {
  if (routed.fence == nullptr) return Submit(routed.device, call, std::move(op));
  return Submit(
      routed.device, call,
      [fence = routed.fence, op = std::move(op)](Communicator& c, absl::Time deadline) mutable {
        if (absl::Status s = fence->Wait(deadline); !s.ok()) return s;
        return op(c, deadline);
      });
}

std::shared_ptr<Work> ProcessGroup::Impl::SubmitP2P(bool send, Tensor t, int peer, uint64_t tag) {
  const char* what = send ? "send" : "recv";
  if (absl::Status s = CheckTensor(t, what); !s.ok()) return Failed(s);
  const bool any_source = !send && peer == -1;
  absl::StatusOr<int> group_rank =
      any_source ? absl::StatusOr<int>(PointToPoint::kAnySource) : GroupRank(peer);
  if (!group_rank.ok()) return Failed(group_rank.status());
  if (any_source && t.device != Device::kCpu) {
    return Failed(absl::UnimplementedError(
        "recv from any source: only CPU tensors (NCCL matches messages by peer)"));
  }
  Routed on;
  if (auto gpu = Route(&on, what, {&t}, [&] {
        // NCCL has no tags: messages between two ranks match in order.
        GpuCall g;
        g.op = v1::GPU_SEND_RECV;
        g.dtype = t.dtype;
        g.p2p.push_back({send, *group_rank, t});
        return g;
      })) {
    return gpu;
  }
  if (absl::Status gone = SessionStatus(); !gone.ok()) return Failed(gone);
  Backend* backend = backend_for(on);
  PointToPoint* p2p = backend != nullptr ? backend->point_to_point() : nullptr;
  if (p2p == nullptr) {
    return Failed(absl::UnimplementedError(absl::StrCat("point-to-point: backend '",
                                                        backend != nullptr ? backend->name() : "",
                                                        "' of group '", name_, "' has none")));
  }
  if (absl::Status s = p2p->Validate(send, *group_rank, tag); !s.ok()) return Failed(s);
  // Posting starts the transfer: the stream's earlier work must be done.
  if (on.fence != nullptr) {
    if (absl::Status s = on.fence->Wait(absl::Now() + timeout_); !s.ok()) return Failed(s);
  }
  std::shared_ptr<Work> work = Work::Impl::Create();
  const int64_t now_ns = TraceClockNanos();
  const absl::Time now = absl::FromUnixNanos(now_ns);
  uint64_t trace_id = 0;
  if (trace_ != nullptr) {
    TraceCall call =
        Traced(send ? TraceOp::kSend : TraceOp::kRecv, t, any_source ? -2 : *group_rank);
    call.tag = tag;
    trace_id = trace_->Begin(0, call, now_ns);
    trace_->Started(trace_id, now_ns);
  }
  p2p->Post(send, *group_rank, tag, t.data, t.bytes(), now + timeout_,
            [work, this, trace_id](absl::Status s, int source) {
              // Cancelled because this group is being destroyed: not a sign
              // that musterd went away (Explain waits up to a second for
              // that, for every pending operation in turn).
              if (!s.ok() && !Destroying()) s = Explain(std::move(s));
              if (trace_ != nullptr) {
                trace_->Finished(trace_id, static_cast<int>(s.code()), TraceClockNanos());
              }
              Work::Impl::Of(*work).Complete(std::move(s), source >= 0 ? ranks_[source] : -1);
            });
  return work;
}

bool ProcessGroup::Impl::Destroying() const {
  absl::MutexLock lock(&exec_mu_);
  return stopping_;
}

absl::Status ProcessGroup::Impl::SessionStatus() const {
  return session_ != nullptr ? session_->status() : absl::OkStatus();
}

absl::Status ProcessGroup::Impl::Explain(absl::Status status) const {
  return session_ != nullptr ? session_->Explain(std::move(status)) : status;
}

void ProcessGroup::Impl::BreakForDaemon(const absl::Status& gone) {
  // The built-in CPU backends wake a collective waiting in shared memory
  // and fail later ones (a Gloo collective in flight finishes with its
  // peers, then the meshes close), and end point-to-point waits.
  if (cpu_backend_ != nullptr) cpu_backend_->Abort(gone);
  if (cuda_backend_ != nullptr) cuda_backend_->Abort(gone);
}

std::shared_ptr<Work> ProcessGroup::Impl::SubmitGpu(const GpuCall& call) {
  if (!is_member()) {
    return Failed(absl::FailedPreconditionError(
        absl::StrCat("this rank is not a member of group '", name_, "'")));
  }
  // musterd runs the GPU collectives: nothing to do without it.
  if (absl::Status gone = SessionStatus(); !gone.ok()) return Failed(gone);
  std::shared_ptr<GpuPath> path;
  {
    absl::MutexLock lock(&gpu_mu_);
    if (gpu_ == nullptr) {
      absl::StatusOr<CudaDriver*> driver = SystemCudaDriver();
      if (!driver.ok()) return Failed(driver.status());
      std::shared_ptr<v1::Gpu::Stub> stub = v1::Gpu::NewStub(session_->channel());
      // musterd answers within the group timeout twice over: waiting for
      // the node's other members to issue the collective, then creating
      // the communicator (first call).
      const absl::Duration deadline = 2 * timeout_ + absl::Seconds(10);
      GpuTransport transport = [stub, deadline](const v1::GpuCollectiveRequest& request)
          -> absl::StatusOr<v1::GpuCollectiveResponse> {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
        v1::GpuCollectiveResponse response;
        grpc::Status s = stub->Collective(&context, request, &response);
        if (!s.ok()) {
          return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
        }
        return response;
      };
      GpuStatusCheck status_check = [stub, job = world_.job_id, rank = slot_,
                                     group = name_](uint64_t sequence) -> absl::Status {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
        v1::CollectiveStatusRequest request;
        request.mutable_caller()->set_job_id(job);
        request.mutable_caller()->set_global_rank(rank);
        request.set_group(group);
        request.set_sequence(sequence);
        v1::CollectiveStatusResponse response;
        grpc::Status s = stub->CollectiveStatus(&context, request, &response);
        if (!s.ok()) {
          return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
        }
        return absl::OkStatus();
      };
      gpu_ = std::make_shared<GpuPath>(*driver, std::move(transport), world_.job_id, slot_, name_,
                                       std::move(status_check), deadline, timeout_);
    }
    path = gpu_;
  }
  const int64_t submitted_ns = TraceClockNanos();
  absl::StatusOr<GpuPath::Launched> launched = path->Run(call);
  // The recorder: submitted when asked, started when musterd enqueued it on
  // the stream, completed when a Synchronize saw the GPU pass it.
  uint64_t trace_id = 0;
  if (trace_ != nullptr) {
    TraceCall t = GpuTraceCall(call);
    trace_id = trace_->Begin(launched.ok() ? launched->sequence : 0, t, submitted_ns);
    if (!launched.ok()) {
      trace_->Finished(trace_id, static_cast<int>(launched.status().code()), TraceClockNanos());
    } else {
      trace_->Started(trace_id, TraceClockNanos());
    }
  }
  if (!launched.ok()) return Failed(Explain(launched.status()));
  std::shared_ptr<Work> work = Work::Impl::Create();
  Work::Impl& w = Work::Impl::Of(*work);
  w.set_sequence(launched->sequence);
  std::shared_ptr<void> marker(launched->marker, [path](void* e) { path->Release(e); });
  // The Work may outlive the group: it keeps the ring's mapping.
  w.set_synchronize([path, marker, sequence = launched->sequence, segment = trace_segment_,
                     trace = trace_, trace_id](absl::Time deadline) {
    absl::Status s = path->Synchronize(marker.get(), sequence, deadline);
    if (trace != nullptr && s.code() != absl::StatusCode::kDeadlineExceeded) {
      trace->Finished(trace_id, static_cast<int>(s.code()), TraceClockNanos());
    }
    return s;
  });
  w.Complete(absl::OkStatus());
  return work;
}

absl::StatusOr<int> ProcessGroup::Impl::GroupRank(int global_rank) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == global_rank) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", global_rank, " is not in group '", name_, "'"));
}

absl::StatusOr<int> ProcessGroup::Impl::GlobalRank(int group_rank) const {
  if (group_rank < 0 || group_rank >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("group rank ", group_rank, " is outside group '",
                                                   name_, "' of size ", size()));
  }
  return ranks_[group_rank];
}

absl::Status ProcessGroup::Impl::Barrier(absl::Duration timeout) {
  if (!is_member()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", world_.rank, " is not a member of group '", name_, "'"));
  }
  int64_t sequence;
  {
    absl::MutexLock lock(&barrier_mu_);
    sequence = ++barrier_sequence_;
  }
  v1::BarrierRequest req;
  req.mutable_caller()->set_job_id(world_.job_id);
  req.mutable_caller()->set_global_rank(slot_);
  req.set_name(name_);
  req.set_sequence(sequence);
  if (timeout > absl::ZeroDuration()) {
    req.mutable_timeout()->set_millis(absl::ToInt64Milliseconds(timeout));
  }
  absl::Duration rpc =
      (timeout > absl::ZeroDuration() ? timeout : world_.timeout) + absl::Seconds(30);
  v1::BarrierResponse resp;
  return session_->Call(absl::StrCat("barrier on group '", name_, "'"), rpc,
                        [&](grpc::ClientContext* context) {
                          return session_->groups()->Barrier(context, req, &resp);
                        });
}

}  // namespace muster
