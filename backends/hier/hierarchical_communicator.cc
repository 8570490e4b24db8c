#include "backends/hier/hierarchical_communicator.h"

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/shm/collectives.h"
#include "common/status_macros.h"

namespace muster {
namespace {

// The group-wide outcome of a signature exchange (fixed size: it travels
// through shared memory and Gloo as bytes).
struct Verdict {
  int32_t mismatch = 0;
  char message[508] = {};
  void Set(const std::string& text) {
    mismatch = 1;
    std::strncpy(message, text.c_str(), sizeof(message) - 1);
  }
};

// What each leader contributes to the leaders' exchange.
struct NodeReport {
  OpSignature signature;  // the leader's
  Verdict local;          // whether the node's members agree
};

bool Fatal(const absl::Status& s) {
  return !s.ok() && s.code() != absl::StatusCode::kInvalidArgument &&
         s.code() != absl::StatusCode::kFailedPrecondition;
}

}  // namespace

NodeTopology NodeTopology::FromNodeIds(const std::vector<std::string>& node_ids) {
  NodeTopology t;
  std::map<std::string, int> index;
  for (size_t i = 0; i < node_ids.size(); ++i) {
    auto [it, inserted] = index.emplace(node_ids[i], static_cast<int>(t.members.size()));
    if (inserted) t.members.emplace_back();
    t.node_of.push_back(it->second);
    t.local_index.push_back(static_cast<int>(t.members[it->second].size()));
    t.members[it->second].push_back(static_cast<int>(i));
  }
  return t;
}

absl::Status ConnectSpanningMeshes(GroupSegment& segment, bool leader, const std::string& who,
                                   const GlooConnect& connect_flat,
                                   const GlooConnect& connect_leaders,
                                   std::unique_ptr<GlooCommunicator>* flat,
                                   std::unique_ptr<GlooCommunicator>* leaders) {
  auto fail = [&](absl::Status s) {
    if (*flat != nullptr) (*flat)->Close();
    segment.Abort(absl::StrCat(who, ": ", s.message()));
    return s;
  };
  auto f = connect_flat();
  if (!f.ok()) return fail(f.status());
  *flat = std::move(*f);
  if (leader) {
    auto l = connect_leaders();
    if (!l.ok()) return fail(l.status());
    *leaders = std::move(*l);
  }
  return absl::OkStatus();
}

HierarchicalCommunicator::HierarchicalCommunicator(
    int rank, NodeTopology topology, std::unique_ptr<Communicator> local, GroupSegment* segment,
    std::unique_ptr<GlooCommunicator> leaders, std::unique_ptr<GlooCommunicator> flat,
    std::string group_name, std::vector<int> global_ranks)
    : rank_(rank),
      size_(static_cast<int>(topology.node_of.size())),
      topology_(std::move(topology)),
      node_(topology_.node_of[rank]),
      local_(std::move(local)),
      segment_(segment),
      leaders_(std::move(leaders)),
      flat_(std::move(flat)),
      group_name_(std::move(group_name)),
      global_ranks_(std::move(global_ranks)) {}

HierarchicalCommunicator::~HierarchicalCommunicator() = default;

int HierarchicalCommunicator::local_size() const {
  return static_cast<int>(topology_.members[node_].size());
}

absl::Status HierarchicalCommunicator::CheckRoot(int root) const {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("root ", root, " is outside the group of size ", size_));
  }
  return absl::OkStatus();
}

void HierarchicalCommunicator::Abort(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  if (local_ != nullptr) local_->Abort(reason);
  if (segment_ != nullptr) segment_->AbortLocally(reason);
  if (leaders_ != nullptr) leaders_->Abort(reason);
  if (flat_ != nullptr) flat_->Abort(reason);
}

absl::Status HierarchicalCommunicator::Break(absl::Status status, bool local_stage_failed) {
  if (status.ok()) return status;
  if (aborted_.load(std::memory_order_acquire)) {
    // This rank gave up (Abort): whatever stage failed, the reason is that,
    // and only this process's side of the segment is aborted.
    broken_ = abort_reason();
    return broken_;
  }
  bool fatal = Fatal(status);
  if (!fatal && !local_stage_failed) return status;
  if (fatal && segment_ != nullptr && !segment_->aborted()) {
    // A Gloo peer went away or timed out. If a member died, musterd is about
    // to abort the segment with a reason naming it: prefer that.
    absl::Time until = absl::Now() + absl::Seconds(1);
    while (!segment_->aborted() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  }
  if (fatal && segment_ != nullptr && segment_->aborted()) {
    std::string reason = segment_->abort_reason();
    // (Unless this rank's own failure aborted it: then its status stays,
    // e.g. DEADLINE_EXCEEDED for its shared-memory stage's timeout.)
    if (status.message().find(reason) == absl::string_view::npos &&
        reason.find(std::string(status.message())) == std::string::npos) {
      status = absl::AbortedError(
          absl::StrCat("collective on group '", group_name_, "' aborted: ", reason));
    }
  }
  if (segment_ != nullptr) segment_->Abort(std::string(status.message()));
  if (leaders_ != nullptr) leaders_->Close();
  if (flat_ != nullptr) flat_->Close();
  broken_ = status;
  return status;
}

template <typename F>
absl::Status HierarchicalCommunicator::Run(F&& f) {
  if (!broken_.ok()) return broken_;
  if (aborted_.load(std::memory_order_acquire)) return broken_ = abort_reason();
  local_stage_failed_ = false;
  absl::Status status = f();
  return Break(std::move(status), local_stage_failed_);
}

absl::Status HierarchicalCommunicator::CheckSignature(uint32_t kind, DType dtype, uint64_t count,
                                                      int root, ReduceOp op, absl::Time deadline) {
  OpSignature mine =
      MakeSignature(++sequence_, static_cast<CollectiveKind>(kind), dtype, count, root, op);
  const std::vector<int>& locals = topology_.members[node_];
  int n_local = local_size();
  // 1. The node's members compare their signatures (all see the same table,
  //    so all reach the same verdict).
  NodeReport report;
  report.signature = mine;
  if (n_local > 1) {
    std::vector<OpSignature> all(n_local);
    RETURN_IF_ERROR(
        local_->AllGather(&mine, all.data(), sizeof(OpSignature), DType::kUInt8, deadline));
    report.signature = all[0];
    for (int j = 1; j < n_local; ++j) {
      if (!SameSignature(all[0], all[j])) {
        report.local.Set(SignatureMismatch(locals[0], all[0], locals[j], all[j]));
        break;
      }
    }
  }
  // 2. The leaders compare their nodes'.
  Verdict verdict = report.local;
  if (is_leader() && leaders_ != nullptr) {
    int nodes = topology_.nodes();
    std::vector<NodeReport> reports(nodes);
    RETURN_IF_ERROR(
        leaders_->AllGather(&report, reports.data(), sizeof(NodeReport), DType::kUInt8, deadline));
    verdict = Verdict();
    for (int k = 0; k < nodes && !verdict.mismatch; ++k) {
      if (reports[k].local.mismatch) verdict = reports[k].local;
    }
    for (int k = 1; k < nodes && !verdict.mismatch; ++k) {
      if (!SameSignature(reports[0].signature, reports[k].signature)) {
        verdict.Set(SignatureMismatch(topology_.leader(0), reports[0].signature,
                                      topology_.leader(k), reports[k].signature));
      }
    }
  }
  // 3. The leader tells its node.
  if (n_local > 1) {
    RETURN_IF_ERROR(local_->Broadcast(&verdict, sizeof(verdict), DType::kUInt8, 0, deadline));
  }
  if (verdict.mismatch) {
    verdict.message[sizeof(verdict.message) - 1] = '\0';
    return absl::FailedPreconditionError(verdict.message);
  }
  return absl::OkStatus();
}

absl::Status HierarchicalCommunicator::Barrier(absl::Time deadline) {
  // The signature exchange completes on a member only after every member
  // started it (it went through every node's leader and back): a barrier.
  return Run([&] {
    return CheckSignature(static_cast<uint32_t>(CollectiveKind::kBarrier), DType::kUInt8, 0, -1,
                          ReduceOp::kSum, deadline);
  });
}

absl::Status HierarchicalCommunicator::RawAllReduce(void* data, size_t count, DType dtype,
                                                    ReduceOp op, double scale,
                                                    absl::Time deadline) {
  if (count == 0) return absl::OkStatus();
  bool many_local = local_size() > 1;
  // AVG sums everywhere and divides once at the end; PREMUL_SUM scales each
  // contribution in the local stage and sums afterwards.
  ReduceOp local_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  ReduceOp leader_op = op == ReduceOp::kAvg || op == ReduceOp::kPremulSum ? ReduceOp::kSum : op;
  if (many_local) {
    RETURN_IF_ERROR(Local(local_->Reduce(data, count, dtype, local_op, scale, 0, deadline)));
  } else if (op == ReduceOp::kPremulSum) {
    ReduceInit(data, data, count, dtype, op, scale);
  }
  if (is_leader()) {
    if (leaders_ != nullptr) {
      RETURN_IF_ERROR(leaders_->AllReduce(data, count, dtype, leader_op, 1.0, deadline));
    }
    if (op == ReduceOp::kAvg) ReduceFinish(data, count, dtype, op, size_);
  }
  if (many_local) RETURN_IF_ERROR(Local(local_->Broadcast(data, count, dtype, 0, deadline)));
  return absl::OkStatus();
}

absl::Status HierarchicalCommunicator::AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                                 double scale, absl::Time deadline) {
  RETURN_IF_ERROR(CheckReduce(dtype, op));
  return Run([&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kAllReduce), dtype, count,
                                   -1, op, deadline));
    return RawAllReduce(data, count, dtype, op, scale, deadline);
  });
}

absl::Status HierarchicalCommunicator::Broadcast(void* data, size_t count, DType dtype, int root,
                                                 absl::Time deadline) {
  RETURN_IF_ERROR(CheckRoot(root));
  return Run([&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kBroadcast), dtype, count,
                                   root, ReduceOp::kSum, deadline));
    if (count == 0) return absl::OkStatus();
    int root_node = topology_.node_of[root];
    bool many_local = local_size() > 1;
    // The root's node first (its leader included), then the other leaders,
    // then their nodes.
    if (node_ == root_node && many_local) {
      RETURN_IF_ERROR(
          Local(local_->Broadcast(data, count, dtype, topology_.local_index[root], deadline)));
    }
    if (is_leader() && leaders_ != nullptr) {
      RETURN_IF_ERROR(leaders_->Broadcast(data, count, dtype, root_node, deadline));
    }
    if (node_ != root_node && many_local) {
      RETURN_IF_ERROR(Local(local_->Broadcast(data, count, dtype, 0, deadline)));
    }
    return absl::OkStatus();
  });
}

absl::Status HierarchicalCommunicator::Reduce(void* data, size_t count, DType dtype, ReduceOp op,
                                              double scale, int root, absl::Time deadline) {
  RETURN_IF_ERROR(CheckRoot(root));
  RETURN_IF_ERROR(CheckReduce(dtype, op));
  return Run([&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kReduce), dtype, count,
                                   root, op, deadline));
    if (count == 0) return absl::OkStatus();
    // Only the root's buffer changes: everyone reduces a copy.
    std::string copy(static_cast<const char*>(data), count * DTypeSize(dtype));
    bool many_local = local_size() > 1;
    ReduceOp local_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    ReduceOp leader_op = op == ReduceOp::kAvg || op == ReduceOp::kPremulSum ? ReduceOp::kSum : op;
    if (many_local) {
      RETURN_IF_ERROR(
          Local(local_->Reduce(copy.data(), count, dtype, local_op, scale, 0, deadline)));
    } else if (op == ReduceOp::kPremulSum) {
      ReduceInit(copy.data(), copy.data(), count, dtype, op, scale);
    }
    int root_node = topology_.node_of[root];
    if (is_leader()) {
      // Every leader takes part; only the root node's keeps the result.
      if (leaders_ != nullptr) {
        RETURN_IF_ERROR(leaders_->AllReduce(copy.data(), count, dtype, leader_op, 1.0, deadline));
      }
      if (op == ReduceOp::kAvg) ReduceFinish(copy.data(), count, dtype, op, size_);
    }
    if (node_ == root_node && topology_.local_index[root] != 0) {
      RETURN_IF_ERROR(Local(local_->Broadcast(copy.data(), count, dtype, 0, deadline)));
    }
    if (rank_ == root) std::memcpy(data, copy.data(), copy.size());
    return absl::OkStatus();
  });
}

absl::Status HierarchicalCommunicator::AllGather(const void* in, void* out, size_t count,
                                                 DType dtype, absl::Time deadline) {
  return Run([&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kAllGather), dtype, count,
                                   -1, ReduceOp::kSum, deadline));
    if (count == 0) return absl::OkStatus();
    size_t block = count * DTypeSize(dtype);
    int n_local = local_size();
    // This node's inputs, in local order, at its leader.
    std::string mine(is_leader() ? block * n_local : 0, '\0');
    if (n_local > 1) {
      RETURN_IF_ERROR(Local(local_->Gather(in, mine.data(), count, dtype, 0, deadline)));
    } else {
      std::memcpy(mine.data(), in, block);
    }
    if (is_leader()) {
      int nodes = topology_.nodes();
      std::vector<size_t> bytes(nodes);
      for (int k = 0; k < nodes; ++k) bytes[k] = block * topology_.members[k].size();
      std::string all(block * size_, '\0');
      if (leaders_ != nullptr) {
        RETURN_IF_ERROR(leaders_->AllGatherV(mine.data(), all.data(), bytes, deadline));
      } else {
        all = mine;
      }
      // Node blocks -> group-rank order.
      size_t offset = 0;
      for (int k = 0; k < nodes; ++k) {
        for (int r : topology_.members[k]) {
          std::memcpy(static_cast<char*>(out) + r * block, all.data() + offset, block);
          offset += block;
        }
      }
    }
    if (n_local > 1) {
      RETURN_IF_ERROR(Local(local_->Broadcast(out, count * size_, dtype, 0, deadline)));
    }
    return absl::OkStatus();
  });
}

absl::Status HierarchicalCommunicator::Gather(const void* in, void* out, size_t count, DType dtype,
                                              int root, absl::Time deadline) {
  RETURN_IF_ERROR(CheckRoot(root));
  return Run([&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kGather), dtype, count,
                                   root, ReduceOp::kSum, deadline));
    // Flat mesh: every block goes to the root anyway.
    return flat_->Gather(in, out, count, dtype, root, deadline);
  });
}

absl::Status HierarchicalCommunicator::Scatter(const void* in, void* out, size_t count, DType dtype,
                                               int root, absl::Time deadline) {
  RETURN_IF_ERROR(CheckRoot(root));
  return Run([&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kScatter), dtype, count,
                                   root, ReduceOp::kSum, deadline));
    // Flat mesh: every block comes from the root anyway.
    return flat_->Scatter(in, out, count, dtype, root, deadline);
  });
}

absl::Status HierarchicalCommunicator::ReduceScatter(const void* in, void* out, size_t count,
                                                     DType dtype, ReduceOp op, double scale,
                                                     absl::Time deadline) {
  RETURN_IF_ERROR(CheckReduce(dtype, op));
  return Run([&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kReduceScatter), dtype,
                                   count, -1, op, deadline));
    // The hierarchical all_reduce of every block, then keep ours: the
    // inter-node traffic is one all_reduce among the leaders.
    size_t block = count * DTypeSize(dtype);
    std::string all(static_cast<const char*>(in), block * size_);
    RETURN_IF_ERROR(RawAllReduce(all.data(), count * size_, dtype, op, scale, deadline));
    std::memcpy(out, all.data() + rank_ * block, block);
    return absl::OkStatus();
  });
}

absl::Status HierarchicalCommunicator::AllToAll(const void* in,
                                                const std::vector<size_t>& send_counts, void* out,
                                                const std::vector<size_t>& recv_counts, DType dtype,
                                                absl::Time deadline) {
  if (send_counts.size() != static_cast<size_t>(size_) ||
      recv_counts.size() != static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError("all_to_all: one count per rank");
  }
  return Run([&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kAllToAll), dtype, size_,
                                   -1, ReduceOp::kSum, deadline));
    // Flat mesh: each pair exchanges its own data, nothing combines on the
    // way through a leader.
    return flat_->AllToAll(in, send_counts, out, recv_counts, dtype, deadline);
  });
}

}  // namespace muster
