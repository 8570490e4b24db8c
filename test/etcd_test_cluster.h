// A local etcd cluster for one test binary (tools/etcd_cluster.sh, Debian's
// etcd-server), started on first use and stopped when the binary exits, and
// key prefixes that keep the binary's test cases apart. Thread-safe: the
// cluster is a function-local static.
#ifndef MUSTER_TEST_ETCD_TEST_CLUSTER_H_
#define MUSTER_TEST_ETCD_TEST_CLUSTER_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace muster::testing {

struct TestEtcdCluster {
  std::string dir;                     // tools/etcd_cluster.sh's state directory
  std::vector<std::string> endpoints;  // one client URL per member
  bool available = false;              // false: no /usr/bin/etcd, or it did not start

  // The binary's cluster of `members` members (1 or 3); the first call
  // starts it and decides the size, later calls return the same cluster.
  static const TestEtcdCluster& Get(int members);
};

// A prefix no other test case of this process uses: "/<label>-<pid>-<n>/".
std::string FreshEtcdPrefix(absl::string_view label);

}  // namespace muster::testing

#endif  // MUSTER_TEST_ETCD_TEST_CLUSTER_H_
