#include "client/gpu_path.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace muster {

absl::StatusOr<DeviceBufferExporter::Exported> DeviceBufferExporter::Export(const void* ptr,
                                                                            size_t bytes) {
  absl::StatusOr<CudaDriver::Allocation> a = driver_->FindAllocation(ptr);
  if (!a.ok()) return a.status();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p + bytes > a->base + a->size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA buffer of ", bytes, " bytes at 0x", absl::Hex(p), " runs past the end of its ",
        a->size, "-byte allocation at 0x", absl::Hex(a->base)));
  }
  absl::StatusOr<std::string> handle = driver_->ExportAllocation(*a);
  if (!handle.ok()) return handle.status();
  // Allocations that overlap this one but differ are gone (freed, and the
  // memory reused): the daemon may close them.
  auto it = known_.lower_bound(a->base);
  if (it != known_.begin()) --it;
  while (it != known_.end() && it->first < a->base + a->size) {
    const bool overlaps = it->first + it->second.size > a->base;
    const bool same = it->first == a->base && it->second.handle == *handle;
    if (overlaps && !same) {
      released_.push_back(it->second.handle);
      it = known_.erase(it);
    } else {
      ++it;
    }
  }
  known_[a->base] = Known{a->size, *handle};
  Exported e;
  e.buffer.set_ipc_handle(*handle);
  e.buffer.set_offset(p - a->base);
  e.buffer.set_bytes(bytes);
  e.pci_bus_id = a->pci_bus_id;
  e.context = a->context;
  return e;
}

std::vector<std::string> DeviceBufferExporter::TakeReleased() {
  std::vector<std::string> out;
  out.swap(released_);
  return out;
}

absl::StatusOr<Device> TensorsDevice(absl::Span<const Tensor* const> tensors, const char* what) {
  int cpu = 0, cuda = 0;
  for (const Tensor* t : tensors) {
    if (t == nullptr) continue;
    (t->device == Device::kCuda ? cuda : cpu)++;
  }
  if (cpu > 0 && cuda > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": mixes CPU and CUDA tensors (", cpu, " CPU, ", cuda, " CUDA)"));
  }
  return cuda > 0 ? Device::kCuda : Device::kCpu;
}

GpuPath::GpuPath(CudaDriver* driver, GpuTransport transport, std::string job_id, int global_rank,
                 std::string group, GpuStatusCheck status_check, absl::Duration call_timeout,
                 absl::Duration group_timeout)
    : driver_(driver),
      transport_(std::move(transport)),
      status_check_(std::move(status_check)),
      job_id_(std::move(job_id)),
      global_rank_(global_rank),
      group_(std::move(group)),
      call_timeout_(call_timeout),
      group_timeout_(group_timeout),
      exporter_(driver) {}

GpuPath::~GpuPath() {
  absl::MutexLock lock(&mu_);
  if (ready_ != nullptr) driver_->DestroyEvent(ready_);
  if (done_ != nullptr) driver_->DestroyEvent(done_);
}

absl::Status GpuPath::EnsureEvents(void* context) {
  if (ready_ != nullptr) {
    if (context != context_) {
      return absl::InvalidArgumentError(
          "CUDA tensors of one group must stay on one device (this group's first collective "
          "used another CUDA context)");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<void*> ready = driver_->CreateIpcEvent(context, &ready_handle_);
  if (!ready.ok()) return ready.status();
  absl::StatusOr<void*> done = driver_->CreateIpcEvent(context, &done_handle_);
  if (!done.ok()) {
    driver_->DestroyEvent(*ready);
    return done.status();
  }
  context_ = context;
  ready_ = *ready;
  done_ = *done;
  return absl::OkStatus();
}

absl::StatusOr<GpuPath::Launched> GpuPath::Run(const GpuCall& call) {
  absl::MutexLock lock(&mu_);
  v1::GpuCollectiveRequest request;
  request.mutable_caller()->set_job_id(job_id_);
  request.mutable_caller()->set_global_rank(global_rank_);
  request.set_group(group_);
  request.set_op(call.op);
  request.set_dtype(static_cast<int>(call.dtype));
  request.set_count(call.count);
  request.set_root(call.root);
  request.set_reduce_op(static_cast<int>(call.reduce_op));
  request.set_scale(call.scale);
  for (size_t c : call.send_counts) request.add_send_counts(c);
  for (size_t c : call.recv_counts) request.add_recv_counts(c);

  std::string bus_id;
  void* context = nullptr;
  void* stream = nullptr;
  bool first = true;
  auto add = [&](const Tensor& t, v1::GpuBuffer* out) -> absl::Status {
    absl::StatusOr<DeviceBufferExporter::Exported> e = exporter_.Export(t.data, t.bytes());
    if (!e.ok()) return e.status();
    if (first) {
      bus_id = e->pci_bus_id;
      context = e->context;
      stream = t.stream;
      first = false;
    } else if (e->pci_bus_id != bus_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA tensors of one collective are on different GPUs (", bus_id, " and ",
                       e->pci_bus_id, ")"));
    }
    *out = e->buffer;
    return absl::OkStatus();
  };
  for (const Tensor& t : call.inputs) {
    if (absl::Status s = add(t, request.add_inputs()); !s.ok()) return s;
  }
  for (const Tensor& t : call.outputs) {
    if (absl::Status s = add(t, request.add_outputs()); !s.ok()) return s;
  }
  for (const GpuCall::PointToPoint& op : call.p2p) {
    v1::GpuPointToPoint* p = request.add_p2p();
    p->set_send(op.send);
    p->set_peer(op.peer);
    if (absl::Status s = add(op.tensor, p->mutable_buffer()); !s.ok()) return s;
  }
  if (first) return absl::InvalidArgumentError("a GPU collective without CUDA tensors");
  request.set_pci_bus_id(bus_id);
  if (absl::Status s = EnsureEvents(context); !s.ok()) return s;
  for (std::string& h : exporter_.TakeReleased()) request.add_released_handles(std::move(h));
  request.set_ready_event(ready_handle_);
  request.set_done_event(done_handle_);
  request.set_sequence(++sequence_);
  if (group_timeout_ > absl::ZeroDuration()) {
    request.set_timeout_millis(std::max<int64_t>(1, absl::ToInt64Milliseconds(group_timeout_)));
  }

  // The daemon's stream starts after the work already on ours...
  if (absl::Status s = driver_->RecordEvent(ready_, stream, context); !s.ok()) return s;
  absl::Status sent = absl::UnavailableError("no channel");
  if (channel_ != nullptr) {
    std::string bytes = request.SerializeAsString();
    absl::StatusOr<uint64_t> launched = channel_->Call(bytes, absl::Now() + call_timeout_);
    if (launched.ok()) {
      ++channel_calls_;
      sent = absl::OkStatus();
    } else if (absl::IsUnavailable(launched.status()) ||
               absl::IsResourceExhausted(launched.status())) {
      if (channel_->closed()) channel_.reset();  // the daemon closed it: gRPC says why
    } else {
      // Unanswered (DeadlineExceeded): the daemon may still read this
      // request from the segment, so the next one must not overwrite it
      // there; gRPC carries the rank's later requests.
      if (absl::IsDeadlineExceeded(launched.status())) channel_.reset();
      return launched.status();
    }
  }
  if (!sent.ok()) {
    absl::StatusOr<v1::GpuCollectiveResponse> response = transport_(request);
    if (!response.ok()) return response.status();
    if (channel_ == nullptr && !response->channel().empty()) {
      absl::StatusOr<std::unique_ptr<GpuChannel>> channel = GpuChannel::Open(response->channel());
      if (channel.ok()) channel_ = std::move(*channel);  // else gRPC stays the path
    }
  }
  // ...and ours continues after the collective.
  if (absl::Status s = driver_->StreamWaitEvent(stream, done_, context); !s.ok()) return s;
  absl::StatusOr<void*> marker = driver_->CreateEvent(context);
  if (!marker.ok()) return marker.status();
  if (absl::Status s = driver_->RecordEvent(*marker, stream, context); !s.ok()) {
    driver_->DestroyEvent(*marker);
    return s;
  }
  return Launched{sequence_, *marker};
}

absl::Status GpuPath::Synchronize(void* event, uint64_t sequence, absl::Time deadline) {
  int spins = 0;
  while (true) {
    absl::StatusOr<bool> done = driver_->EventDone(event);
    if (!done.ok()) return done.status();
    if (*done) return status_check_ ? status_check_(sequence) : absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("GPU collective on group ", group_, " has not finished on the GPU"));
    }
    if (++spins > 1000) absl::SleepFor(absl::Microseconds(20));
  }
}

void GpuPath::Release(void* event) { driver_->DestroyEvent(event); }

}  // namespace muster
