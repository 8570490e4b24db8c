// The communicator conformance suite over HierarchicalCommunicator: the
// ranks (threads) are split across fake nodes, each with its own
// shared-memory segment (4 KiB slots, so large buffers take many rounds),
// leaders' and flat meshes over Gloo on loopback. Each world size runs in
// two layouts where it has them: nodes of consecutive ranks and nodes whose
// ranks are not consecutive or hold one rank. A member's death is what the
// daemons do: its own node's musterd aborts that segment at once, the other
// nodes' (which learn through the job's store) 300 ms later.
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/communicator_conformance.h"
#include "backends/gloo/gloo_communicator.h"
#include "backends/hier/hierarchical_communicator.h"
#include "backends/shm/collectives.h"
#include "muster/hash_store.h"
#include "muster/prefix_store.h"

namespace muster {
namespace {

class HierTransport : public ConformanceTransport {
 public:
  ~HierTransport() override { JoinDaemons(); }
  Traits traits() const override {
    Traits t;
    // Abort wakes a member waiting in a node-local stage at once (see
    // hierarchical_communicator_test.cc), not a leader waiting in a Gloo
    // stage (GlooCommunicator::Abort): at world 2 rank 0 is such a leader.
    t.abort_wakes_own_wait = false;
    t.death_names_reason = true;
    // A member that never joins, on another node: its node-mates' leader
    // waits in the leaders' Gloo stage while they wait for the leader in
    // the node's last stage; both deadlines pass together, the node-mate's
    // shared-memory timeout ("timed out waiting for ranks 100", the leader
    // that is there) aborts the segment and every member fails ABORTED
    // with it: no DEADLINE_EXCEEDED, and the rank named is not the missing
    // one (nodes a,a,b and a,a,b,b).
    t.known_bugs = {"Timeout"};
    return t;
  }
  int variants(int world) const override { return static_cast<int>(Layouts(world).size()); }
  std::string VariantName(int world, int variant) const override {
    return "nodes " + absl::StrJoin(Layouts(world)[variant], ",");
  }
  absl::Status NewGroup(int world, int variant) override {
    JoinDaemons();
    ids_ = Layouts(world)[variant];
    topology_ = NodeTopology::FromNodeIds(ids_);
    segments_.clear();
    for (int k = 0; k < topology_.nodes(); ++k) {
      static std::atomic<int> counter{0};
      std::string name = absl::StrCat("/muster-hier-conformance.", ::getpid(), ".", counter++);
      auto s = GroupSegment::Create(name, static_cast<int>(topology_.members[k].size()), 4096);
      if (!s.ok()) return s.status();
      GroupSegment::Unlink(name);  // mapped by this process only
      segments_.push_back(std::move(*s));
    }
    store_ = std::make_shared<HashStore>();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Connect(int r) override {
    int n = static_cast<int>(ids_.size());
    int node = topology_.node_of[r];
    absl::Duration timeout = absl::Seconds(30);
    auto flat = GlooCommunicator::Connect(std::make_shared<PrefixStore>("flat", store_), r, n,
                                          "127.0.0.1", timeout, false);
    if (!flat.ok()) return flat.status();
    std::unique_ptr<GlooCommunicator> leaders;
    if (topology_.local_index[r] == 0 && topology_.nodes() > 1) {
      auto l = GlooCommunicator::Connect(std::make_shared<PrefixStore>("leaders", store_), node,
                                         topology_.nodes(), "127.0.0.1", timeout, false);
      if (!l.ok()) return l.status();
      leaders = std::move(*l);
    }
    std::vector<int> global(n);
    for (int i = 0; i < n; ++i) global[i] = 100 + i;
    std::vector<int> local_global;
    for (int m : topology_.members[node]) local_global.push_back(100 + m);
    auto local = std::make_unique<ShmCommunicator>(segments_[node].get(), topology_.local_index[r],
                                                   "g", local_global);
    return std::unique_ptr<Communicator>(
        new HierarchicalCommunicator(r, topology_, std::move(local), segments_[node].get(),
                                     std::move(leaders), std::move(*flat), "g", global));
  }
  void MemberDied(int rank, const std::string& reason) override {
    int dead_node = topology_.node_of[rank];
    segments_[dead_node]->Abort(reason);
    daemons_.emplace_back([this, dead_node, reason] {
      absl::SleepFor(absl::Milliseconds(300));
      for (int k = 0; k < topology_.nodes(); ++k) {
        if (k != dead_node) segments_[k]->Abort(reason);
      }
    });
  }

 private:
  // Node ids of group ranks 0, 1, ...: consecutive first, then mixed.
  static std::vector<std::vector<std::string>> Layouts(int world) {
    switch (world) {
      case 1:
        return {{"a"}};
      case 2:
        return {{"a", "b"}};
      case 3:
        return {{"a", "a", "b"}, {"a", "b", "a"}};
      default:
        return {{"a", "a", "b", "b"}, {"a", "b", "c", "a"}};
    }
  }
  void JoinDaemons() {
    for (auto& t : daemons_) t.join();
    daemons_.clear();
  }

  std::vector<std::string> ids_;
  NodeTopology topology_;
  std::vector<std::unique_ptr<GroupSegment>> segments_;
  std::shared_ptr<HashStore> store_;
  std::vector<std::thread> daemons_;  // remote "musterd"s learning of a death
};

}  // namespace

std::unique_ptr<ConformanceTransport> MakeConformanceTransport() {
  return std::make_unique<HierTransport>();
}

}  // namespace muster
