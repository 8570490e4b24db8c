// What tests of communicators share: one description of a collective call
// (Case), the inputs every rank passes for it and the one reference of what
// each rank must get back (Expected), a runner that makes the call on a
// Communicator, and a thread-safe error list for rank threads.
//
// Inputs are small integers (-2..3; 0..3 unsigned; 0/1 bool) encoded in
// each dtype, so sums, products and averages are exact or rounded once in
// every dtype, and transports that combine contributions in another order
// (rings, per-node stages) must still give the reference's bits. Expected()
// combines contributions in rank order with the kernels of
// backends/shm/reduce.h (tested on their own in reduce_test.cc), following
// c10d: which op applies to which dtype is CheckReduce's.
//
// Stateless functions are thread-safe; Errors is thread-safe.
#ifndef MUSTER_BACKENDS_COMMUNICATOR_TESTING_H_
#define MUSTER_BACKENDS_COMMUNICATOR_TESTING_H_

#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "backends/communicator.h"
#include "core/signature.h"
#include "muster/types.h"

namespace muster {
namespace conformance {

// The collectives are core/signature.h's kinds.
using Kind = CollectiveKind;
inline const char* KindName(Kind kind) { return CollectiveName(kind); }
inline bool Reduces(Kind kind) { return CollectiveReduces(kind); }
inline bool Rooted(Kind kind) { return CollectiveHasRoot(kind); }

// PREMUL_SUM's factor in every case: exact in every float type.
inline constexpr double kScale = 0.5;

// One collective call, the same on every rank.
struct Case {
  Kind kind = Kind::kBarrier;
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  int root = 0;
  int salt = 0;  // varies the inputs from case to case
  // "all_reduce(int32, count 7, SUM)".
  std::string Describe() const;
  // Whether the call is valid (the reduce op applies to the dtype).
  bool Valid() const;
};

// all_to_all: elements rank `from` sends to rank `to` (uneven, some zero).
size_t Split(const Case& c, int from, int to);
// What `rank` passes: its input buffer (in place: its data; scatter: the
// root's blocks; reduce_scatter: its `world` blocks; all_to_all: its
// blocks for every rank, consecutive).
std::string Input(const Case& c, int world, int rank);
// What `rank`'s output buffer holds afterwards (in place: its data), or
// nothing where c10d leaves it unspecified (reduce and gather off the
// root). For valid cases only.
std::optional<std::string> Expected(const Case& c, int world, int rank);

// Memory for one buffer of `bytes` bytes, valid until the call returns.
using Allocate = std::function<char*(size_t bytes)>;
// Makes the call `c` on `comm` with Input()'s data; `out` receives the
// output buffer (see Expected). Buffers are heap strings, or from
// `allocate` when given.
absl::Status RunCase(Communicator& comm, const Case& c, absl::Time deadline, std::string* out,
                     const Allocate& allocate = nullptr);

// Failures seen on rank threads (Catch2 is not thread-safe), checked on
// the test's thread: the count and the first few.
struct Errors {
  std::mutex mu;
  int count = 0;
  std::string first;
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (count++ < 8) first += what + "\n";
  }
};

}  // namespace conformance
}  // namespace muster

#endif  // MUSTER_BACKENDS_COMMUNICATOR_TESTING_H_
