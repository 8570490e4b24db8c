// FakeGpuRuntime: an in-process stand-in for CUDA + NCCL, for testing the
// engine on machines without a GPU. "Device memory" is host memory; an IPC
// handle is 64 bytes whose first 8 hold the host pointer; communicators of
// one unique id form a clique whose ranks rendezvous in Launch and are
// executed by the last rank to arrive, with muster's CPU reduction kernels.
// Like NCCL's non-blocking mode, Init/Split/Launch return at once and
// PollComm says Unavailable until the clique completes the operation.
//
// Fault injection: InjectAsyncError(comm-of-rank), HangCollectives().
// Thread-safe.
#ifndef MUSTER_DAEMON_GPU_FAKE_GPU_RUNTIME_H_
#define MUSTER_DAEMON_GPU_FAKE_GPU_RUNTIME_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/nccl/gpu_runtime.h"

namespace muster {

// 64-byte handle bytes for a host pointer (what a fake rank sends).
std::string FakeIpcHandle(const void* ptr);

// Cross-process fake "device memory": a memfd of a rank process, opened by
// the fake runtime through /proc/<pid>/fd/<fd> and mapped shared, so that a
// test musterd can run real rank processes without a GPU. `generation`
// tells apart successive allocations that reuse an fd.
std::string FakeShmHandle(int pid, int fd, uint64_t size, uint32_t generation);
// A cross-process fake event handle (events do nothing across processes:
// the fake executes collectives before Launch's caller is answered).
std::string FakeShmEventHandle(uint64_t id);

// A rank's interprocess event; its handle is FakeIpcHandle(&event).
struct FakeEvent {
  std::string name;
};

class FakeGpuRuntime : public GpuRuntime {
 public:
  FakeGpuRuntime();
  ~FakeGpuRuntime() override;

  std::string Unavailable() override { return unavailable_; }
  absl::StatusOr<int> DeviceByPciBusId(const std::string& bus_id) override;
  absl::Status SetDevice(int) override { return absl::OkStatus(); }
  absl::StatusOr<void*> CreateStream() override;
  void DestroyStream(void* stream) override;
  absl::Status StreamSynchronize(void*) override { return absl::OkStatus(); }
  absl::StatusOr<void*> DeviceAlloc(size_t bytes) override;
  void DeviceFree(void* ptr) override;
  absl::StatusOr<void*> OpenMemHandle(const std::string& handle) override;
  void CloseMemHandle(void* base) override;
  // Shared-memory handles: their size; pointer handles: what
  // SetAllocationSize said, else unlimited.
  absl::StatusOr<size_t> AllocationSize(void* base) override;
  void SetAllocationSize(const void* base, size_t bytes);
  absl::StatusOr<void*> OpenEventHandle(const std::string& handle) override;
  absl::StatusOr<void*> CreateEvent() override;
  void DestroyEvent(void* event) override;
  absl::Status RecordEvent(void* event, void* stream) override;
  absl::Status StreamWaitEvent(void* stream, void* event) override;
  absl::StatusOr<bool> EventDone(void* event) override;
  size_t UniqueIdBytes() override { return 128; }
  absl::StatusOr<std::string> NewUniqueId() override;
  absl::StatusOr<void*> CommInit(int nranks, const std::string& unique_id, int rank) override;
  absl::StatusOr<void*> CommSplit(void* parent, int color, int key) override;
  absl::Status PollComm(void* comm) override;
  void AbortComm(void* comm) override;
  void DestroyComm(void* comm) override;
  absl::Status Launch(void* comm, const std::vector<NcclPrimitive>& primitives,
                      void* stream) override;

  // Test controls and counters.
  void SetUnavailable(std::string why) { unavailable_ = std::move(why); }
  // The clique of every live communicator whose group rank is `rank` in a
  // clique of `size` gets an asynchronous error.
  void InjectAsyncError(int size, int rank, const std::string& message);
  // Launched work never completes on the "GPU" (EventDone stays false).
  void HangCollectives(bool hang) { hang_ = hang; }
  int open_mem_handles() const;
  int mem_opens() const { return mem_opens_; }
  int aborts() const { return aborts_; }
  int destroys() const { return destroys_; }
  int live_comms() const;
  // PollComm calls on a communicator whose operation another thread issued
  // and has not yet seen complete (NCCL allows one thread at a time on a
  // communicator; the engine's worker owns it while an operation runs).
  int foreign_polls() const { return foreign_polls_; }
  // Events recorded / waited on, in order: "wait <event>" / "record <event>"
  // / "launch"; for ordering checks.
  std::vector<std::string> log() const;

  struct Clique;
  struct Comm;

 private:
  void Append(std::string entry);
  std::string unavailable_;
  std::atomic<bool> hang_{false};
  std::atomic<int> mem_opens_{0}, aborts_{0}, destroys_{0}, foreign_polls_{0};
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Clique>> cliques_;  // by unique id
  std::map<void*, int> open_mem_;
  std::vector<Comm*> comms_;
  std::set<void*> local_events_;
  std::map<void*, size_t> shm_maps_;     // FakeShmHandle mappings
  std::map<const void*, size_t> sizes_;  // SetAllocationSize
  std::vector<std::string> log_;
  uint64_t next_id_ = 1;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_GPU_FAKE_GPU_RUNTIME_H_
