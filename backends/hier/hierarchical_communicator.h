// HierarchicalCommunicator: collectives for a process group whose members
// span nodes, in three stages: the members on each node combine in shared
// memory (a ShmCommunicator over a segment musterd creates for this node's
// members of the group), one leader per node — the member with the lowest
// group rank on that node — runs the inter-node part over Gloo (TCP) among
// the leaders only, and the node's members share the result in shared
// memory again. The leader's own rank process runs the inter-node part
// (there is no proxy in musterd; the daemon only creates the segment and
// reads its sequence numbers, as for node-local groups).
//
//   all_reduce     local reduce -> leaders all_reduce -> local broadcast
//   broadcast      local broadcast on the root's node -> leaders broadcast
//                  from that node -> local broadcast on the other nodes
//   reduce         local reduce -> leaders all_reduce -> local broadcast of
//                  the result on the root's node only (into scratch memory)
//   all_gather     local gather -> leaders all_gatherv of node blocks ->
//                  local broadcast of the whole result
//   reduce_scatter an all_reduce of all blocks, each rank keeps its own
//   barrier        the signature exchange below (it is a barrier)
//   gather, scatter, all_to_all
//                  the flat per-rank Gloo mesh: each block has one source
//                  and one destination, so routing it through the leaders
//                  would only add copies and a hop
//
// Desync detection across nodes: every collective starts with a signature
// exchange in three steps — local all_gather of the members' signatures,
// leaders' all_gather of their node's signature and verdict, local
// broadcast of the group-wide verdict — so ranks that called different
// collectives all fail with FAILED_PRECONDITION naming both ranks and both
// calls, and the group stays usable.
//
// Failures: an ABORTED or DEADLINE_EXCEEDED from any stage, or any failure
// of a node-local stage after the signature exchange, breaks the
// communicator: it aborts the node's segment (the node's other members stop
// waiting) and closes its Gloo connections (the other nodes' leaders, and
// through them their nodes, stop waiting). When the failure came from Gloo,
// it first gives musterd up to a second to abort the segment itself, whose
// reason names the member that died. Later calls fail with the same error.
// Abort (the rank lost its musterd) breaks it from any thread with the
// given reason: the node's segment is aborted for this process only (the
// node's other members share that musterd and learn it themselves) and the
// Gloo meshes are closed, so the other nodes stop waiting for this rank
// (a Gloo stage in flight first finishes with the other nodes, see
// GlooCommunicator::Abort; the next node-local stage then fails).
//
// Thread-compatible: one thread drives it (the group's executor); Abort is
// thread-safe.
#ifndef MUSTER_BACKENDS_HIER_HIERARCHICAL_COMMUNICATOR_H_
#define MUSTER_BACKENDS_HIER_HIERARCHICAL_COMMUNICATOR_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/communicator.h"
#include "backends/gloo/gloo_communicator.h"
#include "backends/shm/segment.h"

namespace muster {

// Which node each member of a group is on. Nodes are numbered in order of
// their lowest group rank; members of a node are listed in group-rank order
// (the first is the node's leader).
struct NodeTopology {
  std::vector<int> node_of;               // group rank -> node
  std::vector<int> local_index;           // group rank -> position on its node
  std::vector<std::vector<int>> members;  // node -> group ranks
  // `node_ids[i]` identifies group rank i's node (e.g. its daemon).
  static NodeTopology FromNodeIds(const std::vector<std::string>& node_ids);
  int nodes() const { return static_cast<int>(members.size()); }
  int leader(int node) const { return members[node][0]; }
};

class HierarchicalCommunicator : public Communicator {
 public:
  // `rank`: this member's group rank. `local`: a communicator among this
  // node's members (rank = local_index) over `segment` (which must outlive
  // this object; may be null with `local` when the node has one member).
  // `leaders`: among the nodes' leaders (rank = node), on leaders only, and
  // `flat`: among all members (rank = group rank); both created with
  // check_signatures=false. `global_ranks[i]` names group rank i.
  HierarchicalCommunicator(int rank, NodeTopology topology, std::unique_ptr<Communicator> local,
                           GroupSegment* segment, std::unique_ptr<GlooCommunicator> leaders,
                           std::unique_ptr<GlooCommunicator> flat, std::string group_name,
                           std::vector<int> global_ranks);
  ~HierarchicalCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const NodeTopology& topology() const { return topology_; }
  bool is_leader() const { return topology_.local_index[rank_] == 0; }
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

 private:
  absl::Status CheckRoot(int root) const;
  // The three-step signature exchange (see above).
  absl::Status CheckSignature(uint32_t kind, DType dtype, uint64_t count, int root, ReduceOp op,
                              absl::Time deadline);
  // all_reduce without the signature exchange.
  absl::Status RawAllReduce(void* data, size_t count, DType dtype, ReduceOp op, double scale,
                            absl::Time deadline);
  // Runs one collective: refuses if broken, breaks on ABORTED/DEADLINE_EXCEEDED.
  template <typename F>
  absl::Status Run(F&& f);
  // Breaks the communicator on ABORTED/DEADLINE_EXCEEDED, or on any failure
  // when `local_stage_failed` (see Local).
  absl::Status Break(absl::Status status, bool local_stage_failed = false);
  // Wraps a node-local stage that runs after the signature exchange: the
  // other nodes passed the exchange too and wait for this node in the next
  // stage, so any failure here (e.g. ranks of this node disagreeing on the
  // shared-memory direct path) breaks the communicator, failing them now
  // instead of at their deadline.
  absl::Status Local(absl::Status status) {
    if (!status.ok()) local_stage_failed_ = true;
    return status;
  }
  int local_size() const;

  int rank_;
  int size_;
  NodeTopology topology_;
  int node_;
  std::unique_ptr<Communicator> local_;
  GroupSegment* segment_;
  std::unique_ptr<GlooCommunicator> leaders_;
  std::unique_ptr<GlooCommunicator> flat_;
  std::string group_name_;
  std::vector<int> global_ranks_;
  uint64_t sequence_ = 0;
  bool local_stage_failed_ = false;
  absl::Status broken_;
  // Set by Abort (any thread); Run and Break read it.
  std::atomic<bool> aborted_{false};
  // std::mutex, not absl::Mutex: ThreadSanitizer cannot see into Debian's
  // Abseil, and the backends' tests run ranks as threads.
  mutable std::mutex abort_mu_;
  absl::Status abort_reason_;  // guarded by abort_mu_
  absl::Status abort_reason() const {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return abort_reason_;
  }
};

// Connects the Gloo meshes of one member of a spanning group: the flat mesh
// (every member), then the leaders' mesh on a node's leader. On any failure
// it aborts `segment` with `who` and the reason and closes the flat mesh:
// the node's other members connect no leaders' mesh and may already wait in
// a collective for this rank (they fail at once instead of at the group
// timeout), and the other nodes' members stop waiting on the flat mesh.
using GlooConnect = std::function<absl::StatusOr<std::unique_ptr<GlooCommunicator>>()>;
absl::Status ConnectSpanningMeshes(GroupSegment& segment, bool leader, const std::string& who,
                                   const GlooConnect& connect_flat,
                                   const GlooConnect& connect_leaders,
                                   std::unique_ptr<GlooCommunicator>* flat,
                                   std::unique_ptr<GlooCommunicator>* leaders);

}  // namespace muster

#endif  // MUSTER_BACKENDS_HIER_HIERARCHICAL_COMMUNICATOR_H_
