// FakeDirectory: a GpuGroupDirectory for tests: groups are declared by the
// test, breaks are recorded, and the job store is an in-process HashStore.
// Every member is local (registered at this musterd) unless the test puts
// them on different nodes (SetNodes).
// Thread-safe.
#ifndef MUSTER_DAEMON_GPU_FAKE_DIRECTORY_H_
#define MUSTER_DAEMON_GPU_FAKE_DIRECTORY_H_

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/gpu/nccl_engine.h"
#include "muster/hash_store.h"

namespace muster {

class FakeDirectory : public GpuGroupDirectory {
 public:
  // Declares (or, under a later job epoch, re-forms: no longer broken)
  // group `name`.
  void AddGroup(const std::string& name, std::vector<int> ranks,
                absl::Duration timeout = absl::Seconds(20),
                std::string backend = "cpu:gloo,cuda:nccl", int64_t job_epoch = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    GpuGroupView view;
    view.ranks = std::move(ranks);
    view.timeout = timeout;
    view.backend = std::move(backend);
    view.job_epoch = job_epoch;
    groups_[name] = view;
    broken_.erase(name);
  }
  // Members of `group` by node (global ranks): Lookup's local_ranks are
  // the caller's node's, as if each node had its own musterd.
  void SetNodes(const std::string& group, std::vector<std::vector<int>> nodes) {
    std::lock_guard<std::mutex> lock(mu_);
    nodes_[group] = std::move(nodes);
  }
  absl::StatusOr<GpuGroupView> Lookup(const std::string&, const std::string& group,
                                      int global_rank) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = groups_.find(group);
    if (it == groups_.end()) return absl::NotFoundError("no group " + group);
    if (broken_.count(group)) return absl::AbortedError(broken_[group]);
    if (std::find(it->second.ranks.begin(), it->second.ranks.end(), global_rank) ==
        it->second.ranks.end()) {
      return absl::FailedPreconditionError("not a member");
    }
    GpuGroupView view = it->second;
    view.local_ranks = view.ranks;
    std::sort(view.local_ranks.begin(), view.local_ranks.end());
    for (const std::vector<int>& node : nodes_[group]) {
      if (std::find(node.begin(), node.end(), global_rank) != node.end()) {
        view.local_ranks = node;
        std::sort(view.local_ranks.begin(), view.local_ranks.end());
      }
    }
    return view;
  }
  std::string BrokenReason(const std::string&, const std::string& group) override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_.count(group) ? broken_[group] : "";
  }
  void BreakGroup(const std::string&, const std::string& group,
                  const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    broken_.emplace(group, reason);
    breaks_.push_back(group + ": " + reason);
  }
  absl::StatusOr<std::shared_ptr<Store>> JobStore(const std::string&) override { return store_; }
  Store& store() { return *store_; }
  std::vector<std::string> breaks() {
    std::lock_guard<std::mutex> lock(mu_);
    return breaks_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, GpuGroupView> groups_;
  std::map<std::string, std::vector<std::vector<int>>> nodes_;
  std::map<std::string, std::string> broken_;
  std::vector<std::string> breaks_;
  std::shared_ptr<Store> store_ = std::make_shared<HashStore>();
};

}  // namespace muster

#endif  // MUSTER_DAEMON_GPU_FAKE_DIRECTORY_H_
