#include "backends/hier/fake_nodes.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "muster/prefix_store.h"

namespace muster {

FakeNodes::FakeNodes(std::vector<std::string> node_ids, uint64_t slot_bytes)
    : ids(std::move(node_ids)), topology(NodeTopology::FromNodeIds(ids)) {
  static std::atomic<int> counter{0};
  for (int k = 0; k < topology.nodes(); ++k) {
    std::string name = absl::StrCat("/muster-hier-test.", ::getpid(), ".", counter++);
    auto s = GroupSegment::Create(name, static_cast<int>(topology.members[k].size()), slot_bytes);
    if (!s.ok()) {
      status = s.status();
      return;
    }
    GroupSegment::Unlink(name);  // mapped by this process only
    segments.push_back(std::move(*s));
  }
}

absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> FakeNodes::Connect(int r) {
  if (!status.ok()) return status;
  int n = static_cast<int>(ids.size());
  int node = topology.node_of[r];
  absl::Duration timeout = absl::Seconds(30);
  auto flat = GlooCommunicator::Connect(std::make_shared<PrefixStore>("flat", store), r, n,
                                        "127.0.0.1", timeout, false);
  if (!flat.ok()) return flat.status();
  std::unique_ptr<GlooCommunicator> leaders;
  if (topology.local_index[r] == 0 && topology.nodes() > 1) {
    auto l = GlooCommunicator::Connect(std::make_shared<PrefixStore>("leaders", store), node,
                                       topology.nodes(), "127.0.0.1", timeout, false);
    if (!l.ok()) return l.status();
    leaders = std::move(*l);
  }
  std::vector<int> global(n);
  for (int i = 0; i < n; ++i) global[i] = 100 + i;
  std::vector<int> local_global;
  for (int m : topology.members[node]) local_global.push_back(100 + m);
  auto local = std::make_unique<ShmCommunicator>(segments[node].get(), topology.local_index[r], "g",
                                                 local_global);
  if (configure) configure(r, *local);
  return std::make_unique<HierarchicalCommunicator>(r, topology, std::move(local),
                                                    segments[node].get(), std::move(leaders),
                                                    std::move(*flat), "g", global);
}

}  // namespace muster
