// What one rank is doing in a collective, as every transport compares it
// across ranks to detect desynchronized programs: the collective kinds, the
// signature (kept in shared memory by the shm backend, exchanged over Gloo by
// the gloo and hierarchical ones) and its description for messages.
//
// Stateless; thread-safe.
#ifndef MUSTER_CORE_SIGNATURE_H_
#define MUSTER_CORE_SIGNATURE_H_

#include <cstdint>
#include <string>

#include "muster/types.h"

namespace muster {

enum class CollectiveKind : uint32_t {
  kBarrier = 1,
  kAllReduce = 2,
  kBroadcast = 3,
  kReduce = 4,
  kAllGather = 5,
  kGather = 6,
  kScatter = 7,
  kReduceScatter = 8,
  kAllToAll = 9,
};
const char* CollectiveName(CollectiveKind kind);  // "all_reduce", ...
bool CollectiveHasRoot(CollectiveKind kind);      // broadcast, reduce, gather, scatter
bool CollectiveReduces(CollectiveKind kind);      // all_reduce, reduce, reduce_scatter

// A plain struct: it lives in shared memory (backends/shm/segment.h).
struct OpSignature {
  uint64_t sequence = 0;  // per group, from 1
  uint32_t kind = 0;      // CollectiveKind
  uint32_t dtype = 0;
  uint64_t count = 0;  // elements (per rank, as the op defines)
  int32_t root = -1;
  uint32_t reduce_op = 0;
};

// The signature of collective #`sequence`: root and op only where the kind
// has them (so ranks that pass an unused root still agree).
OpSignature MakeSignature(uint64_t sequence, CollectiveKind kind, DType dtype, uint64_t count,
                          int root, ReduceOp op);
bool SameSignature(const OpSignature& a, const OpSignature& b);
// "all_reduce #3(float32, count 1024, SUM)" for messages.
std::string DescribeSignature(const OpSignature& s);
// "collectives do not match across nodes: group rank A called … but group
// rank B called …" (FAILED_PRECONDITION's message for a desync).
std::string SignatureMismatch(int rank_a, const OpSignature& a, int rank_b, const OpSignature& b);

}  // namespace muster

#endif  // MUSTER_CORE_SIGNATURE_H_
