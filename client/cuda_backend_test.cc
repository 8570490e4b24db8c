// A third party's "cuda" backend gets device pointers, never a stream: the
// SDK makes its Communicator (and PointToPoint) wait until the work queued
// on the tensors' streams before the call finished (backends/communicator.h).
// Without a GPU: a fake CUDA driver whose events finish when the test says,
// and a one-rank group built without musterd.
#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "client/cuda_driver.h"
#include "client/process_group_impl.h"
#include "muster/world.h"
#include "proto/groups.pb.h"

namespace muster {
namespace {

// Every pointer is device memory of one context; events are done once
// the test releases the streams' work.
class FakeDriver : public CudaDriver {
 public:
  absl::StatusOr<Allocation> FindAllocation(const void* ptr) override {
    Allocation a;
    a.base = reinterpret_cast<uintptr_t>(ptr);
    a.size = 1 << 20;
    a.pci_bus_id = "fake:0";
    a.context = this;
    return a;
  }
  absl::StatusOr<std::string> ExportAllocation(const Allocation&) override {
    return absl::UnimplementedError("not used");
  }
  absl::StatusOr<void*> CreateIpcEvent(void*, std::string*) override {
    return absl::UnimplementedError("not used");
  }
  absl::StatusOr<void*> CreateEvent(void* context) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (context != this) return absl::InvalidArgumentError("wrong context");
    void* e = reinterpret_cast<void*>(next_++);
    live_.insert(e);
    return e;
  }
  void DestroyEvent(void* event) override {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(event);
  }
  absl::Status RecordEvent(void*, void* stream, void*) override {
    std::lock_guard<std::mutex> lock(mu_);
    recorded_on_.push_back(reinterpret_cast<uintptr_t>(stream));
    return absl::OkStatus();
  }
  absl::Status StreamWaitEvent(void*, void*, void*) override { return absl::OkStatus(); }
  absl::StatusOr<bool> EventDone(void*) override { return released.load(); }

  std::vector<uintptr_t> recorded_on() {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_on_;
  }
  size_t live() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  std::atomic<bool> released{false};

 private:
  std::mutex mu_;
  uintptr_t next_ = 0x1000;
  std::set<void*> live_;
  std::vector<uintptr_t> recorded_on_;
};

FakeDriver driver;

// Remembers whether the streams' work was done when it was called.
class CheckingCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status Barrier(absl::Time) override { return absl::OkStatus(); }
  absl::Status AllReduce(void*, size_t, DType, ReduceOp, double, absl::Time) override {
    return Called();
  }
  absl::Status Broadcast(void*, size_t, DType, int, absl::Time) override { return Called(); }
  absl::Status Reduce(void*, size_t, DType, ReduceOp, double, int, absl::Time) override {
    return Called();
  }
  absl::Status AllGather(const void*, void*, size_t, DType, absl::Time) override {
    return Called();
  }
  absl::Status Gather(const void*, void*, size_t, DType, int, absl::Time) override {
    return Called();
  }
  absl::Status Scatter(const void*, void*, size_t, DType, int, absl::Time) override {
    return Called();
  }
  absl::Status ReduceScatter(const void*, void*, size_t, DType, ReduceOp, double,
                             absl::Time) override {
    return Called();
  }
  absl::Status AllToAll(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&,
                        DType, absl::Time) override {
    return Called();
  }
  std::atomic<int> calls{0}, early{0};

 private:
  absl::Status Called() {
    ++calls;
    if (!driver.released.load()) ++early;
    return absl::OkStatus();
  }
};

CheckingCommunicator* checking = nullptr;

class CheckingBackend : public Backend {
 public:
  explicit CheckingBackend(BackendOptions o) : options_(std::move(o)) { checking = &comm_; }
  const std::string& name() const override { return name_; }
  const BackendOptions& options() const override { return options_; }
  Communicator* communicator() override { return &comm_; }

 private:
  const std::string name_ = "checking";
  BackendOptions options_;
  CheckingCommunicator comm_;
};

std::shared_ptr<ProcessGroup> OneRankGroup() {
  ProcessGroup::Impl::RegisterSdkBackends();
  static absl::Status registered =
      RegisterBackend("checking",
                      [](const BackendOptions& o) -> absl::StatusOr<std::unique_ptr<Backend>> {
                        return std::make_unique<CheckingBackend>(o);
                      },
                      {"cuda"});
  REQUIRE(registered.ok());
  InitOptions world;
  world.rank = 0;
  world.world_size = 1;
  world.job_id = "job";
  v1::GroupInfo info;
  info.set_name("g");
  info.set_backend("cpu:gloo,cuda:checking");
  info.set_timeout_millis(5000);
  return ProcessGroup::Impl::Create(nullptr, world, world.rank, {0}, {{"cuda", "checking"}}, info);
}

Tensor Cuda(void* data, size_t count, uintptr_t stream) {
  Tensor t;
  t.data = data;
  t.count = count;
  t.dtype = DType::kFloat32;
  t.device = Device::kCuda;
  t.stream = reinterpret_cast<void*>(stream);
  return t;
}

TEST_CASE("a third-party CUDA backend runs only after the work queued on the tensors' streams") {
  SetCudaDriverForTesting(&driver);
  driver.released = false;
  std::shared_ptr<ProcessGroup> group = OneRankGroup();
  REQUIRE(checking != nullptr);
  float in[4] = {}, out[4] = {};
  auto reduce = group->AllReduce(Cuda(in, 4, 0x77));
  auto gathered = group->AllGatherIntoTensor(Cuda(out, 4, 0x88), Cuda(in, 4, 0x77));
  // The streams' work is not done: nothing reached the backend.
  CHECK(reduce->Wait(absl::Milliseconds(200)).code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(checking->calls == 0);
  // Recorded at each call, once per stream of its tensors.
  CHECK(driver.recorded_on() == std::vector<uintptr_t>{0x77, 0x77, 0x88});
  driver.released = true;
  CHECK(reduce->Wait(absl::Seconds(5)).ok());
  CHECK(gathered->Wait(absl::Seconds(5)).ok());
  CHECK(checking->calls == 2);
  CHECK(checking->early == 0);
  group.reset();
  CHECK(driver.live() == 0);  // the fences' events were destroyed
}

TEST_CASE("an empty CUDA tensor needs no fence") {
  SetCudaDriverForTesting(&driver);
  driver.released = false;
  std::shared_ptr<ProcessGroup> group = OneRankGroup();
  const size_t recorded = driver.recorded_on().size();
  CHECK(group->AllReduce(Cuda(nullptr, 0, 0x55))->Wait(absl::Seconds(5)).ok());
  CHECK(driver.recorded_on().size() == recorded);
  driver.released = true;
}

TEST_CASE("a stream whose work never finishes fails the call at the group timeout") {
  SetCudaDriverForTesting(&driver);
  driver.released = false;
  std::shared_ptr<ProcessGroup> group = OneRankGroup();
  const int before = checking->calls;
  float in[4] = {};
  auto reduce = group->AllReduce(Cuda(in, 4, 0x99));
  absl::Status s = reduce->Wait(absl::Seconds(20));
  CHECK(absl::IsDeadlineExceeded(s));
  CHECK(s.message().find("CUDA tensors' stream") != std::string::npos);
  CHECK(checking->calls == before);
  driver.released = true;
}

}  // namespace
}  // namespace muster
