// Communicator: what one rank uses to run collectives in one process group,
// whatever moves the data: shared memory for node-local groups
// (ShmCommunicator), Gloo over TCP (GlooCommunicator), both for groups
// spanning nodes (HierarchicalCommunicator), or a third party's. Buffers are
// memory of the backend's device (CPU for the built-in ones); counts are
// elements of `dtype`. Every method blocks until the collective completed on
// this rank or failed (INVALID_ARGUMENT, FAILED_PRECONDITION for desync,
// ABORTED, DEADLINE_EXCEEDED naming what it waited for).
//
// CUDA buffers (a backend registered for "cuda"): the SDK hands the
// Communicator device pointers, never a stream. Its contract is the one a
// CPU buffer has: when a method is called, the work the caller queued on
// each tensor's stream before its call has finished (the SDK records an
// event on those streams at the call and waits for it, bounded by the
// call's deadline, before calling the Communicator on the group's
// executor; a point-to-point call waits before it is posted), and when
// the method returns (or PointToPoint's `done` runs) the backend has
// finished with the buffers: anything it queued on its own streams is
// complete. Work completes then, so the caller's later stream work sees
// the result. (muster's own "nccl" runs in musterd and is ordered on the
// stream instead; see client/gpu_path.h.)
//
// PointToPoint: the same group's sends and receives (c10d semantics:
// matched by (peer, tag), in order per (peer, tag); a receive may take a
// message from any source).
//
// Thread-compatible: one thread drives a communicator at a time; Abort may
// be called from any thread meanwhile. PointToPoint is thread-safe.
#ifndef MUSTER_BACKENDS_COMMUNICATOR_H_
#define MUSTER_BACKENDS_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "muster/types.h"

namespace muster {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Breaks this process's side of the communicator from any thread: a
  // collective waiting for its peers stops waiting and fails, as do later
  // ones, with `reason` (not OK) where the transport lets it say so, else
  // with ABORTED. Used when the rank lost what the group needs (its
  // musterd). Implementations without a way to interrupt a wait ignore it.
  virtual void Abort(const absl::Status& reason) {}

  virtual absl::Status Barrier(absl::Time deadline) = 0;
  // In place.
  virtual absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, double scale,
                                 absl::Time deadline) = 0;
  virtual absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                                 absl::Time deadline) = 0;
  // In place at the root.
  virtual absl::Status Reduce(void* data, size_t count, DType dtype, ReduceOp op, double scale,
                              int root, absl::Time deadline) = 0;
  // `out`: size()*count elements, rank i's at offset i*count. `in` is apart
  // from `out` or is `out` + rank()*count (in place).
  virtual absl::Status AllGather(const void* in, void* out, size_t count, DType dtype,
                                 absl::Time deadline) = 0;
  virtual absl::Status Gather(const void* in, void* out, size_t count, DType dtype, int root,
                              absl::Time deadline) = 0;
  virtual absl::Status Scatter(const void* in, void* out, size_t count, DType dtype, int root,
                               absl::Time deadline) = 0;
  // `in`: size()*count elements; block i is reduced into rank i's `out`.
  virtual absl::Status ReduceScatter(const void* in, void* out, size_t count, DType dtype,
                                     ReduceOp op, double scale, absl::Time deadline) = 0;
  virtual absl::Status AllToAll(const void* in, const std::vector<size_t>& send_counts, void* out,
                                const std::vector<size_t>& recv_counts, DType dtype,
                                absl::Time deadline) = 0;
};

class PointToPoint {
 public:
  // A receive's peer that matches a message from any member.
  static constexpr int kAnySource = -1;
  // The result, and for receives the sender's group rank (-1 for sends).
  using Done = std::function<void(absl::Status status, int source)>;

  virtual ~PointToPoint() = default;
  // Checks an operation before it is posted (peer range, not self, tag).
  virtual absl::Status Validate(bool send, int peer, uint64_t tag) const = 0;
  // Posts a send of `bytes` at `data` to group rank `peer` (or a receive
  // into it from `peer` or kAnySource); `done` runs once, on any thread,
  // when it completed or failed (DEADLINE_EXCEEDED at `deadline`). The
  // buffer stays the caller's until then.
  virtual void Post(bool send, int peer, uint64_t tag, void* data, size_t bytes,
                    absl::Time deadline, Done done) = 0;
  // Any thread: pending and later operations fail with `reason`.
  virtual void Abort(const absl::Status& reason) = 0;
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_COMMUNICATOR_H_
