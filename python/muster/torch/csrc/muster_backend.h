// The torch.distributed backend "muster": a c10d backend whose collectives
// run through muster's C API (muster.h, libmuster.so) and nothing else.
//
// One source for torch 1.13 (backends subclass c10d::ProcessGroup) and torch
// 2.x (they subclass c10d::Backend); TORCH_VERSION_MAJOR picks the base.
//
// A torch group maps to a muster group of the same name: the default group
// to muster's world group (the first backend of the process joins the job
// with muster_world_init), every other group to muster_group_create over its
// global ranks with local synchronization (torch creates backends on member
// ranks only).
//
// Errors: bad arguments that can be seen locally (unknown dtype,
// non-contiguous outputs, wrong tensor counts, splits that do not add up,
// ranks outside the group) throw at call time; everything muster reports
// (a dead rank, desync, timeouts, dtype/op combinations muster rejects)
// becomes the Work's error: wait() throws it, getFuture() carries it.
#ifndef MUSTER_PYTHON_MUSTER_TORCH_CSRC_MUSTER_BACKEND_H_
#define MUSTER_PYTHON_MUSTER_TORCH_CSRC_MUSTER_BACKEND_H_

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "muster/muster.h"

namespace muster_torch {

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

// "allreduce on group '0'", for messages. Formatted only when a message is
// made (never on the success path of a call).
struct OpLabel {
  const char* op;     // a string literal
  std::string group;  // torch's group name (short: no allocation)
  std::string str() const { return std::string(op) + " on group '" + group + "'"; }
  operator std::string() const { return str(); }  // NOLINT: messages take either
};
inline std::ostream& operator<<(std::ostream& os, const OpLabel& l) {
  return os << l.op << " on group '" << l.group << "'";
}

// How the first backend of a process joins the job (muster_init_options);
// empty strings and -1 mean "muster reads it from the environment".
struct WorldConfig {
  std::string job_id;
  int rank = -1;
  int world_size = -1;
  std::string master_addr;
  int master_port = 0;
  std::string socket;
  std::string backend;
  double timeout_s = 0;
  std::string world_group_name;
};

// The Work of one muster call (or of several, for coalesced calls): it owns
// the muster_work handles and keeps the tensors alive until they completed.
// Completion arrives either through muster_work_on_complete (relayed to a
// process-wide completion thread, so that torch future callbacks never run on
// muster's executor threads) or through wait()/isCompleted() on the caller's
// thread; whichever sees the last handle finish settles the Work once:
// records the exception and completes the future.
//
// Thread-safety: all methods may be called from any thread.
class MusterWork : public c10d::Work {
 public:
  // Takes one reference of each handle. `outputs` become the future's value
  // and result(); `keep_alive` (inputs, temporaries) live as long as the
  // Work. `stream` is the CUDA stream of CUDA collectives.
  MusterWork(int rank, c10d::OpType op, OpLabel what, std::vector<muster_work*> handles,
             std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive,
             std::optional<c10::Stream> stream);
  ~MusterWork() override;

  // Settles a Work without handles at once. Call once, after the Work is
  // owned by an intrusive_ptr.
  void Start();

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // timeout zero (kNoTimeout) waits forever; a wait that times out throws
  // DEADLINE_EXCEEDED and leaves the collective running.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A completed receive from any source: the sender's group rank.
  int sourceRank() const override;
  // Receives: `global_ranks` (the group's members in group-rank order)
  // map the sender muster reports to sourceRank's group rank.
  void SetGroupRanks(std::vector<int32_t> global_ranks) { group_ranks_ = std::move(global_ranks); }

  // Called for handle `index` once it completed (any thread).
  void HandleDone(size_t index, int code, const std::string& message);

 private:
  static void OnComplete(void* arg, int code, const char* message);
  // Registers the completion callbacks (each pending one holds a
  // reference), once: only a Work whose future is asked for needs them, so
  // a plain wait() costs no hand-off to the completion thread.
  void RegisterCallbacks();
  void Settle();

  const OpLabel what_;
  const std::vector<muster_work*> handles_;
  const std::vector<at::Tensor> outputs_;
  const std::vector<at::Tensor> keep_alive_;
  const std::optional<c10::Stream> stream_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<int32_t> group_ranks_;  // set before the Work is shared

  std::once_flag callbacks_once_;
  std::mutex state_mu_;
  std::vector<bool> done_;            // guarded by state_mu_
  size_t pending_;                    // guarded by state_mu_
  int first_error_code_ = MUSTER_OK;  // guarded by state_mu_
  std::string first_error_;           // guarded by state_mu_
  bool settled_ = false;              // guarded by state_mu_
};

// The Work of endCoalescing: completes when every Work issued while
// coalescing did; its error is the first of theirs.
//
// Thread-safety: all methods may be called from any thread.
class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<MusterWork>> works);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  const std::vector<c10::intrusive_ptr<MusterWork>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A torch process group backed by a muster group.
//
// Thread-safety: collectives may be issued from any thread (muster orders
// them per group); shutdown() may race with them (they then fail cleanly).
class MusterBackend : public BackendBase {
 public:
  // Takes one reference of `group`. `global_ranks[i]` is group rank i.
  MusterBackend(int rank, int size, muster_group* group, std::vector<int32_t> global_ranks,
                std::string name, bool is_world, double timeout_s);
  ~MusterBackend() override;

  // Joins the job if needed and creates (or, for the default group, takes)
  // the muster group. Throws c10::Error with muster's message.
  static c10::intrusive_ptr<MusterBackend> Create(int group_rank, int group_size,
                                                  const std::string& group_id,
                                                  const std::vector<int64_t>& global_ranks,
                                                  double timeout_s, const WorldConfig& world);

  const std::string getBackendName() const override { return "muster"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  // The number of calls this backend issued (c10d's debug wrapper, under
  // TORCH_DISTRIBUTED_DEBUG=DETAIL, reads it); muster keeps its own per-group
  // sequence numbers for desync detection.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return calls_.load(); }

#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void shutdown() override { Shutdown(); }
  c10::intrusive_ptr<Options> getBackendOptions() override;
#else
  void startCoalescing() override;
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& reqs) override;
#endif

  // c10d's monitored_barrier; timeout_s 0: the group's timeout.
  void MonitoredBarrier(double timeout_s);
  // Destroys the muster group (non-world groups) and drops its reference;
  // later collectives fail. Idempotent.
  void Shutdown();
  // The muster group (borrowed; valid while this backend is not shut down).
  // A new reference to the muster group (release it), or null once shut down.
  muster_group* RetainGroup();
  const std::string& name() const { return name_; }

 private:
  using Call = std::function<int(muster_group*, muster_work**)>;
  // Issues `call` on the group and wraps its handle in a started Work.
  c10::intrusive_ptr<MusterWork> Launch(c10d::OpType op, const char* what, const Call& call,
                                        std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> keep_alive,
                                        std::optional<c10::Stream> stream);
  // Wraps handles of several calls in one started Work.
  c10::intrusive_ptr<MusterWork> Wrap(c10d::OpType op, const char* what,
                                      std::vector<muster_work*> handles,
                                      std::vector<at::Tensor> outputs,
                                      std::vector<at::Tensor> keep_alive,
                                      std::optional<c10::Stream> stream);
  OpLabel What(const char* op) const;
  int GlobalRank(int group_rank, const char* what) const;
  void CheckRoot(int64_t root, const char* what) const;

  const std::vector<int32_t> global_ranks_;
  const std::string name_;
  const bool is_world_;
  const double timeout_s_;  // the group's timeout in torch (0: muster's default)
  std::atomic<uint64_t> calls_{0};

  std::mutex mu_;
  muster_group* group_;                                    // guarded by mu_; null once shut down
  bool coalescing_ = false;                                // guarded by mu_
  std::vector<c10::intrusive_ptr<MusterWork>> coalesced_;  // guarded by mu_
};

}  // namespace muster_torch

#endif  // MUSTER_PYTHON_MUSTER_TORCH_CSRC_MUSTER_BACKEND_H_
