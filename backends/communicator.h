// Communicator: what one rank uses to run collectives in one process group,
// whatever moves the data: shared memory for node-local groups
// (ShmCommunicator) or Gloo over TCP for groups spanning nodes
// (GlooCommunicator). Buffers are CPU memory; counts are elements of
// `dtype`. Every method blocks until the collective completed on this rank
// or failed (INVALID_ARGUMENT, FAILED_PRECONDITION for desync, ABORTED,
// DEADLINE_EXCEEDED naming what it waited for).
//
// Thread-compatible: one thread drives a communicator at a time; Abort may
// be called from any thread meanwhile.
#ifndef MUSTER_BACKENDS_COMMUNICATOR_H_
#define MUSTER_BACKENDS_COMMUNICATOR_H_

#include <cstddef>
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
  // `out`: size()*count elements, rank i's at offset i*count.
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

}  // namespace muster

#endif  // MUSTER_BACKENDS_COMMUNICATOR_H_
