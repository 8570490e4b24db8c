// The SDK's GPU path without a GPU: routing, the buffer exporter, and
// GpuPath talking to a real NcclEngine (on FakeGpuRuntime) in-process, with
// a fake CUDA driver whose "device memory" is host memory.
#include "client/gpu_path.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <future>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/fake_directory.h"
#include "daemon/gpu/fake_gpu_runtime.h"

namespace muster {
namespace {

// Host buffers registered as device allocations; handles are the fake
// runtime's (pointer) plus a generation byte so that a new allocation at an
// old address exports a different handle, as CUDA's do.
class FakeCudaDriver : public CudaDriver {
 public:
  ~FakeCudaDriver() override {
    for (FakeEvent* e : events_) delete e;
  }
  void Allocate(void* base, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(base)] = {size, ++generation_};
  }
  absl::StatusOr<Allocation> FindAllocation(const void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    auto it = allocations_.upper_bound(p);
    if (it == allocations_.begin()) return absl::InvalidArgumentError("not device memory");
    --it;
    if (p >= it->first + it->second.first) return absl::InvalidArgumentError("not device memory");
    Allocation a;
    a.base = it->first;
    a.size = it->second.first;
    a.pci_bus_id = "fake:0";
    a.context = this;
    return a;
  }
  absl::StatusOr<std::string> ExportAllocation(const Allocation& a) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string handle = FakeIpcHandle(reinterpret_cast<void*>(a.base));
    handle[8] = static_cast<char>(allocations_[a.base].second);
    return handle;
  }
  absl::StatusOr<void*> CreateIpcEvent(void*, std::string* handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto* e = new FakeEvent{"ipc" + std::to_string(events_.size())};
    events_.insert(e);
    *handle = FakeIpcHandle(e);
    return e;
  }
  absl::StatusOr<void*> CreateEvent(void*) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto* e = new FakeEvent{"marker"};
    events_.insert(e);
    ++markers_;
    return e;
  }
  void DestroyEvent(void* event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (events_.erase(static_cast<FakeEvent*>(event)) > 0) {
      delete static_cast<FakeEvent*>(event);
      ++destroyed_;
    }
  }
  absl::Status RecordEvent(void* event, void* stream, void*) override {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back("record " + static_cast<FakeEvent*>(event)->name + " on " +
                   std::to_string(reinterpret_cast<uintptr_t>(stream)));
    return absl::OkStatus();
  }
  absl::Status StreamWaitEvent(void* stream, void* event, void*) override {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back("wait " + static_cast<FakeEvent*>(event)->name + " on " +
                   std::to_string(reinterpret_cast<uintptr_t>(stream)));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> EventDone(void*) override { return done_; }

  std::vector<std::string> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  bool done_ = true;
  int markers_ = 0, destroyed_ = 0;

 private:
  std::mutex mu_;
  std::map<uintptr_t, std::pair<size_t, int>> allocations_;
  int generation_ = 0;
  std::set<FakeEvent*> events_;
  std::vector<std::string> log_;
};

// What musterd's gRPC service does with a request: the engine's answer
// once it launched (or failed) the collective. `seen` (if any) looks at
// each request first.
GpuTransport EngineTransport(NcclEngine& engine,
                             std::function<void(const v1::GpuCollectiveRequest&)> seen = nullptr) {
  return [&engine, seen](
             const v1::GpuCollectiveRequest& request) -> absl::StatusOr<v1::GpuCollectiveResponse> {
    if (seen) seen(request);
    std::promise<absl::StatusOr<uint64_t>> promise;
    engine.Collective(request, [&](absl::StatusOr<uint64_t> s) { promise.set_value(s); });
    absl::StatusOr<uint64_t> launched = promise.get_future().get();
    if (!launched.ok()) return launched.status();
    v1::GpuCollectiveResponse response;
    response.set_launched(*launched);
    return response;
  };
}

Tensor Cuda(void* data, size_t count, DType dtype, uintptr_t stream = 7) {
  Tensor t;
  t.data = data;
  t.count = count;
  t.dtype = dtype;
  t.device = Device::kCuda;
  t.stream = reinterpret_cast<void*>(stream);
  return t;
}

TEST_CASE("a call's tensors are on one device") {
  std::vector<float> a(4), b(4);
  Tensor cpu{a.data(), 4, DType::kFloat32};
  Tensor gpu = Cuda(b.data(), 4, DType::kFloat32);
  CHECK(*TensorsDevice({&cpu}, "all_reduce") == Device::kCpu);
  CHECK(*TensorsDevice({&gpu, nullptr}, "all_reduce") == Device::kCuda);
  CHECK(*TensorsDevice({}, "barrier") == Device::kCpu);
  auto mixed = TensorsDevice({&cpu, &gpu}, "all_gather");
  CHECK(absl::IsInvalidArgument(mixed.status()));
  CHECK(mixed.status().message() == "all_gather: mixes CPU and CUDA tensors (1 CPU, 1 CUDA)");
}

TEST_CASE("the exporter sends (allocation handle, offset) and reports replaced allocations") {
  FakeCudaDriver driver;
  std::vector<char> memory(4096);
  driver.Allocate(memory.data(), 1024);
  DeviceBufferExporter exporter(&driver);
  auto e = exporter.Export(memory.data() + 100, 200);
  REQUIRE(e.ok());
  CHECK(e->buffer.offset() == 100);
  CHECK(e->buffer.bytes() == 200);
  CHECK(e->pci_bus_id == "fake:0");
  CHECK(exporter.TakeReleased().empty());

  auto past = exporter.Export(memory.data() + 1000, 100);
  CHECK(absl::IsInvalidArgument(past.status()));
  CHECK(past.status().message().find("runs past the end of its 1024-byte allocation") !=
        std::string::npos);
  CHECK(absl::IsInvalidArgument(exporter.Export(memory.data() + 2048, 4).status()));

  // Freed and reallocated at the same address: a new handle; the old one
  // is released.
  const std::string old_handle = e->buffer.ipc_handle();
  driver.Allocate(memory.data(), 2048);
  auto again = exporter.Export(memory.data(), 4);
  REQUIRE(again.ok());
  CHECK(again->buffer.ipc_handle() != old_handle);
  CHECK(exporter.TakeReleased() == std::vector<std::string>{old_handle});
  // Same allocation again: nothing released.
  REQUIRE(exporter.Export(memory.data() + 8, 4).ok());
  CHECK(exporter.TakeReleased().empty());
}

TEST_CASE("GpuPath runs collectives through the NCCL engine and orders them on the stream") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngine engine(&runtime, &directory);
  FakeCudaDriver driver;
  GpuTransport transport = EngineTransport(engine);
  std::vector<std::vector<float>> data = {{1, 2, 3}, {10, 20, 30}};
  std::vector<std::vector<float>> gathered(2, std::vector<float>(6));
  std::vector<std::vector<float>> sendbuf = {{5}, {6}}, recvbuf = {{0}, {0}};
  for (int r = 0; r < 2; ++r) {
    driver.Allocate(data[r].data(), 12);
    driver.Allocate(gathered[r].data(), 24);
    driver.Allocate(sendbuf[r].data(), 4);
    driver.Allocate(recvbuf[r].data(), 4);
  }
  std::vector<absl::Status> status(2);
  std::vector<uint64_t> sequences(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      GpuPath path(&driver, transport, "job", r, "world");
      GpuCall all_reduce;
      all_reduce.op = v1::GPU_ALL_REDUCE;
      all_reduce.dtype = DType::kFloat32;
      all_reduce.count = 3;
      all_reduce.reduce_op = ReduceOp::kMax;
      all_reduce.inputs = {Cuda(data[r].data(), 3, DType::kFloat32)};
      auto a = path.Run(all_reduce);
      if (!a.ok()) {
        status[r] = a.status();
        return;
      }
      status[r] = path.Synchronize(a->marker, a->sequence, absl::Now() + absl::Seconds(5));
      path.Release(a->marker);
      GpuCall all_gather;
      all_gather.op = v1::GPU_ALL_GATHER;
      all_gather.dtype = DType::kFloat32;
      all_gather.count = 3;
      all_gather.inputs = {Cuda(data[r].data(), 3, DType::kFloat32)};
      all_gather.outputs = {Cuda(gathered[r].data(), 6, DType::kFloat32)};
      auto b = path.Run(all_gather);
      if (!b.ok()) {
        status[r] = b.status();
        return;
      }
      path.Release(b->marker);
      GpuCall exchange;
      exchange.op = v1::GPU_SEND_RECV;
      exchange.dtype = DType::kFloat32;
      exchange.p2p.push_back({true, 1 - r, Cuda(sendbuf[r].data(), 1, DType::kFloat32)});
      exchange.p2p.push_back({false, 1 - r, Cuda(recvbuf[r].data(), 1, DType::kFloat32)});
      auto c = path.Run(exchange);
      if (!c.ok()) {
        status[r] = c.status();
        return;
      }
      sequences[r] = c->sequence;
      path.Release(c->marker);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(status[r].ok());
    CHECK(data[r] == std::vector<float>{10, 20, 30});
    CHECK(gathered[r] == std::vector<float>{10, 20, 30, 10, 20, 30});
    CHECK(recvbuf[r][0] == sendbuf[1 - r][0]);
    CHECK(sequences[r] == 3);
  }
  // Each of the 6 collectives: the rank recorded its ready event on stream
  // 7, the daemon's stream waited on it and recorded the done event, and
  // stream 7 waits on that.
  auto count_prefix = [](const std::vector<std::string>& log, const std::string& prefix) {
    return std::count_if(log.begin(), log.end(),
                         [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
  };
  std::vector<std::string> rank_log = driver.log();
  std::vector<std::string> daemon_log = runtime.log();
  CHECK(count_prefix(rank_log, "record ipc") == 6);
  CHECK(count_prefix(rank_log, "wait ipc") == 6);
  CHECK(count_prefix(daemon_log, "wait ipc") == 6);
  CHECK(count_prefix(daemon_log, "record ipc") == 6);
  CHECK(driver.markers_ == 6);
  CHECK(driver.destroyed_ == 6 + 4);  // the markers, then each path's two events
}

TEST_CASE("GpuPath sends the group timeout: a member that comes late fails it on every member") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1}, absl::Seconds(20));
  NcclEngine engine(&runtime, &directory);
  FakeCudaDriver driver;
  std::vector<uint64_t> sent_timeouts(2);
  GpuTransport transport = EngineTransport(engine, [&](const v1::GpuCollectiveRequest& request) {
    sent_timeouts[request.caller().global_rank()] = request.timeout_millis();
  });
  std::vector<std::vector<float>> data = {{1}, {2}};
  for (int r = 0; r < 2; ++r) driver.Allocate(data[r].data(), 4);
  std::vector<absl::Status> status(2);
  std::vector<absl::Duration> took(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      // Rank 0's group timeout is 300 ms; rank 1 comes after 800 ms.
      GpuPath path(&driver, transport, "job", r, "world", nullptr, absl::Seconds(30),
                   r == 0 ? absl::Milliseconds(300) : absl::Seconds(10));
      if (r == 1) absl::SleepFor(absl::Milliseconds(800));
      GpuCall call;
      call.op = v1::GPU_ALL_REDUCE;
      call.count = 1;
      call.inputs = {Cuda(data[r].data(), 1, DType::kFloat32)};
      const absl::Time start = absl::Now();
      auto launched = path.Run(call);
      took[r] = absl::Now() - start;
      status[r] = launched.status();
      if (launched.ok()) path.Release(launched->marker);
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(sent_timeouts[0] == 300);
  CHECK(sent_timeouts[1] == 10000);
  INFO("rank 0: " << status[0] << " after " << took[0] << "; rank 1: " << status[1]);
  CHECK(absl::IsDeadlineExceeded(status[0]));
  CHECK(status[0].message().find("timed out waiting for ranks 1") != std::string::npos);
  CHECK(took[0] < absl::Milliseconds(700));
  CHECK(absl::IsAborted(status[1]));
  CHECK(status[1].message().find("timed out waiting for ranks 1") != std::string::npos);
}

TEST_CASE("Synchronize reports a collective that failed after it was enqueued") {
  FakeCudaDriver driver;
  GpuTransport transport =
      [](const v1::GpuCollectiveRequest&) -> absl::StatusOr<v1::GpuCollectiveResponse> {
    return v1::GpuCollectiveResponse();
  };
  std::vector<uint64_t> asked;
  GpuStatusCheck check = [&asked](uint64_t sequence) -> absl::Status {
    asked.push_back(sequence);
    if (sequence == 2) return absl::AbortedError("NCCL error on rank 1 of group world: remote");
    return absl::OkStatus();
  };
  GpuPath path(&driver, transport, "job", 0, "world", check);
  std::vector<float> data(4);
  driver.Allocate(data.data(), 16);
  GpuCall call;
  call.op = v1::GPU_ALL_REDUCE;
  call.count = 4;
  call.inputs = {Cuda(data.data(), 4, DType::kFloat32)};
  auto first = path.Run(call);
  auto second = path.Run(call);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(path.Synchronize(first->marker, first->sequence, absl::Now() + absl::Seconds(1)).ok());
  absl::Status failed =
      path.Synchronize(second->marker, second->sequence, absl::Now() + absl::Seconds(1));
  CHECK(absl::IsAborted(failed));
  CHECK(failed.message().find("NCCL error on rank 1") != std::string::npos);
  CHECK(asked == std::vector<uint64_t>{1, 2});
  // The GPU has not passed it yet: the CPU waits, up to the deadline.
  driver.done_ = false;
  absl::Status late =
      path.Synchronize(first->marker, first->sequence, absl::Now() + absl::Milliseconds(50));
  CHECK(absl::IsDeadlineExceeded(late));
  path.Release(first->marker);
  path.Release(second->marker);
}

TEST_CASE("a daemon error comes back as the call's status; a bad buffer never leaves the rank") {
  FakeCudaDriver driver;
  int calls = 0;
  GpuTransport transport =
      [&calls](const v1::GpuCollectiveRequest&) -> absl::StatusOr<v1::GpuCollectiveResponse> {
    ++calls;
    return absl::AbortedError("rank 1 (host n1, pid 9) failed: killed by signal 9");
  };
  GpuPath path(&driver, transport, "job", 0, "world");
  std::vector<float> data(4);
  driver.Allocate(data.data(), 16);
  GpuCall call;
  call.op = v1::GPU_ALL_REDUCE;
  call.count = 4;
  call.inputs = {Cuda(data.data(), 4, DType::kFloat32)};
  auto failed = path.Run(call);
  CHECK(absl::IsAborted(failed.status()));
  CHECK(failed.status().message().find("killed by signal 9") != std::string::npos);
  std::vector<float> host(4);
  call.inputs = {Cuda(host.data(), 4, DType::kFloat32)};
  CHECK(absl::IsInvalidArgument(path.Run(call).status()));
  CHECK(calls == 1);
}

TEST_CASE("a channel request left unanswered times out and later requests go through gRPC") {
  // A "daemon" that names a channel but never serves it (it died, or hangs).
  auto daemon = GpuChannel::Create(absl::StrCat("/muster.", ::getpid(), ".gpupathtest.1"));
  REQUIRE(daemon.ok());
  FakeCudaDriver driver;
  int calls = 0;
  GpuTransport transport =
      [&](const v1::GpuCollectiveRequest&) -> absl::StatusOr<v1::GpuCollectiveResponse> {
    ++calls;
    v1::GpuCollectiveResponse response;
    response.set_launched(calls);
    response.set_channel((*daemon)->name());
    return response;
  };
  GpuPath path(&driver, transport, "job", 0, "world", nullptr, absl::Milliseconds(100));
  std::vector<float> data(4);
  driver.Allocate(data.data(), 16);
  GpuCall call;
  call.op = v1::GPU_ALL_REDUCE;
  call.count = 4;
  call.inputs = {Cuda(data.data(), 4, DType::kFloat32)};
  auto first = path.Run(call);  // gRPC; the reply names the channel
  REQUIRE(first.ok());
  path.Release(first->marker);
  CHECK(calls == 1);
  const absl::Time start = absl::Now();
  auto unanswered = path.Run(call);  // the channel: nobody answers
  CHECK(absl::IsDeadlineExceeded(unanswered.status()));
  CHECK(absl::Now() - start < absl::Seconds(10));
  // The unanswered request may still be read from the segment: the next
  // one goes through gRPC instead of overwriting it there.
  auto third = path.Run(call);
  REQUIRE(third.ok());
  path.Release(third->marker);
  CHECK(calls == 2);
  CHECK(path.channel_calls() == 0);
}

}  // namespace
}  // namespace muster
