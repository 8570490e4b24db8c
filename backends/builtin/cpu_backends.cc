#include "backends/builtin/cpu_backends.h"

#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/gloo/gloo_communicator.h"
#include "backends/gloo/gloo_p2p.h"
#include "backends/hier/hierarchical_communicator.h"
#include "backends/shm/collectives.h"
#include "backends/shm/p2p.h"
#include "backends/shm/segment.h"
#include "common/status_macros.h"
#include "muster/prefix_store.h"

namespace muster {
namespace {

// GlooP2P as the group's PointToPoint.
class GlooPointToPoint final : public PointToPoint {
 public:
  explicit GlooPointToPoint(std::unique_ptr<GlooP2P> p2p) : p2p_(std::move(p2p)) {}
  absl::Status Validate(bool send, int peer, uint64_t tag) const override {
    if (!send && peer == kAnySource) {
      if (tag <= GlooP2P::kMaxTag) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat("tag ", tag, " is above the largest tag ", GlooP2P::kMaxTag));
    }
    return p2p_->Validate(peer, tag);
  }
  void Post(bool send, int peer, uint64_t tag, void* data, size_t bytes, absl::Time deadline,
            Done done) override {
    if (!send && peer == kAnySource) {
      p2p_->PostRecvAnySource(tag, data, bytes, deadline, std::move(done));
      return;
    }
    p2p_->Post(send, peer, tag, data, bytes, deadline,
               [done = std::move(done), source = send ? -1 : peer](absl::Status s) {
                 done(std::move(s), source);
               });
  }
  void Abort(const absl::Status&) override { p2p_->Abort(); }

 private:
  std::unique_ptr<GlooP2P> p2p_;
};

// What a built-in CPU backend holds: the segment (if any), the collectives
// and point to point over it or over Gloo.
class CpuBackend final : public Backend {
 public:
  CpuBackend(std::string name, BackendOptions options)
      : name_(std::move(name)), options_(std::move(options)) {}
  ~CpuBackend() override {
    p2p_.reset();  // its thread uses the segment
    comm_.reset();
  }
  const std::string& name() const override { return name_; }
  const BackendOptions& options() const override { return options_; }
  Communicator* communicator() override { return comm_.get(); }
  PointToPoint* point_to_point() override { return p2p_.get(); }
  void Abort(const absl::Status& reason) override {
    if (comm_ != nullptr) comm_->Abort(reason);
    if (segment_ != nullptr) segment_->AbortLocally(reason);
    if (p2p_ != nullptr) p2p_->Abort(reason);
  }

  std::unique_ptr<GroupSegment> segment_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<PointToPoint> p2p_;

 private:
  const std::string name_;
  const BackendOptions options_;
};

// A Gloo mesh among `size` members (this one is `rank`), named `mesh` among
// the group's meshes. On the group's flat meshes every member first says how
// it runs the group (flat or hierarchical): mixed members would wait for
// meshes the others never join.
absl::StatusOr<std::unique_ptr<GlooCommunicator>> ConnectGloo(const BackendOptions& o,
                                                              const std::string& mesh, int rank,
                                                              int size, bool check_signatures) {
  if (!o.connect_store) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", o.group_name, "': no store to connect a Gloo mesh through"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Store> base, o.connect_store());
  if (mesh == "/flat" || mesh == "/hier") {
    PrefixStore modes("mode", base);
    const char* mine = mesh == "/flat" ? "flat" : "hierarchical";
    if (absl::Status s = modes.Set(std::to_string(rank), mine); !s.ok()) {
      return Annotate(s, absl::StrCat("group '", o.group_name, "': publishing its mode"));
    }
    std::vector<std::string> keys;
    for (int i = 0; i < size; ++i) keys.push_back(std::to_string(i));
    auto all = modes.MultiGet(keys, o.timeout);
    if (!all.ok()) {
      return Annotate(all.status(),
                      absl::StrCat("group '", o.group_name, "': waiting for every member's mode"));
    }
    for (int i = 1; i < size; ++i) {
      if ((*all)[i] != (*all)[0]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", o.group_name, "': group rank 0 (rank ", o.global_ranks[0], ") runs ",
            (*all)[0], " collectives but group rank ", i, " (rank ", o.global_ranks[i], ") runs ",
            (*all)[i],
            " ones; all members must run the same (MUSTER_HIERARCHICAL differs "
            "between ranks, or a node's musterd could not create the group's shared memory)"));
      }
    }
  }
  auto store = std::make_shared<PrefixStore>(mesh.substr(1), base);
  auto comm =
      GlooCommunicator::Connect(store, rank, size, o.local_address, o.timeout, check_signatures);
  if (!comm.ok()) return Annotate(comm.status(), absl::StrCat("group '", o.group_name, "'", mesh));
  return std::move(*comm);
}

absl::Status ConnectSpanning(const BackendOptions& o, CpuBackend& b) {
  if (o.member_nodes.size() != o.global_ranks.size()) {
    return absl::InternalError(absl::StrCat("musterd described ", o.member_nodes.size(),
                                            " members of group '", o.group_name, "', not ",
                                            o.global_ranks.size()));
  }
  NodeTopology topology = NodeTopology::FromNodeIds(o.member_nodes);
  int node = topology.node_of[o.group_rank];
  const std::vector<int>& mine = topology.members[node];
  if (mine != o.shm_group_ranks) {
    return absl::InternalError(
        absl::StrCat("group '", o.group_name, "': musterd's segment holds group ranks ",
                     absl::StrJoin(o.shm_group_ranks, ","), " but this node's members are ",
                     absl::StrJoin(mine, ",")));
  }
  ASSIGN_OR_RETURN(auto segment, GroupSegment::Open(o.shm_name, static_cast<int>(mine.size())));
  // Every member joins the flat mesh (point to point, gather/scatter/
  // all_to_all); then the leaders connect theirs. A failure aborts this
  // node's segment, so its other members do not wait for this rank.
  std::unique_ptr<GlooCommunicator> flat, leaders;
  RETURN_IF_ERROR(ConnectSpanningMeshes(
      *segment, topology.local_index[o.group_rank] == 0,
      absl::StrCat("rank ", o.global_ranks[o.group_rank], " could not connect group '",
                   o.group_name, "' across nodes"),
      [&] { return ConnectGloo(o, "/hier", o.group_rank, o.group_size, false); },
      [&] { return ConnectGloo(o, "/hier/leaders", node, topology.nodes(), false); }, &flat,
      &leaders));
  std::vector<int> local_globals;
  for (int m : mine) local_globals.push_back(o.global_ranks[m]);
  auto local = std::make_unique<ShmCommunicator>(segment.get(), topology.local_index[o.group_rank],
                                                 o.group_name, local_globals);
  b.p2p_ = std::make_unique<GlooPointToPoint>(
      std::make_unique<GlooP2P>(flat->context(), o.group_name, o.global_ranks));
  b.segment_ = std::move(segment);
  b.comm_ = std::make_unique<HierarchicalCommunicator>(
      o.group_rank, std::move(topology), std::move(local), b.segment_.get(), std::move(leaders),
      std::move(flat), o.group_name, o.global_ranks);
  return absl::OkStatus();
}

absl::Status ConnectNodeLocal(const BackendOptions& o, CpuBackend& b) {
  ASSIGN_OR_RETURN(b.segment_, GroupSegment::Open(o.shm_name, o.group_size));
  b.comm_ = std::make_unique<ShmCommunicator>(b.segment_.get(), o.group_rank, o.group_name,
                                              o.global_ranks);
  b.p2p_ = std::make_unique<ShmPointToPoint>(b.segment_.get(), o.group_rank, o.group_name,
                                             o.global_ranks);
  return absl::OkStatus();
}

bool Spans(const BackendOptions& o) {
  return !o.shm_group_ranks.empty() && static_cast<int>(o.shm_group_ranks.size()) < o.group_size;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateGloo(const BackendOptions& o) {
  auto b = std::make_unique<CpuBackend>("gloo", o);
  const char* hierarchical = std::getenv("MUSTER_HIERARCHICAL");
  bool flat_only = hierarchical != nullptr && std::string(hierarchical) == "0";
  if (!o.shm_name.empty() && Spans(o) && !flat_only) {
    RETURN_IF_ERROR(ConnectSpanning(o, *b));
  } else if (o.shm_name.empty() || Spans(o)) {
    // No shared memory, or a spanning group run flat for comparisons.
    ASSIGN_OR_RETURN(auto comm, ConnectGloo(o, "/flat", o.group_rank, o.group_size, true));
    b->p2p_ = std::make_unique<GlooPointToPoint>(
        std::make_unique<GlooP2P>(comm->context(), o.group_name, o.global_ranks));
    b->comm_ = std::move(comm);
  } else {
    RETURN_IF_ERROR(ConnectNodeLocal(o, *b));
  }
  return std::unique_ptr<Backend>(std::move(b));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateShm(const BackendOptions& o) {
  if (o.shm_name.empty() || Spans(o)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group '", o.group_name, "': backend 'shm' needs every member on one node and the ",
        "shared-memory segment musterd makes for such a group (use 'gloo' for groups spanning "
        "nodes)"));
  }
  auto b = std::make_unique<CpuBackend>("shm", o);
  RETURN_IF_ERROR(ConnectNodeLocal(o, *b));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace

void RegisterBuiltinCpuBackends(BackendRegistry& registry) {
  static std::once_flag global_once;
  auto add = [&registry] {
    (void)registry.Register("gloo", CreateGloo, {"cpu"});
    (void)registry.Register("shm", CreateShm, {"cpu"});
  };
  if (&registry == &BackendRegistry::Global()) {
    std::call_once(global_once, add);
  } else {
    add();
  }
}

}  // namespace muster
