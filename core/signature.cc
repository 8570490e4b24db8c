#include "core/signature.h"

#include "absl/strings/str_cat.h"

namespace muster {

bool CollectiveHasRoot(CollectiveKind k) {
  return k == CollectiveKind::kBroadcast || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kGather || k == CollectiveKind::kScatter;
}

bool CollectiveReduces(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kReduceScatter;
}

OpSignature MakeSignature(uint64_t sequence, CollectiveKind kind, DType dtype, uint64_t count,
                          int root, ReduceOp op) {
  OpSignature s;
  s.sequence = sequence;
  s.kind = static_cast<uint32_t>(kind);
  s.dtype = static_cast<uint32_t>(dtype);
  s.count = count;
  s.root = CollectiveHasRoot(kind) ? root : -1;
  s.reduce_op = CollectiveReduces(kind) ? static_cast<uint32_t>(op) : 0;
  return s;
}

bool SameSignature(const OpSignature& a, const OpSignature& b) {
  return a.sequence == b.sequence && a.kind == b.kind && a.dtype == b.dtype && a.count == b.count &&
         a.root == b.root && a.reduce_op == b.reduce_op;
}

std::string SignatureMismatch(int rank_a, const OpSignature& a, int rank_b, const OpSignature& b) {
  return absl::StrCat("collectives do not match across nodes: group rank ", rank_a, " called ",
                      DescribeSignature(a), " but group rank ", rank_b, " called ",
                      DescribeSignature(b));
}

const char* CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kReduce:
      return "reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kGather:
      return "gather";
    case CollectiveKind::kScatter:
      return "scatter";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
  }
  return "unknown";
}

std::string DescribeSignature(const OpSignature& s) {
  auto kind = static_cast<CollectiveKind>(s.kind);
  std::string out = absl::StrCat(CollectiveName(kind), " #", s.sequence);
  if (kind == CollectiveKind::kBarrier) return out;
  absl::StrAppend(&out, "(", DTypeName(static_cast<DType>(s.dtype)), ", count ", s.count);
  if (CollectiveHasRoot(kind)) absl::StrAppend(&out, ", root ", s.root);
  if (CollectiveReduces(kind))
    absl::StrAppend(&out, ", ", ReduceOpName(static_cast<ReduceOp>(s.reduce_op)));
  return out + ")";
}

}  // namespace muster
