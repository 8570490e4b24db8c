// The communicator conformance suite over HierarchicalCommunicator: the
// ranks (threads) are split across FakeNodes, each node with its own
// shared-memory segment (4 KiB slots, so large buffers take many rounds),
// leaders' and flat meshes over Gloo on loopback. Each world size runs in
// two layouts where it has them: nodes of consecutive ranks and nodes whose
// ranks are not consecutive or hold one rank. A member's death is what the
// daemons do: its own node's musterd aborts that segment at once, the other
// nodes' (which learn through the job's store) 300 ms later.
#include <thread>

#include "absl/strings/str_join.h"
#include "backends/communicator_conformance.h"
#include "backends/hier/fake_nodes.h"

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
    return t;
  }
  int variants(int world) const override { return static_cast<int>(Layouts(world).size()); }
  std::string VariantName(int world, int variant) const override {
    return "nodes " + absl::StrJoin(Layouts(world)[variant], ",");
  }
  absl::Status NewGroup(int world, int variant) override {
    JoinDaemons();
    nodes_ = std::make_unique<FakeNodes>(Layouts(world)[variant], 4096);
    return nodes_->status;
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Connect(int r) override {
    auto comm = nodes_->Connect(r);
    if (!comm.ok()) return comm.status();
    return std::unique_ptr<Communicator>(std::move(*comm));
  }
  void MemberDied(int rank, const std::string& reason) override {
    int dead_node = nodes_->topology.node_of[rank];
    nodes_->segments[dead_node]->Abort(reason);
    daemons_.emplace_back([this, dead_node, reason] {
      absl::SleepFor(absl::Milliseconds(300));
      for (int k = 0; k < nodes_->topology.nodes(); ++k) {
        if (k != dead_node) nodes_->segments[k]->Abort(reason);
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

  std::unique_ptr<FakeNodes> nodes_;
  std::vector<std::thread> daemons_;  // remote "musterd"s learning of a death
};

}  // namespace

std::unique_ptr<ConformanceTransport> MakeConformanceTransport() {
  return std::make_unique<HierTransport>();
}

}  // namespace muster
