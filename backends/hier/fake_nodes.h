// FakeNodes: one test process standing in for the nodes of a spanning
// group. Group rank i is on node node_ids[i]; each node gets its own
// shared-memory segment (what musterd creates for its node's members of the
// group), the leaders' and flat meshes are Gloo on loopback through one
// in-process store. Connect(r) builds rank r's HierarchicalCommunicator the
// way the SDK does; global ranks are 100 + group rank.
//
// Connect may be called from one thread per rank concurrently; the rest is
// for the test's thread.
#ifndef MUSTER_BACKENDS_HIER_FAKE_NODES_H_
#define MUSTER_BACKENDS_HIER_FAKE_NODES_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/hier/hierarchical_communicator.h"
#include "backends/shm/collectives.h"
#include "backends/shm/segment.h"
#include "muster/hash_store.h"

namespace muster {

struct FakeNodes {
  // `status` says whether the segments could be made.
  explicit FakeNodes(std::vector<std::string> node_ids, uint64_t slot_bytes = 64 << 10);
  absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> Connect(int rank);

  absl::Status status;
  std::vector<std::string> ids;
  NodeTopology topology;
  std::vector<std::unique_ptr<GroupSegment>> segments;  // by node
  // Called on each rank's ShmCommunicator before use.
  std::function<void(int, ShmCommunicator&)> configure;
  std::shared_ptr<HashStore> store = std::make_shared<HashStore>();
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_HIER_FAKE_NODES_H_
