// GlooCommunicator: collectives for a process group whose members span
// nodes, over Debian's Gloo (TCP transport). Every member connects a full
// mesh of TCP pairs, rendezvousing through the job's store (StoreAdapter
// turns a muster::Store into Gloo's store interface). Each rank runs its
// part itself, as c10d's gloo backend does; reductions use muster's kernels,
// so every dtype and reduce op behaves as on shared memory.
//
// Before each collective the members exchange its signature (op, dtype,
// count, root, reduce op, sequence number) in a small all_gather, so ranks
// that called different collectives all fail with FAILED_PRECONDITION
// naming both ranks and both calls instead of hanging or mixing data (one
// extra small exchange per collective).
//
// Gloo reports failures by throwing; every method catches and returns a
// Status (DEADLINE_EXCEEDED for timeouts, ABORTED otherwise).
//
// Created with check_signatures=false (the leaders' mesh and the flat
// fallback inside HierarchicalCommunicator, which checks signatures itself
// across all members), collectives skip that exchange.
//
// Gloo's TCP transport writes without MSG_NOSIGNAL, so a write to a peer
// that has gone raises SIGPIPE, whose default action kills the process
// before Gloo can report the failure. The first Connect therefore sets
// SIGPIPE to ignored when the process left it at its default (Python does
// the same at start-up); a handler the application installed is kept.
//
// Thread-compatible: one thread drives it (the group's executor); Abort is
// thread-safe.
#ifndef MUSTER_BACKENDS_GLOO_GLOO_COMMUNICATOR_H_
#define MUSTER_BACKENDS_GLOO_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/communicator.h"
#include "muster/store.h"

namespace gloo {
class Context;
}

namespace muster {

class GlooCommunicator : public Communicator {
 public:
  // Connects the mesh. All members call it; it returns once every pair is
  // connected or fails after `timeout`. `address` is this rank's IP as the
  // other members can reach it; `store` is namespaced to this group.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(std::shared_ptr<Store> store,
                                                                   int rank, int size,
                                                                   const std::string& address,
                                                                   absl::Duration timeout,
                                                                   bool check_signatures = true);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Breaks the communicator: later collectives fail with `reason`, and the
  // connections are closed (see Close: the peers' pending operations fail
  // at once) — at once if no collective of this rank is in flight, else as
  // soon as it ends. Debian's Gloo wakes none of this rank's own waiters
  // when a pair is closed locally (a test shows it), so closing under a
  // collective in flight would leave it waiting until its deadline; left
  // alone, it finishes with its peers (or fails when one of them goes) and
  // returns what it got (a failure reports `reason`).
  void Abort(const absl::Status& reason) override;
  absl::Status Barrier(absl::Time deadline) override;
  absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, double scale,
                         absl::Time deadline) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         absl::Time deadline) override;
  absl::Status Reduce(void* data, size_t count, DType dtype, ReduceOp op, double scale, int root,
                      absl::Time deadline) override;
  absl::Status AllGather(const void* in, void* out, size_t count, DType dtype,
                         absl::Time deadline) override;
  absl::Status Gather(const void* in, void* out, size_t count, DType dtype, int root,
                      absl::Time deadline) override;
  absl::Status Scatter(const void* in, void* out, size_t count, DType dtype, int root,
                       absl::Time deadline) override;
  absl::Status ReduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                             double scale, absl::Time deadline) override;
  absl::Status AllToAll(const void* in, const std::vector<size_t>& send_counts, void* out,
                        const std::vector<size_t>& recv_counts, DType dtype,
                        absl::Time deadline) override;
  // all_gatherv of bytes: rank i contributes bytes[i] bytes; `out` receives
  // them concatenated in rank order. No signature exchange.
  absl::Status AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes,
                          absl::Time deadline);
  // Closes every connection: pending and later operations fail here and on
  // the peers (their pairs see the connection end), so no member waits for
  // a collective this one abandoned. The communicator is unusable afterwards.
  void Close();
  // The Gloo context (for point-to-point through GlooP2P over the same mesh).
  const std::shared_ptr<gloo::Context>& context() const { return context_; }

 private:
  GlooCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  uint32_t NextTag() { return tag_++; }
  absl::Status CheckRoot(int root) const;
  // Exchanges this collective's signature with every member; FAILED_PRECONDITION
  // on a mismatch.
  absl::Status CheckSignature(uint32_t kind, DType dtype, uint64_t count, int root, ReduceOp op,
                              absl::Time deadline);
  // Marks a public collective in flight for Abort (nested calls count
  // once each); `refused()` is the abort reason once aborted, and then the
  // collective must not start.
  class InFlight {
   public:
    explicit InFlight(GlooCommunicator* comm);
    ~InFlight();
    const absl::Status& refused() const { return refused_; }

   private:
    GlooCommunicator* comm_;
    absl::Status refused_;
  };
  // A Gloo exception as a Status (DEADLINE_EXCEEDED for timeouts, else
  // ABORTED), or the reason given to Abort. A collective that failed inside
  // Gloo leaves the mesh in an unknown state, and its peers may still wait
  // in it: the communicator aborts itself with that status, so the mesh
  // closes (once no collective runs) and every member's pending and later
  // collectives fail too — the group is broken for all, not just here.
  absl::Status FromGloo(const std::exception& e, const char* what);
  uint64_t sequence_ = 0;
  // The collectives without the signature exchange (used inside others).
  absl::Status RawBarrier(absl::Time deadline);
  absl::Status RawAllReduce(void* data, size_t count, DType dtype, ReduceOp op, double scale,
                            absl::Time deadline);

  int rank_;
  int size_;
  uint32_t tag_ = 1;
  bool check_signatures_ = true;
  std::shared_ptr<gloo::Context> context_;
  std::atomic<bool> aborted_{false};
  // std::mutex, not absl::Mutex: ThreadSanitizer cannot see into Debian's
  // Abseil, and the backends' tests run ranks as threads.
  mutable std::mutex abort_mu_;
  absl::Status abort_reason_;  // guarded by abort_mu_
  int in_flight_ = 0;          // collectives running (InFlight); guarded by abort_mu_
};

// The local IPv4/IPv6 address this host uses to reach `host` (what the
// other members of a job can connect back to), e.g. for MASTER_ADDR.
absl::StatusOr<std::string> LocalAddressToward(const std::string& host, int port);

}  // namespace muster

#endif  // MUSTER_BACKENDS_GLOO_GLOO_COMMUNICATOR_H_
